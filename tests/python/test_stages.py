"""Stages placed by the policy, end to end (NOTE [stages] in src/runtime/control.cpp): tiny-wan on two ranks.

The built-in disaggregated placement (``fcfs:stages=split``: every encode and decode on the last rank, the steps
on the others, the state migrating between them) and a Python policy that places each stage itself
(``places_decodes``; ``Decision(stage=Stage.ENCODE / DECODE)``) give the image a one-rank engine gives, bit for
bit (the text encoder runs once, the state migrates bit for bit, the steps and the decode run on one rank as
there); the default placement (the encode once on the first rank, the steps and a parallel decode on both) gives
it within 1e-5. The timelines show where each stage ran.
"""

from __future__ import annotations

import pytest
from gfdit import Decision, Engine, Policy, Request
from gfdit._C.cost import Stage

pytest.importorskip("diffusers")

REQUESTS = [
    Request(prompt="a red fox in the snow", seed=3, num_frames=5, height=32, width=48),
    Request(prompt="a lighthouse", seed=4, num_frames=5, height=32, width=48, guidance_scale=2.5),
]


def _run(policy) -> list:
    with Engine(
        model="tiny-wan",
        world_size=1 if policy == "static:1" else 2,
        policy=policy,
    ) as eng:
        handles = [eng.submit(r) for r in REQUESTS]
        return [h.result(timeout=300) for h in handles]


def _ranks(result, kind: str) -> set[int]:
    return {w for s in result.timeline if s.kind == kind for w in s.ranks}


class Placed(Policy):
    """Encodes on rank 1, steps on rank 0, decodes on rank 1: each stage as its own decision."""

    def name(self) -> str:
        return "placed"

    def places_decodes(self) -> bool:
        return True

    def schedule(self, view):
        free, out = set(view.free_ranks), []
        for r in view.ready:
            if r.state.name == "QUEUED":
                stage, ranks, steps = Stage.ENCODE, [1], 1
            elif r.steps_left == 0:
                stage, ranks, steps = Stage.DECODE, [1], 1
            else:
                stage, ranks, steps = Stage.DENOISE, [0], r.steps_left
            if set(ranks) <= free:
                free -= set(ranks)
                out.append(Decision(r.id, ranks, num_steps=steps, stage=stage))
        return out


def test_every_placement_gives_the_one_rank_image():
    alone = _run("static:1")
    for policy in ("fcfs:stages=split", Placed()):
        placed = _run(policy)
        for p, a in zip(placed, alone, strict=True):
            assert p.state == "DONE", p.reason
            assert _ranks(p, "encode") == {1} and _ranks(p, "decode") == {1} and _ranks(p, "denoise") == {0}
            assert (p.output - a.output).abs().max().item() == 0.0, policy
    spread = _run("fcfs")
    for p, a in zip(spread, alone, strict=True):
        assert len(_ranks(p, "encode")) == 1  # the text encoder once, on one rank
        assert (p.output - a.output).abs().max().item() <= 1e-5
