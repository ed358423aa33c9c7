"""A short soak of ``gfdit serve`` (bench/bench_soak.py, which runs the full one: 5,000 images, 50 video jobs).

150 images on tiny-qwen-image with 4 ranks (the embedded default) and 3 video jobs on tiny-wan with 2 ranks,
both servers loaded at once by ``gfdit bench``'s client, 8 requests in flight on each: every request is
answered 200 and none with a 5xx, every rank keeps its worker process, and /dev/shm holds nothing with either
engine's tag once its server has stopped. The warm-up is the first 30% of each server's requests, which
covers every image size and step count once.

Resident memory is bounded more loosely than the soak's 10%: the servers' by 25%. The workers' is reported,
not bounded: a run this short ends while their allocators still grow (a worker that ran a 256x256 image
alone first runs it next to other large ones: tens of MiB more, a large share of a 400 MiB process), which
only thousands of requests amortise; the full soak bounds it.
"""

from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("diffusers")

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench")
)
import bench_soak  # noqa: E402

SERVER_RSS_BOUND = 0.25


@pytest.mark.timeout(600)
def test_short_soak_loses_nothing_and_leaves_nothing():
    # the analytic CPU cost model: no profile to measure first, and it spreads the larger images over ranks
    result = bench_soak.soak(150, 3, concurrency=8, warmup_share=0.3, serve_args=["--cluster", "cpu"])
    print(bench_soak.format_result(result))
    assert set(result["servers"]) == {"images", "videos"}
    for name, server in result["servers"].items():
        checks = server["checks"]
        assert checks["nothing_lost"], (name, server["load"])
        assert checks["workers_stable"], (name, server["rss"])
        assert checks["shm_clean"], (name, server["queue_tag"], server["shm_left"])
        assert server["exit_status"] == 0, name
        (main,) = [p for p in server["rss"] if p["role"] == "server"]
        assert main["growth"] <= SERVER_RSS_BOUND, (name, main)
    assert result["servers"]["images"]["load"]["num_requests"] == 150
    assert result["servers"]["videos"]["load"]["num_requests"] == 3


def test_the_soak_sees_what_an_engine_leaves_in_dev_shm_and_how_memory_grows():
    import secrets
    import subprocess

    tag = secrets.token_hex(8)
    name = f"gfdit-o-{tag}-{os.getpid()}"
    path = os.path.join("/dev/shm", name)
    with open(path, "wb"):
        pass
    try:
        assert bench_soak.shm_left(tag) == [name]
        assert bench_soak.shm_left(secrets.token_hex(8)) == []
    finally:
        os.unlink(path)
    assert bench_soak.shm_left(tag) == []

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    server = bench_soak.Server("images", "m", 1, proc, "http://unused")
    server.names = {proc.pid: "server", 7: "worker"}
    # (t, KiB, after the warm-up): the warm-up's samples do not count; growth is max over first after it
    server.rss = {
        proc.pid: [(0, 900, False), (1, 1000, True), (2, 1200, True), (3, 1100, True)],
        7: [(3, 50, True)],
    }
    by_pid = {p["pid"]: p for p in bench_soak.rss_figures(server)}
    main, late = by_pid[proc.pid], by_pid[7]
    assert (main["role"], late["role"]) == ("server", "worker")
    assert (
        main["first_mib"] * 1024 == 1000
        and main["max_mib"] * 1024 == 1200
        and main["last_mib"] * 1024 == 1100
    )
    assert main["growth"] == pytest.approx(0.2) and not main["started_after_warmup"]
    assert main["peak_growth"] == pytest.approx(
        0.1
    )  # the last sample's peak over the first one's (windows of 1)
    assert late["started_after_warmup"] and late["growth"] == 0
