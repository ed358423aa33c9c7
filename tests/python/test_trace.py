"""Trace format (gfdit.planning.trace): good traces load, malformed ones are refused naming the line, round trips;
replay metrics against hand-computed values."""

from __future__ import annotations

import json
import math

import gfdit
import pytest
from gfdit._C import cost as cost_c
from gfdit.planning.trace import (
    SUMMARY_KEYS,
    Outcome,
    TraceRequest,
    load_trace,
    percentile,
    summarize,
    write_trace,
)


def _line(arch, **changes) -> dict:
    """A valid request line for `arch` at its default size, with `changes` applied (None deletes a key)."""
    d = {
        "id": 0,
        "arrival_s": 0.0,
        "model": arch.name,
        "height": int(arch.default_height),
        "width": int(arch.default_width),
        "num_frames": int(arch.default_frames) if arch.is_video else 1,
        "num_inference_steps": 2,
        "deadline_s": None,
    }
    for k, v in changes.items():
        if v is _DELETE:
            d.pop(k)
        else:
            d[k] = v
    return d


_DELETE = object()


def _write(path, lines) -> str:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    return str(path)


@pytest.fixture
def wan():
    return cost_c.model_arch("tiny-wan")


@pytest.fixture
def qwen():
    return cost_c.model_arch("tiny-qwen-image")


# ------------------------------------------------------------------------------------------------ loading
def test_good_trace_loads(tmp_path, wan):
    m = wan.spatial_multiple()
    lines = [
        _line(wan, id=3, arrival_s=0, deadline_s=2),
        "",
        _line(wan, id=1, arrival_s=0.5, num_frames=1, priority=2),
        _line(wan, id=7, arrival_s=0.5, height=wan.default_height + m, num_frames=wan.vae_stride_t + 1),
    ]
    reqs = load_trace(_write(tmp_path / "t.jsonl", lines), model="tiny-wan")
    assert [r.id for r in reqs] == [3, 1, 7]
    assert reqs[0] == TraceRequest(
        id=3,
        arrival_s=0.0,
        model="tiny-wan",
        height=wan.default_height,
        width=wan.default_width,
        num_frames=wan.default_frames,
        num_inference_steps=2,
        deadline_s=2.0,
        priority=0,
    )
    assert isinstance(reqs[0].arrival_s, float) and isinstance(reqs[0].deadline_s, float)
    assert reqs[1].priority == 2 and reqs[1].deadline_s is None and reqs[1].num_frames == 1
    assert reqs[2].num_frames == wan.vae_stride_t + 1
    # without a model argument any known model is accepted
    assert len(load_trace(_write(tmp_path / "u.jsonl", [_line(wan)]))) == 1


def test_round_trip(tmp_path, wan, qwen):
    reqs = [
        TraceRequest(0, 0.0, "tiny-wan", wan.default_height, wan.default_width, 1, 3, None),
        TraceRequest(
            5, 0.25, "tiny-wan", wan.default_height, wan.default_width, wan.default_frames, 2, 4.5, 3
        ),
        TraceRequest(2, 1.0, "tiny-wan", 2 * wan.default_height, wan.default_width, 1, 1, 1.5, -1),
    ]
    path = str(tmp_path / "rt.jsonl")
    write_trace(path, reqs)
    assert load_trace(path) == reqs
    with open(path) as f:
        first = json.loads(f.readline())
    assert list(first) == [
        "id",
        "arrival_s",
        "model",
        "height",
        "width",
        "num_frames",
        "num_inference_steps",
        "deadline_s",
        "priority",
    ]
    q = [TraceRequest(1, 0.0, "tiny-qwen-image", qwen.default_height, qwen.default_width, 1, 2, None)]
    write_trace(path, q)
    assert load_trace(path, model="tiny-qwen-image") == q


