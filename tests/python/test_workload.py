"""gfdit trace (gfdit.planning.workload): traces are deterministic per seed, arrival processes have the stated rate
and burstiness, sizes stay in the stated ranges and load as traces, deadlines equal arrival + K x the alone
latency computed independently from gfdit.planning.cost.estimate, the CLI writes a loadable file."""

from __future__ import annotations

import argparse
import json
import statistics

import gfdit
import numpy as np
import pytest
from gfdit.planning import cost, workload
from gfdit.planning.trace import load_trace, write_trace


def _cli(argv: list[str]) -> int:
    """What `gfdit trace ARGV` runs (gfdit.tools.cli dispatches to these two functions)."""
    parser = argparse.ArgumentParser(prog="gfdit trace")
    workload.add_arguments(parser, "trace")
    return workload.run(parser.parse_args(argv), "trace")


@pytest.fixture(scope="module")
def pricer():
    return workload.Pricer("h20x8")


def _gaps(times: list[float]) -> np.ndarray:
    return np.diff(np.asarray([0.0, *times]))


# ------------------------------------------------------------------------------------------------ seeds
def test_same_seed_same_trace(pricer):
    args = ("mixed", "bursty", 0.05, 2000.0, 3.0)
    a = workload.generate(*args, 7, priority_share=0.2, pricer=pricer)
    b = workload.generate(*args, 7, priority_share=0.2, pricer=pricer)
    c = workload.generate(*args, 8, priority_share=0.2, pricer=pricer)
    assert len(a) > 20 and a == b
    assert [r.arrival_s for r in a] != [r.arrival_s for r in c[: len(a)]]


def test_sizes_do_not_depend_on_the_rate(pricer):
    """Separate random streams: the same seed at another rate draws the same sequence of sizes."""
    slow = workload.generate("image", "poisson", 0.1, 1000.0, 2.0, 3, pricer=pricer)
    fast = workload.generate("image", "poisson", 0.4, 1000.0, 2.0, 3, pricer=pricer)
    n = min(len(slow), len(fast))
    assert n > 50
    shape = lambda r: (r.height, r.width, r.num_frames, r.num_inference_steps)  # noqa: E731
    assert [shape(r) for r in slow[:n]] == [shape(r) for r in fast[:n]]


# ------------------------------------------------------------------------------------------------ arrivals
@pytest.mark.parametrize(
    "arrival, duration, cv, rate_tol, cv_tol",
    [
        ("poisson", 4000.0, 1.0, 0.03, 0.05),
        ("bursty", 4000.0, 2.0, 0.05, 0.2),
        ("onoff", 20000.0, None, 0.06, 0),
    ],
)
def test_rate_and_burstiness(arrival, duration, cv, rate_tol, cv_tol):
    rate = 10.0
    rng = np.random.Generator(np.random.PCG64(11))
    times = workload.arrival_times(arrival, rate, duration, rng)
    assert all(0 <= a <= b < duration for a, b in zip(times, times[1:]))  # Gamma gaps can round to 0
    assert abs(len(times) / duration - rate) <= rate_tol * rate
    gaps = _gaps(times)
    measured = gaps.std() / gaps.mean()
    if cv is not None:
        assert abs(measured - cv) <= cv_tol, measured
    else:  # bursts at 4x the rate and silences: gaps far more variable than Poisson's
        assert measured > 1.5, measured


def test_onoff_bursts_run_at_the_burst_rate():
    rng = np.random.Generator(np.random.PCG64(5))
    times = workload.arrival_times("onoff", 2.0, 20000.0, rng, burst_factor=5.0)
    gaps = _gaps(times)
    # most gaps lie inside a burst (exponential at 5 x 2 = 10/s); the median of Exp(10) is ln 2 / 10
    assert abs(np.median(gaps) - np.log(2) / 10.0) < 0.012


def test_bad_arrival_arguments():
    rng = np.random.Generator(np.random.PCG64(0))
    for kwargs in ({"rate": 0.0}, {"rate": float("inf")}, {"duration_s": -1.0}):
        args = {"arrival": "poisson", "rate": 1.0, "duration_s": 10.0, **kwargs}
        with pytest.raises(gfdit.InvalidUsage):
            workload.arrival_times(rng=rng, **args)
    with pytest.raises(gfdit.InvalidUsage, match="valid: poisson, bursty, onoff"):
        workload.arrival_times("steady", 1.0, 10.0, rng)


