"""``gfdit.Engine``: a thin facade over the C++ control plane (docs/architecture.md, "The runtime").

The control plane (``gfdit._C.runtime.EngineLoop``: requests, the trajectory task graph, the policy,
completions, deadlines, recovery) runs on its own C++ thread without the GIL; it takes the GIL only to ask
a policy written in Python. ``submit`` hands it a typed request, which it checks (``checkRequest``: a bad
field raises gfdit.InvalidUsage whose ``param`` names it). This module starts one worker process per rank
(``gfdit.serving.worker``), and one thread that waits in C++ for the engine's updates: each request's
progress, pushed to its ``RequestHandle`` and to the engine's progress listeners, and its result, whose
decoded output it maps from shared memory without copying. A third thread replaces workers that die
(NOTE [healing]).

NOTE [healing]
A worker that dies (killed, crashed, or stopped for a missed task deadline) is reaped and replaced by a new
process for the same worker id and device. The control plane notices the death (its liveness check) and
recovers as always; the supervisor thread sees the worker dead, readies its rings (``prepare_replacement``) and
starts the new process, which inherits the rings' descriptor (their name is gone once the engine runs), loads
the model and says hello. The control plane then takes it into the world at the next step boundary (NOTE
[replacements] in src/runtime/control.cpp). A replacement that exits before it joins, or is refused at its hello,
is started again after a delay that doubles each time (REPLACE_BACKOFF_S to REPLACE_BACKOFF_MAX_S), and its
reason is kept (``stats()["restart_error"]``); when REPLACE_GIVE_UP replacements in a row failed and no worker is
left, the requests waiting for one fail with that reason, and later ones wait for a replacement that works.
"""

from __future__ import annotations

import datetime
import logging
import multiprocessing as mp
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from gfdit import settings
from gfdit._C import Error, InvalidUsage
from gfdit._C import runtime as rt
from gfdit.attention.spec import ParallelSpec
from gfdit.comm.devices import parse_device, resolve_device
from gfdit.comm.dtypes import DTYPE_TO_TORCH
from gfdit.serving import worker
from gfdit.serving.request import Request, RequestFailed, RequestHandle, RequestState, Result, Stage

TaskKind = rt.TaskKind
Policy = rt.Policy
Decision = rt.Decision
Layout = rt.Layout

# Limits an engine enforces besides the model's strides; defaults from the model's registry entry.
LIMIT_FIELDS = ("max_steps", "max_pixels", "max_frames", "max_tokens")
UPDATE_WAIT_S = 0.5  # how long the result thread waits in C++ at a time (then it checks for shutdown)
SUPERVISE_S = 0.1  # how often the supervisor looks for dead workers (the control plane's liveness period)
REPLACE_BACKOFF_S = 0.5  # NOTE [healing]: the delay after a replacement's first failure, doubled each time
REPLACE_BACKOFF_MAX_S = 30.0
REPLACE_GIVE_UP = 5

log = logging.getLogger("gfdit.engine")

# What Engine(cost_model=None) plans with: the cached profile of this model, world and machine (NOTE [cached
# profiles] in gfdit.tools.profile_cache). The function that resolves it measures profiles with engines, so it
# lives a layer above this one; `import gfdit` registers it (register_cost_model_default).
_cost_model_default: Callable[..., Any] | None = None


def register_cost_model_default(fn: Callable[..., Any]) -> None:
    """Sets how an engine resolves its ``cost_model`` argument: ``fn(cost_model, model, world_size, *,
    model_path, device, policy, reprofile)`` returns the cost model it plans with (or None)."""
    global _cost_model_default
    _cost_model_default = fn


__all__ = [
    "Decision",
    "Engine",
    "Layout",
    "Policy",
    "Request",
    "RequestFailed",
    "RequestHandle",
    "RequestState",
    "Result",
    "Stage",
    "TaskKind",
    "worker_devices",
]


