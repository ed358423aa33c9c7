"""Every built-in policy on the real engine (tiny-wan, world 2, CPU workers) with a profiled cost model, and
one Python policy object in the simulator and in the engine.

The profile is written here, not measured: a step of the video on two ranks is twice as fast as on one and
the image's is six times slower, so the dynamic policies spread a lone video, then shrink it when images
arrive. Each request's output must equal a single-rank run of the same request (same seed), within the
float32 tolerance the engine tests use for parallel attention.
"""

from __future__ import annotations

import json
import time

import gfdit
import pytest
import torch
from gfdit import Decision, Engine, Layout, Policy, Request
from gfdit._C import cost as cost_c
from gfdit.planning import cost, simulate
from gfdit.planning.trace import TraceRequest

WORLD = 2
MODEL = "tiny-wan"
VIDEO = dict(height=64, width=64, num_frames=9, num_inference_steps=6)
IMAGE = dict(height=32, width=32, num_frames=1, num_inference_steps=4)
# the lone video first, then two images and a second video (each with a deadline and a priority)
REQUESTS = [
    dict(prompt="a lone video", seed=11, deadline_s=60.0, priority=0, **VIDEO),
    dict(prompt="an image", seed=12, deadline_s=30.0, priority=1, **IMAGE),
    dict(prompt="another image", seed=13, deadline_s=30.0, priority=0, **IMAGE),
    dict(prompt="a second video", seed=14, deadline_s=60.0, priority=0, **VIDEO),
]
POLICIES = ["fcfs", "srtf", "edf", "priority", "static:1", "static:2"]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / max(b.double().norm(), 1e-30))


def _tokens(r: dict) -> int:
    return int(cost_c.model_arch(MODEL).tokens(r["height"], r["width"], r["num_frames"]))


def _profile(path) -> str:
    """Two ranks halve the video's step and make the image's six times slower (see the module's docstring)."""
    entries = []
    for shape, one, two in ((VIDEO, 0.02, 0.01), (IMAGE, 0.005, 0.03)):
        t = _tokens(shape)
        entries += [
            {"stage": "encode", "tokens": t, "seconds": 0.003},
            {"stage": "decode", "tokens": t, "seconds": 0.01},
            {"stage": "migrate", "tokens": t, "degree": 2, "ulysses": 2, "num_new": 1, "seconds": 0.002},
            {"stage": "denoise", "tokens": t, "seconds": one},
            {"stage": "denoise", "tokens": t, "degree": 2, "ulysses": 2, "seconds": two},
            {"stage": "denoise", "tokens": t, "degree": 2, "ring": 2, "seconds": two * 1.2},
        ]
    for e in entries:
        e["guidance"] = True
    doc = {
        "format": "gfdit-profile/2",
        "model": MODEL,
        "hardware": "cpu",
        "world_size": WORLD,
        "num_cores": 2,
    }
    path.write_text(json.dumps({**doc, "entries": entries}))
    return str(path)


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory) -> str:
    return _profile(tmp_path_factory.mktemp("profile") / "profile.json")


@pytest.fixture(scope="module")
def reference() -> dict[int, torch.Tensor]:
    """Each request alone on a single rank: output by seed."""
    with Engine(model=MODEL, world_size=1, policy="fcfs", timeout_s=30.0) as eng:
        handles = [eng.submit(Request(**r)) for r in REQUESTS]
        return {r["seed"]: h.result(timeout=120).output.clone() for r, h in zip(REQUESTS, handles)}