# ------------------------------------------------------------------------------------------------ sizes
def test_image_sizes_in_range_and_loadable(tmp_path, pricer):
    reqs = workload.generate("image", "poisson", 1.0, 600.0, 2.0, 1, pricer=pricer)
    assert len(reqs) > 400
    for r in reqs:
        assert r.model == "qwen-image" and r.num_frames == 1
        assert 512 <= min(r.height, r.width) and max(r.height, r.width) <= 1536
        assert r.height % 16 == 0 and r.width % 16 == 0
        assert 20 <= r.num_inference_steps <= 50
    counts = {}
    for r in reqs:
        counts[(r.height, r.width)] = counts.get((r.height, r.width), 0) + 1
    assert max(counts, key=counts.get) == (1024, 1024)  # the most common size
    write_trace(str(tmp_path / "t.jsonl"), reqs)
    assert load_trace(str(tmp_path / "t.jsonl"), model="qwen-image") == reqs


def test_video_and_mixed_sizes(tmp_path, pricer):
    video = workload.generate("video", "poisson", 0.05, 4000.0, 2.0, 2, pricer=pricer)
    mixed = workload.generate("mixed", "poisson", 0.2, 4000.0, 2.0, 2, pricer=pricer)
    assert len(video) > 100 and len(mixed) > 500
    for r in video:
        assert r.model == "wan2.2" and 33 <= r.num_frames <= 121 and (r.num_frames - 1) % 4 == 0
        assert sorted((r.height, r.width)) in ([480, 832], [720, 1280])
        assert 20 <= r.num_inference_steps <= 50
    share = sum(r.num_frames > 1 for r in mixed) / len(mixed)
    assert abs(share - 0.3) < 0.05
    assert {r.model for r in mixed} == {"wan2.2"}  # one model: what a replay serves
    for name, reqs in (("v", video), ("m", mixed)):
        write_trace(str(tmp_path / f"{name}.jsonl"), reqs)
        assert load_trace(str(tmp_path / f"{name}.jsonl"), model="wan2.2") == reqs


def test_two_model_mixed_trace(tmp_path, pricer):
    reqs = workload.generate(
        "mixed", "poisson", 0.2, 600.0, 2.0, 4, model="qwen-image", video_model="wan2.2", pricer=pricer
    )
    assert {r.model for r in reqs} == {"qwen-image", "wan2.2"}
    assert all((r.num_frames > 1) == (r.model == "wan2.2") for r in reqs)
    write_trace(str(tmp_path / "t.jsonl"), reqs)
    assert load_trace(str(tmp_path / "t.jsonl")) == reqs


def test_tiny_models_get_scaled_sizes(tmp_path):
    pricer = workload.Pricer("h20x8")
    for wl, model in (("mixed", "tiny-wan"), ("image", "tiny-qwen-image")):
        reqs = workload.generate(wl, "poisson", 2.0, 100.0, 2.0, 0, model=model, pricer=pricer)
        write_trace(str(tmp_path / "t.jsonl"), reqs)
        assert load_trace(str(tmp_path / "t.jsonl"), model=model) == reqs


def test_refuses_a_video_workload_of_an_image_model(pricer):
    with pytest.raises(gfdit.InvalidUsage, match="needs a video model"):
        workload.generate("video", "poisson", 1.0, 10.0, 2.0, 0, model="qwen-image", pricer=pricer)
    with pytest.raises(gfdit.InvalidUsage, match="unknown workload"):
        workload.generate("audio", "poisson", 1.0, 10.0, 2.0, 0, pricer=pricer)


# ------------------------------------------------------------------------------------------------ deadlines
def _alone_by_estimate(r) -> float:
    """Independent alone latency: gfdit.planning.cost.estimate per degree (Ulysses), best of 1, 2, 4, 8 (both
    models' head counts allow 8, and h20x8 has 8 ranks), with the decode split over the fastest number of the
    group's ranks the cost model predicts (NOTE [parallel decode]), each degree asked of the model itself."""
    cm = cost.cost_model(r.model, "h20x8")
    shape = (r.height, r.width, r.num_frames)
    rows = r.height // int(cost.model_arch(r.model).vae_stride_s)
    best = float("inf")
    for d in (1, 2, 4, 8):
        e = cost.estimate(r.model, "h20", height=r.height, width=r.width, num_frames=r.num_frames, ulysses=d)
        decode = min(
            cm.seconds(cost.Stage.DECODE, *shape, degree=k, num_steps=r.num_inference_steps)
            for k in range(1, min(d, rows) + 1)
        )
        best = min(best, e["encode_s"] + r.num_inference_steps * e["step_s"] + decode)
    return best