def worker_devices(device: Any, world_size: int) -> list[str | None]:
    """Every worker's device for ``Engine(device=...)`` ("cuda:N", or None for the CPU), checked here so that
    a bad value or a build without the CUDA transport is refused before any worker starts."""

    if device is None:
        device = settings.get("GFDIT_DEVICE").strip() or None
    if isinstance(device, (list, tuple)):
        if len(device) != world_size:
            raise InvalidUsage(
                f"gfdit.Engine: device lists {len(device)} devices for {world_size} workers; give one per worker"
            )
        specs = list(device)
    else:
        specs = [device] * world_size
    parsed = [parse_device(spec) for spec in specs]
    if len({p is None for p in parsed}) > 1:
        raise InvalidUsage(f"gfdit.Engine: device {device!r} puts some workers on the CPU and some on GPUs")
    out: list[Any] = []
    for w, (spec, p) in enumerate(zip(specs, parsed)):
        if p is None:
            out.append(None)
            continue
        resolve_device(spec, w, "gfdit.Engine device")  # the transport, CUDA and the index
        # "cuda": worker w on w modulo the visible devices (not LOCAL_RANK: the workers are this engine's)
        index = w % torch.cuda.device_count() if p == "cuda" else int(p)
        out.append(f"cuda:{index}")
    return out


def _check_limits(overrides: dict) -> dict:
    """The Engine(limits=...) overrides, each a known limit with a positive integer."""
    for k, v in overrides.items():
        if k not in LIMIT_FIELDS:
            raise InvalidUsage(
                f"gfdit.Engine: unknown limit {k!r}; known: {', '.join(LIMIT_FIELDS)}", param="limits"
            )
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InvalidUsage(
                f"gfdit.Engine: limit {k} must be a positive integer, got {v!r}", param="limits"
            )
    return dict(overrides)


