#!/usr/bin/env python3
"""Group formation and the first collective on a fresh group: gfdit against torch.distributed (gloo).

In a world of 2 and of 4 ranks (processes), it measures:

  1. gfdit.new_group(ranks): local, no communication. Calls are timed in batches (a batch's time over its
     number of calls); the median over batches, max over ranks. Target: <= 10 us.
  2. torch.distributed.new_group(ranks, backend="gloo") with the same ranks, each call timed alone after a
     barrier; median over the calls, max over ranks. Target: gfdit is >= 1000x faster.
  3. First collective on a fresh group: every iteration forms a new gfdit group (the world's ranks in a
     different order each time) and times a small all_reduce on it; that median over the median of the
     same all_reduce repeated on one group. The two are interleaved, each after a barrier. Target: <= 2x.
     For reference the same ratio for gloo: the first all_reduce on each new torch group over the steady
     state of one group.

    python bench/bench_groups.py               # 2 and 4 ranks
    python bench/bench_groups.py --quick       # smoke test (< 60 s)
    python bench/bench_groups.py --json out.json
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402

TARGET_NEW_GROUP_S = 10e-6
TARGET_NEW_GROUP_SPEEDUP = 1000.0
TARGET_FIRST_OVER_STEADY = 2.0


def rank_fn(ctx: C.RankContext) -> dict[str, Any]:
    import gfdit
    import torch
    import torch.distributed as dist

    opts = ctx.options
    n = ctx.world_size
    world = list(range(n))
    out: dict[str, Any] = {"world_size": n}

    # 1. gfdit.new_group: batches of calls (perf_counter's own cost is amortised), and single calls.
    group_lists = {"world order": world, "reversed": world[::-1]}
    gf_new: dict[str, Any] = {}
    for name, ranks in group_lists.items():
        for _ in range(200):
            gfdit.new_group(ranks)
        batch = opts["batch"]
        per_call = []
        for _ in range(opts["batches"]):
            t0 = time.perf_counter_ns()
            for _ in range(batch):
                gfdit.new_group(ranks)
            per_call.append((time.perf_counter_ns() - t0) * 1e-9 / batch)
        single = []
        for _ in range(opts["batches"]):
            t0 = time.perf_counter_ns()
            gfdit.new_group(ranks)
            single.append((time.perf_counter_ns() - t0) * 1e-9)
        # cost of the timer itself, to read the single-call numbers
        timer = []
        for _ in range(opts["batches"]):
            t0 = time.perf_counter_ns()
            timer.append((time.perf_counter_ns() - t0) * 1e-9)
        med, med_single, med_timer = ctx.max_over_ranks(
            [C.median(per_call), C.median(single), C.median(timer)]
        )
        gf_new[name] = {
            "ranks": ranks,
            "median_s": med,
            "single_call_median_s": med_single,
            "timer_overhead_s": med_timer,
            "batches": opts["batches"],
            "batch": batch,
        }
    out["gfdit_new_group"] = gf_new

    # 2. torch.distributed.new_group (gloo), and the first all_reduce on each new group.
    x = torch.zeros(opts["msg_bytes"] // 4, dtype=torch.float32)
    torch_new, torch_first, pgs = [], [], []
    for _ in range(opts["torch_calls"]):
        dist.barrier()
        t0 = time.perf_counter_ns()
        pg = dist.new_group(world, backend="gloo")
        t1 = time.perf_counter_ns()
        dist.barrier()
        t2 = time.perf_counter_ns()
        dist.all_reduce(x, group=pg)
        t3 = time.perf_counter_ns()
        torch_new.append((t1 - t0) * 1e-9)
        torch_first.append((t3 - t2) * 1e-9)
        pgs.append(pg)
    steady_pg = pgs[-1]
    for _ in range(opts["warmup"]):
        dist.all_reduce(x, group=steady_pg)
    torch_steady = []
    for _ in range(opts["steady_iters"]):
        dist.barrier()
        t0 = time.perf_counter_ns()
        dist.all_reduce(x, group=steady_pg)
        torch_steady.append((time.perf_counter_ns() - t0) * 1e-9)
    for pg in pgs:
        try:
            dist.destroy_process_group(pg)
        except Exception:
            pass
    t_new, t_first, t_steady = ctx.max_over_ranks(
        [C.median(torch_new), C.median(torch_first), C.median(torch_steady)]
    )
    out["torch_new_group"] = {
        "ranks": world,
        "median_s": t_new,
        "calls": opts["torch_calls"],
        "per_rank_min_s": min(torch_new),
        "per_rank_max_s": max(torch_new),
    }
    out["torch_first_collective"] = {
        "first_median_s": t_first,
        "steady_median_s": t_steady,
        "ratio": t_first / t_steady,
    }

    # 3. gfdit: first all_reduce on a fresh group vs the same all_reduce on one group, interleaved.
    orders = list(itertools.permutations(world))
    steady_group = gfdit.new_group(world)
    for _ in range(opts["warmup"]):
        steady_group.all_reduce(x)
    first, form_and_first, steady = [], [], []
    for i in range(opts["fresh_iters"]):
        gfdit.barrier()
        t0 = time.perf_counter_ns()
        g = gfdit.new_group(list(orders[(i + 1) % len(orders)]))
        t1 = time.perf_counter_ns()
        g.all_reduce(x)
        t2 = time.perf_counter_ns()
        first.append((t2 - t1) * 1e-9)
        form_and_first.append((t2 - t0) * 1e-9)
        gfdit.barrier()
        t0 = time.perf_counter_ns()
        steady_group.all_reduce(x)
        steady.append((time.perf_counter_ns() - t0) * 1e-9)
    # steady state without a barrier in between, for reference
    gfdit.barrier()
    back_to_back = []
    for _ in range(opts["fresh_iters"]):
        t0 = time.perf_counter_ns()
        steady_group.all_reduce(x)
        back_to_back.append((time.perf_counter_ns() - t0) * 1e-9)
    f, ff, s, b = ctx.max_over_ranks(
        [C.median(first), C.median(form_and_first), C.median(steady), C.median(back_to_back)]
    )
    out["gfdit_first_collective"] = {
        "first_median_s": f,
        "form_and_first_median_s": ff,
        "steady_median_s": s,
        "back_to_back_median_s": b,
        "ratio": f / s,
        "iters": opts["fresh_iters"],
        "distinct_orders": len(orders),
        "msg_bytes": opts["msg_bytes"],
    }
    ctx.log(
        f"  n={n}: gfdit new_group {C.fmt_us(gf_new['world order']['median_s'])} us, torch new_group "
        f"{C.fmt_us(t_new)} us, gfdit first/steady {f / s:.2f}"
    )
    return out


def report(results: list[dict[str, Any]], msg_bytes: int) -> tuple[list[str], list[C.Target]]:
    tables, targets = [], []
    rows = []
    for r in results:
        n = r["world_size"]
        t_torch = r["torch_new_group"]["median_s"]
        for name, g in r["gfdit_new_group"].items():
            ratio = t_torch / g["median_s"]
            ok_t = g["median_s"] <= TARGET_NEW_GROUP_S
            ok_r = ratio >= TARGET_NEW_GROUP_SPEEDUP
            g["speedup_vs_torch"] = ratio
            rows.append(
                [
                    n,
                    str(g["ranks"]).replace(" ", ""),
                    name,
                    C.fmt_us(g["median_s"]),
                    C.fmt_us(g["single_call_median_s"]),
                    f"<= {TARGET_NEW_GROUP_S * 1e6:.0f}",
                    C.verdict(ok_t),
                    C.fmt_us(t_torch),
                    C.fmt_ratio(ratio),
                    f">= {TARGET_NEW_GROUP_SPEEDUP:,.0f}x",
                    C.verdict(ok_r),
                ]
            )
            targets.append(
                C.Target(
                    f"n={n} gfdit.new_group {name}: median time [s]",
                    g["median_s"],
                    f"<= {TARGET_NEW_GROUP_S * 1e6:.0f} us",
                    ok_t,
                )
            )
            targets.append(
                C.Target(
                    f"n={n} gfdit.new_group {name}: speedup vs torch new_group",
                    ratio,
                    f">= {TARGET_NEW_GROUP_SPEEDUP:.0f}x",
                    ok_r,
                )
            )
    tables.append(
        C.print_table(
            "Group formation: gfdit.new_group vs torch.distributed.new_group (gloo), same ranks",
            [
                "world",
                "ranks",
                "order",
                "gfdit [us]",
                "1 call [us]",
                "target",
                "meets",
                "torch [us]",
                "x torch",
                "target",
                "meets",
            ],
            rows,
            [
                "gfdit: median over batches of calls (per call); '1 call' timed alone, timer overhead included",
                "torch: median over single new_group calls; both max over ranks",
            ],
        )
    )

    rows = []
    for r in results:
        n = r["world_size"]
        g = r["gfdit_first_collective"]
        t = r["torch_first_collective"]
        ok = g["ratio"] <= TARGET_FIRST_OVER_STEADY
        rows.append(
            [
                n,
                "gfdit",
                C.fmt_us(g["first_median_s"]),
                C.fmt_us(g["form_and_first_median_s"]),
                C.fmt_us(g["steady_median_s"]),
                C.fmt_us(g["back_to_back_median_s"]),
                C.fmt_ratio(g["ratio"]),
                f"<= {TARGET_FIRST_OVER_STEADY:.0f}x",
                C.verdict(ok),
            ]
        )
        rows.append(
            [
                n,
                "gloo (baseline)",
                C.fmt_us(t["first_median_s"]),
                "-",
                C.fmt_us(t["steady_median_s"]),
                "-",
                C.fmt_ratio(t["ratio"]),
                "-",
                "-",
            ]
        )
        targets.append(
            C.Target(
                f"n={n} gfdit first all_reduce on a fresh group / steady",
                g["ratio"],
                f"<= {TARGET_FIRST_OVER_STEADY:.0f}x",
                ok,
            )
        )
    tables.append(
        C.print_table(
            f"First collective on a fresh group: all_reduce of {C.fmt_size(msg_bytes)} float32, new group every iteration",
            [
                "world",
                "library",
                "first [us]",
                "form+first [us]",
                "steady [us]",
                "no barrier [us]",
                "first/steady",
                "target",
                "meets",
            ],
            rows,
            [
                "each timed op follows a barrier; medians, max over ranks; gfdit fresh groups cycle through the orders of "
                "the world's ranks",
                "'no barrier': the same all_reduce repeated back to back on one group",
            ],
        )
    )
    return tables, targets


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="2,4", help="world sizes, comma separated (default 2,4)")
    ap.add_argument("--quick", action="store_true", help="smoke test: fewer calls")
    ap.add_argument(
        "--torch-calls", type=int, default=None, help="torch new_group calls (default 15, quick 5)"
    )
    ap.add_argument(
        "--fresh-iters", type=int, default=None, help="fresh-group iterations (default 300, quick 50)"
    )
    ap.add_argument("--msg-bytes", type=C.parse_size, default=4 * C.KIB, help="all_reduce size (default 4K)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds allowed for one world")
    ap.add_argument("--json", default=None, help="write results to this JSON file")
    args = ap.parse_args(argv)

    ok, why = C.gfdit_importable()
    if not ok:
        print(f"gfdit is not importable ({why}); build it first (make build)", file=sys.stderr)
        return 2

    opts = {
        "batch": 1000,
        "batches": 30 if args.quick else 101,
        "torch_calls": args.torch_calls or (5 if args.quick else 15),
        "fresh_iters": args.fresh_iters or (50 if args.quick else 300),
        "steady_iters": 50 if args.quick else 200,
        "warmup": 5,
        "msg_bytes": args.msg_bytes,
        "heap_bytes": 16 * C.MIB,
    }
    env = C.environment()
    C.header("gfdit group formation", env)
    t_start = time.monotonic()
    results, errors = [], {}
    for n in C.parse_ints(args.ranks):
        try:
            results.append(C.run_ranks(rank_fn, n, opts, timeout_s=args.timeout)[0])
        except Exception as e:
            errors[f"world_size={n}"] = str(e)
            print(f"world of {n} FAILED: {e}", file=sys.stderr, flush=True)
    tables, targets = report(results, args.msg_bytes) if results else ([], [])
    print(C.target_summary(targets), flush=True)
    if errors:
        print("errors: " + "; ".join(f"{k}: {v.splitlines()[-1] if v else v}" for k, v in errors.items()))
    print(f"total {time.monotonic() - t_start:.0f} s", flush=True)
    C.write_json(
        args.json,
        {
            "benchmark": "groups",
            "environment": env,
            "config": dict(opts, quick=args.quick),
            "results": results,
            "targets": [t.as_dict() for t in targets],
            "errors": errors,
            "tables": tables,
        },
    )
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
