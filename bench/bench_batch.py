#!/usr/bin/env python3
"""Batches in the engine: four tiny Qwen-Image requests of 64x64 on one rank, batched by the policy against
run one after another, end to end (encode, steps, decode; the engine, its worker and the rings included).

Two engines of one worker each, with the same analytic CPU cost model and the same four requests (different
prompts, so different text lengths, seeds and guidance scales; default steps), submitted at once:

  * S: ``fcfs:batch=1``: the requests run one after another (each step one transformer forward per pass);
  * B: ``fcfs``: the policy batches them (NOTE [planning], 3b; NOTE [batches] in src/runtime/control.cpp).

Both engines are started once; the four requests then run in rounds that alternate S and B. A round's time is
from the first submit to the last result; the table shows the medians and the throughput ratio S / B (> 1x:
batching is faster). |B-S| is the largest difference of the images on [0, 1] pixels, and "batched" the share
of denoise tasks in B that stepped more than one request.

    python bench/bench_batch.py            # about a minute on 2 quiet cores
    python bench/bench_batch.py --quick    # fewer rounds
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402

MODEL = "tiny-qwen-image"
SIZE = (64, 64)
NUM_REQUESTS = 4
TARGET_RATIO = 1.5  # S / B


def _requests() -> list[Any]:
    from gfdit import Request

    prompts = [
        "a lighthouse at dusk",
        "two cats",
        "a very long and winding mountain road in the rain at night",
        "x",
    ]
    return [
        Request(prompt=p, seed=1 + i, guidance_scale=3.0 + i, height=SIZE[0], width=SIZE[1])
        for i, p in enumerate(prompts[:NUM_REQUESTS])
    ]


def _round(engine: Any) -> tuple[float, list[Any]]:
    reqs = _requests()
    t0 = time.perf_counter()
    handles = [engine.submit(r) for r in reqs]
    results = [h.result(timeout=300) for h in handles]
    return time.perf_counter() - t0, results


def run(rounds: int) -> dict[str, Any]:
    from gfdit import Engine
    from gfdit.planning import cost

    cm = cost.cost_model(MODEL, "cpu")
    times: dict[str, list[float]] = {"S": [], "B": []}
    tasks = {"S": [0, 0], "B": [0, 0]}  # (denoise tasks, of them batched)
    diff = 0.0
    with (
        Engine(model=MODEL, world_size=1, policy="fcfs:batch=1", cost_model=cm) as s_eng,
        Engine(model=MODEL, world_size=1, policy="fcfs", cost_model=cm) as b_eng,
    ):
        engines = {"S": s_eng, "B": b_eng}
        for name, eng in engines.items():
            _round(eng)  # warm-up: not counted
        for _ in range(rounds):
            outs = {}
            for name, eng in engines.items():
                dt, results = _round(eng)
                times[name].append(dt)
                outs[name] = [r.output for r in results]
                for r in results:
                    for s in r.timeline:
                        if s.kind == "denoise":
                            tasks[name][0] += 1
                            tasks[name][1] += s.batch > 1
            diff = max(
                diff, max(float((b - s).abs().max()) for b, s in zip(outs["B"], outs["S"], strict=True))
            )
    return {
        "model": MODEL,
        "size": list(SIZE),
        "requests": NUM_REQUESTS,
        "rounds": rounds,
        "s_times": times["S"],
        "b_times": times["B"],
        "s_median_s": statistics.median(times["S"]),
        "b_median_s": statistics.median(times["B"]),
        "batched_share": tasks["B"][1] / max(1, tasks["B"][0]),
        "max_diff": diff,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer rounds")
    ap.add_argument(
        "--json",
        default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "batch.json"),
        help="JSON output (default %(default)s)",
    )
    args = ap.parse_args(argv)
    ok, why = C.gfdit_importable()
    if not ok:
        print(f"gfdit is not importable ({why}); build it first (make build)", file=sys.stderr)
        return 2
    env = C.environment()
    C.header("gfdit batches in the engine vs one request after another", env)
    t_start = time.monotonic()
    r = run(3 if args.quick else 9)
    ratio = r["s_median_s"] / r["b_median_s"]
    table = C.print_table(
        f"{NUM_REQUESTS} requests of {MODEL} {SIZE[0]}x{SIZE[1]} on one rank, end to end",
        ["S (batch=1)", "B (batched)", "S/B", "batched tasks", "|B-S|", "rounds"],
        [
            [
                f"{r['s_median_s'] * 1e3:.0f} ms",
                f"{r['b_median_s'] * 1e3:.0f} ms",
                C.fmt_ratio(ratio),
                C.fmt_pct(r["batched_share"]),
                f"{r['max_diff']:.0e}",
                r["rounds"],
            ]
        ],
        [f"median time of a round (first submit to last result); target S/B >= {TARGET_RATIO:g}x"],
    )
    targets = [
        C.Target(
            f"{MODEL} {NUM_REQUESTS}x{SIZE[0]}x{SIZE[1]} on one rank: batched vs one after another (S / B)",
            ratio,
            f">= {TARGET_RATIO:g}x",
            ratio >= TARGET_RATIO,
        )
    ]
    print(C.target_summary(targets), flush=True)
    print(f"total {time.monotonic() - t_start:.0f} s", flush=True)
    C.write_json(
        args.json,
        {
            "benchmark": "batch",
            "environment": env,
            "config": {"quick": args.quick},
            "record": r,
            "targets": [t.as_dict() for t in targets],
            "tables": [table],
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