@pytest.mark.parametrize("wl", ["image", "video"])
def test_deadlines_are_k_times_the_alone_latency(wl, pricer):
    k = 2.5
    reqs = workload.generate(wl, "bursty", 0.05, 2000.0, k, 9, pricer=pricer)
    picked = {(r.height, r.width, r.num_frames, r.num_inference_steps): r for r in reqs}
    assert len(picked) >= 3
    for r in list(picked.values())[:4]:
        assert r.deadline_s == pytest.approx(r.arrival_s + k * _alone_by_estimate(r), rel=1e-9)


def test_best_degree_depends_on_the_size(pricer):
    """Small images are fastest on few ranks, large videos on all of them (the case for changing degrees)."""
    assert pricer.best("qwen-image", 512, 512, 1, 50)[1] <= 2
    assert pricer.best("wan2.2", 720, 1280, 81, 40)[1] == 8


def test_cpu_cluster_uses_the_profile(tmp_path):
    """With a profile the deadlines come from its measurements, and sizes it cannot price are left out."""
    arch = cost.model_arch("tiny-wan")
    lo = arch.tokens(128, 224, 1)
    hi = arch.tokens(192, 336, 9)
    entries = []
    for d in (1, 2):
        for tokens, secs in ((lo, 0.01), (hi, 0.05)):
            entries.append({"stage": "denoise", "tokens": tokens, "degree": d, "ulysses": d, "guidance": True,
                            "seconds": secs / d})  # fmt: skip
            entries.append({"stage": "decode", "tokens": tokens, "guidance": True, "seconds": 2 * secs})
        entries.append({"stage": "encode", "tokens": lo, "degree": d, "guidance": True, "seconds": 0.003})
    path = tmp_path / "profile.json"
    path.write_text(
        json.dumps({"format": cost.PROFILE_FORMAT, "model": "tiny-wan", "world_size": 2, "entries": entries})
    )
    reqs = workload.generate(
        "mixed", "poisson", 5.0, 60.0, 3.0, 0, model="tiny-wan", cluster="cpu", profile=path
    )
    assert len(reqs) > 100
    assert all(lo <= arch.tokens(r.height, r.width, r.num_frames) <= hi for r in reqs)
    cm = cost.cost_model("tiny-wan", profile=str(path))
    r = reqs[0]
    q = {"num_steps": r.num_inference_steps, "guidance_scale": float(arch.default_guidance)}
    step = cm.seconds(cost.Stage.DENOISE, r.height, r.width, r.num_frames, degree=2, ulysses=2, **q)
    dec = cm.seconds(cost.Stage.DECODE, r.height, r.width, r.num_frames, **q)
    assert r.deadline_s == pytest.approx(r.arrival_s + 3.0 * (0.003 + r.num_inference_steps * step + dec))
    with pytest.raises(gfdit.InvalidUsage, match="needs a profile"):
        workload.Pricer("cpu")


# ------------------------------------------------------------------------------------------------ priority
def test_priority_share(pricer):
    reqs = workload.generate("image", "poisson", 2.0, 1000.0, 2.0, 5, priority_share=0.25, pricer=pricer)
    share = statistics.mean(r.priority for r in reqs)
    assert set(r.priority for r in reqs) == {0, 1} and abs(share - 0.25) < 0.04
    assert all(
        r.priority == 0 for r in workload.generate("image", "poisson", 2.0, 100.0, 2.0, 5, pricer=pricer)
    )


# ------------------------------------------------------------------------------------------------ CLI
def test_cli_writes_a_trace(tmp_path, capsys):
    out = tmp_path / "t.jsonl"
    argv = ["--workload", "video", "--arrival", "onoff", "--load", "0.8", "--duration", "20000"]
    argv += ["--slo-scale", "2", "--seed", "3", "--model", "wan2.2", "--out", str(out)]
    assert _cli(argv) == 0
    text = capsys.readouterr().out
    assert "0.80 x the capacity" in text
    reqs = load_trace(str(out), model="wan2.2")
    assert reqs == workload.generate("video", "onoff", 0.8 * workload.capacity_rps("video"), 20000.0, 2.0, 3)
    assert _cli([*argv[:-2], "--model", "qwen-image", "--out", str(out)]) == 2
    assert "needs a video model" in capsys.readouterr().err


def test_cli_is_registered():
    from gfdit.tools.cli import COMMANDS

    assert COMMANDS["trace"][0] == "gfdit.planning.workload"
