"""Workers that heal (NOTE [healing] in gfdit.serving.engine, NOTE [replacements] in src/runtime/control.cpp): a
worker that dies is reaped and replaced, the replacement joins the world at a step boundary, and no request is
lost, whether one worker dies, two die one after the other, or the only one dies."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import signal
import time

import pytest
import torch
from gfdit import Engine, Request

MODEL = "tiny-qwen-image"
JOIN_TIMEOUT_S = (
    120.0  # a replacement loads torch and the model: seconds on an idle machine, more on a busy one
)


pytestmark = pytest.mark.usefixtures("no_shm_leftovers")


def _request(k: int, steps: int = 6) -> Request:
    return Request(prompt=f"a lighthouse {k}", height=64, width=64, num_inference_steps=steps, seed=100 + k)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / max(b.double().norm(), 1e-30))


def _reaped(pid: int) -> bool:
    """Gone for good: neither running nor a zombie waiting for its parent."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1].split()[0] == "X"
    except FileNotFoundError:
        return True


def _wait(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.05)


def _wait_denoising(handles) -> None:
    _wait(lambda: any(h.status().get("step", 0) >= 1 for h in handles), 120, "a step")


def _kill(eng: Engine, w: int) -> int:
    pid = eng.worker_pids[w]
    os.kill(pid, signal.SIGKILL)
    return pid


def _healthy(eng: Engine) -> bool:
    st = eng.stats()
    return all(st["alive"]) and not st["restarting"]


def test_a_worker_killed_under_load_is_reaped_and_replaced_and_nothing_is_lost():
    # static:2 runs only on both ranks: after the kill no step runs until the replacement has joined, so every
    # request that completes after it proves the world was re-formed with the new process
    with Engine(model=MODEL, world_size=2, policy="static:2", timeout_s=20.0) as eng:
        refs = [eng.submit(_request(k)).result(timeout=120).output for k in range(3)]
        hs = [eng.submit(_request(k % 3)) for k in range(9)]
        _wait_denoising(hs)
        dead = _kill(eng, 1)
        outs = [h.result(timeout=240) for h in hs]
        _wait(lambda: _healthy(eng), JOIN_TIMEOUT_S, "the replacement joined")
        st = eng.stats()
        assert st["worker_deaths"] == 1 and st["replacements"] == 1, st
        assert st["restart_error"] == ""
        assert eng.worker_pids[1] != dead
        assert _reaped(dead), "the dead worker is a zombie"
        for k, out in enumerate(outs):
            assert out.state == "DONE", out.reason
            assert _rel(out.output, refs[k % 3]) <= 1e-4
        # full capacity: the next request runs on both ranks, the replacement among them
        after = eng.submit(_request(0)).result(timeout=120)
        assert all(s.ranks == [0, 1] for s in after.timeline if s.kind == "denoise")
        assert _rel(after.output, refs[0]) <= 1e-4
    for pid in eng.worker_pids:
        assert _reaped(pid)


def test_two_deaths_in_a_row_are_both_replaced():
    with Engine(model=MODEL, world_size=2, policy="fcfs", timeout_s=20.0) as eng:
        hs = [eng.submit(_request(k, steps=8)) for k in range(6)]
        _wait_denoising(hs)
        first = _kill(eng, 1)
        _wait(lambda: eng.stats()["replacements"] >= 1, JOIN_TIMEOUT_S, "the first replacement joined")
        second = _kill(eng, 1)  # the replacement itself, at once
        hs += [eng.submit(_request(k, steps=8)) for k in range(6, 9)]
        outs = [h.result(timeout=300) for h in hs]
        assert all(o.state == "DONE" for o in outs), [o.reason for o in outs]
        _wait(lambda: _healthy(eng), JOIN_TIMEOUT_S, "the second replacement joined")
        st = eng.stats()
        assert st["worker_deaths"] == 2 and st["replacements"] == 2, st
        assert _reaped(first) and _reaped(second)


def test_the_only_worker_dies_and_its_replacement_runs_the_requests_again():
    with Engine(model=MODEL, world_size=1, policy="static:1", timeout_s=20.0) as eng:
        ref = eng.submit(_request(7, steps=10)).result(timeout=120).output
        hs = [eng.submit(_request(7, steps=10)) for _ in range(2)]
        _wait_denoising(hs)
        dead = _kill(eng, 0)
        outs = [h.result(timeout=240) for h in hs]
        for out in outs:
            assert out.state == "DONE", out.reason  # from its beginning: its only copy died
            assert _rel(out.output, ref) <= 1e-4
        assert any(s[0] == "QUEUED" and s[1] == 0 for o in outs for s in o.transitions[1:])
        st = eng.stats()
        assert st["worker_deaths"] == 1 and st["replacements"] == 1, st
        assert _reaped(dead)


def test_a_replacement_that_cannot_start_is_retried_with_a_growing_delay_and_says_why(caplog):
    caplog.set_level(logging.WARNING, logger="gfdit.engine")
    with Engine(model=MODEL, world_size=2, policy="fcfs", timeout_s=20.0) as eng:
        good = eng._config
        eng._config = dataclasses.replace(good, model="no-such-model")  # what a replacement would load
        _kill(eng, 1)
        _wait(lambda: "no-such-model" in eng.stats()["restart_error"], JOIN_TIMEOUT_S, "the first failure")
        # the survivor serves meanwhile
        assert eng.submit(_request(1)).result(timeout=120).state == "DONE"
        _wait(lambda: len(_delays(caplog.text)) >= 2, JOIN_TIMEOUT_S, "a second failure")
        delays = _delays(caplog.text)
        assert delays[1] == pytest.approx(2 * delays[0]), delays
        st = eng.stats()
        assert not st["alive"][1] and st["restarting"] == [1]
        eng._config = good
        _wait(lambda: _healthy(eng), JOIN_TIMEOUT_S + 30, "a replacement that loads the right model")
        assert eng.stats()["replacements"] == 1


def _delays(log: str) -> list[float]:
    return [float(x) for x in re.findall(r"next try in ([0-9.]+) s", log)]


def test_an_engine_that_does_not_replace_goes_on_with_the_survivors():
    with Engine(model=MODEL, world_size=2, policy="fcfs", timeout_s=20.0, replace_workers=False) as eng:
        _kill(eng, 1)
        _wait(lambda: not eng.alive_workers()[1], 10, "the death seen")
        assert eng.submit(_request(2)).result(timeout=120).state == "DONE"
        time.sleep(1.0)
        st = eng.stats()
        assert st["replacements"] == 0 and not st["alive"][1]


def test_requests_wait_for_the_replacement_of_the_only_worker_with_no_error():
    # the control plane with replacements on: the last death keeps the requests (C++ side: ControlPlane tests);
    # here, a request submitted while no worker is alive completes once the replacement joins
    with Engine(model=MODEL, world_size=1, policy="fcfs", timeout_s=20.0) as eng:
        _kill(eng, 0)
        _wait(lambda: not eng.alive_workers()[0], 10, "the death seen")
        h = eng.submit(_request(3))
        assert h.result(timeout=JOIN_TIMEOUT_S).state == "DONE"
        assert eng.stats()["replacements"] == 1
