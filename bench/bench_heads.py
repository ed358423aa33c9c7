#!/usr/bin/env python3
"""Uneven heads against even degrees, and the attention plan cache off against on, in one run each.

(a) Uneven heads. Tiny Wan and tiny Qwen-Image transformers (diffusers' classes, seeded weights, 6 heads
    of 64 channels, two blocks) at 1k, 2k, 4k and 8k image/video tokens, in one world of 4 processes:

      * U4 uneven: Ulysses 4 over all four ranks, 6 heads split 2, 2, 1, 1 (what this change allows);
      * U2xR2: the same four ranks with an even Ulysses split (3 heads each) and a ring of 2;
      * U3: Ulysses 3 on ranks 0-2 (2 heads each; rank 3 idles), the nearest degree that divides 6;
      * U2: Ulysses 2 on ranks 0-1 (3 heads each).

    Each repetition runs the four layouts in turn, each after a world barrier (ranks outside a layout's
    group wait in the next barrier); a layout's time is the max over its members, the table shows the
    median over repetitions and speedup = T(layout) / T(U4 uneven) (> 1x: the uneven degree is faster).
    |diff| is the largest difference between a layout's output and U2's (the same model and inputs).
    On a 2-core machine, degree 3 and 4 share the cores: the ratios then show oversubscription more than
    the algorithm; the load average is printed.

(b) The plan cache. gfdit.attention at 1k tokens (B=1, H=8, D=64, float32), world 2, Ulysses, Ring and
    Torus, with seq_splits: plan cache on (the metadata all_gather runs once per plan) against off (it
    runs on every call, as before), alternating in one run; the same with the local attention removed
    (comm only, where the exchange is a larger share); and the collectives of one tiny-Wan forward.

    python bench/bench_heads.py              # about 3-4 minutes on 2 cores
    python bench/bench_heads.py --quick      # 1k and 2k tokens, fewer repetitions, under a minute
    python bench/bench_heads.py --tokens 2k,8k --models wan --json out.json
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
from bench_attention import comm_only, fmt_ms, fmt_tokens, parse_tokens  # noqa: E402

DEFAULT_TOKENS = "1k,2k,4k,8k"
QUICK_TOKENS = "1k,2k"
HEADS = 6
WORLD = 4
WAN_OVERRIDES = dict(num_attention_heads=HEADS, attention_head_dim=64, ffn_dim=1024, num_layers=2)
QWEN_OVERRIDES = dict(
    num_attention_heads=HEADS, attention_head_dim=64, axes_dims_rope=(16, 24, 24), num_layers=2
)
# (name, members, spec kwargs): the uneven layout first, then its even neighbours.
LAYOUTS = (
    ("U4 uneven", [0, 1, 2, 3], dict(ulysses=4, ring=1)),
    ("U2xR2", [0, 1, 2, 3], dict(ulysses=2, ring=2, placement="ulysses-low")),
    ("U3", [0, 1, 2], dict(ulysses=3, ring=1)),
    ("U2", [0, 1], dict(ulysses=2, ring=1)),
)
CHECK_TOL = 1e-3  # largest |layout - U2| of the outputs (float32, relative to outputs of order 1)


def timed(
    ctx: C.RankContext, runs: list[tuple[str, list[int], Callable[[], Any]]], reps: int, warmup: int
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Warm-up, then `reps` rounds of every run in turn, each after a world barrier; a run's time is the
    max over its members. Returns ({name: {"median_s", "times_s", "reps"}}, {name: warm-up output})."""
    import gfdit

    outs: dict[str, Any] = {}
    for _ in range(warmup):
        for name, members, fn in runs:
            gfdit.barrier()
            if ctx.rank in members:
                outs[name] = fn()
    times = {name: [0.0] * reps for name, _, _ in runs}
    for i in range(reps):
        for name, members, fn in runs:
            gfdit.barrier()
            if ctx.rank in members:
                t0 = time.perf_counter_ns()
                fn()
                times[name][i] = (time.perf_counter_ns() - t0) * 1e-9
    res = {}
    for name, _, _ in runs:
        per_rank = ctx.gather_over_ranks(times[name])
        worst = [max(r[i] for r in per_rank) for i in range(reps)]
        res[name] = {"median_s": C.median(worst), "times_s": worst, "reps": reps}
    return res, outs


# ----------------------------------------------------------------------------------------------------------
# (a) uneven heads, inside a rank of the 4-process world