class Engine:
    """Starts one worker per rank and serves requests on them.

    model: a name for gfdit.models.load ("tiny-wan", "tiny-qwen-image", "wan2.2", "wan2.1", "qwen-image");
    model_path for real weights. policy: "fcfs", "static:D" or a gfdit.Policy object. max_inflight_steps:
    steps of one request dispatched ahead of completions. timeout_s: the workers' collective timeout.
    task_timeout_s: a task not done this long past its expected end fails, its workers are stopped and its
    request retried (max_attempts times) or failed. limits: overrides of max_steps, max_pixels, max_frames,
    max_tokens. cost_model: a gfdit._C.cost.CostModel the control plane and policies consult; None: the profile
    of this model, world and machine, measured on first use and cached (NOTE [cached profiles] in
    gfdit.tools.profile_cache); False: none. reprofile: measure that cached profile again.
    heap_bytes: each worker's symmetric heap (None: the GFDIT_HEAP_BYTES setting). replace_workers: start a new
    process for a worker that dies (NOTE [healing]); False: the engine goes on with the survivors.
    device: where the workers run (default: the ``GFDIT_DEVICE`` environment variable, else the CPU): None or
    "cpu"; "cuda" (worker w on ``gfdit.comm.default_device(w)``: w modulo the visible devices); "cuda:N" or N
    (every worker on device N); or a list with one device per worker. Each worker then joins the world with
    its device and holds the model and its states there (see gfdit.serving.worker). Use as a context manager or call
    shutdown().
    """

    def __init__(
        self,
        model: str = "tiny-wan",
        world_size: int = 2,
        policy: Any = "fcfs",
        model_path: str | None = None,
        max_inflight_steps: int = 2,
        timeout_s: float = 60.0,
        heap_bytes: int | None = None,
        threads_per_worker: int = 1,
        start_timeout_s: float = 120.0,
        task_timeout_s: float = 300.0,
        max_attempts: int = 3,
        limits: dict | None = None,
        cost_model: Any = None,
        device: Any = None,
        replace_workers: bool = True,
        reprofile: bool = False,
    ) -> None:
        import torch.distributed as dist

        if isinstance(world_size, bool):  # the rest of what the arguments must be, the engine loop checks
            raise InvalidUsage(f"gfdit.Engine: world_size {world_size!r} is not a number", param="world_size")
        overrides = _check_limits(limits or {})  # refused here, before any worker starts
        devices = worker_devices(device, world_size) if isinstance(world_size, int) else []
        self.world_size = world_size
        self.model_name = model
        assert _cost_model_default is not None, "import gfdit registers it"
        cost_model = _cost_model_default(
            cost_model,
            model,
            world_size,
            model_path=model_path,
            device=device,
            policy=policy,
            reprofile=reprofile,
        )
        self.cost_model = cost_model
        self._closed = False
        try:
            self._loop = rt.EngineLoop(
                world_size,
                policy,
                cost_model,
                max_inflight_steps=max_inflight_steps,
                task_timeout_s=float(task_timeout_s),
                max_attempts=max_attempts,
            )
        except InvalidUsage as e:
            if e.param is None:  # the policy's own message
                raise
            raise InvalidUsage(f"gfdit.Engine: {e.message}", param=e.param) from None
        self.policy_name = policy if isinstance(policy, str) else policy.name()
        self._store = dist.TCPStore(
            "127.0.0.1", 0, None, True, timeout=datetime.timedelta(seconds=60), wait_for_workers=False
        )
        self._ctx = mp.get_context("spawn")
        self._devices = devices
        self._config = worker.WorkerConfig(
            world_size,
            "127.0.0.1",
            self._store.port,
            self._loop.queue_name,
            model,
            model_path,
            timeout_s,
            heap_bytes,
            threads_per_worker,
        )
        self._procs = [self._start_worker(w) for w in range(world_size)]
        try:
            # the model the workers loaded (their hello), and the limits of its registry entry
            self.model_info: Any = self._loop.await_workers(self.worker_pids, start_timeout_s)
            self._apply_limits(overrides)
        except Error as e:
            self._kill_all()
            self._loop.shutdown()  # the rings' name goes now, not when the loop is collected
            raise RuntimeError(f"gfdit.Engine: {e.message}") from None
        except BaseException:
            self._kill_all()
            self._loop.shutdown()
            raise
        self._handles: dict[int, RequestHandle] = {}
        self._listeners: list[Callable[[Any], None]] = []
        self._lock = threading.Lock()
        self._loop.start()
        self._thread = threading.Thread(target=self._collect, name="gfdit-results", daemon=True)
        self._thread.start()
        # see NOTE [healing]
        self._stopping = threading.Event()
        self._pending: set[int] = set()  # workers whose replacement started and has not joined yet
        self._next_try: dict[int, float] = {}  # when a worker's next replacement may start (monotonic)
        self._failures = [0] * world_size  # replacements in a row that exited before joining
        self._restart_error = ""
        self._supervisor: threading.Thread | None = None
        if replace_workers:
            self._loop.set_replacing(True)
            self._supervisor = threading.Thread(target=self._supervise, name="gfdit-supervisor", daemon=True)
            self._supervisor.start()

    # ---- public ----

    def submit(self, request: Request) -> RequestHandle:
        """Checks a request against the model and queues it; returns at once. Bad fields raise
        gfdit.InvalidUsage whose ``param`` names the field."""
        if self._closed:
            raise InvalidUsage("gfdit.Engine: submit after shutdown")
        if not isinstance(request, Request):
            raise InvalidUsage("gfdit.Engine.submit takes a gfdit.Request")
        message = request.message()  # each field's type, checked in C++
        with self._lock:
            rid = self._loop.submit(message)  # each field's value, checked in C++; defaults filled in
            # registered before the lock is released, so _collect always finds it
            handle = self._handles[rid] = RequestHandle(self, rid, message.num_inference_steps)
        return handle

    def submit_batch(self, requests: list[Request]) -> list[RequestHandle]:
        """Checks and queues requests as one job (the n images of one HTTP request): every request is checked
        first and a bad field of any raises gfdit.InvalidUsage with nothing queued; then all are queued at once, as
        one group the built-in policies run as one batch where batching pays (NOTE [planning] 3a in
        src/runtime/planning_policy.cpp: the same shape and guidance, room in memory, and a cheaper step per
        request; with a cost model). Returns their handles, in order."""
        if self._closed:
            raise InvalidUsage("gfdit.Engine: submit after shutdown")
        if not isinstance(requests, (list, tuple)) or not all(isinstance(r, Request) for r in requests):
            raise InvalidUsage("gfdit.Engine.submit_batch takes a list of gfdit.Request")
        messages = [r.message() for r in requests]
        with self._lock:
            ids, checked = self._loop.submit_group(messages)
            handles = [
                RequestHandle(self, rid, m.num_inference_steps or 0)
                for rid, m in zip(ids, checked, strict=True)
            ]
            for h in handles:
                self._handles[h.request_id] = h
        return handles

    def check(self, request: Request) -> None:
        """What submit checks, alone (nothing is queued): raises gfdit.InvalidUsage naming a bad field."""
        if not isinstance(request, Request):
            raise InvalidUsage("gfdit.Engine.check takes a gfdit.Request")
        self._loop.check(request.message())

    def add_progress_listener(self, fn: Callable[[Any], None]) -> None:
        """Calls ``fn(progress)`` for every change of any request's state, step or ranks (a
        ``gfdit._C.runtime.RequestProgress``), on the engine's result thread: fn must be quick. What it raises is
        dropped."""
        with self._lock:
            self._listeners.append(fn)

    def shutdown(self, timeout: float = 30.0) -> None:
        """Ends requests in flight as CANCELLED, stops the workers; leaves no process and no shared memory."""
        if self._closed:
            return
        self._closed = True
        self._stopping.set()
        if self._supervisor is not None:
            self._supervisor.join(10.0)
        self._loop.shutdown()
        deadline = time.monotonic() + timeout
        for p in self._procs:
            p.join(max(0.0, deadline - time.monotonic()))
        self._kill_all()
        self._thread.join(5.0)
        rt.unlink_outputs(rt.output_prefix(self._loop.queue_name))
        # a worker killed while its world formed left its region's name (gfdit/world.h)
        rt.unlink_outputs("/" + rt.world_shm_prefix(self._loop.queue_name) + "-")

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def ping(self, worker: int, count: int = 100, timeout: float = 30.0) -> list[tuple[int, int, int, int]]:
        """Round trips of an empty task to an idle worker: (dispatch, start, post, seen) ns each, for latency
        measurements. Each ping waits for the previous one."""
        return [
            (s.dispatch_ns, s.start_ns, s.post_ns, s.seen_ns) for s in self._loop.ping(worker, count, timeout)
        ]

    def requests(self) -> dict[int, str]:
        """State of every request submitted and not yet finished (as its progress was last pushed)."""
        with self._lock:
            handles = list(self._handles.values())
        return {h.request_id: h.status()["state"] for h in handles if not h.done()}

    @property
    def closed(self) -> bool:
        """Whether shutdown() ran."""
        return self._closed

    @property
    def worker_pids(self) -> list[int]:
        """Process id of each worker."""
        return [int(p.pid or 0) for p in self._procs]  # every worker is started

    def alive_workers(self) -> list[bool]:
        """Whether the control plane counts each worker as alive."""
        return list(self._loop.stats()["alive"])

    def stats(self) -> dict:
        """Control-plane counters: tasks, policy calls, lookahead hits, regroups, migrations, recoveries, task
        timeouts, control_cpu_ns (CPU time of the control thread), requests not yet pruned; the workers: alive,
        joining, worker_deaths, replacements, restarting (workers whose replacement is under way: NOTE
        [healing]) and restart_error (why the latest replacement failed, "" if none did)."""
        out = dict(self._loop.stats())
        with self._lock:
            out["restarting"] = sorted(w for w in range(self.world_size) if not out["alive"][w])
            out["restart_error"] = self._restart_error
        return out

    @property
    def limits(self) -> dict:
        """What submit checks requests against."""
        lim = self._loop.limits
        return {k: getattr(lim, k) for k in LIMIT_FIELDS}

    # ---- internals ----

    def _apply_limits(self, overrides: dict) -> None:
        lim = self._loop.limits  # the model's: its registry entry, with the strides its workers reported
        for k, v in overrides.items():
            setattr(lim, k, v)
        self._loop.limits = lim

    def _collect(self) -> None:
        """Hands progress and finished requests to their handles (the only thread that waits for them)."""
        while True:
            progress, results = self._loop.wait_updates(UPDATE_WAIT_S)
            if progress:
                with self._lock:
                    listeners = list(self._listeners)
                    handles = [self._handles.get(p.id) for p in progress]
                for p, handle in zip(progress, handles):
                    if handle is not None:
                        handle._progress = p
                    for fn in listeners:
                        try:
                            fn(p)
                        except Exception:  # a listener's bug must not stop the engine's updates
                            pass
            for rr in results:
                with self._lock:
                    handle = self._handles.pop(rr.id)
                handle._finish(self._result_of(rr))
            if not progress and not results and self._loop.closed:
                return

    def _result_of(self, rr: Any) -> Result:
        output = None
        if rr.state == RequestState.DONE and rr.output.name:
            buf = rt.open_output(rr.output)
            output = torch.frombuffer(buf, dtype=DTYPE_TO_TORCH[rr.output.dtype]).view(*rr.output.shape)
        elif rr.output.name:
            rt.discard_output(rr.output)
        timeline = []
        for s in rr.stages:
            spec = ParallelSpec.of(s.layout)
            timeline.append(
                Stage(
                    kind=s.kind.name.lower(),
                    ranks=list(s.ranks),
                    ulysses=spec.ulysses,
                    ring=spec.ring,
                    mode=spec.mode,
                    cfg=spec.cfg,
                    step_begin=s.step_begin,
                    num_steps=s.num_steps,
                    dispatch_ns=s.dispatch_ns,
                    start_ns=s.start_ns,
                    end_ns=s.end_ns,
                    regroup=bool(s.regroup),
                    batch=int(s.batch),
                    cached_steps=int(s.cached_steps),
                    cached_passes=int(s.cached_passes),
                )
            )
        transitions = [(t.state.name, t.step, t.t_ns) for t in rr.transitions]
        return Result(
            request_id=rr.id,
            output=output,
            state=rr.state.name,
            reason=rr.reason,
            timeline=timeline,
            transitions=transitions,
        )

    def _supervise(self) -> None:
        """Replaces dead workers (NOTE [healing])."""
        while not self._stopping.wait(SUPERVISE_S):
            try:
                st = self._loop.stats()
                for w in range(self.world_size):
                    self._look_after(w, st["alive"][w] or st["joining"][w])
            except Exception:  # the engine is shutting down under us, or a start failed: try again later
                if self._stopping.is_set():
                    return
                log.exception("gfdit.Engine: replacing a worker failed")

    def _look_after(self, w: int, live: bool) -> None:
        p = self._procs[w]
        if live:
            if w in self._pending:  # joined
                self._pending.discard(w)
                self._failures[w] = 0
                log.warning("gfdit.Engine: worker %d replaced (pid %d)", w, p.pid)
            return
        if p.exitcode is None:  # a replacement loading its model (exitcode reaps a process that ended)
            return
        now = time.monotonic()
        if w in self._pending:  # the replacement exited before it joined
            self._pending.discard(w)
            reason = self._loop.take_replacement_error(w) or f"exited with code {p.exitcode} before joining"
            self._failures[w] += 1
            delay = min(REPLACE_BACKOFF_MAX_S, REPLACE_BACKOFF_S * 2 ** (self._failures[w] - 1))
            with self._lock:
                self._restart_error = f"worker {w}: {reason}"
            log.warning(
                "gfdit.Engine: replacement of worker %d failed (%s); next try in %.1f s", w, reason, delay
            )
            self._next_try[w] = now + delay
            if self._failures[w] >= REPLACE_GIVE_UP and not any(self._loop.stats()["alive"]):
                # nobody can serve: the waiting requests learn why; later ones wait for a replacement that works
                self._loop.set_replacing(False, f"no worker left: replacing worker {w} failed: {reason}")
                self._loop.set_replacing(True)
            return
        if self._next_try.get(w, 0.0) > now:
            return
        self._loop.prepare_replacement(w)
        q = self._procs[w] = self._start_worker(w, worker.InheritedFd(self._loop.queue_fd))
        self._loop.set_worker_pid(w, int(q.pid or 0))
        self._pending.add(w)

    def _start_worker(self, w: int, queue_fd: Any = None) -> Any:
        """Worker w's process, started (queue_fd: a replacement's inherited rings, NOTE [healing])."""
        p = self._ctx.Process(
            target=worker.main,
            name=f"gfdit-worker-{w}",
            daemon=True,
            args=(w, self._config, self._devices[w], queue_fd),
        )
        p.start()
        return p

    def _kill_all(self) -> None:
        for p in self._procs:
            if p.is_alive():
                p.kill()
            p.join(5.0)
