#!/usr/bin/env python3
"""Bandwidth of gfdit collectives against torch.distributed (gloo) and single-core memcpy, same run.

For every world size (2 and 4 ranks by default; ranks are processes), operation (all_gather_into_tensor,
all_to_all_single, all_reduce), per-rank message size and tensor kind (ordinary torch tensors, and heap
tensors from gfdit.empty), it reports:

  * the time per operation: each rank times every iteration alone, takes its median, and the table shows
    the max over ranks of those medians (a barrier precedes every timed loop);
  * the same for torch.distributed gloo on the same tensors (speedup = gloo time / gfdit time);
  * bus bandwidth as nccl-tests defines it, and that bandwidth over the bandwidth of a single-core memcpy
    of the same per-rank size measured in this run (torch dst.copy_(src), one thread, parent process).

Per-rank message size S means: all_gather: every rank contributes S bytes (output n*S);
all_to_all_single: every rank's input and output are S bytes (S/n to each peer); all_reduce: the tensor
is S bytes. Bus bandwidth: all_gather (n*S)*(n-1)/n/t, all_to_all S*(n-1)/n/t, all_reduce 2*(n-1)/n*S/t.

Targets: >= 10x gloo at 4 KiB, >= 20x gloo from 1 MiB up, busbw >= 50% of memcpy from 1 MiB up at 2 ranks.

    python bench/bench_collectives.py                 # full: 2 and 4 ranks, 4 KiB .. 64 MiB
    python bench/bench_collectives.py --quick         # smoke test (< 60 s)
    python bench/bench_collectives.py --ranks 2 --sizes 4K,1M --ops all_reduce --json out.json
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402

OPS = ("all_gather_into_tensor", "all_to_all_single", "all_reduce")
SHORT = {
    "all_gather_into_tensor": "all_gather",
    "all_to_all_single": "all_to_all",
    "all_reduce": "all_reduce",
}
KINDS = ("tensor", "heap")
DEFAULT_SIZES = "4K,64K,1M,4M,16M,64M"
QUICK_SIZES = "4K,1M"

TARGET_SMALL_SIZE = 4 * C.KIB
TARGET_SMALL_SPEEDUP = 10.0
TARGET_LARGE_FROM = 1 * C.MIB
TARGET_LARGE_SPEEDUP = 20.0
TARGET_MEMCPY_FRACTION = 0.5
TARGET_MEMCPY_RANKS = 2


# ----------------------------------------------------------------------------------------------------------
# definitions of the operations


def busbw_factor(op: str, n: int) -> float:
    """busbw = factor * S / t, S the per-rank message size (see module docstring)."""
    if op == "all_gather_into_tensor":
        return n * (n - 1) / n
    if op == "all_to_all_single":
        return (n - 1) / n
    if op == "all_reduce":
        return 2 * (n - 1) / n
    raise ValueError(op)


def speedup_target(size: int) -> float | None:
    if size == TARGET_SMALL_SIZE:
        return TARGET_SMALL_SPEEDUP
    if size >= TARGET_LARGE_FROM:
        return TARGET_LARGE_SPEEDUP
    return None


def memcpy_target(size: int, n: int) -> float | None:
    if size >= TARGET_LARGE_FROM and n == TARGET_MEMCPY_RANKS:
        return TARGET_MEMCPY_FRACTION
    return None


# ----------------------------------------------------------------------------------------------------------
# timing inside a rank


def time_loop(ctx: C.RankContext, fn, barrier, opts: dict[str, Any]) -> dict[str, Any]:
    """Warm up, agree on an iteration count, barrier, time each iteration; stats over ranks."""
    for _ in range(opts["warmup"]):
        fn()
    barrier()
    t0 = time.perf_counter()
    for _ in range(3):
        fn()
    one = (time.perf_counter() - t0) / 3
    one = ctx.max_over_ranks([one])[0]  # every rank must run the same number of iterations
    iters = int(opts["target_s"] / max(one, 1e-7))
    iters = max(opts["min_iters"], min(opts["max_iters"], iters))
    times = [0.0] * iters
    barrier()
    for i in range(iters):
        t0 = time.perf_counter_ns()
        fn()
        times[i] = (time.perf_counter_ns() - t0) * 1e-9
    med = C.median(times)
    per_rank = [r[0] for r in ctx.gather_over_ranks([med])]
    p90 = ctx.max_over_ranks([C.percentile(times, 90)])[0]
    return {
        "median_s": max(per_rank),
        "per_rank_median_s": per_rank,
        "p90_s": p90,
        "iters": iters,
        "ops_run": opts["warmup"] + 3 + iters,
    }


def make_tensors(kind: str, op: str, size: int, n: int, rank: int):
    """(out, inp) for the op, filled with random integers (exact in float32 sums), as `kind` tensors."""
    import gfdit
    import torch

    numel = size // 4
    alloc = (
        (lambda shape: gfdit.empty(shape, dtype=torch.float32))
        if kind == "heap"
        else (lambda shape: torch.empty(shape, dtype=torch.float32))
    )
    gen = torch.Generator().manual_seed(1234 + 17 * rank + size)
    if op == "all_gather_into_tensor":
        inp, out = alloc((numel,)), alloc((n * numel,))
    elif op == "all_to_all_single":
        inp, out = alloc((numel,)), alloc((numel,))
    else:
        inp, out = alloc((numel,)), None
    inp.copy_(torch.randint(-64, 64, (numel,), generator=gen).to(torch.float32))
    if out is not None:
        out.zero_()
    return out, inp


def check_op(op: str, out, inp) -> bool:
    """One gfdit op and one gloo op on copies of the same input; True when the results are identical."""
    import gfdit
    import torch
    import torch.distributed as dist

    if op == "all_reduce":
        ref = inp.clone()
        dist.all_reduce(ref)
        gfdit.all_reduce(inp)  # in place on the (possibly heap) tensor itself
        return torch.equal(inp, ref)
    ref = torch.empty_like(out)
    if op == "all_gather_into_tensor":
        dist.all_gather_into_tensor(ref, inp)
        gfdit.all_gather_into_tensor(out, inp)
    else:
        dist.all_to_all_single(ref, inp)
        gfdit.all_to_all_single(out, inp)
    return torch.equal(out, ref)


def rank_fn(ctx: C.RankContext) -> list[dict[str, Any]]:
    import gfdit
    import torch.distributed as dist

    opts = ctx.options
    n = ctx.world_size
    records: list[dict[str, Any]] = []
    stats_fn = None
    if hasattr(gfdit, "get_world") and hasattr(gfdit.get_world(), "stats"):
        stats_fn = gfdit.get_world().stats
    is_heap = getattr(gfdit, "is_heap_tensor", None)
    for size in opts["sizes"]:
        for op in opts["ops"]:
            for kind in opts["kinds"]:
                out, inp = make_tensors(kind, op, size, n, ctx.rank)
                ok = check_op(op, out, inp) if opts["check"] else None
                ok_all = None if ok is None else bool(ctx.max_over_ranks([0.0 if ok else 1.0])[0] == 0.0)
                if op == "all_gather_into_tensor":
                    g_fn = lambda: gfdit.all_gather_into_tensor(out, inp)  # noqa: E731
                    b_fn = lambda: dist.all_gather_into_tensor(out, inp)  # noqa: E731
                elif op == "all_to_all_single":
                    g_fn = lambda: gfdit.all_to_all_single(out, inp)  # noqa: E731
                    b_fn = lambda: dist.all_to_all_single(out, inp)  # noqa: E731
                else:
                    inp.zero_()  # repeated sums of zeros stay finite
                    g_fn = lambda: gfdit.all_reduce(inp)  # noqa: E731
                    b_fn = lambda: dist.all_reduce(inp)  # noqa: E731
                before = stats_fn() if stats_fn else None
                g = time_loop(ctx, g_fn, gfdit.barrier, opts)
                after = stats_fn() if stats_fn else None
                rec = {"world_size": n, "op": op, "kind": kind, "size": size, "check_ok": ok_all, "gfdit": g}
                if is_heap is not None:
                    rec["inputs_in_heap"] = bool(is_heap(inp)) and (out is None or bool(is_heap(out)))
                if before is not None and after is not None:
                    rec["gfdit_stats_delta"] = _stats_delta(before, after)
                if kind == "tensor" or opts["gloo_on_heap"] or "tensor" not in opts["kinds"]:
                    rec["gloo"] = time_loop(ctx, b_fn, dist.barrier, opts)
                records.append(rec)
                ctx.log(
                    f"  n={n} {SHORT[op]:<10} {C.fmt_size(size):>7} {kind:<6} gfdit {C.fmt_us(g['median_s'])} us"
                    + (f", gloo {C.fmt_us(rec['gloo']['median_s'])} us" if "gloo" in rec else "")
                )
                out = inp = g_fn = b_fn = None  # free them before the next size
                gc.collect()
    return records


def _stats_delta(before: Any, after: Any) -> Any:
    def as_dict(s: Any) -> dict[str, Any]:
        if isinstance(s, dict):
            return s
        return {
            k: getattr(s, k)
            for k in dir(s)
            if not k.startswith("_") and isinstance(getattr(s, k), (int, float))
        }

    b, a = as_dict(before), as_dict(after)
    return {k: a[k] - b.get(k, 0) for k in a if isinstance(a[k], (int, float))}


# ----------------------------------------------------------------------------------------------------------
# memcpy baseline (parent process, one thread, no rank running)


def measure_memcpy(sizes: list[int], target_s: float) -> dict[int, dict[str, float]]:
    import torch

    torch.set_num_threads(1)
    out: dict[int, dict[str, float]] = {}
    for size in sizes:
        src = torch.randint(0, 255, (size,), dtype=torch.uint8)
        dst = torch.empty_like(src)
        for _ in range(3):
            dst.copy_(src)
        t0 = time.perf_counter()
        dst.copy_(src)
        one = time.perf_counter() - t0
        iters = max(20, min(20000, int(target_s / max(one, 1e-7))))
        times = []
        for _ in range(iters):
            t0 = time.perf_counter_ns()
            dst.copy_(src)
            times.append((time.perf_counter_ns() - t0) * 1e-9)
        t = C.median(times)
        out[size] = {"median_s": t, "bytes_per_s": size / t, "iters": iters}
    return out


# ----------------------------------------------------------------------------------------------------------
# report


def build_rows(records: list[dict[str, Any]], memcpy: dict[int, dict[str, float]]):
    rows, targets = [], []
    for rec in records:
        n, op, kind, size = rec["world_size"], rec["op"], rec["kind"], rec["size"]
        t = rec["gfdit"]["median_s"]
        t_gloo = rec["gloo"]["median_s"] if "gloo" in rec else None
        if t_gloo is None:  # gloo measured on ordinary tensors only: use that row's time
            for other in records:
                if (other["world_size"], other["op"], other["size"], other["kind"]) == (
                    n,
                    op,
                    size,
                    "tensor",
                ) and "gloo" in other:
                    t_gloo = other["gloo"]["median_s"]
        speedup = t_gloo / t if t_gloo else None
        busbw = busbw_factor(op, n) * size / t
        mem_bw = memcpy[size]["bytes_per_s"]
        frac = busbw / mem_bw
        s_target = speedup_target(size)
        m_target = memcpy_target(size, n)
        s_met = None if s_target is None or speedup is None else speedup >= s_target
        m_met = None if m_target is None else frac >= m_target
        rec.update(
            {
                "gloo_median_s_used": t_gloo,
                "speedup_vs_gloo": speedup,
                "busbw_bytes_per_s": busbw,
                "gloo_busbw_bytes_per_s": busbw_factor(op, n) * size / t_gloo if t_gloo else None,
                "memcpy_bytes_per_s": mem_bw,
                "busbw_over_memcpy": frac,
                "speedup_target": s_target,
                "speedup_met": s_met,
                "memcpy_fraction_target": m_target,
                "memcpy_fraction_met": m_met,
            }
        )
        marks = []
        if s_met is False:
            marks.append("speedup")
        if m_met is False:
            marks.append("memcpy%")
        if rec.get("check_ok") is False:
            marks.append("WRONG RESULT")
        rows.append(
            [
                SHORT[op],
                n,
                C.fmt_size(size),
                kind,
                C.fmt_us(t),
                C.fmt_us(t_gloo),
                C.fmt_ratio(speedup),
                f">={s_target:.0f}x" if s_target else "-",
                C.fmt_gbps(busbw),
                C.fmt_gbps(mem_bw),
                C.fmt_pct(frac),
                f">={100 * m_target:.0f}%" if m_target else "-",
                {None: "-", True: "ok", False: "FAIL"}[rec.get("check_ok")],
                "MISS " + ",".join(marks) if marks else ("ok" if (s_met or m_met) else "-"),
            ]
        )
        name = f"{SHORT[op]} n={n} {C.fmt_size(size)} {kind}"
        if s_target is not None and speedup is not None:
            targets.append(C.Target(f"{name}: speedup vs gloo", speedup, f">= {s_target:.0f}x", s_met))
        if m_target is not None:
            targets.append(C.Target(f"{name}: busbw / memcpy", frac, f">= {100 * m_target:.0f}%", m_met))
        if rec.get("check_ok") is False:
            targets.append(C.Target(f"{name}: result equals gloo", 0.0, "identical", False))
    return rows, targets


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="2,4", help="world sizes, comma separated (default 2,4)")
    ap.add_argument("--sizes", default=None, help=f"per-rank message sizes (default {DEFAULT_SIZES})")
    ap.add_argument("--ops", default=",".join(OPS), help="operations, comma separated")
    ap.add_argument(
        "--kinds", default=",".join(KINDS), help="tensor kinds: tensor (ordinary), heap (gfdit.empty)"
    )
    ap.add_argument(
        "--quick", action="store_true", help=f"smoke test: sizes {QUICK_SIZES}, short timing loops"
    )
    ap.add_argument(
        "--target-ms", type=float, default=None, help="time budget of one timing loop (default 500, quick 60)"
    )
    ap.add_argument("--min-iters", type=int, default=None, help="fewest timed iterations (default 10)")
    ap.add_argument("--max-iters", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument(
        "--gloo-on-heap",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time gloo on the heap tensors (default on); off: heap rows use the gloo time of "
        "the ordinary tensors",
    )
    ap.add_argument("--no-check", action="store_true", help="skip the one-shot comparison with gloo's result")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed for one world")
    ap.add_argument("--json", default=None, help="write results to this JSON file")
    args = ap.parse_args(argv)

    ok, why = C.gfdit_importable()
    if not ok:
        print(f"gfdit is not importable ({why}); build it first (make build)", file=sys.stderr)
        return 2

    sizes = C.parse_sizes(args.sizes or (QUICK_SIZES if args.quick else DEFAULT_SIZES))
    worlds = C.parse_ints(args.ranks)
    ops = [o for o in args.ops.split(",") if o]
    for o in ops:
        if o not in OPS:
            ap.error(f"unknown op {o}; choose from {OPS}")
    kinds = [k for k in args.kinds.split(",") if k]
    target_s = (args.target_ms if args.target_ms is not None else (60.0 if args.quick else 500.0)) / 1000.0
    min_iters = args.min_iters if args.min_iters is not None else (5 if args.quick else 10)
    opts_common = {
        "sizes": sizes,
        "ops": ops,
        "kinds": kinds,
        "target_s": target_s,
        "min_iters": min_iters,
        "max_iters": args.max_iters,
        "warmup": args.warmup,
        "gloo_on_heap": args.gloo_on_heap,
        "check": not args.no_check,
    }

    env = C.environment()
    C.header("gfdit collectives vs gloo vs memcpy", env)
    t_start = time.monotonic()
    memcpy = measure_memcpy(sizes, target_s)
    C.print_table(
        "single-core memcpy (torch dst.copy_(src), 1 thread, parent process)",
        ["size", "time [us]", "GB/s"],
        [[C.fmt_size(s), C.fmt_us(m["median_s"]), C.fmt_gbps(m["bytes_per_s"])] for s, m in memcpy.items()],
    )

    records: list[dict[str, Any]] = []
    errors: dict[str, str] = {}
    for n in worlds:
        largest = max(sizes)
        per_size_heap = (
            (n + 1) * largest + 2 * largest + largest
        )  # all_gather (in+out), all_to_all, all_reduce
        opts = dict(opts_common, heap_bytes=int(per_size_heap * 1.25) + 64 * C.MIB)
        print(f"world of {n} ranks (heap {opts['heap_bytes'] // C.MIB} MiB per rank) ...", flush=True)
        t0 = time.monotonic()
        try:
            per_rank = C.run_ranks(rank_fn, n, opts, timeout_s=args.timeout)
            records += per_rank[0]
        except Exception as e:
            errors[f"world_size={n}"] = str(e)
            print(f"world of {n} FAILED: {e}", file=sys.stderr, flush=True)
        print(f"world of {n} ranks done in {time.monotonic() - t0:.0f} s", flush=True)

    rows, targets = build_rows(records, memcpy)
    headers = [
        "op",
        "n",
        "size/rank",
        "kind",
        "gfdit [us]",
        "gloo [us]",
        "x gloo",
        "target",
        "busbw GB/s",
        "memcpy GB/s",
        "busbw/memcpy",
        "target",
        "check",
        "meets",
    ]
    notes = [
        "time: max over ranks of each rank's median time per op; gloo runs on the same tensors in the same processes",
        "busbw (nccl-tests): all_gather n*S*(n-1)/n/t, all_to_all S*(n-1)/n/t, all_reduce 2(n-1)/n*S/t; "
        "S = per-rank message size",
        "memcpy: single-thread dst.copy_(src) of S bytes measured in this run (small S copies within the caches); "
        "kind heap = gfdit.empty tensors",
    ]
    table = C.print_table("gfdit collectives (float32)", headers, rows, notes)
    print(C.target_summary(targets), flush=True)
    if errors:
        print("errors: " + "; ".join(f"{k}: {v.splitlines()[-1] if v else v}" for k, v in errors.items()))
    print(f"total {time.monotonic() - t_start:.0f} s", flush=True)

    C.write_json(
        args.json,
        {
            "benchmark": "collectives",
            "environment": env,
            "config": dict(opts_common, worlds=worlds, quick=args.quick),
            "memcpy": {str(s): m for s, m in memcpy.items()},
            "records": records,
            "targets": [t.as_dict() for t in targets],
            "errors": errors,
            "table": table,
        },
    )
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
