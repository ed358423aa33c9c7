"""gfdit run-trace: a short trace of tiny images replayed on the real engine (world 2, CPU workers)."""

from __future__ import annotations

import argparse
import json
import os

import pytest
from gfdit._C import InvalidUsage
from gfdit._C import cost as cost_c
from gfdit.planning.trace import SUMMARY_KEYS, TraceRequest, load_trace, write_trace
from gfdit.tools import replay as run_trace

WORLD = 2


def _cli(command: str, argv: list[str]) -> int:
    """What `gfdit COMMAND ARGV` runs (gfdit.tools.cli dispatches to these two functions)."""
    parser = argparse.ArgumentParser(prog=f"gfdit {command}")
    run_trace.add_arguments(parser, command)
    return run_trace.run(parser.parse_args(argv), command)


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> str:
    """Five tiny images (tiny-wan, one frame), two arriving together, generous deadlines on four."""
    arch = cost_c.model_arch("tiny-wan")
    h, w = int(arch.default_height), int(arch.default_width)
    arrivals = [0.0, 0.05, 0.2, 0.2, 0.35]
    reqs = [
        TraceRequest(
            id=i,
            arrival_s=t,
            model="tiny-wan",
            height=h if i % 2 == 0 else 2 * h,
            width=w,
            num_frames=1,
            num_inference_steps=3,
            deadline_s=None if i == 2 else t + 60.0,
            priority=i % 2,
        )
        for i, t in enumerate(arrivals)
    ]
    path = str(tmp_path_factory.mktemp("trace") / "images.jsonl")
    write_trace(path, reqs)
    return path


@pytest.mark.timeout(90)
@pytest.mark.parametrize("policy", ["static:1", "fcfs"])
def test_run_trace_reports_sane_metrics(trace, tmp_path, policy, capsys):
    out = tmp_path / "m.json"
    plots = tmp_path / "plots"
    argv = [
        "--trace",
        trace,
        "--policy",
        policy,
        "--model",
        "tiny-wan",
        "--world-size",
        str(WORLD),
        "--json",
        str(out),
    ]
    if policy == "fcfs":
        argv += ["--plot", str(plots)]
    assert _cli("run-trace", argv) == 0
    printed = capsys.readouterr().out
    assert "5 of 5 requests completed" in printed and "p99_latency_s" in printed
    m = json.loads(out.read_text())
    assert tuple(m) == SUMMARY_KEYS
    assert m["policy"] == policy and m["num_requests"] == 5
    assert m["slo_attainment"] == 1.0  # every request with a deadline completed within a minute
    assert 0 < m["p50_latency_s"] <= m["p99_latency_s"] < 60
    assert m["mean_latency_s"] > 0 and m["throughput_rps"] > 0
    assert 0 < m["utilization"] <= 1
    if policy == "fcfs":
        for name in ("latency_cdf.png", "timeline.png"):
            p = plots / name
            assert p.is_file() and p.stat().st_size > 5000
            with open(p, "rb") as f:
                assert f.read(8) == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(90)
def test_replay_records_every_request(trace):
    reqs = load_trace(trace, model="tiny-wan")
    replay = run_trace.replay_trace(reqs, model="tiny-wan", world_size=WORLD, policy="static:1", timeout_s=60)
    assert [o.id for o in replay.outcomes] == [r.id for r in reqs]
    assert all(o.completed and o.latency_s > 0 for o in replay.outcomes)
    for o, r in zip(replay.outcomes, reqs):
        assert o.arrival_s >= r.arrival_s  # submitted at (not before) its arrival time
        assert o.deadline_s == r.deadline_s
    # static:1 on two ranks: every request's tasks stay on one rank, and every stage kind shows up
    ranks_of = {}
    for iv in replay.intervals:
        ranks_of.setdefault(iv.request_id, set()).add(iv.rank)
        assert 0 <= iv.rank < WORLD and iv.end_s >= iv.start_s
    assert all(len(r) == 1 for r in ranks_of.values()) and set(ranks_of) == {r.id for r in reqs}
    assert {iv.kind for iv in replay.intervals} == {"encode", "denoise", "decode"}
    busy = sum(iv.end_s - iv.start_s for iv in replay.intervals)
    assert replay.busy_rank_s == pytest.approx(busy, rel=1e-6)


