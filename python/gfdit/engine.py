"""The engine: control plane of the trajectory runtime (DESIGN.md, "Runtime").

One control thread owns the C++ scheduler (request state machine + policy). It reacts to arrivals,
cancellations, completions and worker deaths, asks the policy for decisions at step boundaries, and writes
fixed-size task descriptors into the workers' shared-memory dispatch rings. Writing a descriptor is all a
dispatch costs: the engine never waits for a worker.

NOTE [dispatch order]
Every task goes out from the one control thread, so all tasks form one total order, and each worker runs
its ring in FIFO order. Hence every pair of workers meets the collectives of their shared tasks in the
same order, which is what the group-free collectives need to be deadlock-free (NOTE [group-free
collectives] in include/gfdit/world.h). A task may therefore be queued behind a busy holder (a migration
from a rank that is still running another request): it simply runs when that rank gets to it.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import itertools
import json
import multiprocessing as mp
import os
import threading
import time
from concurrent.futures import CancelledError
from typing import Any

import torch

from gfdit._C import InvalidUsage
from gfdit._C import runtime as rt

RequestState = rt.RequestState
TaskKind = rt.TaskKind
Policy = rt.Policy
Decision = rt.Decision
Layout = rt.Layout

_FINISHED = (RequestState.DONE, RequestState.FAILED, RequestState.CANCELLED)


@dataclasses.dataclass
class Request:
    """One generation request. Sizes default to the model's defaults."""

    prompt: str
    negative_prompt: str | None = None
    height: int | None = None
    width: int | None = None
    num_frames: int | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    seed: int = 0
    deadline_s: float | None = None  # seconds after submit
    priority: int = 0  # larger is more urgent (policies that use priorities)


@dataclasses.dataclass
class Stage:
    """One task of a request as it ran: what, where, with which layout, when (monotonic ns)."""

    kind: str
    ranks: list[int]
    ulysses: int
    ring: int
    mode: str
    step_begin: int
    num_steps: int
    dispatch_ns: int
    start_ns: int
    end_ns: int


@dataclasses.dataclass
class Result:
    request_id: int
    output: torch.Tensor | None
    state: str
    reason: str
    timeline: list[Stage]
    transitions: list[tuple[str, int, int]]  # (state, step, t_ns)


class RequestFailed(RuntimeError):
    """The request ended FAILED; the message says why."""


class RequestHandle:
    """What submit returns: wait for the result, or cancel."""

    def __init__(self, engine: "Engine", request_id: int) -> None:
        self._engine = engine
        self.request_id = request_id
        self._event = threading.Event()
        self._result: Result | None = None

    def result(self, timeout: float | None = None) -> Result:
        """The output and its timeline. Raises RequestFailed, CancelledError, or TimeoutError."""
        if not self._event.wait(timeout):
            raise TimeoutError(f"request {self.request_id} not finished within {timeout} s")
        r = self._result
        assert r is not None
        if r.state == "FAILED":
            raise RequestFailed(f"request {self.request_id} failed: {r.reason}")
        if r.state == "CANCELLED":
            raise CancelledError(f"request {self.request_id} was cancelled: {r.reason}")
        return r

    def done(self) -> bool:
        return self._event.is_set()

    def cancel(self) -> None:
        """Cancels the request; its output, if any, is dropped."""
        self._engine._inbox.append(("cancel", self.request_id, None))
        self._engine._wake()

    def _finish(self, result: Result) -> None:
        self._result = result
        self._event.set()


@dataclasses.dataclass
class _Task:
    task_id: int
    request_id: int
    kind: Any
    ranks: list[int]
    layout: Any
    step_begin: int
    num_steps: int
    dispatch_ns: int
    pending: set[int]
    ok: bool = True
    message: str = ""
    start_ns: int = 0
    end_ns: int = 0
    step_end: int = 0


@dataclasses.dataclass
class _Req:
    spec: Request
    handle: RequestHandle
    timeline: list[Stage] = dataclasses.field(default_factory=list)
    holders: list[int] = dataclasses.field(default_factory=list)  # workers whose state is at record.step
    cancel: bool = False
    output: torch.Tensor | None = None
    # a decision in progress: steps not yet dispatched, and the group/layout they run on
    todo_steps: int = 0
    group: list[int] = dataclasses.field(default_factory=list)
    layout: Any = None
    inflight: int = 0
    next_step: int = 0      # the step the next denoise task of the decision starts at
    payload: bytes = b""    # the request as JSON, for encode tasks
    decoded: bool = False   # the decode task completed (the output may still be on its way)


