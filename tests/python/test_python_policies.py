"""A policy written in Python sees every waiting request in ``view.ready`` (built-in policies keep their own
order of them instead: NOTE [ready order] in src/runtime/control.cpp), so one that hands its view to a
built-in decides exactly as that built-in does by itself, also when thousands wait."""

from __future__ import annotations

import random

import pytest
from gfdit import Policy
from gfdit._C import cost as cost_c
from gfdit._C import runtime as rt
from gfdit.planning import cost

POLICIES = ["fcfs", "srtf", "edf", "priority", "static:2"]


class Delegate(Policy):
    """Answers what a built-in answers on the same view; counts what it was shown."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.inner = rt.make_policy(name)
        self.most_ready = 0
        self.in_arrival_order = True

    def name(self) -> str:
        return "delegate-" + self.inner.name()

    def schedule(self, view):
        ready = view.ready
        self.most_ready = max(self.most_ready, len(ready))
        keys = [(r.arrival_ns, r.id) for r in ready]
        self.in_arrival_order &= keys == sorted(keys)
        return self.inner.schedule(view)


def _overload(n: int, rate: float, seed: int = 3) -> list:
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        side = rng.choice([512, 768, 1024])
        deadline = t + rng.uniform(5, 120) if rng.random() < 0.7 else None
        out.append(
            rt.SimRequest(
                id=i,
                arrival_s=t,
                height=side,
                width=side,
                num_frames=1,
                num_steps=rng.randint(10, 30),
                deadline_s=deadline,
                priority=rng.randint(0, 2),
            )
        )
    return out


@pytest.mark.parametrize("name", POLICIES)
def test_a_python_policy_sees_every_waiting_request(name):
    cluster = cost_c.cluster("h20x8")
    model = cost.cost_model("qwen-image", "h20x8")
    reqs = _overload(300, 1.0)  # about three times what eight H20s serve
    built_in = rt.Simulator(model, cluster, name).run(reqs)
    delegate = Delegate(name)
    python = rt.Simulator(model, cluster, delegate).run(reqs)
    assert delegate.most_ready > 100, "the queue was meant to grow"
    assert delegate.in_arrival_order
    for a, b in zip(built_in.requests, python.requests):
        assert (a.id, a.state, a.finish_s, a.first_start_s) == (b.id, b.state, b.finish_s, b.first_start_s)
    assert built_in.num_tasks == python.num_tasks
