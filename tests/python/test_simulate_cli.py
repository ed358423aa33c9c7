"""gfdit simulate: a small trace on the simulated h20x8 (analytic cost model) and on this CPU (profiled);
unknown clusters and policies are refused with the valid names; the plots of a replay."""

from __future__ import annotations

import argparse
import json
import random

import gfdit
import pytest
from gfdit._C import cost as cost_c
from gfdit.planning import cost, simulate
from gfdit.planning.trace import SUMMARY_KEYS, Interval, Outcome, TraceRequest, write_trace
from gfdit.tools import profile


def _cli(argv: list[str]) -> int:
    """What `gfdit simulate ARGV` runs (gfdit.tools.cli dispatches to these two functions)."""
    parser = argparse.ArgumentParser(prog="gfdit simulate")
    simulate.add_arguments(parser, "simulate")
    return simulate.run(parser.parse_args(argv), "simulate")


def _trace(path, model: str, n: int, gap_s: float, budget_s: float | None, seed: int = 0) -> str:
    """n requests of `model` at its default size (images for an image model, some images for a video
    model), Poisson arrivals with mean gap `gap_s`, deadlines `budget_s` after arrival on every other one."""
    arch = cost_c.model_arch(model)
    rng = random.Random(seed)
    t, reqs = 0.0, []
    for i in range(n):
        frames = int(arch.default_frames) if arch.is_video and i % 3 else 1
        reqs.append(
            TraceRequest(
                id=i,
                arrival_s=round(t, 6),
                model=model,
                height=int(arch.default_height),
                width=int(arch.default_width),
                num_frames=frames,
                num_inference_steps=int(arch.default_steps),
                deadline_s=round(t + budget_s, 6) if budget_s and i % 2 == 0 else None,
            )
        )
        t += rng.expovariate(1.0 / gap_s)
    write_trace(str(path), reqs)
    return str(path)


def _check_metrics(m: dict, policy: str, n: int) -> None:
    assert tuple(m) == SUMMARY_KEYS
    assert m["policy"] == policy and m["num_requests"] == n
    assert m["throughput_rps"] > 0 and 0 < m["p50_latency_s"] <= m["p99_latency_s"]
    assert 0 < m["utilization"] <= 1


@pytest.mark.parametrize("policy", ["fcfs", "static:2"])
def test_simulate_h20x8_analytic(tmp_path, policy, capsys):
    trace = _trace(tmp_path / "t.jsonl", "qwen-image", n=12, gap_s=20.0, budget_s=300.0)
    out, plots = tmp_path / "m.json", tmp_path / "plots"
    argv = [
        "--trace",
        trace,
        "--policy",
        policy,
        "--cluster",
        "h20x8",
        "--model",
        "qwen-image",
        "--json",
        str(out),
        "--plot",
        str(plots),
    ]
    assert _cli(argv) == 0
    assert "12 of 12 requests completed" in capsys.readouterr().out
    _check_metrics(json.loads(out.read_text()), policy, 12)
    assert (plots / "latency_cdf.png").stat().st_size > 5000 and (
        plots / "timeline.png"
    ).stat().st_size > 5000


@pytest.fixture(scope="module")
def cpu_profile(tmp_path_factory) -> str:
    """A reduced profile of tiny-wan measured here (world 2): what --cluster cpu needs."""
    path = tmp_path_factory.mktemp("profile") / "profile.json"
    p = profile.measure("tiny-wan", 2, [(32, 48, 1), (64, 96, 1)], steps=2, repeats=1)
    cost.write_profile(path, p)
    return str(path)


@pytest.mark.timeout(120)
def test_simulate_cpu_with_profile(tmp_path, cpu_profile):
    arch = cost_c.model_arch("tiny-wan")
    h, w = int(arch.default_height), int(arch.default_width)
    reqs = [
        TraceRequest(
            id=i,
            arrival_s=0.02 * i,
            model="tiny-wan",
            height=h * (1 + i % 2),
            width=w * (1 + i % 2),
            num_frames=1,
            num_inference_steps=3,
            deadline_s=0.02 * i + 5.0,
        )
        for i in range(6)
    ]
    trace = str(tmp_path / "t.jsonl")
    write_trace(trace, reqs)
    out = tmp_path / "m.json"
    argv = [
        "--trace",
        trace,
        "--policy",
        "fcfs",
        "--cluster",
        "cpu",
        "--model",
        "tiny-wan",
        "--profile",
        cpu_profile,
        "--json",
        str(out),
    ]
    assert _cli(argv) == 0
    _check_metrics(json.loads(out.read_text()), "fcfs", 6)
    assert _cli([*argv[:6], "--model", "tiny-wan"]) == 2  # the cpu cluster needs a profile