def _model_and_inputs(model: str, tokens: int):
    from gfdit.models import tiny

    if model == "wan":
        m = tiny.tiny_wan(0, **WAN_OVERRIDES)
        frames = max(1, tokens // 1024)  # patch 1x2x2: frames x 32 x 32 tokens
        return m, tiny.wan_inputs(m, 1, frames=frames, height=64, width=64)
    m = tiny.tiny_qwen_image(0, **QWEN_OVERRIDES)
    return m, tiny.qwen_image_inputs(m, 1, height=32, width=max(1, tokens // 32))


def heads_fn(ctx: C.RankContext) -> list[dict[str, Any]]:
    import gfdit
    import torch
    from gfdit.models import parallelize

    opts = ctx.options
    groups = {tuple(m): gfdit.new_group(m) for _, m, _ in LAYOUTS}
    records = []
    for model_name in opts["models"]:
        for tokens in opts["tokens"]:
            model, inputs = _model_and_inputs(model_name, tokens)
            par = parallelize(model)
            runs = []
            for name, members, kw in LAYOUTS:
                spec = gfdit.ParallelSpec(mode="usp", **kw)
                group = groups[tuple(members)]

                def fn(spec=spec, group=group):
                    with torch.no_grad():
                        return par(**inputs, group=group, spec=spec)[0]

                runs.append((name, members, fn))
            res, outs = timed(ctx, runs, opts["reps"], opts["warmup"])
            diffs = {}
            if ctx.rank == 0:  # rank 0 is in every layout
                base = outs["U2"]
                diffs = {name: float((outs[name] - base).abs().max()) for name, _, _ in LAYOUTS}
            real_tokens = int(inputs["hidden_states"].shape[1]) if model_name == "qwen" else tokens
            records.append({"model": model_name, "tokens": real_tokens, "times": res, "diff_vs_U2": diffs})
            ctx.log(
                f"  {model_name} {fmt_tokens(real_tokens)}: "
                + ", ".join(f"{name} {fmt_ms(res[name]['median_s'])} ms" for name, _, _ in LAYOUTS)
            )
            model = par = inputs = outs = None
    return records


# ----------------------------------------------------------------------------------------------------------
# (b) the plan cache, inside a rank of the 2-process world


def cache_fn(ctx: C.RankContext) -> dict[str, Any]:
    import gfdit
    import torch
    from gfdit.attention import core
    from gfdit.models import parallelize, tiny

    opts = ctx.options
    n = ctx.world_size
    tokens = opts["cache_tokens"]
    s_local = tokens // n
    g = torch.Generator().manual_seed(7 + ctx.rank)
    q, k, v = (torch.randn(1, s_local, 8, 64, generator=g) for _ in range(3))
    world = gfdit.get_world()
    records = []
    for mode, kw in (
        ("ulysses", dict(ulysses=n, ring=1)),
        ("ring", dict(ulysses=1, ring=n)),
        ("torus", dict(ulysses=n, ring=1, mode="torus")),
    ):
        spec = gfdit.ParallelSpec(**kw)

        def call(cache: bool, spec=spec) -> Any:
            core.PLAN_CACHE = cache  # set alike on both ranks, between calls
            return gfdit.attention.attention(q, k, v, spec=spec, seq_splits=[s_local] * n)

        gathers = {}
        for cache in (False, True):
            call(cache)
            before = world.stats().all_gathers
            call(cache)
            gathers[cache] = world.stats().all_gathers - before
        runs = [("off", [0, 1], lambda: call(False)), ("on", [0, 1], lambda: call(True))]
        layer, _ = timed(ctx, runs, opts["cache_reps"], 1)
        with comm_only():
            comm, _ = timed(ctx, runs, opts["cache_reps"], 1)
        records.append(
            {
                "mode": mode,
                "tokens": tokens,
                "layer": layer,
                "comm": comm,
                "all_gathers_per_call": {"off": gathers[False], "on": gathers[True]},
            }
        )
        ctx.log(
            f"  {mode} {fmt_tokens(tokens)}: layer off {fmt_ms(layer['off']['median_s'])} ms, on "
            f"{fmt_ms(layer['on']['median_s'])} ms; comm off {fmt_ms(comm['off']['median_s'])} ms, on "
            f"{fmt_ms(comm['on']['median_s'])} ms"
        )
    core.PLAN_CACHE = True
    # The metadata exchange alone: the all_gather of one record per member that the cache saves.
    rec = torch.zeros(core._META_LEN, dtype=torch.int64)
    out = torch.empty(n * core._META_LEN, dtype=torch.int64)
    exchange, _ = timed(
        ctx, [("exchange", [0, 1], lambda: world.all_gather_into_tensor(out, rec))], opts["cache_reps"] * 5, 3
    )
    # Collectives of one tiny-Wan forward (2 blocks) with the cache off and on.
    model = tiny.tiny_wan(0, **WAN_OVERRIDES)
    inputs = tiny.wan_inputs(model, 1, frames=1, height=32, width=32)
    par = parallelize(model)
    wan = {}
    for cache in (False, True):
        core.PLAN_CACHE = cache
        with torch.no_grad():
            par(**inputs)
            st0 = world.stats()
            par(**inputs)
            st1 = world.stats()
        wan["on" if cache else "off"] = {
            "collectives": st1.collectives - st0.collectives,
            "all_gathers": st1.all_gathers - st0.all_gathers,
        }
    core.PLAN_CACHE = True
    return {
        "records": records,
        "exchange": exchange["exchange"],
        "exchange_bytes": 8 * core._META_LEN,
        "wan_forward": wan,
        "blocks": WAN_OVERRIDES["num_layers"],
    }


# ----------------------------------------------------------------------------------------------------------
# report


def report(
    heads: list[dict[str, Any]], cache: dict[str, Any], opts: dict[str, Any]
) -> tuple[list[str], list[C.Target]]:
    tables, targets = [], []
    if heads:
        rows = []
        for rec in heads:
            t = {name: rec["times"][name]["median_s"] for name, _, _ in LAYOUTS}
            u4 = t["U4 uneven"]
            worst = max(rec["diff_vs_U2"].values()) if rec["diff_vs_U2"] else float("nan")
            ok = worst <= CHECK_TOL
            rec["speedup_of_uneven"] = {name: t[name] / u4 for name in t}
            targets.append(
                C.Target(
                    f"uneven heads {rec['model']} {fmt_tokens(rec['tokens'])}: outputs equal the even layouts'",
                    worst,
                    f"<= {CHECK_TOL:g}",
                    ok,
                )
            )
            rows.append(
                [rec["model"], fmt_tokens(rec["tokens"])]
                + [fmt_ms(t[name]) for name, _, _ in LAYOUTS]
                + [C.fmt_ratio(t[name] / u4) for name in ("U2xR2", "U3", "U2")]
                + [f"{worst:.0e}" + ("" if ok else " FAIL")]
            )
        tables.append(
            C.print_table(
                f"Uneven heads: {HEADS} heads at Ulysses 4 against even degrees (world {WORLD})",
                ["model", "tokens"]
                + [name for name, _, _ in LAYOUTS]
                + ["U2xR2/U4", "U3/U4", "U2/U4", "|diff|"],
                rows,
                [
                    f"times in ms of one transformer forward (2 blocks, {HEADS} heads x 64, float32), median of "
                    f"{opts['reps']} repetitions of the max over the layout's ranks",
                    "U4 uneven: Ulysses 4, heads 2,2,1,1; U2xR2: Ulysses 2 x Ring 2 on the same 4 ranks, 3 heads "
                    "each; U3: Ulysses 3 on 3 ranks; U2: Ulysses 2 on 2 ranks",
                    "X/U4 = T(X) / T(U4 uneven): above 1x the uneven degree is faster; |diff| = max |output - "
                    "U2's| over layouts",
                    f"one process per rank, one thread each, on {os.cpu_count()} cpus: degrees above the cpu "
                    "count share cores",
                ],
            )
        )
    if cache:
        rows = []
        for rec in cache["records"]:
            lo, ln = rec["layer"]["off"]["median_s"], rec["layer"]["on"]["median_s"]
            co, cn = rec["comm"]["off"]["median_s"], rec["comm"]["on"]["median_s"]
            ag = rec["all_gathers_per_call"]
            # Paired: the median of off_i / on_i over repetitions i (neighbours in time share the load).
            lp = C.median(
                [a / b for a, b in zip(rec["layer"]["off"]["times_s"], rec["layer"]["on"]["times_s"])]
            )
            cp = C.median(
                [a / b for a, b in zip(rec["comm"]["off"]["times_s"], rec["comm"]["on"]["times_s"])]
            )
            rec.update({"layer_ratio": lo / ln, "comm_ratio": co / cn, "layer_paired": lp, "comm_paired": cp})
            exchange_gone = ag["off"] - ag["on"] == 1
            targets.append(
                C.Target(
                    f"plan cache {rec['mode']}: one all_gather fewer per call",
                    ag["off"] - ag["on"],
                    "== 1",
                    exchange_gone,
                )
            )
            rows.append(
                [
                    rec["mode"],
                    fmt_tokens(rec["tokens"]),
                    f"{ag['off']} / {ag['on']}",
                    fmt_ms(lo),
                    fmt_ms(ln),
                    C.fmt_ratio(lo / ln),
                    C.fmt_ratio(lp),
                    fmt_ms(co),
                    fmt_ms(cn),
                    C.fmt_ratio(co / cn),
                    C.fmt_ratio(cp),
                ]
            )
        wan = cache["wan_forward"]
        tables.append(
            C.print_table(
                "Attention plan cache: off (metadata all_gather per call) vs on (once per plan), world 2",
                [
                    "mode",
                    "tokens",
                    "all_gathers off/on",
                    "layer off",
                    "layer on",
                    "off/on",
                    "paired",
                    "comm off",
                    "comm on",
                    "off/on",
                    "paired",
                ],
                rows,
                [
                    f"times in ms, median of {opts['cache_reps']} alternating repetitions of the max over 2 ranks; "
                    "B=1, H=8, D=64, float32, seq_splits given; off/on > 1x: the cache is faster",
                    "paired = median over repetitions of off_i / on_i; comm: the same call with the local attention "
                    "patched out (PartialMerger.add_block); Torus keeps its own per-call all_gather (workspace "
                    "offsets, its start barrier)",
                    f"the metadata exchange alone (all_gather of {cache['exchange_bytes']} bytes per member): "
                    f"{C.fmt_us(cache['exchange']['median_s'])} us; a hit also skips the records' validation and the "
                    "plan's construction in Python",
                    f"tiny Wan forward ({cache['blocks']} blocks, 1k tokens, world 2): collectives off "
                    f"{wan['off']['collectives']} (all_gathers {wan['off']['all_gathers']}), on "
                    f"{wan['on']['collectives']} (all_gathers {wan['on']['all_gathers']})",
                ],
            )
        )
    return tables, targets


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=f"tokens {QUICK_TOKENS}, fewer repetitions")
    ap.add_argument("--tokens", default=None, help=f"token counts of (a) (default {DEFAULT_TOKENS})")
    ap.add_argument("--models", default="wan,qwen", help="comma separated: wan,qwen")
    ap.add_argument("--reps", type=int, default=None, help="repetitions of (a) (default 3, quick 2)")
    ap.add_argument("--cache-reps", type=int, default=None, help="repetitions of (b) (default 41, quick 11)")
    ap.add_argument("--skip", default="", help="comma separated: heads,cache")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds allowed for one world")
    ap.add_argument(
        "--json",
        default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "heads.json"),
        help="JSON output (default %(default)s)",
    )
    args = ap.parse_args(argv)
    ok, why = C.gfdit_importable()
    if not ok:
        print(f"gfdit is not importable ({why}); build it first (make build)", file=sys.stderr)
        return 2
    models = [m for m in args.models.split(",") if m]
    for m in models:
        if m not in ("wan", "qwen"):
            ap.error(f"unknown model {m}")
    tokens = parse_tokens(args.tokens or (QUICK_TOKENS if args.quick else DEFAULT_TOKENS))
    for t in tokens:
        if t % 1024:
            ap.error(f"{t} tokens: use multiples of 1k")
    skip = {s for s in args.skip.split(",") if s}
    opts = {
        "tokens": tokens,
        "models": models,
        "reps": args.reps or (2 if args.quick else 3),
        "warmup": 1,
        "cache_tokens": 1024,
        "cache_reps": args.cache_reps or (11 if args.quick else 41),
        "heap_bytes": 256 * C.MIB,
    }
    env = C.environment()
    C.header("gfdit uneven heads and the attention plan cache", env)
    t_start = time.monotonic()
    errors: dict[str, str] = {}
    heads: list[dict[str, Any]] = []
    cache: dict[str, Any] = {}
    if "heads" not in skip:
        print(f"(a) uneven heads: world of {WORLD} processes ...", flush=True)
        try:
            heads = C.run_ranks(heads_fn, WORLD, opts, timeout_s=args.timeout)[0]
        except Exception as e:
            errors["heads"] = str(e)
            print(f"(a) FAILED: {e}", file=sys.stderr, flush=True)
    if "cache" not in skip:
        print("(b) plan cache: world of 2 processes ...", flush=True)
        try:
            cache = C.run_ranks(cache_fn, 2, opts, timeout_s=args.timeout)[0]
        except Exception as e:
            errors["cache"] = str(e)
            print(f"(b) FAILED: {e}", file=sys.stderr, flush=True)
    tables, targets = report(heads, cache, opts)
    for t in targets:
        print(f"{C.verdict(t.met)}  {t.name}: {t.value:.3g} (target {t.target})")
    print(C.target_summary(targets), flush=True)
    if errors:
        print("errors: " + "; ".join(f"{k}: {v.splitlines()[-1] if v else v}" for k, v in errors.items()))
    load_end = [round(x, 2) for x in os.getloadavg()]
    print(
        f"total {time.monotonic() - t_start:.0f} s; load average at the start {env.get('loadavg_1_5_15')}, at the "
        f"end {load_end} on {env.get('cpu_count')} cpus (above ~1 per cpu, other processes shared the cores)",
        flush=True,
    )
    C.write_json(
        args.json,
        {
            "benchmark": "heads",
            "environment": env,
            "loadavg_end_1_5_15": load_end,
            "config": dict(opts, quick=args.quick, wan=WAN_OVERRIDES, qwen=QWEN_OVERRIDES),
            "uneven_heads": heads,
            "plan_cache": cache,
            "targets": [t.as_dict() for t in targets],
            "errors": errors,
            "tables": tables,
        },
    )
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