def _wait_denoising(handle, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end and not handle.done():
        if handle.status()["state"] in ("DENOISING", "DECODING"):
            return
        time.sleep(0.002)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("policy", POLICIES)
def test_policy_completes_every_request_with_the_single_rank_output(policy, profile_path, reference):
    model = cost.cost_model(MODEL, "cpu", profile=profile_path)
    with Engine(model=MODEL, world_size=WORLD, policy=policy, timeout_s=30.0, cost_model=model) as eng:
        first = eng.submit(Request(**REQUESTS[0]))
        _wait_denoising(first)  # the video starts alone: a dynamic policy gives it both ranks
        handles = [first] + [eng.submit(Request(**r)) for r in REQUESTS[1:]]
        results = [h.result(timeout=120) for h in handles]
    for r, res in zip(REQUESTS, results):
        assert res.state == "DONE", (policy, r["prompt"], res.reason)
        assert res.output.shape == reference[r["seed"]].shape
        err = _rel(res.output, reference[r["seed"]])
        assert err <= 1e-4, (policy, r["prompt"], err)
        steps = [s for s in res.timeline if s.kind == "denoise"]
        assert sum(s.num_steps for s in steps) == r["num_inference_steps"]
    groups = [sorted(s.ranks) for s in results[0].timeline if s.kind == "denoise"]
    if policy == "static:1":
        assert all(len(g) == 1 for res in results for g in [s.ranks for s in res.timeline])
    elif policy == "static:2":
        assert all(g == [0, 1] for g in groups)
    else:
        # by the profile the lone video runs faster on both ranks, and the images never do
        assert groups[0] == [0, 1], (policy, groups)
        for res in results[1:3]:
            assert all(len(s.ranks) == 1 for s in res.timeline if s.kind == "denoise"), policy


class CostGreedy(Policy):
    """Shortest predicted remaining time first; a request keeps its holders when they are free and takes two
    ranks when the cost model says its step is faster there and two are free. Reads record.cost,
    record.ranks and view.free_ranks, as a policy written in Python does."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.seen_costs: list[bool] = []
        self.degrees: list[int] = []

    def name(self) -> str:
        return "cost-greedy"

    def schedule(self, view):
        self.calls += 1
        free = list(view.free_ranks)
        out = []
        for r in sorted(view.ready, key=lambda r: (r.remaining_s(1), r.id)):
            if not free:
                break
            self.seen_costs.append(bool(r.cost.known))
            want = 2 if r.cost.known and r.cost.step_s(2) < r.cost.step_s(1) and len(free) >= 2 else 1
            ranks = [w for w in r.ranks if w in free][:want]  # its holders first: nothing moves
            ranks += [w for w in free if w not in ranks][: want - len(ranks)]
            for w in ranks:
                free.remove(w)
            self.degrees.append(len(ranks))
            out.append(Decision(r.id, ranks, Layout(ulysses=len(ranks)), 1))
        return out


@pytest.mark.timeout(120)
def test_one_python_policy_object_in_the_simulator_and_the_engine(profile_path, reference):
    policy = CostGreedy()
    trace = [
        TraceRequest(
            id=i,
            arrival_s=0.05 * i,
            model=MODEL,
            height=r["height"],
            width=r["width"],
            num_frames=r["num_frames"],
            num_inference_steps=r["num_inference_steps"],
            deadline_s=0.05 * i + r["deadline_s"],
            priority=r["priority"],
        )
        for i, r in enumerate(REQUESTS)
    ]
    sim = simulate.simulate_trace(
        trace, model=MODEL, cluster="cpu", policy=policy, profile=profile_path, record_intervals=True
    )
    assert sim.policy == "cost-greedy"
    assert all(o.state == "DONE" for o in sim.outcomes) and len(sim.outcomes) == len(REQUESTS)
    sim_calls = policy.calls
    assert sim_calls > 0 and all(policy.seen_costs) and 2 in policy.degrees

    model = cost.cost_model(MODEL, "cpu", profile=profile_path)
    with Engine(model=MODEL, world_size=WORLD, policy=policy, timeout_s=30.0, cost_model=model) as eng:
        # the video first and alone, so its first decision sees both ranks free whatever the timing later
        first = eng.submit(Request(**REQUESTS[0]))
        _wait_denoising(first)
        handles = [first] + [eng.submit(Request(**r)) for r in REQUESTS[1:]]
        results = [h.result(timeout=120) for h in handles]
    assert policy.calls > sim_calls  # the same object decided in the engine too
    for r, res in zip(REQUESTS, results):
        assert res.state == "DONE"
        assert _rel(res.output, reference[r["seed"]]) <= 1e-4
    # the engine applied what the policy decided: the lone video on two ranks, the images on one
    video_groups = {
        len(s.ranks) for res in (results[0], results[3]) for s in res.timeline if s.kind == "denoise"
    }
    assert 2 in video_groups
    image_groups = {len(s.ranks) for res in results[1:3] for s in res.timeline if s.kind == "denoise"}
    assert image_groups == {1}
    with pytest.raises(gfdit.InvalidUsage, match="gfdit.Policy"):
        simulate.simulate_trace(trace, model=MODEL, cluster="cpu", policy=object(), profile=profile_path)