def test_unknown_cluster_and_policy_list_valid_names(tmp_path, capsys):
    trace = _trace(tmp_path / "t.jsonl", "qwen-image", n=2, gap_s=1.0, budget_s=None)
    base = ["--trace", trace, "--model", "qwen-image"]
    assert _cli([*base, "--policy", "fcfs", "--cluster", "h20x9000"]) == 2
    err = capsys.readouterr().err
    assert "h20x9000" in err and "h20x8" in err and "h200x8" in err and "Traceback" not in err
    assert _cli([*base, "--policy", "no-such-policy", "--cluster", "h20x8"]) == 2
    err = capsys.readouterr().err
    assert "no-such-policy" in err and "fcfs" in err and "static" in err and "Traceback" not in err


def test_plots_stay_readable_with_many_requests(tmp_path):
    """Hundreds of requests: both PNGs are written, the legend is capped (the plot functions return)."""
    rng = random.Random(1)
    outcomes, intervals = [], []
    for i in range(300):
        arrival = i * 0.1
        ranks = rng.sample(range(8), rng.choice([1, 2, 4]))
        t = arrival + rng.random()
        for kind, dur in (
            ("encode", 0.05),
            ("denoise", 0.2),
            ("denoise", 0.2),
            ("migrate", 0.01),
            ("denoise", 0.2),
            ("decode", 0.1),
        ):
            for r in ranks if kind != "decode" else ranks[:1]:
                intervals.append(Interval(rank=r, request_id=i, kind=kind, start_s=t, end_s=t + dur))
            t += dur
        outcomes.append(
            Outcome(
                id=i,
                arrival_s=arrival,
                finish_s=t,
                deadline_s=arrival + 1.0 if i % 2 else None,
                state="DONE" if i % 10 else "FAILED",
            )
        )
    replay = simulate.Replay(
        policy="fcfs",
        outcomes=outcomes,
        busy_rank_s=1.0,
        num_ranks=8,
        intervals=intervals,
        wall_s=0.0,
        where="synthetic",
    )
    paths = simulate.write_plots(replay, str(tmp_path / "plots"))
    assert [p.rsplit("/", 1)[1] for p in paths] == ["latency_cdf.png", "timeline.png"]
    for p in paths:
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    # a replay in which nothing completed still plots
    empty = simulate.Replay(
        policy="fcfs",
        outcomes=[Outcome(0, 0.0, None, 1.0, "FAILED")],
        busy_rank_s=0.0,
        num_ranks=2,
        intervals=[],
        wall_s=0.0,
        where="synthetic",
    )
    simulate.write_plots(empty, str(tmp_path / "empty"))


def test_regroup_cost_is_charged_on_new_groups(tmp_path):
    """A group-formation cost (NCCL's ~0.78 s) slows fcfs, whose groups change, and never static:2 beyond
    the first use of each of its four groups."""
    from gfdit.planning.trace import load_trace

    reqs = load_trace(_trace(tmp_path / "t.jsonl", "qwen-image", n=30, gap_s=5.0, budget_s=None))

    def mean(policy: str, regroup_s: float | None) -> float:
        r = simulate.simulate_trace(
            reqs, model="qwen-image", cluster="h20x8", policy=policy, regroup_s=regroup_s
        )
        return r.summary()["mean_latency_s"]

    assert mean("fcfs", 0.778) > mean("fcfs", None) + 0.1
    assert mean("static:2", 0.778) - mean("static:2", 0.0) <= 0.778 + 1e-9
    with pytest.raises(gfdit.InvalidUsage, match="regroup_s"):
        simulate.simulate_trace(reqs, model="qwen-image", cluster="h20x8", policy="fcfs", regroup_s=-1.0)
