"""Fidelity: the same trace and policy on the real engine and in the simulator with the profiled cost model.

Profiles tiny-wan on this machine (`gfdit profile`, the trace's shapes), writes a mixed trace (Poisson
arrivals; 30% 64x64x9-frame videos at 8 steps, 70% 32x32 images at 4 steps), then for each policy replays it
on a real engine (`gfdit run-trace`) and simulates it on the `cpu` cluster with the profile (`gfdit
simulate`). Targets: mean latency within 10%, p99 within 20%, and the same ranking of the policies by mean
latency.

    python bench/bench_fidelity.py [--quick] [--world-size 4] [--requests 24] [--rate 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _common as C  # noqa: E402
from gfdit.planning import cost  # noqa: E402
from gfdit.planning.simulate import simulate_trace  # noqa: E402
from gfdit.planning.trace import TraceRequest, write_trace  # noqa: E402
from gfdit.tools import profile as gprofile  # noqa: E402
from gfdit.tools.replay import replay_trace  # noqa: E402

VIDEO = (64, 64, 9, 8)  # height, width, frames, steps
IMAGE = (32, 32, 1, 4)


def make_trace(n: int, rate: float, seed: int = 1, model: str = "tiny-wan") -> list[TraceRequest]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        h, w, f, steps = VIDEO if rng.random() < 0.3 else IMAGE
        out.append(
            TraceRequest(
                id=i,
                arrival_s=round(t, 4),
                model=model,
                height=h,
                width=w,
                num_frames=f,
                num_inference_steps=steps,
                deadline_s=None,
            )
        )
    return out


def compare(policies: list[str], world_size: int, n: int, rate: float, workdir: str, log=print) -> dict:
    """Profiles, replays and simulates; returns per-policy real and simulated metrics and the errors."""
    t0 = time.perf_counter()
    prof = gprofile.measure("tiny-wan", world_size, shapes=[VIDEO[:3], IMAGE[:3]], steps=4, repeats=5)
    profile_path = os.path.join(workdir, "profile.json")
    cost.write_profile(profile_path, prof)
    log(f"profiled in {time.perf_counter() - t0:.0f} s ({len(prof.entries)} entries)")
    trace = make_trace(n, rate)
    write_trace(os.path.join(workdir, "trace.jsonl"), trace)
    out = {}
    for policy in policies:
        real = replay_trace(  # the engine's policies plan with the same profile the simulator runs on
            trace, model="tiny-wan", world_size=world_size, policy=policy, profile=profile_path
        ).summary()
        sim = simulate_trace(
            trace, model="tiny-wan", cluster="cpu", policy=policy, profile=profile_path
        ).summary()
        out[policy] = {
            "real": real,
            "sim": sim,
            "mean_error": sim["mean_latency_s"] / real["mean_latency_s"] - 1,
            "p99_error": sim["p99_latency_s"] / real["p99_latency_s"] - 1,
        }
        log(
            f"{policy}: real mean {real['mean_latency_s'] * 1e3:.1f} ms p99 {real['p99_latency_s'] * 1e3:.1f} ms; "
            f"sim mean {sim['mean_latency_s'] * 1e3:.1f} ms p99 {sim['p99_latency_s'] * 1e3:.1f} ms"
        )
    real_rank = sorted(policies, key=lambda p: out[p]["real"]["mean_latency_s"])
    sim_rank = sorted(policies, key=lambda p: out[p]["sim"]["mean_latency_s"])
    return {"policies": out, "real_ranking": real_rank, "sim_ranking": sim_rank, "profile": profile_path}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--world-size", type=int, default=4)
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--rate", type=float, default=3.0)
    ap.add_argument("--json", default="bench/results/fidelity.json")
    args = ap.parse_args()
    policies = ["fcfs", "static:1", "static:2", "static:4"][: 3 if args.quick else 4]
    with tempfile.TemporaryDirectory() as d:
        res = compare(policies, args.world_size, 12 if args.quick else args.requests, args.rate, d)
    rows, targets = [], []
    for p, r in res["policies"].items():
        rows.append(
            [
                p,
                f"{r['real']['mean_latency_s'] * 1e3:.1f}",
                f"{r['sim']['mean_latency_s'] * 1e3:.1f}",
                f"{100 * r['mean_error']:+.1f}%",
                f"{r['real']['p99_latency_s'] * 1e3:.1f}",
                f"{r['sim']['p99_latency_s'] * 1e3:.1f}",
                f"{100 * r['p99_error']:+.1f}%",
            ]
        )
        targets.append(
            C.Target(
                f"fidelity {p}: mean latency error",
                r["mean_error"],
                "within 10%",
                abs(r["mean_error"]) <= 0.10,
            )
        )
        targets.append(
            C.Target(
                f"fidelity {p}: p99 latency error", r["p99_error"], "within 20%", abs(r["p99_error"]) <= 0.20
            )
        )
    same = res["real_ranking"] == res["sim_ranking"]
    targets.append(C.Target("fidelity: same ranking of policies", None, "same order", same))
    C.print_table(
        f"Fidelity: tiny-wan, world {args.world_size}, real engine vs simulator (profile)",
        ["policy", "real mean ms", "sim mean ms", "error", "real p99 ms", "sim p99 ms", "error"],
        rows,
        notes=[
            f"ranking real: {' < '.join(res['real_ranking'])}",
            f"ranking sim:  {' < '.join(res['sim_ranking'])}",
        ],
    )
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({**res, "targets": [t.__dict__ for t in targets]}, f, indent=2)
    print(C.target_summary(targets))
    return 0


if __name__ == "__main__":
    sys.exit(main())
