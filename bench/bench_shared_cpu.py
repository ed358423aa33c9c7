#!/usr/bin/env python3
"""A two-rank denoise step on a shared CPU: the same step with the cores idle and busy, same run.

An engine of two workers (tiny-wan, policy static:2: every step runs on both ranks, which meet in the
attention's collectives) runs blocks of requests, alternately with the cores left to it ("idle") and with
extra processes spinning in a loop ("busy", one per usable core by default). Each denoise task's
time per step is one sample; the table shows each condition's median and p90 and the ratio of the medians.

Target (issue: collectives on a shared CPU): busy / idle at most 1.5 on 2 cores. The collectives' waits
adapt to the host's load (NOTE [adaptive spin]); GFDIT_SPIN_US / GFDIT_YIELD_US fix them, to compare.
"Idle" is only as idle as the machine: the 1-minute load average is printed before and after.

    python bench/bench_shared_cpu.py                  # 4 rounds of 3 requests x 8 steps per condition
    python bench/bench_shared_cpu.py --rounds 8 --hogs 2 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from gfdit import Engine, Request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

TARGET_RATIO = 1.5
# a process that keeps a core busy until its parent is gone (so a killed benchmark leaves none behind)
HOG = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    pass"


def load1() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def step_times(eng: Engine, requests: int, steps: int, seed: int) -> list[float]:
    """Seconds per step of every two-rank denoise task of `requests` requests run one after another."""
    out = []
    for k in range(requests):
        req = Request(prompt=f"shared cpu {seed + k}", seed=seed + k, num_inference_steps=steps)
        res = eng.submit(req).result(timeout=600)
        out += [
            (s.end_ns - s.start_ns) / 1e9 / s.num_steps
            for s in res.timeline
            if s.kind == "denoise" and len(s.ranks) == 2
        ]
    return out


def run(rounds: int, requests: int, steps: int, hogs: int) -> dict:
    samples: dict[str, list[float]] = {"idle": [], "busy": []}
    load_before = load1()
    with Engine(model="tiny-wan", world_size=2, policy="static:2") as eng:
        step_times(eng, 2, steps, 0)  # warm up
        for r in range(rounds):
            samples["idle"] += step_times(eng, requests, steps, 1000 * r)
            spinners = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(hogs)]
            try:
                time.sleep(0.2)  # the spinners are running
                samples["busy"] += step_times(eng, requests, steps, 1000 * r + 500)
            finally:
                for p in spinners:
                    p.kill()
                for p in spinners:
                    p.wait()
    stats = {
        k: {"median_ms": C.median(v) * 1e3, "p90_ms": C.percentile(v, 90) * 1e3, "samples": len(v)}
        for k, v in samples.items()
    }
    return {
        "hogs": hogs,
        "rounds": rounds,
        "requests_per_round": requests,
        "steps": steps,
        "load1_before": load_before,
        "load1_after": load1(),
        "spin_us": os.environ.get("GFDIT_SPIN_US"),
        "yield_us": os.environ.get("GFDIT_YIELD_US"),
        "conditions": stats,
        "ratio": stats["busy"]["median_ms"] / stats["idle"]["median_ms"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=4, help="idle/busy rounds (default 4)")
    ap.add_argument("--requests", type=int, default=3, help="requests per condition and round (default 3)")
    ap.add_argument("--steps", type=int, default=8, help="denoising steps per request (default 8)")
    ap.add_argument(
        "--hogs", type=int, default=len(os.sched_getaffinity(0)), help="spinning processes when busy"
    )
    ap.add_argument("--json", default=None, help="write results to this JSON file")
    args = ap.parse_args()
    res = run(args.rounds, args.requests, args.steps, args.hogs)
    print(f"== two-rank tiny-wan step, idle vs {res['hogs']} spinning processes (static:2) ==")
    print(f"{'condition':<9}  {'median [ms]':>11}  {'p90 [ms]':>8}  {'samples':>7}")
    for k, v in res["conditions"].items():
        print(f"{k:<9}  {v['median_ms']:>11.2f}  {v['p90_ms']:>8.2f}  {v['samples']:>7}")
    meets = "meets" if res["ratio"] <= TARGET_RATIO else "MISS"
    print(f"busy / idle: {res['ratio']:.2f} (target <= {TARGET_RATIO}): {meets}")
    print(f"load average (1 min): {res['load1_before']:.2f} before, {res['load1_after']:.2f} after")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
