"""Batches end to end (NOTE [batches] in src/runtime/control.cpp): engines of tiny models whose policy batches
requests of one shape, against the same requests with batching off.

tiny-qwen-image on one rank, four requests of different prompts (so different text lengths), seeds and
guidance submitted at once: the built-in fcfs policy (with the analytic CPU cost model, which prices batches)
runs them in batched steps (the timelines say so) and every image equals the one fcfs:batch=1 makes alone,
float32 within 1e-5 on [0, 1] pixels. tiny-wan on two ranks with a Python policy that batches every ready
request on both ranks with Ulysses 2, two requests joining at a boundary of the first: the same. A Python
policy's batch of two shapes is refused with the reason (NOTE [refused decisions]).
"""

from __future__ import annotations

import pytest
from gfdit import Decision, Engine, Layout, Policy, Request
from gfdit._C import InvalidUsage as gfdit_InvalidUsage
from gfdit.planning import cost
from gfdit.serving.request import RequestFailed

pytest.importorskip("diffusers")

ATOL = 1e-5


def _requests(n: int, **shape) -> list[Request]:
    return [
        Request(prompt="a red fox " * (i + 1), seed=10 + i, guidance_scale=2.0 + i, **shape) for i in range(n)
    ]


def _run(engine: Engine, requests: list[Request]) -> list:
    handles = [engine.submit(r) for r in requests]
    return [h.result(timeout=300) for h in handles]


def _batches(results) -> list[int]:
    return [s.batch for r in results for s in r.timeline if s.kind == "denoise"]


def test_builtin_policy_batches_small_images_and_each_equals_its_image_alone():
    cm = cost.cost_model("tiny-qwen-image", "cpu")
    reqs = _requests(4, height=64, width=64)
    with Engine(model="tiny-qwen-image", world_size=1, policy="fcfs", cost_model=cm) as eng:
        batched = _run(eng, reqs)
        assert eng.stats()["batched_steps"] > 0
    with Engine(model="tiny-qwen-image", world_size=1, policy="fcfs:batch=1", cost_model=cm) as eng:
        alone = _run(eng, reqs)
    assert max(_batches(batched)) > 1 and max(_batches(alone)) == 1
    for b, a in zip(batched, alone, strict=True):
        assert b.state == "DONE" and a.state == "DONE"
        assert (b.output - a.output).abs().max().item() <= ATOL


class BatchEveryone(Policy):
    """Every ready request of the first one's shape on ranks [0, 1] with Ulysses 2, one step per decision."""

    def __init__(self, mix_shapes: bool = False) -> None:
        super().__init__()
        self.mix_shapes = mix_shapes

    def name(self) -> str:
        return "batch-everyone"

    def schedule(self, view):
        if not view.ready or sorted(view.free_ranks) != [0, 1]:
            return []
        head = view.ready[0]
        others = [r.id for r in view.ready[1:] if self.mix_shapes or r.height == head.height]
        d = Decision(head.id, [0, 1], Layout(ulysses=2), 1, batch=others)
        d.dispatch_ahead = False
        return [d]


def test_a_batch_on_two_ranks_equals_each_request_alone():
    reqs = _requests(3, height=32, width=48, num_frames=5)
    with Engine(model="tiny-wan", world_size=2, policy=BatchEveryone()) as eng:
        first = eng.submit(reqs[0])  # runs a step alone; the others join at a boundary
        rest = [eng.submit(r) for r in reqs[1:]]
        batched = [first.result(timeout=300)] + [h.result(timeout=300) for h in rest]
    with Engine(model="tiny-wan", world_size=1, policy="fcfs:batch=1") as eng:
        alone = _run(eng, reqs)
    assert max(_batches(batched)) == 3
    for b, a in zip(batched, alone, strict=True):
        assert b.state == "DONE", b.reason
        assert (b.output - a.output).abs().max().item() <= ATOL


def test_a_batch_of_two_shapes_is_refused_naming_the_reason():
    # see NOTE [refused decisions]: this policy asks for the same two-shape batch again and again, so when nothing
    # else is in flight its head fails with the reason; the other request, named only in the batch, runs alone
    reqs = [
        Request(prompt="a", height=32, width=48, num_frames=5),
        Request(prompt="b", height=48, width=48, num_frames=5),
    ]
    with Engine(model="tiny-wan", world_size=2, policy=BatchEveryone(mix_shapes=True)) as eng:
        handles = [eng.submit(r) for r in reqs]
        with pytest.raises(RequestFailed, match="cannot batch with request"):
            handles[0].result(timeout=300)
        assert handles[1].result(timeout=300).state == "DONE"
        assert eng.stats()["refused_decisions"] >= 1


def test_requests_submitted_together_run_as_one_batch_on_a_free_cluster():
    # NOTE [planning], 3a: two ranks free, three requests submitted as one job run as one batch of three; a bad
    # field in any of them refuses the whole job with nothing queued
    cm = cost.cost_model("tiny-qwen-image", "cpu")
    reqs = _requests(3, height=64, width=64)
    with Engine(model="tiny-qwen-image", world_size=2, policy="fcfs", cost_model=cm) as eng:
        with pytest.raises(gfdit_InvalidUsage) as bad:
            eng.submit_batch([reqs[0], Request(prompt="x", height=65, width=64)])
        assert bad.value.param == "height"
        assert eng.stats()["submitted"] == 0
        together = [h.result(timeout=300) for h in eng.submit_batch(reqs)]
    with Engine(model="tiny-qwen-image", world_size=1, policy="fcfs:batch=1", cost_model=cm) as eng:
        alone = _run(eng, reqs)
    for t in together:
        assert [s.batch for s in t.timeline if s.kind == "denoise"] == [3] * len(
            [s for s in t.timeline if s.kind == "denoise"]
        )
    for t, a in zip(together, alone, strict=True):
        assert (t.output - a.output).abs().max().item() <= ATOL