def _bad_cases(wan, qwen):
    """(lines, model argument, bad line number, words the message must contain)."""
    m = wan.spatial_multiple()
    ok = _line(wan)
    cases = {
        "bad json": ([ok, '{"id": 1, "arrival_s": '], None, 2, ["JSON"]),
        "not an object": (["[1, 2]"], None, 1, ["object"]),
        "missing field": ([_line(wan, width=_DELETE)], None, 1, ["missing", "width"]),
        "missing deadline": ([_line(wan, deadline_s=_DELETE)], None, 1, ["missing", "deadline_s"]),
        "unknown field": ([_line(wan, seed=3)], None, 1, ["unknown field", "seed"]),
        "string height": ([_line(wan, height=str(wan.default_height))], None, 1, ["height", "integer"]),
        "float steps": ([_line(wan, num_inference_steps=2.0)], None, 1, ["num_inference_steps", "integer"]),
        "bool id": ([_line(wan, id=True)], None, 1, ["id", "integer"]),
        "string arrival": ([_line(wan, arrival_s="0")], None, 1, ["arrival_s", "number"]),
        "string deadline": ([_line(wan, deadline_s="soon")], None, 1, ["deadline_s"]),
        "float priority": ([_line(wan, priority=0.5)], None, 1, ["priority", "integer"]),
        "negative id": ([_line(wan, id=-1)], None, 1, ["id", "negative"]),
        "negative arrival": ([_line(wan, arrival_s=-0.5)], None, 1, ["arrival_s", "negative"]),
        "negative deadline": ([_line(wan, deadline_s=-1.0)], None, 1, ["deadline_s", "negative"]),
        "out of order": (
            [ok, _line(wan, id=1, arrival_s=2.0), _line(wan, id=2, arrival_s=1.0)],
            None,
            3,
            ["arrival"],
        ),
        "duplicate id": ([ok, _line(wan, arrival_s=1.0)], None, 2, ["duplicate", "line 1"]),
        "deadline before arrival": (
            [_line(wan, arrival_s=3.0, deadline_s=2.0)],
            None,
            1,
            ["deadline_s", "after"],
        ),
        "deadline at arrival": (
            [_line(wan, arrival_s=3.0, deadline_s=3.0)],
            None,
            1,
            ["deadline_s", "after"],
        ),
        "unknown model": ([_line(wan, model="no-such-model")], None, 1, ["no-such-model", "tiny-wan"]),
        "other model": ([ok, _line(qwen, id=1)], "tiny-wan", 2, ["tiny-qwen-image", "tiny-wan"]),
        "height not patchable": ([_line(wan, height=wan.default_height + m // 2)], None, 1, ["height"]),
        "width not patchable": ([_line(wan, width=wan.default_width + 1)], None, 1, ["width"]),
        "video frames": ([_line(wan, num_frames=wan.vae_stride_t + 2)], None, 1, ["num_frames"]),
        "frames of an image model": ([_line(qwen, num_frames=5)], None, 1, ["num_frames"]),
        "zero steps": ([_line(wan, num_inference_steps=0)], None, 1, ["num_inference_steps"]),
        "zero height": ([_line(wan, height=0)], None, 1, ["height"]),
    }
    if wan.max_steps:
        cases["too many steps"] = (
            [_line(wan, num_inference_steps=wan.max_steps + 1)],
            None,
            1,
            ["num_inference_steps"],
        )
    if wan.max_pixels:
        side = m * (math.isqrt(wan.max_pixels) // m + 1)
        cases["too large"] = ([_line(wan, height=side, width=side, num_frames=1)], None, 1, [])
    if wan.max_frames:
        k = (wan.max_frames - 1) // wan.vae_stride_t + 1
        cases["too many frames"] = (
            [_line(wan, num_frames=wan.vae_stride_t * k + 1)],
            None,
            1,
            ["num_frames"],
        )
    return cases


def test_malformed_traces_name_the_line(tmp_path, wan, qwen):
    for name, (lines, model, lineno, words) in _bad_cases(wan, qwen).items():
        path = _write(tmp_path / "bad.jsonl", lines)
        with pytest.raises(gfdit.InvalidUsage) as info:
            load_trace(path, model=model)
        msg = str(info.value)
        assert f"{path}:{lineno}:" in msg, f"{name}: {msg}"
        for w in words:
            assert w.lower() in msg.lower(), f"{name}: {w!r} not in {msg!r}"


def test_empty_and_missing_traces(tmp_path, wan):
    with pytest.raises(gfdit.InvalidUsage, match="no requests"):
        load_trace(_write(tmp_path / "empty.jsonl", ["", "  "]))
    with pytest.raises(gfdit.InvalidUsage, match="cannot read"):
        load_trace(str(tmp_path / "nowhere.jsonl"))
    with pytest.raises(gfdit.InvalidUsage, match="unknown model"):
        load_trace(_write(tmp_path / "ok.jsonl", [_line(wan)]), model="no-such-model")


# ------------------------------------------------------------------------------------------------ metrics
def test_percentile_interpolates_linearly():
    assert percentile([5.0], 99) == 5.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile([0.0, 10.0], 99) == pytest.approx(9.9)
    assert percentile([1.0, 2.0, 3.0], 0) == 1.0 and percentile([1.0, 2.0, 3.0], 100) == 3.0


def test_summarize_by_hand():
    outcomes = [
        Outcome(id=0, arrival_s=0.0, finish_s=2.0, deadline_s=3.0, state="DONE"),  # latency 2, met
        Outcome(id=1, arrival_s=1.0, finish_s=4.0, deadline_s=3.5, state="DONE"),  # latency 3, missed
        Outcome(id=2, arrival_s=2.0, finish_s=None, deadline_s=10.0, state="FAILED"),  # missed
        Outcome(id=3, arrival_s=3.0, finish_s=5.0, deadline_s=None, state="DONE"),  # latency 2
    ]
    s = summarize("fcfs", outcomes, busy_rank_s=6.0, num_ranks=2)
    assert tuple(s) == SUMMARY_KEYS
    assert s["policy"] == "fcfs" and s["num_requests"] == 4
    assert s["throughput_rps"] == pytest.approx(3 / 5)  # 3 completed over 0 .. 5 s
    assert s["mean_latency_s"] == pytest.approx(7 / 3)
    assert s["p50_latency_s"] == pytest.approx(2.0)  # sorted 2, 2, 3: position 1
    assert s["p99_latency_s"] == pytest.approx(2.98)  # position 1.98: 2 + 0.98 * (3 - 2)
    assert s["slo_attainment"] == pytest.approx(1 / 3)  # of 0, 1, 2 only 0 met its deadline
    assert s["utilization"] == pytest.approx(6.0 / (2 * 5.0))
    json.dumps(s)  # plain JSON


def test_summarize_without_deadlines_or_completions():
    outcomes = [
        Outcome(id=0, arrival_s=1.0, finish_s=1.5, deadline_s=None, state="DONE"),
        Outcome(id=1, arrival_s=2.0, finish_s=3.0, deadline_s=None, state="DONE"),
    ]
    s = summarize("static:2", outcomes, busy_rank_s=1.0, num_ranks=4)
    assert s["slo_attainment"] is None
    assert s["mean_latency_s"] == pytest.approx(0.75) and s["p50_latency_s"] == pytest.approx(0.75)
    assert s["throughput_rps"] == pytest.approx(2 / 2.0) and s["utilization"] == pytest.approx(1.0 / 8.0)
    failed = [Outcome(id=0, arrival_s=0.0, finish_s=None, deadline_s=1.0, state="FAILED")]
    s = summarize("fcfs", failed, busy_rank_s=0.0, num_ranks=2)
    assert s["num_requests"] == 1 and s["slo_attainment"] == 0.0
    assert s["throughput_rps"] is None and s["mean_latency_s"] is None and s["utilization"] is None
    assert json.loads(json.dumps(s))["p99_latency_s"] is None