class Engine:
    """Starts one worker per rank and serves requests on them.

    model: a name for gfdit.models.load ("tiny-wan", "tiny-qwen-image", "wan2.2", "qwen-image"); model_path
    for real weights. policy: "fcfs", "static:D" or a gfdit.Policy object. max_inflight_steps: how many
    steps of one request may be dispatched ahead of completions. Use as a context manager or call shutdown().
    """

    def __init__(self, model: str = "tiny-wan", world_size: int = 2, policy: Any = "fcfs",
                 model_path: str | None = None, max_inflight_steps: int = 2, timeout_s: float = 60.0,
                 heap_bytes: int = 64 << 20, threads_per_worker: int = 1, start_timeout_s: float = 120.0) -> None:
        import torch.distributed as dist

        if world_size < 1 or world_size > 64:
            raise InvalidUsage(f"gfdit.Engine: world_size {world_size} is outside [1, 64]")
        if max_inflight_steps < 1:
            raise InvalidUsage("gfdit.Engine: max_inflight_steps must be >= 1")
        self.world_size = world_size
        self.max_inflight_steps = max_inflight_steps
        self._scheduler = rt.Scheduler(world_size, policy)
        self.policy_name = self._scheduler.policy_name
        self._queues = rt.QueueSet.create(world_size, 256)
        self._store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=datetime.timedelta(seconds=60),
                                    wait_for_workers=False)
        ctx = mp.get_context("spawn")
        self._results = ctx.Queue()
        from gfdit import worker

        self._procs = []
        for w in range(world_size):
            p = ctx.Process(target=worker.main, name=f"gfdit-worker-{w}", daemon=True,
                            args=(w, world_size, "127.0.0.1", self._store.port, self._queues.name, model, model_path,
                                  self._results, timeout_s, heap_bytes, threads_per_worker))
            p.start()
            self._procs.append(p)
        self._alive = [True] * world_size
        self._next_task = 1
        self._request_ids = itertools.count(1)
        self._tasks: dict[int, _Task] = {}
        self._reqs: dict[int, _Req] = {}
        self._inbox: collections.deque = collections.deque()  # append/popleft are thread-safe
        self._stash: dict[int, Any] = {}
        self._stash_lock = threading.Lock()
        self._pings: dict[int, Any] = {}
        self._last_liveness = 0.0
        self._epoch = 0
        self._recovering = False
        self._closed = False
        self.model_info: dict = {}
        self.control_ns = 0  # control-plane CPU time (thread time), for benchmarks
        try:
            self._await_workers(start_timeout_s)
        except BaseException:
            self._kill_all()
            raise
        self._queues.unlink_name()  # every worker mapped it: nothing remains in /dev/shm
        self._thread = threading.Thread(target=self._loop, name="gfdit-engine", daemon=True)
        self._thread.start()
        self._output_thread = threading.Thread(target=self._receive_outputs, name="gfdit-outputs", daemon=True)
        self._output_thread.start()

    # ---- public ----

    def submit(self, request: Request) -> RequestHandle:
        """Queues a request; returns at once."""
        if self._closed:
            raise InvalidUsage("gfdit.Engine: submit after shutdown")
        if not isinstance(request, Request):
            raise InvalidUsage("gfdit.Engine.submit takes a gfdit.Request")
        if not isinstance(request.prompt, str):
            raise InvalidUsage("gfdit.Request: prompt must be a string")
        for name in ("height", "width", "num_frames", "num_inference_steps"):
            v = getattr(request, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise InvalidUsage(f"gfdit.Request: {name} must be a positive integer, got {v!r}")
        if isinstance(request.seed, bool) or not isinstance(request.seed, int):
            raise InvalidUsage(f"gfdit.Request: seed must be an integer, got {request.seed!r}")
        payload = self._payload(request)
        rid = next(self._request_ids)  # atomic under the GIL: submit may be called from several threads
        handle = RequestHandle(self, rid)
        self._inbox.append(("submit", rid, (request, handle, payload)))
        self._wake()
        return handle

    def _wake(self) -> None:
        """Wakes the control loop (blocked on the completion ring) for an inbox event."""
        c = rt.Completion()
        c.task_id = 0  # not a task: ignored, but the ring's doorbell wakes the loop
        self._queues.push_completion(c, 1.0)

    def shutdown(self, timeout: float = 30.0) -> None:
        """Ends requests in flight as CANCELLED, stops the workers; leaves no process and no shared memory."""
        if self._closed:
            return
        self._closed = True
        self._inbox.append(("shutdown", 0, None))
        self._wake()
        self._thread.join(timeout)
        for w, p in enumerate(self._procs):
            if self._alive[w]:
                t = rt.TaskDescriptor()
                t.kind = TaskKind.SHUTDOWN
                self._queues.push_task(w, t, 1.0)
        deadline = time.monotonic() + timeout
        for p in self._procs:
            p.join(max(0.0, deadline - time.monotonic()))
        self._kill_all()
        self._results.put(None)  # ends the output thread
        self._output_thread.join(5.0)
        self._results.close()
        self._results.join_thread()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def ping(self, worker: int, count: int = 100, timeout: float = 30.0) -> list[tuple[int, int, int, int]]:
        """Round trips of an empty task to an idle worker: (dispatch, start, post, seen) ns each, for latency
        measurements. Each ping waits for the previous one."""
        out: list[tuple[int, int, int, int]] = []
        for _ in range(count):
            done = threading.Event()
            self._inbox.append(("ping", worker, (done, out)))
            self._wake()
            if not done.wait(timeout):
                raise TimeoutError(f"gfdit.Engine: ping of worker {worker} not answered in {timeout} s")
        return out

    def requests(self) -> dict[int, str]:
        """State name of every request the engine knows."""
        return {rid: r.handle._result.state if r.handle._result else "RUNNING" for rid, r in self._reqs.items()}

    # ---- start-up ----

    def _payload(self, r: Request) -> bytes:
        d = {k: v for k, v in dataclasses.asdict(r).items() if k not in ("deadline_s", "priority") and v is not None}
        b = json.dumps(d).encode()
        if len(b) > rt.PAYLOAD_BYTES:
            raise InvalidUsage(f"gfdit.Request: the request is {len(b)} bytes as JSON; at most {rt.PAYLOAD_BYTES} "
                               "(shorten the prompt)")
        return b

    def _await_workers(self, timeout: float) -> None:
        seen = set()
        deadline = time.monotonic() + timeout
        while len(seen) < self.world_size:
            c = self._queues.pop_completion(0.1)
            if c is None:
                for w, p in enumerate(self._procs):
                    if not p.is_alive():
                        raise RuntimeError(f"gfdit.Engine: worker {w} exited during start-up (code {p.exitcode})")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"gfdit.Engine: workers not ready within {timeout} s")
                continue
            if c.task_id != 0:
                continue
            if not c.ok:
                raise RuntimeError(f"gfdit.Engine: worker {c.rank}: {c.message}")
            self.model_info = json.loads(c.message)
            seen.add(c.rank)

    def _kill_all(self) -> None:
        for p in self._procs:
            if p.is_alive():
                p.kill()
            p.join(5.0)
        self._queues.unlink_name()

    # ---- the control loop ----

    def _loop(self) -> None:
        try:
            while True:
                c = self._queues.pop_completion(0.005)
                t0 = time.thread_time_ns()
                changed = c is not None
                while c is not None:
                    seen = rt.now_ns()
                    self._on_completion(c, seen)
                    c = self._queues.pop_completion(0.0)
                stop, arrived = self._drain_inbox()
                changed |= arrived
                changed |= self._check_workers()
                if stop:
                    self._cancel_all("engine shut down")
                    return
                # The policy runs only when something happened: a completion, an arrival, a death.
                if changed and not self._recovering:
                    self._schedule()
                self.control_ns += time.thread_time_ns() - t0
        except Exception as e:  # a bug in the control plane must not leave callers waiting forever
            self._cancel_all(f"engine control loop failed: {type(e).__name__}: {e}", failed=True)
            raise

    def _drain_inbox(self) -> tuple[bool, bool]:
        """(shutdown asked, anything arrived)."""
        arrived = False
        while self._inbox:
            what, rid, arg = self._inbox.popleft()
            arrived = True
            if what == "shutdown":
                return True, arrived
            if what == "submit":
                request, handle, payload = arg
                rec = rt.RequestRecord()
                rec.id = rid
                steps = request.num_inference_steps or self.model_info.get("defaults", {}).get("num_inference_steps", 1)
                rec.num_steps = int(steps)
                if request.deadline_s is not None:
                    rec.deadline_ns = rt.now_ns() + int(request.deadline_s * 1e9)
                rec.max_degree = self._max_degree()
                self._scheduler.add_request(rec)
                self._reqs[rid] = _Req(spec=request, handle=handle, payload=payload)
            elif what == "ping":
                self._dispatch(0, TaskKind.FREE, [rid])
                self._pings[self._next_task - 1] = arg
            elif what == "cancel":
                r = self._reqs.get(rid)
                if r is not None and not r.handle.done():
                    r.cancel = True
                    if not self._scheduler.request(rid).busy:
                        self._finish(rid, RequestState.CANCELLED, "cancelled by the caller")
            elif what == "output":
                self._output_arrived(rid)
        return False, arrived

    def _max_degree(self) -> int:
        heads = int(self.model_info.get("heads", 1))
        d = 1
        while d * 2 <= self.world_size and heads % (d * 2) == 0:
            d *= 2
        return d

    # ---- dispatch ----

    def _dispatch(self, rid: int, kind: Any, ranks: list[int], layout: Any = None, step_begin: int = 0,
                  num_steps: int = 0, src: int = -1, payload: bytes = b"") -> None:
        t = rt.TaskDescriptor()
        t.task_id = self._next_task
        self._next_task += 1
        t.request_id = rid
        t.kind = kind
        t.ranks = ranks
        if layout is not None:
            t.layout = layout
        t.step_begin = step_begin
        t.num_steps = num_steps
        t.src_rank = src
        if payload:
            t.payload = payload
        t.dispatch_ns = rt.now_ns()
        members = [src] + [r for r in ranks if r != src] if kind == TaskKind.MIGRATE else ranks
        for w in sorted(set(members)):
            if not self._queues.push_task(w, t, 5.0):
                raise RuntimeError(f"gfdit.Engine: dispatch queue of worker {w} stayed full for 5 s")
        self._tasks[t.task_id] = _Task(t.task_id, rid, kind, list(ranks), layout, step_begin, num_steps,
                                       t.dispatch_ns, set(members))
        if rid in self._reqs and kind in (TaskKind.ENCODE, TaskKind.DENOISE, TaskKind.MIGRATE, TaskKind.DECODE):
            self._reqs[rid].inflight += 1

    def _schedule(self) -> None:
        for d in self._scheduler.schedule():
            self._start_decision(d)

    def _start_decision(self, d: Any) -> None:
        rid = d.request_id
        r = self._reqs[rid]
        rec = self._scheduler.request(rid)
        ranks = list(d.ranks)
        self._scheduler.occupy(ranks)
        self._scheduler.set_busy(rid, True)
        r.group, r.layout = ranks, d.layout
        r.todo_steps = min(int(d.num_steps), rec.num_steps - rec.step)
        r.next_step = rec.step
        if rec.state == RequestState.QUEUED:
            self._scheduler.transition(rid, RequestState.ENCODING)
            self._dispatch(rid, TaskKind.ENCODE, ranks, payload=r.payload)
            r.holders = list(ranks)
        else:
            new = [w for w in ranks if w not in r.holders]
            if new:
                src = next((w for w in ranks if w in r.holders), r.holders[0])
                self._dispatch(rid, TaskKind.MIGRATE, [src] + new, step_begin=rec.step, src=src)
            stale = [w for w in r.holders if w not in ranks]
            if stale:
                self._dispatch(rid, TaskKind.FREE, stale)  # FIFO: after the migration that read them
            r.holders = list(ranks)
        self._pump(rid)

    def _pump(self, rid: int) -> None:
        """Dispatches the decision's next steps, at most max_inflight_steps ahead of completions."""
        r = self._reqs[rid]
        while r.todo_steps > 0 and r.inflight <= self.max_inflight_steps:
            r.todo_steps -= 1
            self._dispatch(rid, TaskKind.DENOISE, r.group, r.layout, step_begin=r.next_step, num_steps=1)
            r.next_step += 1

    # ---- completions ----

    def _on_completion(self, c: Any, seen_ns: int) -> None:
        t = self._tasks.get(c.task_id)
        if t is None:  # a worker's hello after a restart, or a task of a finished request
            return
        ping = self._pings.pop(c.task_id, None)
        if ping is not None:
            ping[1].append((c.dispatch_ns, c.start_ns, c.post_ns, seen_ns))
            ping[0].set()
        t.pending.discard(c.rank)
        t.start_ns = min(t.start_ns or c.start_ns, c.start_ns)
        t.end_ns = max(t.end_ns, c.end_ns)
        t.step_end = c.step_end
        if not c.ok:
            t.ok = False
            t.message = t.message or f"worker {c.rank}: {c.message}"
        if not t.pending:
            self._task_done(t)

    def _task_done(self, t: _Task) -> None:
        del self._tasks[t.task_id]
        rid = t.request_id
        r = self._reqs.get(rid)
        if t.kind == TaskKind.REINIT:
            self._reinit_done(t)
            return
        if r is None or t.kind == TaskKind.FREE:
            return
        if t.kind in (TaskKind.ENCODE, TaskKind.DENOISE, TaskKind.MIGRATE, TaskKind.DECODE):
            r.inflight -= 1
        layout = t.layout
        r.timeline.append(Stage(kind=t.kind.name.lower(), ranks=t.ranks,
                                ulysses=layout.ulysses if layout is not None else 1,
                                ring=layout.ring if layout is not None else 1,
                                mode=("torus" if layout is not None and layout.mode == 1 else "usp"),
                                step_begin=t.step_begin, num_steps=t.num_steps, dispatch_ns=t.dispatch_ns,
                                start_ns=t.start_ns, end_ns=t.end_ns))
        rec = self._scheduler.request(rid)
        if rec.state in _FINISHED:
            self._maybe_release(rid)
            return
        if not t.ok:
            if "comm: " in t.message or self._recovering:
                # A collective failed (a worker died, or timed out): re-create the world, then the
                # request continues from its last completed step (_reinit_done).
                self._start_recovery()
                return
            self._finish(rid, RequestState.FAILED, t.message)
            return
        if t.kind == TaskKind.ENCODE:
            self._scheduler.transition(rid, RequestState.DENOISING, 0)
        elif t.kind == TaskKind.DENOISE:
            self._scheduler.transition(rid, RequestState.DENOISING, t.step_begin + t.num_steps)
            if r.cancel:
                r.todo_steps = 0
        elif t.kind == TaskKind.DECODE:
            r.decoded = True
            self._output_arrived(rid)
            return
        if r.cancel and r.inflight == 0:
            self._finish(rid, RequestState.CANCELLED, "cancelled by the caller")
            return
        self._pump(rid)
        if r.todo_steps == 0 and r.inflight == 0:
            self._end_decision(rid)

    def _end_decision(self, rid: int) -> None:
        r = self._reqs[rid]
        rec = self._scheduler.request(rid)
        self._scheduler.release(r.group)
        self._scheduler.set_busy(rid, False)
        if rec.step >= rec.num_steps:
            self._scheduler.transition(rid, RequestState.DECODING, rec.step)
            self._scheduler.occupy(r.holders[:1])
            self._scheduler.set_busy(rid, True)
            r.group = r.holders[:1]
            self._dispatch(rid, TaskKind.DECODE, r.holders[:1])

    def _receive_outputs(self) -> None:
        """Output thread: moves decoded outputs from the workers into the stash, then tells the loop."""
        while True:
            try:
                item = self._results.get()
            except (EOFError, OSError, ValueError):
                return
            if item is None:
                return
            rid, arr = item
            with self._stash_lock:
                self._stash[rid] = torch.from_numpy(arr)
            self._inbox.append(("output", rid, None))
            self._wake()

    def _output_arrived(self, rid: int) -> None:
        """DONE once both the decode task completed and its output arrived (in either order)."""
        r = self._reqs.get(rid)
        if r is None or r.handle.done() or not r.decoded:
            return
        with self._stash_lock:
            out = self._stash.pop(rid, None)
        if out is None:
            return
        r.output = out
        self._finish(rid, RequestState.DONE)

    def _maybe_release(self, rid: int) -> None:
        r = self._reqs[rid]
        if r.inflight == 0 and self._scheduler.request(rid).busy:
            self._scheduler.release(r.group)
            self._scheduler.set_busy(rid, False)

    def _finish(self, rid: int, state: Any, reason: str = "") -> None:
        r = self._reqs[rid]
        rec = self._scheduler.request(rid)
        if rec.state not in _FINISHED:
            self._scheduler.transition(rid, state, -1, reason)
        live = [w for w in r.holders if self._alive[w]]
        if live:
            self._dispatch(rid, TaskKind.FREE, live)
        r.holders = []
        r.todo_steps = 0
        self._maybe_release(rid)
        rec = self._scheduler.request(rid)
        result = Result(request_id=rid, output=r.output if state == RequestState.DONE else None,
                        state=rec.state.name, reason=rec.reason, timeline=list(r.timeline),
                        transitions=[(x.state.name, x.step, x.t_ns) for x in rec.transitions])
        r.handle._finish(result)

    def _cancel_all(self, reason: str, failed: bool = False) -> None:
        for rid, r in list(self._reqs.items()):
            if not r.handle.done():
                state = RequestState.FAILED if failed else RequestState.CANCELLED
                try:
                    self._finish(rid, state, reason)
                except Exception:
                    r.handle._finish(Result(rid, None, state.name, reason, list(r.timeline), []))

    # ---- worker deaths ----

    def _check_workers(self) -> bool:
        """Notices dead workers (and drives recovery); returns whether anything changed."""
        now = time.monotonic()
        if now - self._last_liveness < 0.05 and not self._recovering:
            return False  # every 50 ms is plenty for "noticed within a second"
        self._last_liveness = now
        dead = [w for w, p in enumerate(self._procs) if self._alive[w] and not p.is_alive()]
        if not dead:
            if self._recovering:
                self._try_reinit()
            return False
        for w in dead:
            self._alive[w] = False
            self._scheduler.occupy([w])  # never scheduled again
            for t in list(self._tasks.values()):
                if w in t.pending:
                    t.pending.discard(w)
                    t.ok = False
                    t.message = t.message or f"comm: worker {w} died"
                    if not t.pending:
                        self._task_done(t)
        self._start_recovery()
        return True

    def _start_recovery(self) -> None:
        if not self._recovering:
            self._recovering = True
            self._queues.request_abort()  # collectives blocked on a dead or broken peer fail within ~100 ms
        self._try_reinit()

    def _try_reinit(self) -> None:
        """Once no task is in flight, re-creates the collectives world among the survivors."""
        if any(t.kind != TaskKind.REINIT for t in self._tasks.values()):
            return  # survivors still finishing (tasks with the dead fail within ~100 ms)
        if any(t.kind == TaskKind.REINIT for t in self._tasks.values()):
            return
        survivors = [w for w in range(self.world_size) if self._alive[w]]
        if not survivors:
            self._cancel_all("every worker died", failed=True)
            self._recovering = False
            return
        self._epoch += 1
        payload = json.dumps({"epoch": self._epoch, "workers": survivors}).encode()
        self._dispatch(0, TaskKind.REINIT, survivors, payload=payload)

    def _reinit_done(self, t: _Task) -> None:
        self._recovering = False
        for rid, r in self._reqs.items():
            rec = self._scheduler.request(rid)
            if rec.state in _FINISHED:
                continue
            r.inflight = 0
            r.todo_steps = 0
            if rec.busy:
                self._scheduler.release([w for w in r.group if self._alive[w]])
                self._scheduler.set_busy(rid, False)
            live = [w for w in r.holders if self._alive[w]]
            if r.cancel:
                r.holders = live
                self._finish(rid, RequestState.CANCELLED, "cancelled by the caller")
                continue
            if rec.state == RequestState.QUEUED:
                r.holders = []
                continue  # never started: the policy places it as usual
            if rec.state == RequestState.ENCODING or not live:
                # nothing survives to continue from: start again from encode
                if live:
                    self._dispatch(rid, TaskKind.FREE, live)
                r.holders = []
                self._scheduler.transition(rid, RequestState.QUEUED, 0, "restarted: its workers died")
            elif rec.state == RequestState.DECODING:
                r.holders = live
                self._scheduler.transition(rid, RequestState.QUEUED, rec.step, "decode lost")
                self._scheduler.transition(rid, RequestState.ENCODING, rec.step)
                self._scheduler.transition(rid, RequestState.DENOISING, rec.step)
                self._end_decision_after_recovery(rid)
            else:
                r.holders = live  # continue from the last completed step on a surviving holder

    def _end_decision_after_recovery(self, rid: int) -> None:
        r = self._reqs[rid]
        r.group = r.holders[:1]
        self._scheduler.occupy(r.group)
        self._scheduler.set_busy(rid, True)
        self._end_decision(rid)
