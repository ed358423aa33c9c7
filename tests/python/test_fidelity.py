"""The simulator against the real engine: the same trace and policies on tiny-wan at world 4, the simulator
driven by a profile measured here (a short version of bench/bench_fidelity.py, whose targets are tighter)."""

from __future__ import annotations

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "bench"))


def _check(res: dict, policies: list[str]) -> None:
    for p in policies:
        r = res["policies"][p]
        assert r["real"]["num_requests"] == 12 and r["sim"]["num_requests"] == 12
        # The benchmark's targets are 10% (mean) and 20% (p99). Here one short run is one sample of a noisy
        # measurement: on 2 shared cores the same policy's real mean moved between 107 and 177 ms from one run
        # to the next (static:4), and the profile the simulator reads varies as much (a two-rank step measured
        # 2.6 ms in one profile and 4.8 ms in the next). 40% still catches a simulator that leaves out a stage
        # or mis-schedules (those are off by 2x and more).
        assert abs(r["mean_error"]) < 0.4, (p, r)
        assert abs(r["p99_error"]) < 0.5, (p, r)
    # policies whose real means differ clearly rank the same in the simulator, where the simulator tells them
    # apart: with the profile, fcfs keeps every request of this trace on one rank as static:1 does, and
    # what separates their real runs on a shared machine is noise (each mean is still held to the error
    # bounds above)
    real = {p: res["policies"][p]["real"]["mean_latency_s"] for p in policies}
    sim = {p: res["policies"][p]["sim"]["mean_latency_s"] for p in policies}
    for a in policies:
        for b in policies:
            told_apart = abs(sim[a] - sim[b]) > 0.05 * max(sim[a], sim[b])
            if real[a] < 0.8 * real[b] and told_apart:
                assert sim[a] < sim[b], (a, b, real, sim)


@pytest.mark.timeout(420)
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores for a meaningful world of 4")
def test_simulator_follows_the_real_engine(tmp_path):
    from bench_fidelity import compare

    # fcfs (which keeps this trace's requests on one rank, as static:1 would) against static:4; bench_fidelity.py
    # runs every policy
    policies = ["fcfs", "static:4"]
    # The real runs are 12 requests of a few milliseconds each on 2 cores shared by 4 ranks: run to run the real
    # means vary by 20-40% (the simulator is the stable side). Up to three independent runs (new profile, new
    # replay) decide; a simulator that is really off fails all of them. bench_fidelity.py measures it properly.
    failures = []
    for attempt in range(3):
        workdir = tmp_path / str(attempt)
        workdir.mkdir()
        res = compare(policies, world_size=4, n=12, rate=3.0, workdir=str(workdir), log=lambda *_: None)
        try:
            _check(res, policies)
            return
        except AssertionError as exc:
            failures.append(str(exc))
    raise AssertionError("every run missed: " + " | ".join(failures))
