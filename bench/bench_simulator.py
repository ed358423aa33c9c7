"""Simulator speed: the control plane and a built-in policy on a simulated h20x8 with the analytic cost model.

A 10,000-request trace of Qwen-Image (1024x1024, 50 steps, Poisson arrivals at `--load` times the cluster's
capacity at one rank per request: 0.9 by default; at 3 the queue grows to thousands) is replayed under each
built-in policy. Targets: at least 200,000 tasks per second with a built-in policy, and the whole trace in
under 10 s.

    python bench/bench_simulator.py [--quick] [--load 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _common as C  # noqa: E402
from gfdit._C import cost as cost_c  # noqa: E402
from gfdit._C import runtime as rt  # noqa: E402
from gfdit.planning import cost  # noqa: E402


def trace(n: int, rate: float, seed: int = 0) -> list:
    rng = random.Random(seed)
    t = 0.0
    out = []
    for i in range(n):
        t += rng.expovariate(rate)
        out.append(rt.SimRequest(id=i, arrival_s=t, height=1024, width=1024, num_frames=1, num_steps=50))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--requests", type=int, default=10000)
    ap.add_argument("--load", type=float, default=0.9, help="arrival rate / the cluster's capacity")
    ap.add_argument("--json", default="bench/results/simulator.json")
    args = ap.parse_args()
    n = 2000 if args.quick else args.requests
    cluster = cost_c.cluster("h20x8")
    model = cost.cost_model("qwen-image", "h20x8")
    one = model.seconds(cost_c.Stage.DENOISE, 1024, 1024, 1, guidance_scale=4.0)
    capacity = 8 / (50 * one)  # requests per second the cluster sustains at degree 1
    arrival_rps = args.load * capacity
    reqs = trace(n, arrival_rps)
    rows, results, targets = [], {}, []
    for policy in ("fcfs", "srtf", "edf", "priority", "static:1", "static:2", "static:4", "static:8"):
        sim = rt.Simulator(model, cluster, policy)
        t0 = time.perf_counter()
        res = sim.run(reqs)
        wall = time.perf_counter() - t0
        done = [o for o in res.requests if o.state == "DONE"]
        lat = sorted(o.finish_s - o.arrival_s for o in done)
        rate = res.num_tasks / wall
        results[policy] = {
            "requests": n,
            "load": args.load,
            "tasks": res.num_tasks,
            "wall_s": wall,
            "tasks_per_s": rate,
            "mean_latency_s": sum(lat) / len(lat),
            "completed": len(done),
        }
        rows.append([policy, n, res.num_tasks, f"{wall:.2f}", f"{rate:,.0f}", f"{sum(lat) / len(lat):.1f}"])
        targets.append(C.Target(f"simulator {policy}: tasks/s", rate, ">= 200000", rate >= 200000))
        if n >= 10000:
            targets.append(C.Target(f"simulator {policy}: 10k requests wall [s]", wall, "< 10 s", wall < 10))
    C.print_table(
        f"Simulator: {n} Qwen-Image requests (1024 px, 50 steps) on h20x8 at {arrival_rps:.3f} req/s ({args.load:g}x)",
        ["policy", "requests", "tasks", "wall s", "tasks/s", "mean latency s"],
        rows,
    )
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"results": results, "targets": [t.__dict__ for t in targets]}, f, indent=2)
    print(C.target_summary(targets))
    return 0


if __name__ == "__main__":
    sys.exit(main())
