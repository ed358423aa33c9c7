#!/usr/bin/env python3
"""The torch.distributed backend "gfdit" against gloo, in the same run.

1. Group creation: ``dist.new_group(ranks)`` on a default process group of the gfdit backend, against
   ``dist.new_group(ranks, backend="gloo")`` in the same processes; each call timed alone after a
   barrier, median over calls, max over ranks. Also ``init_device_mesh`` (2 x n/2) on each backend.
2. Collectives through torch.distributed's own API: a 4 KiB all_reduce and a 1 MiB all_to_all_single on
   the gfdit default group against a gloo group of the same ranks (what the Python process-group layer
   costs on top of gfdit's collectives).
3. diffusers' own context parallelism (``ContextParallelConfig``, Ulysses 2 and Ring 2) on the tiny Wan and
   Qwen-Image transformers at 256, 1k and 4k image tokens, world 2: the same forward with
   ``init_process_group("gfdit")`` and with ``init_process_group("gloo")``. The two backends run in
   separate worlds (a process has one default group), alternately, each after one warm-up forward; a
   forward's time is the max over ranks, the table shows the median.

  python bench/bench_torch_backend.py               # about 4 minutes on 2 cores
  python bench/bench_torch_backend.py --quick       # smoke test
  python bench/bench_torch_backend.py --json out.json
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# diffusers' context parallelism on CPU needs two shims that the backend tests apply too (one "device", and
# torch's CPU flash attention under the CUDA op's name); the forward itself is theirs.
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "python"))

import _common as C  # noqa: E402

# Image tokens -> tiny-model inputs: Wan latent (frames, height, width) with 1x2x2 patches; Qwen-Image packed
# grid (height, width) of tokens.
WAN_SHAPES = {256: (4, 16, 16), 1024: (4, 32, 32), 4096: (4, 64, 64)}
QWEN_SHAPES = {256: (16, 16), 1024: (32, 32), 4096: (64, 64)}


def groups_rank_fn(ctx: C.RankContext) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    opts = ctx.options
    n = ctx.world_size
    assert dist.get_backend() == "gfdit", dist.get_backend()
    lists = {"world": list(range(n)), "pair": [0, 1]}
    out: dict[str, Any] = {"world_size": n, "new_group": {}}
    for name, ranks in lists.items():
        # The groups are destroyed after the measurement: torch's gloo groups get slower to create as more of them
        # exist (after a thousand, ten times slower), and a program makes tens of groups, not thousands.
        made = []
        times: dict[str, list[float]] = {"gfdit": [], "gloo": []}
        for i in range(opts["calls"]):
            for backend in ("gfdit", "gloo") if i % 2 == 0 else ("gloo", "gfdit"):
                dist.barrier()
                t0 = time.perf_counter()
                pg = dist.new_group(ranks, backend=None if backend == "gfdit" else "gloo")
                times[backend].append(time.perf_counter() - t0)
                made.append(pg)
        # Back to back: every rank makes the same groups in the same order, as a program's start-up does; the
        # median over runs of `batch` calls, per call.
        batch: dict[str, list[float]] = {"gfdit": [], "gloo": []}
        for backend, num_batches, size in (("gfdit", 20, 20), ("gloo", 4, opts["calls"] // 4)):
            for _ in range(num_batches):
                dist.barrier()
                t0 = time.perf_counter()
                pgs = [
                    dist.new_group(ranks, backend=None if backend == "gfdit" else "gloo") for _ in range(size)
                ]
                batch[backend].append((time.perf_counter() - t0) / size)
                made += pgs
        dist.barrier()
        for pg in made:
            dist.destroy_process_group(pg)
        gf, gl, bgf, bgl = ctx.max_over_ranks(
            [
                C.median(times["gfdit"]),
                C.median(times["gloo"]),
                C.median(batch["gfdit"]),
                C.median(batch["gloo"]),
            ]
        )
        out["new_group"][name] = {
            "ranks": ranks,
            "gfdit_s": gf,
            "gloo_s": gl,
            "calls": opts["calls"],
            "back_to_back_gfdit_s": bgf,
            "back_to_back_gloo_s": bgl,
        }

    if n % 2 == 0:
        mesh: dict[str, list[float]] = {"gfdit": [], "gloo": []}
        for _ in range(opts["mesh_calls"]):
            for backend in ("gfdit", "gloo"):
                dist.barrier()
                t0 = time.perf_counter()
                m = init_device_mesh(
                    "cpu",
                    (2, n // 2),
                    backend_override=None if backend == "gfdit" else {0: "gloo", 1: "gloo"},
                )
                mesh[backend].append(time.perf_counter() - t0)
                del m
        gf, gl = ctx.max_over_ranks([C.median(mesh["gfdit"]), C.median(mesh["gloo"])])
        out["device_mesh"] = {"shape": [2, n // 2], "gfdit_s": gf, "gloo_s": gl}

    gloo = dist.new_group(list(range(n)), backend="gloo")
    cols: dict[str, Any] = {}
    small = torch.randn(1024)  # 4 KiB
    big = torch.randn(256 * 1024)  # 1 MiB
    big_out = torch.empty_like(big)
    for name, fn in (
        ("all_reduce 4 KiB", lambda g: dist.all_reduce(small, group=g)),
        ("all_to_all_single 1 MiB", lambda g: dist.all_to_all_single(big_out, big, group=g)),
    ):
        times = {"gfdit": [], "gloo": []}
        for _ in range(5):
            fn(None)
            fn(gloo)
        for i in range(opts["iters"]):
            for backend, g in (
                (("gfdit", None), ("gloo", gloo)) if i % 2 == 0 else (("gloo", gloo), ("gfdit", None))
            ):
                dist.barrier()
                t0 = time.perf_counter()
                fn(g)
                times[backend].append(time.perf_counter() - t0)
        gf, gl = ctx.max_over_ranks([C.median(times["gfdit"]), C.median(times["gloo"])])
        cols[name] = {"gfdit_s": gf, "gloo_s": gl}
    out["collectives"] = cols
    return out


def forward_rank_fn(ctx: C.RankContext) -> dict[str, Any]:
    import cases_diffusers_cp
    import torch.distributed as dist

    opts = ctx.options
    backend = dist.get_backend()
    out: dict[str, Any] = {}
    for kind, ulysses, ring, tokens in opts["cases"]:
        if kind == "wan":
            f, h, w = WAN_SHAPES[tokens]
            inputs = {"frames": f, "height": h, "width": w}
        else:
            h, w = QWEN_SHAPES[tokens]
            inputs = {"height": h, "width": w, "text": 16}
        res = cases_diffusers_cp.diffusers_cp(
            ctx, backend, kind, ulysses, ring, inputs, repeats=opts["repeats"]
        )
        per_rank = ctx.gather_over_ranks(res["times"])
        out[f"{kind} u{ulysses} r{ring} {tokens}"] = [max(col) for col in zip(*per_rank)]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="2,4", help="world sizes of the group-creation part (default 2,4)")
    ap.add_argument("--tokens", default="256,1k,4k", help="image tokens of the forward part")
    ap.add_argument("--rounds", type=int, default=None, help="alternations of the two backends' worlds")
    ap.add_argument("--quick", action="store_true", help="smoke test")
    ap.add_argument("--json", default=None, help="write results to this JSON file")
    args = ap.parse_args(argv)
    ok, why = C.gfdit_importable()
    if not ok:
        print(f"gfdit is not importable ({why}); build it first (make build)", file=sys.stderr)
        return 2
    try:
        import diffusers  # noqa: F401
    except ImportError:
        diffusers = None
    env = C.environment()
    C.header("torch.distributed backend gfdit vs gloo", env)
    t_start = time.monotonic()
    tables: list[str] = []
    targets: list[C.Target] = []
    results: dict[str, Any] = {"groups": [], "forward": {}}
    errors: dict[str, str] = {}

    opts = {
        "default_backend": "gfdit",
        "calls": 10 if args.quick else 40,
        "mesh_calls": 3 if args.quick else 10,
        "iters": 30 if args.quick else 200,
    }
    rows, col_rows = [], []
    for n in C.parse_ints(args.ranks):
        try:
            r = C.run_ranks(groups_rank_fn, n, opts, timeout_s=600)[0]
        except Exception as e:
            errors[f"groups n={n}"] = str(e)
            print(f"world of {n} FAILED: {e}", file=sys.stderr, flush=True)
            continue
        results["groups"].append(r)
        items = list(r["new_group"].items())
        if "device_mesh" in r:
            items.append((f"init_device_mesh {r['device_mesh']['shape']}", r["device_mesh"]))
        for name, g in items:
            ratio = g["gloo_s"] / g["gfdit_s"]
            rows.append([n, name, "alone", C.fmt_us(g["gfdit_s"]), C.fmt_us(g["gloo_s"]), C.fmt_ratio(ratio)])
            if "back_to_back_gfdit_s" in g:
                bgf, bgl = g["back_to_back_gfdit_s"], g["back_to_back_gloo_s"]
                rows.append([n, name, "back to back", C.fmt_us(bgf), C.fmt_us(bgl), C.fmt_ratio(bgl / bgf)])
        for name, c in r["collectives"].items():
            col_rows.append(
                [
                    n,
                    name,
                    C.fmt_us(c["gfdit_s"]),
                    C.fmt_us(c["gloo_s"]),
                    C.fmt_ratio(c["gloo_s"] / c["gfdit_s"]),
                ]
            )
    tables.append(
        C.print_table(
            "Group creation through torch.distributed: backend gfdit vs gloo, same processes",
            ["world", "what", "timed", "gfdit [us]", "gloo [us]", "gloo / gfdit"],
            rows,
            [
                "alone: each call timed alone after a barrier, the two backends alternating; median over calls, max "
                "over ranks",
                "back to back: runs of calls after one barrier, per call, median over runs (what a start-up making its "
                "groups sees)",
            ],
        )
    )
    tables.append(
        C.print_table(
            "Collectives through torch.distributed's API: default group on gfdit vs a gloo group of the same ranks",
            ["world", "collective", "gfdit [us]", "gloo [us]", "gloo / gfdit"],
            col_rows,
            ["each call after a barrier, alternating; median, max over ranks"],
        )
    )

    if diffusers is None:
        print("diffusers is not installed: the context-parallel forward part is skipped", flush=True)
    else:
        tokens = [int(t[:-1]) * 1024 if t.endswith("k") else int(t) for t in args.tokens.split(",")]
        cases = [(kind, u, r, t) for kind in ("wan", "qwen") for (u, r) in ((2, 1), (1, 2)) for t in tokens]
        rounds = args.rounds or (1 if args.quick else 2)
        fopts = {"repeats": 2 if args.quick else 5, "cases": cases}
        times: dict[str, dict[str, list[float]]] = {"gfdit": {}, "gloo": {}}
        for rd in range(rounds):
            for backend in ("gfdit", "gloo") if rd % 2 == 0 else ("gloo", "gfdit"):
                try:
                    r = C.run_ranks(forward_rank_fn, 2, dict(fopts, default_backend=backend), timeout_s=900)[
                        0
                    ]
                except Exception as e:
                    errors[f"forward {backend} round {rd}"] = str(e)
                    print(f"forward world on {backend} FAILED: {e}", file=sys.stderr, flush=True)
                    continue
                for key, ts in r.items():
                    times[backend].setdefault(key, []).extend(ts)
        rows = []
        for kind, u, r, t in cases:
            key = f"{kind} u{u} r{r} {t}"
            gf, gl = times["gfdit"].get(key), times["gloo"].get(key)
            if not gf or not gl:
                continue
            mg, ml = C.median(gf), C.median(gl)
            results["forward"][key] = {"gfdit_s": mg, "gloo_s": ml, "gfdit_all_s": gf, "gloo_all_s": gl}
            ratio = ml / mg
            rows.append(
                [
                    "Wan" if kind == "wan" else "Qwen-Image",
                    f"Ulysses {u}" if u > 1 else f"Ring {r}",
                    t,
                    f"{mg * 1e3:.2f}",
                    f"{ml * 1e3:.2f}",
                    C.fmt_ratio(ratio),
                    len(gf),
                ]
            )
        tables.append(
            C.print_table(
                "diffusers context parallelism (tiny models, world 2): forward with backend gfdit vs gloo",
                ["model", "CP", "tokens", "gfdit [ms]", "gloo [ms]", "gloo / gfdit", "n"],
                rows,
                [
                    "the two backends in separate two-rank worlds, alternating; one warm-up forward each; median over "
                    "forwards of the max over ranks",
                ],
            )
        )
    # The issue sets no thresholds here: the ratios are reported, not judged.
    if errors:
        print("errors: " + "; ".join(f"{k}: {v.splitlines()[-1] if v else v}" for k, v in errors.items()))
    print(f"total {time.monotonic() - t_start:.0f} s", flush=True)
    C.write_json(
        args.json,
        {
            "benchmark": "torch_backend",
            "environment": env,
            "config": {"groups": opts, "quick": args.quick, "tokens": args.tokens},
            "results": results,
            "targets": [t.as_dict() for t in targets],
            "errors": errors,
            "tables": tables,
        },
    )
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
