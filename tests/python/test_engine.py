"""The trajectory runtime end to end: engine, workers, queues, policies, failures (tiny models, CPU ranks)."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import CancelledError

import conftest
import gfdit
import pytest
import torch
from gfdit import Decision, Engine, Layout, Policy, Request

LIVENESS_INTERVAL_S = gfdit._C.runtime.LIVENESS_INTERVAL_S  # how often the control thread checks its workers


pytestmark = pytest.mark.usefixtures("no_shm_leftovers")


def _assert_gone(engine: Engine) -> None:
    for pid in engine.worker_pids:
        assert not os.path.exists(f"/proc/{pid}"), f"worker {pid} still running"


@pytest.fixture
def faults(monkeypatch):
    """Workers honour NOTE [fault injection] prompts."""
    monkeypatch.setenv("GFDIT_FAULT_INJECTION", "1")


class Scripted(Policy):
    """Runs step k of every request on plan[k] (encode with step 0), one request at a time per rank set."""

    def __init__(self, plan: list[list[int]]) -> None:
        super().__init__()
        self.plan = plan

    def name(self) -> str:
        return "scripted"

    def schedule(self, view):
        free = set(view.free_ranks)
        out = []
        for r in view.ready:
            ranks = self.plan[min(r.step, len(self.plan) - 1)]
            if set(ranks) <= free:
                out.append(Decision(r.id, ranks, Layout(ulysses=len(ranks)), 1))
                free -= set(ranks)
        return out


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / max(b.double().norm(), 1e-30))


def test_mixed_requests_fcfs_and_cancel_and_failure(faults):
    with Engine(model="tiny-wan", world_size=2, policy="fcfs", timeout_s=20.0) as eng:
        video = eng.submit(Request(prompt="a red fox running", num_frames=9, seed=1))
        image = eng.submit(Request(prompt="a lighthouse", num_frames=1, seed=2))
        bad = eng.submit(Request(prompt="gfdit-fault:raise in the worker", seed=3))
        cancelled = eng.submit(Request(prompt="to be cancelled", seed=4, num_inference_steps=20))
        # done callbacks: once per handle whatever the ending, after the result is there; one that raises
        # does not stop the others
        called: list[tuple[int, bool]] = []
        for h in (video, image, bad, cancelled):
            h.add_done_callback(lambda _: 1 / 0)
            h.add_done_callback(lambda h: called.append((h.request_id, h.done())))
        cancelled.cancel()
        v = video.result(timeout=120)
        i = image.result(timeout=120)
        assert v.state == "DONE" and tuple(v.output.shape)[:2] == (3, 9)
        assert i.state == "DONE" and i.output.shape[1] == 1  # one frame
        assert float(v.output.min()) >= 0.0 and float(v.output.max()) <= 1.0
        with pytest.raises(gfdit.RequestFailed, match="injected failure"):
            bad.result(timeout=60)
        with pytest.raises(CancelledError):
            cancelled.result(timeout=60)
        deadline = time.monotonic() + 10
        while len(called) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        ids = [h.request_id for h in (video, image, bad, cancelled)]
        assert sorted(called) == sorted((i, True) for i in ids)
        video.add_done_callback(lambda h: called.append((h.request_id, False)))  # ended: called at once
        assert called[-1] == (video.request_id, False)
        kinds = [s.kind for s in v.timeline]
        assert kinds[0] == "encode" and kinds[-1] == "decode" and kinds.count("denoise") == 4
        states = [t[0] for t in v.transitions]
        assert states[0] == "QUEUED" and states[-1] == "DONE" and "DECODING" in states
        assert all(t1[2] <= t2[2] for t1, t2 in zip(v.transitions, v.transitions[1:]))
        for bad_args in (dict(num_inference_steps=0), dict(height=-8), dict(seed="x"), dict(height=33)):
            with pytest.raises(gfdit.InvalidUsage):
                eng.submit(Request(prompt="refused at submit", **bad_args))
        # the engine keeps serving after a failure
        again = eng.submit(Request(prompt="after the failure", num_frames=1, seed=5))
        assert again.result(timeout=120).state == "DONE"
    _assert_gone(eng)


def test_output_does_not_depend_on_the_schedule():
    req = dict(prompt="a boat on a lake", num_frames=5, seed=11)
    with Engine(model="tiny-wan", world_size=4, policy=Scripted([[0]]), timeout_s=30.0) as eng:
        ref = eng.submit(Request(**req)).result(timeout=180)
        switching = Scripted([[0], [2, 0], [1, 2, 3, 0], [3]])
        eng2_policy = switching
    _assert_gone(eng)
    with Engine(model="tiny-wan", world_size=4, policy=eng2_policy, timeout_s=30.0) as eng2:
        out = eng2.submit(Request(**req)).result(timeout=180)
    _assert_gone(eng2)
    groups = [s.ranks for s in out.timeline if s.kind == "denoise"]
    assert groups == [[0], [2, 0], [1, 2, 3, 0], [3]]
    assert any(s.kind == "migrate" for s in out.timeline)
    assert _rel(out.output, ref.output) <= 1e-4


def test_static_policy_keeps_groups():
    with Engine(model="tiny-qwen-image", world_size=4, policy="static:2", timeout_s=30.0) as eng:
        hs = [eng.submit(Request(prompt=f"a city at night {k}", seed=k)) for k in range(3)]
        results = [h.result(timeout=180) for h in hs]
    _assert_gone(eng)
    for r in results:
        groups = {tuple(s.ranks) for s in r.timeline if s.kind == "denoise"}
        assert len(groups) == 1 and list(groups)[0] in {(0, 1), (2, 3)}
        assert r.output.dim() == 3  # an image [3, H, W]


def test_worker_killed_mid_trajectory_requests_continue():
    req = [dict(prompt=f"a windmill {k}", num_frames=5, seed=20 + k, num_inference_steps=6) for k in range(5)]
    with Engine(model="tiny-wan", world_size=2, policy="fcfs", timeout_s=20.0) as ref_eng:
        refs = [ref_eng.submit(Request(**r)) for r in req]
        ref_out = [h.result(timeout=180).output for h in refs]
    # the survivors alone (a replacement would join them again: test_healing.py)
    with Engine(model="tiny-wan", world_size=3, policy="fcfs", timeout_s=20.0, replace_workers=False) as eng:
        hs = [eng.submit(Request(**r)) for r in req]
        # wait until some denoising happened, then kill worker 1
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if any(h.status().get("step", 0) >= 1 for h in hs):
                break
            time.sleep(0.01)
        t_kill = time.monotonic()
        os.kill(eng.worker_pids[1], signal.SIGKILL)
        while eng.alive_workers()[1] and time.monotonic() - t_kill < 10:
            time.sleep(0.005)
        t_seen_ns = gfdit._C.runtime.now_ns()  # tasks may go to worker 1 until its death is seen
        assert not eng.alive_workers()[1], "the control plane did not notice the dead worker"
        outs = [h.result(timeout=180) for h in hs]
        assert eng.stats()["recoveries"] >= 1, "the world was not re-created among the survivors"
        assert all(1 not in s.ranks for o in outs for s in o.timeline if s.dispatch_ns > t_seen_ns)
    _assert_gone(eng)
    for out, ref in zip(outs, ref_out):
        assert out.state == "DONE"
        assert _rel(out.output, ref) <= 1e-4
        later = [s for s in out.timeline if s.start_ns > 0 and s.kind == "denoise"]
        assert later, "no denoising recorded"


def test_shutdown_with_work_in_flight_cancels():
    eng = Engine(model="tiny-wan", world_size=2, policy="fcfs", timeout_s=20.0, limits={"max_steps": 5000})
    hs = [eng.submit(Request(prompt=f"long {k}", num_inference_steps=2000, seed=k)) for k in range(4)]
    time.sleep(0.3)
    eng.shutdown()
    _assert_gone(eng)
    for h in hs:
        with pytest.raises((CancelledError, gfdit.RequestFailed)):
            h.result(timeout=10)
    with pytest.raises(gfdit.InvalidUsage):
        eng.submit(Request(prompt="too late"))


def test_bad_arguments():
    with pytest.raises(gfdit.InvalidUsage):
        Engine(model="tiny-wan", world_size=0)
    with pytest.raises(gfdit.InvalidUsage):
        Engine(model="tiny-wan", world_size=2, policy="lifo")


def test_bad_requests_are_refused_at_submit_naming_the_field():
    with Engine(model="tiny-qwen-image", world_size=1, policy="fcfs", timeout_s=20.0) as eng:
        cases = [  # (the request's fields, what the message says, the field the error names)
            (dict(num_inference_steps=10**9), "num_inference_steps", "num_inference_steps"),
            (dict(num_inference_steps=10**12), "num_inference_steps", "num_inference_steps"),  # not 32-bit
            (dict(height=100000, width=100000), "pixels", "height"),
            (dict(guidance_scale=float("inf")), "guidance_scale", "guidance_scale"),
            (dict(guidance_scale=float("nan")), "guidance_scale", "guidance_scale"),
            (dict(guidance_scale="high"), "guidance_scale", "guidance_scale"),
            (dict(guidance_scale_2=float("inf")), "guidance_scale_2", "guidance_scale_2"),
            (dict(num_frames=9), "num_frames", "num_frames"),  # an image model
            (dict(height=40), "height", "height"),
            (dict(height=True), "height", "height"),
            (dict(width=-16), "width", "width"),
            (dict(deadline_s=-1.0), "deadline_s", "deadline_s"),
            (dict(priority=2**40), "priority", "priority"),
            (dict(seed=-1), "seed", "seed"),
            (dict(prompt="x" * 100_000), "prompt", "prompt"),
            (dict(prompt=3), "prompt", "prompt"),
            (dict(negative_prompt="x" * 100_000), "negative_prompt", "negative_prompt"),
        ]
        for kwargs, text, field in cases:
            kwargs = {"prompt": "a quiet street", **kwargs}
            with pytest.raises(gfdit.InvalidUsage, match=text) as e:
                eng.submit(Request(**kwargs))
            assert e.value.param == field and e.value.message and e.value.message in str(e.value), kwargs
        assert eng.requests() == {}  # nothing was queued
        # prompts of ordinary length (real ones run to 1-2 KB) fit
        long_prompt = "a very detailed description of a harbour at dawn, " * 40
        assert len(long_prompt) > 1500
        r = eng.submit(Request(prompt=long_prompt, negative_prompt="blurry " * 200, seed=3)).result(
            timeout=120
        )
        assert r.state == "DONE" and r.output.dim() == 3
    with Engine(
        model="tiny-wan", world_size=1, policy="fcfs", timeout_s=20.0, limits={"max_frames": 9}
    ) as eng:
        with pytest.raises(gfdit.InvalidUsage, match="num_frames"):
            eng.submit(Request(prompt="frames not 4k+1", num_frames=8))
        with pytest.raises(gfdit.InvalidUsage, match="num_frames"):
            eng.submit(Request(prompt="over the configured limit", num_frames=13))
        # a second expert's scale on a model with one expert: refused at submit, naming the field
        with pytest.raises(gfdit.InvalidUsage, match="one expert") as e:
            eng.submit(Request(prompt="one expert", guidance_scale_2=3.0))
        assert e.value.param == "guidance_scale_2"
        assert (
            eng.submit(Request(prompt="still serving", num_inference_steps=2)).result(timeout=120).state
            == "DONE"
        )
    with pytest.raises(gfdit.InvalidUsage, match="limit"):
        Engine(model="tiny-wan", world_size=1, limits={"max_widgets": 3})


def test_a_task_that_never_completes_fails_or_retries_its_request(faults):
    # A worker hangs in the encoder; the control plane aborts, then stops the worker, and retries the request
    # on the survivors, where it hangs again: after max_attempts it fails. The other request completes.
    with Engine(
        model="tiny-wan", world_size=3, policy="static:1", timeout_s=20.0, task_timeout_s=1.5, max_attempts=2
    ) as eng:
        stuck = eng.submit(Request(prompt="gfdit-fault:sleep=600 hang", num_frames=1, seed=1))
        fine = eng.submit(Request(prompt="an ordinary request", num_frames=1, seed=2))
        assert fine.result(timeout=120).state == "DONE"
        with pytest.raises(gfdit.RequestFailed, match="failed 2 times|deadline"):
            stuck.result(timeout=120)
        assert eng.stats()["task_timeouts"] >= 1
        assert eng.alive_workers().count(False) >= 1  # the wedged worker was stopped
        # the engine still serves on what is left
        assert (
            eng.submit(Request(prompt="after the hang", num_frames=1, seed=4)).result(timeout=120).state
            == "DONE"
        )
    _assert_gone(eng)


def test_shutdown_removes_a_region_a_killed_worker_left():
    # A worker killed while its world forms (between creating its region and every peer mapping it) leaves the
    # region's name; the engine's workers name their regions under world_shm_prefix, which shutdown clears.
    from multiprocessing import shared_memory

    with Engine(model="tiny-wan", world_size=1, policy="static:1", timeout_s=20.0) as eng:
        prefix = gfdit._C.runtime.world_shm_prefix(eng._loop.queue_name)
        assert prefix.startswith("gfdit-w-")
        left = shared_memory.SharedMemory(name=f"{prefix}-0123456789abcdef", create=True, size=4096)
        left.close()
        assert eng.submit(Request(prompt="one", num_frames=1)).result(timeout=120).state == "DONE"
    assert f"{prefix}-0123456789abcdef" not in conftest.gfdit_shm_names()


def test_world_shm_prefix_is_checked():
    import datetime

    import torch.distributed as dist
    from gfdit import comm

    store = dist.TCPStore(
        "127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=10), wait_for_workers=False
    )
    with pytest.raises(gfdit.InvalidUsage, match="shm_prefix"):
        comm.World(0, 1, store, shm_prefix="a/b")


def test_python_policy_that_raises_fails_its_requests_only():
    class Broken(Policy):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def name(self) -> str:
            return "broken"

        def schedule(self, view):
            self.calls += 1
            if self.calls == 1:
                raise ValueError("no idea")
            return [Decision(r.id, [view.free_ranks[0]], Layout(), 1) for r in view.ready[:1]]

    with Engine(model="tiny-wan", world_size=1, policy=Broken(), timeout_s=20.0) as eng:
        first = eng.submit(Request(prompt="meets the bug", num_frames=1))
        with pytest.raises(gfdit.RequestFailed, match="policy broken failed.*no idea"):
            first.result(timeout=60)
        assert eng.submit(Request(prompt="after it", num_frames=1)).result(timeout=120).state == "DONE"


def test_idle_engine_sleeps_and_progress_is_visible():
    with Engine(model="tiny-wan", world_size=2, policy="fcfs", timeout_s=20.0) as eng:
        h = eng.submit(Request(prompt="progress", num_frames=5, num_inference_steps=6, seed=1))
        seen = set()
        while not h.done():
            s = h.status()
            seen.add((s["state"], s.get("step")))
            time.sleep(0.002)
        assert any(state == "DENOISING" for state, _ in seen), seen
        assert h.result().state == "DONE"
        time.sleep(0.2)
        w0, t0 = eng.stats()["loop_wakeups"], time.monotonic()
        time.sleep(2.0)
        wakeups, elapsed = eng.stats()["loop_wakeups"] - w0, time.monotonic() - t0
        # an idle control thread sleeps on its doorbell and wakes once per liveness check; a thread that
        # polled or spun would wake thousands of times (its CPU use is measured by bench/bench_runtime.py)
        assert wakeups <= elapsed / LIVENESS_INTERVAL_S + 5, f"{wakeups} wake-ups in {elapsed:.2f} s"


def test_listeners_hear_every_request_s_progress_in_order_before_its_result():
    # progress comes in paced batches (NOTE [progress pace]); none is lost, the order is kept, and a request's
    # last progress (DONE) reaches the listeners before its handle's result
    order = ["QUEUED", "ENCODING", "DENOISING", "DECODING", "DONE"]
    seen: list = []
    with Engine(model="tiny-wan", world_size=2, policy="fcfs", timeout_s=20.0) as eng:
        eng.add_progress_listener(lambda p: seen.append((p.id, p.state.name, p.step)))
        hs = [eng.submit(Request(prompt=f"heard {k}", num_inference_steps=6, seed=k)) for k in range(3)]
        results = [h.result(timeout=120) for h in hs]
        for r in results:
            mine = [(order.index(state), step) for rid, state, step in seen if rid == r.request_id]
            assert mine == sorted(mine), mine
            assert mine[-1] == (order.index("DONE"), 6), mine
            assert any(state == order.index("DENOISING") for state, _ in mine), mine


def test_python_policy_sees_holders_shapes_and_the_cost_model():
    from gfdit.planning import cost

    seen = []

    class Watcher(Policy):
        def name(self) -> str:
            return "watcher"

        def schedule(self, view):
            out = []
            free = list(view.free_ranks)
            for r in view.ready:
                seen.append(
                    (r.id, r.step, list(r.ranks), r.tokens, view.cost is not None, list(view.node_of))
                )
                if free:
                    out.append(Decision(r.id, [free.pop(0)], Layout(), 1))
            return out

    model = cost.cost_model("tiny-wan", "h20x8")
    with Engine(model="tiny-wan", world_size=2, policy=Watcher(), timeout_s=20.0, cost_model=model) as eng:
        r = eng.submit(Request(prompt="watched", num_frames=5, height=32, width=48, seed=1)).result(
            timeout=120
        )
    assert r.state == "DONE"
    assert all(has_cost and nodes == [0, 0] for *_, has_cost, nodes in seen)
    assert all(tokens == 2 * 2 * 3 for _, _, _, tokens, _, _ in seen)  # (5-1)/4+1 frames x 32/16 x 48/16
    later = [ranks for _, step, ranks, *_ in seen if step > 0]
    assert later and all(len(ranks) == 1 for ranks in later)  # the holder of its state after step 0


class PlannedLayouts(Policy):
    """Request i (in submit order) runs step k on plans[i][k] = (ranks, Layout), one step per decision."""

    def __init__(self, plans: list[list[tuple[list[int], Layout]]]) -> None:
        super().__init__()
        self.plans = list(plans)
        self.of: dict[int, list[tuple[list[int], Layout]]] = {}

    def name(self) -> str:
        return "planned-layouts"

    def schedule(self, view):
        free = set(view.free_ranks)
        out = []
        for r in view.ready:
            if r.id not in self.of:
                self.of[r.id] = self.plans.pop(0)
            plan = self.of[r.id]
            ranks, layout = plan[min(r.step, len(plan) - 1)]
            if set(ranks) <= free:
                out.append(Decision(r.id, ranks, layout, 1))
                free -= set(ranks)
        return out


def test_cfg_parallel_decisions_give_the_one_rank_output():
    """A Python policy runs steps CFG-parallel (Layout cfg=2: the conditional pass on the first half of the
    ranks, the unconditional on the second, NOTE [CFG-parallel]); the output equals the same request on one
    rank. A CFG-parallel decision for a request without guidance is refused and fails that request only."""

    one = [([0], Layout())]
    cfg = [
        ([0, 1], Layout(cfg=2)),  # one rank per guidance pass
        ([1, 0, 3, 2], gfdit.ParallelSpec(ulysses=2, cfg=2).layout()),  # Ulysses 2 per pass: a migration
        ([2], Layout()),  # both passes in turn on one rank
        ([3, 2], Layout(cfg=2)),
    ]
    req = dict(prompt="a kite over the dunes", num_frames=5, seed=21, guidance_scale=4.0)
    policy = PlannedLayouts([one, cfg, cfg, one])
    with Engine(model="tiny-wan", world_size=4, policy=policy, timeout_s=30.0) as eng:
        ref = eng.submit(Request(**req)).result(timeout=180)
        out = eng.submit(Request(**req)).result(timeout=180)
        plain = eng.submit(Request(**{**req, "guidance_scale": 1.0, "seed": 22}))
        with pytest.raises(gfdit.RequestFailed, match="no guidance"):
            plain.result(timeout=120)
        after = eng.submit(Request(**{**req, "seed": 23})).result(timeout=120)  # the engine goes on
        assert after.state == "DONE"
    _assert_gone(eng)
    steps = [(s.ranks, s.cfg, s.ulysses) for s in out.timeline if s.kind == "denoise"]
    assert steps == [([0, 1], 2, 1), ([1, 0, 3, 2], 2, 2), ([2], 1, 1), ([3, 2], 2, 1)]
    assert any(s.kind == "migrate" for s in out.timeline)
    assert _rel(out.output, ref.output) <= 1e-4


@pytest.mark.parametrize(
    "kwargs,param",
    [
        (dict(limits={"bad": 1}), "limits"),
        (dict(limits={"max_steps": 0}), "limits"),
        (dict(limits={"max_pixels": "many"}), "limits"),
        (dict(world_size=True), "world_size"),
        (dict(world_size=0), "world_size"),
        (dict(max_inflight_steps=0), "max_inflight_steps"),
        (dict(task_timeout_s=-1.0), "task_timeout_s"),
        (dict(policy="no-such-policy"), None),
        (dict(device=["cpu"]), None),  # one device for two workers
    ],
)
def test_a_bad_argument_leaves_no_worker_running(kwargs, param):
    # refused before any worker starts, or every worker started is stopped: no child process, no region left
    import multiprocessing

    before = {p.pid for p in multiprocessing.active_children()}
    args = dict(model="tiny-qwen-image", world_size=2, policy="fcfs") | kwargs
    with pytest.raises(gfdit.InvalidUsage) as err:
        Engine(**args)
    if param is not None:
        assert err.value.param == param
    left = [p for p in multiprocessing.active_children() if p.pid not in before]
    assert not left, f"workers left running: {left}"


@pytest.mark.parametrize("field", ["prompt", "negative_prompt"])
def test_text_that_is_not_unicode_is_refused_naming_its_field(field):
    # a lone surrogate has no UTF-8: it was a pybind RuntimeError, not a request error
    fields = {"prompt": "p", field: "a \ud800 b"}
    with pytest.raises(gfdit.InvalidUsage) as err:
        Request(**fields).message()
    assert err.value.param == field
    assert Request(prompt="\U0001f98a fox").message().prompt == "\U0001f98a fox"