def test_bad_policy_and_trace_exit_2(trace, tmp_path, capsys):
    argv = ["--trace", trace, "--model", "tiny-wan", "--world-size", str(WORLD)]
    assert _cli("run-trace", [*argv, "--policy", "no-such-policy"]) == 2
    err = capsys.readouterr().err
    assert "no-such-policy" in err and "fcfs" in err and "static" in err and "Traceback" not in err
    assert (
        _cli("run-trace", [*argv[:2], "--model", "tiny-qwen-image", "--world-size", "2", "--policy", "fcfs"])
        == 2
    )
    assert f"{trace}:1:" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "m.json")


def _synthetic_profile(path, trace_path: str, *, model: str = "tiny-wan", world_size: int = WORLD) -> str:
    """A profile of the trace's sizes in which a step on two ranks is ten times slower than on one, as a small
    image's step is on a busy CPU: a policy that reads it keeps every request on one rank."""
    tokens = sorted(
        {
            int(cost_c.model_arch("tiny-wan").tokens(r.height, r.width, r.num_frames))
            for r in load_trace(trace_path)
        }
    )
    entries = []
    for t in tokens:
        entries.append({"stage": "encode", "tokens": t, "seconds": 0.002})
        entries.append({"stage": "decode", "tokens": t, "seconds": 0.003})
        entries.append(
            {"stage": "migrate", "tokens": t, "degree": 2, "ulysses": 2, "num_new": 1, "seconds": 0.001}
        )
        entries.append({"stage": "denoise", "tokens": t, "seconds": 0.005})
        for u, r in ((2, 1), (1, 2)):
            entries.append(
                {"stage": "denoise", "tokens": t, "degree": 2, "ulysses": u, "ring": r, "seconds": 0.05}
            )
    for e in entries:
        e["guidance"] = True
    doc = {"format": "gfdit-profile/2", "model": model, "hardware": "cpu", "world_size": world_size}
    path.write_text(json.dumps({**doc, "num_cores": 2, "entries": entries}))
    return str(path)


@pytest.mark.timeout(90)
def test_replay_with_a_profile_gives_the_policy_predictions(trace, tmp_path):
    reqs = load_trace(trace, model="tiny-wan")
    prof = _synthetic_profile(tmp_path / "p.json", trace)
    # fcfs without predictions assumes perfect scaling and spreads a lone request over both ranks; with
    # this profile's (two ranks ten times slower) it keeps every request on one rank
    replay = run_trace.replay_trace(reqs, model="tiny-wan", world_size=WORLD, policy="fcfs", profile=prof)
    assert all(o.completed for o in replay.outcomes)
    assert "profile of tiny-wan" in replay.where
    steps = [iv for iv in replay.intervals if iv.kind == "denoise"]
    assert steps and {iv.kind for iv in replay.intervals} >= {"encode", "denoise", "decode"}
    per_task = {}
    for iv in steps:
        per_task.setdefault((iv.request_id, iv.start_s), set()).add(iv.rank)
    assert all(len(ranks) == 1 for ranks in per_task.values()), per_task


def test_replay_refuses_a_profile_of_another_model_or_a_smaller_world(trace, tmp_path, capsys):
    reqs = load_trace(trace, model="tiny-wan")
    other = _synthetic_profile(tmp_path / "qwen.json", trace, model="tiny-qwen-image")
    small = _synthetic_profile(tmp_path / "w1.json", trace, world_size=1)
    with pytest.raises(InvalidUsage, match="measured for 'tiny-qwen-image', not 'tiny-wan'"):
        run_trace.replay_trace(reqs, model="tiny-wan", world_size=WORLD, policy="fcfs", profile=other)
    with pytest.raises(InvalidUsage, match="world size 1, below the replay's 2"):
        run_trace.replay_trace(reqs, model="tiny-wan", world_size=WORLD, policy="fcfs", profile=small)
    # a request the profile cannot price (its sizes were never measured) is refused by name
    bigger = [*reqs, TraceRequest(99, reqs[-1].arrival_s, "tiny-wan", 64, 64, 9, 3)]
    prof = _synthetic_profile(tmp_path / "p.json", trace)
    with pytest.raises(InvalidUsage, match="request 99 .64x64x9. is outside what the profile measured"):
        run_trace.replay_trace(bigger, model="tiny-wan", world_size=WORLD, policy="fcfs", profile=prof)
    argv = ["--trace", trace, "--model", "tiny-wan", "--world-size", str(WORLD), "--policy", "fcfs"]
    assert _cli("run-trace", [*argv, "--profile", small]) == 2
    err = capsys.readouterr().err
    assert "world size 1" in err and "gfdit profile" in err and "Traceback" not in err
    assert _cli("run-trace", [*argv, "--profile", str(tmp_path / "missing.json")]) == 2
    assert "cannot read profile" in capsys.readouterr().err
