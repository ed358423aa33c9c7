"""Runtime benchmarks: queue latencies, control-plane CPU per step, migration bandwidth.

Targets (CPU): dispatch-to-start and completion-to-control-plane at most 20 us median; control-plane CPU
time (all CPU of the control thread, waits included) at most 1% of a tiny-wan step; an idle engine's
control thread under 1% of a core; a killed worker noticed within 1 s (the liveness interval is 100 ms);
migration at least 50% of the memcpy bandwidth measured in the same run.

    python bench/bench_runtime.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import socket
import sys
import time

import gfdit
import torch
from gfdit import Engine, Request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402


def bench_latency(pings: int) -> dict:
    with Engine(model="tiny-wan", world_size=2, policy="fcfs") as eng:
        for w in range(2):
            eng.ping(w, 20)  # warm up
        rows = []
        for w in range(2):
            rows += eng.ping(w, pings)
    d2s = [(s - d) / 1e3 for d, s, p, seen in rows]
    c2e = [(seen - p) / 1e3 for d, s, p, seen in rows]
    return {
        "pings": len(rows),
        "dispatch_to_start_us": {"median": C.median(d2s), "p99": C.percentile(d2s, 99)},
        "completion_to_engine_us": {"median": C.median(c2e), "p99": C.percentile(c2e, 99)},
    }


def bench_control(num_requests: int, steps: int) -> dict:
    with Engine(model="tiny-wan", world_size=2, policy="fcfs") as eng:
        eng.submit(Request(prompt="warm up", num_inference_steps=2)).result(timeout=300)
        s0 = eng.stats()
        t0 = time.perf_counter()
        hs = [
            eng.submit(Request(prompt=f"request {k}", seed=k, num_inference_steps=steps))
            for k in range(num_requests)
        ]
        results = [h.result(timeout=600) for h in hs]
        wall = time.perf_counter() - t0
        s1 = eng.stats()
        time.sleep(0.5)
        i0, w0 = eng.stats()["control_cpu_ns"], time.perf_counter()
        time.sleep(3.0)
        idle = (eng.stats()["control_cpu_ns"] - i0) / 1e9 / (time.perf_counter() - w0)
    control = s1["control_cpu_ns"] - s0["control_cpu_ns"]
    step_ns = [s.end_ns - s.start_ns for r in results for s in r.timeline if s.kind == "denoise"]
    total_steps = num_requests * steps
    per_step = control / total_steps
    return {
        "requests": num_requests,
        "steps": total_steps,
        "wall_s": wall,
        "control_cpu_ns_per_step": per_step,
        "median_step_ns": C.median(step_ns),
        "control_fraction": per_step / C.median(step_ns),
        "idle_core_fraction": idle,
        "lookahead_hits": s1["lookahead_hits"] - s0["lookahead_hits"],
        "loop_wakeups_per_step": (s1["loop_wakeups"] - s0["loop_wakeups"]) / total_steps,
    }


def bench_death(reps: int) -> dict:
    """Seconds from SIGKILL of an idle engine's worker until the control plane counts it dead."""
    import signal

    seen = []
    for _ in range(reps):
        with Engine(model="tiny-wan", world_size=2, policy="fcfs") as eng:
            t0 = time.monotonic()
            os.kill(eng.worker_pids[1], signal.SIGKILL)
            while eng.alive_workers()[1] and time.monotonic() - t0 < 10:
                time.sleep(0.001)
            seen.append(time.monotonic() - t0)
    return {"reps": reps, "seconds": seen, "max_s": max(seen), "median_s": C.median(seen)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _migrate_rank(rank: int, port: int, sizes: list[int], reps: int, out: mp.Queue) -> None:
    import torch.distributed as dist
    from gfdit.models.staged import DenoiseState, migrate

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=datetime.timedelta(seconds=60))
    gfdit.init(rank, 2, store, timeout=60.0, heap_bytes=256 << 20)
    g = gfdit.new_group([0, 1])
    res = []
    for nbytes in sizes:
        state = None
        if rank == 0:
            n = nbytes // 4
            state = DenoiseState(
                latent=torch.randn(1, n),
                prompt_embeds=torch.randn(1, 16, 32),
                negative_prompt_embeds=None,
                sigmas=torch.linspace(1, 0, 5),
                timesteps=torch.linspace(1000, 250, 4),
                step_idx=1,
                guidance_scale=1.0,
                grid=(1, 1, 1),
            )
        times = []
        for _ in range(reps + 1):
            gfdit.barrier(g)
            t0 = time.perf_counter()
            got = migrate(state, g, 0)
            gfdit.barrier(g)  # the receiver has it
            times.append(time.perf_counter() - t0)
        if rank == 1:
            assert got.latent.numel() == nbytes // 4
        res.append((nbytes, C.median(times[1:])))
    if rank == 0:
        # single-core memcpy at the same sizes, same process, same run
        mc = []
        for nbytes in sizes:
            a = torch.randn(nbytes // 4)
            b = torch.empty_like(a)
            b.copy_(a)
            ts = []
            for _ in range(reps + 1):
                t0 = time.perf_counter()
                b.copy_(a)
                ts.append(time.perf_counter() - t0)
            mc.append(C.median(ts[1:]))
        out.put((res, mc))
    gfdit.barrier()
    gfdit.destroy()


def bench_migration(sizes: list[int], reps: int) -> list[dict]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    ps = [ctx.Process(target=_migrate_rank, args=(r, port, sizes, reps, q)) for r in range(2)]
    for p in ps:
        p.start()
    res, mc = q.get(timeout=600)
    for p in ps:
        p.join(60)
    rows = []
    for (nbytes, t), tm in zip(res, mc):
        bw = nbytes / t / 1e9
        mbw = nbytes / tm / 1e9
        rows.append(
            {"bytes": nbytes, "time_us": t * 1e6, "gbps": bw, "memcpy_gbps": mbw, "fraction": bw / mbw}
        )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default="bench/results/runtime.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    lat = bench_latency(100 if args.quick else 500)
    ctl = bench_control(3 if args.quick else 8, 4 if args.quick else 8)
    death = bench_death(1 if args.quick else 3)
    sizes = [1 << 20, 16 << 20] if args.quick else [256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
    mig = bench_migration(sizes, 3 if args.quick else 5)

    def verdict(ok: bool) -> str:
        return "PASS" if ok else "FAIL"

    print("\n== runtime: queue latencies (idle worker, empty task), microseconds ==")
    print(f"{'what':<26}{'median':>10}{'p99':>10}{'target':>12}")
    for key, name in (
        ("dispatch_to_start_us", "dispatch -> start"),
        ("completion_to_engine_us", "completion -> control"),
    ):
        v = lat[key]
        print(
            f"{name:<26}{v['median']:>10.1f}{v['p99']:>10.1f}{'<= 20 med':>12}  {verdict(v['median'] <= 20)}"
        )
    print("\n== runtime: control-plane CPU time per denoising step (fcfs, tiny-wan, 2 workers) ==")
    print(
        f"control CPU per step {ctl['control_cpu_ns_per_step'] / 1e3:.1f} us; median step "
        f"{ctl['median_step_ns'] / 1e6:.2f} ms; fraction {100 * ctl['control_fraction']:.2f}% "
        f"(target <= 1%)  {verdict(ctl['control_fraction'] <= 0.01)}"
    )
    print(
        f"control-thread wake-ups per step {ctl['loop_wakeups_per_step']:.2f}; steps dispatched ahead across "
        f"decisions {ctl['lookahead_hits']}"
    )
    print(
        f"idle engine: control thread {100 * ctl['idle_core_fraction']:.3f}% of a core (target < 1%)  "
        f"{verdict(ctl['idle_core_fraction'] < 0.01)}"
    )
    print(
        f"killed worker noticed after {death['median_s'] * 1e3:.0f} ms median, {death['max_s'] * 1e3:.0f} ms "
        f"at most over {death['reps']} (target <= 1 s)  {verdict(death['max_s'] <= 1.0)}"
    )
    print("\n== runtime: migration of a request's state, 1 holder -> 1 new member ==")
    print(f"{'bytes':>12}{'time us':>12}{'GB/s':>8}{'memcpy GB/s':>13}{'fraction':>10}   target >= 50%")
    for r in mig:
        print(
            f"{r['bytes']:>12}{r['time_us']:>12.1f}{r['gbps']:>8.2f}{r['memcpy_gbps']:>13.2f}"
            f"{100 * r['fraction']:>9.0f}%   {verdict(r['fraction'] >= 0.5)}"
        )
    targets = [
        C.Target(
            "dispatch -> worker start, median [us]",
            lat["dispatch_to_start_us"]["median"],
            "<= 20 us",
            lat["dispatch_to_start_us"]["median"] <= 20,
        ),
        C.Target(
            "completion -> control plane, median [us]",
            lat["completion_to_engine_us"]["median"],
            "<= 20 us",
            lat["completion_to_engine_us"]["median"] <= 20,
        ),
        C.Target(
            "control-plane CPU per step [% of step]",
            100 * ctl["control_fraction"],
            "<= 1%",
            ctl["control_fraction"] <= 0.01,
        ),
        C.Target(
            "killed worker noticed, at most [s]",
            death["max_s"],
            "<= 1 s",
            death["max_s"] <= 1.0,
        ),
        C.Target(
            "idle engine control thread [% of a core]",
            100 * ctl["idle_core_fraction"],
            "< 1%",
            ctl["idle_core_fraction"] < 0.01,
        ),
    ]
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(
            {
                "build_info": gfdit.build_info(),
                "latency": lat,
                "control": ctl,
                "worker_death": death,
                "migration": mig,
                "targets": [t.__dict__ for t in targets],
            },
            f,
            indent=2,
        )
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
