"""``gfdit.Engine``: a thin facade over the C++ control plane (docs/architecture.md, "The runtime").

The control plane (``gfdit._C.runtime.EngineLoop``: requests, the trajectory task graph, the policy,
completions, deadlines, recovery) runs on its own C++ thread without the GIL; it takes the GIL only to ask
a policy written in Python. ``submit`` hands it a typed request, which it checks (``checkRequest``: a bad
field raises gfdit.InvalidUsage whose ``param`` names it). This module starts one worker process per rank
(``gfdit.serving.worker``), and one thread that waits in C++ for the engine's updates: each request's
progress, pushed to its ``RequestHandle`` and to the engine's progress listeners, and its result, whose
decoded output it maps from shared memory without copying. A third thread replaces workers that die
(NOTE [healing]). Workers may also run on other hosts: their node agents (``gfdit.serving.agent``) connect to the
engine's node port (``listen``), and a C++ relay carries their tasks and completions (NOTE [node agents] in
src/runtime/relay.cpp); a fourth thread takes agents that connect to a running engine in the place of a lost host.

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
A worker on another host is replaced the same way by its node agent (the relay's ``start_worker`` in place of a new
process here) while its host is connected; the workers of a lost host are not replaced until an agent connects to the
engine again and takes them over (``Engine._take_over``), its workers joining as replacements.
"""

from __future__ import annotations

import dataclasses
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
NODE_ACCEPT_S = 0.5  # how long the node thread waits for an agent at a time (then it checks for shutdown)
JOIN_POLL_S = 0.05  # how often joining a remote worker looks at what its agent reported

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


def parse_address(text: Any, what: str) -> tuple[str, int]:
    """ "HOST:PORT" as (host, port); anything else raises gfdit.InvalidUsage naming ``what``."""
    host, sep, port = str(text).rpartition(":")
    if not isinstance(text, str) or not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InvalidUsage(f"gfdit: {what} {text!r} is not HOST:PORT", param=what)
    return host, int(port)


def node_timeout_s() -> float:
    """GFDIT_NODE_TIMEOUT_S: how long a silent connection between an engine and a node agent lasts."""
    return settings.get_seconds("GFDIT_NODE_TIMEOUT_S")


class RemoteProcess:
    """A worker on another host as the engine's supervisor sees a process (NOTE [node agents] in
    src/runtime/relay.cpp): its pid there, its exit code once its agent reported its end (-1: its host was lost),
    and kill and join through the relay."""

    def __init__(self, relay: Any, worker_id: int) -> None:
        self._relay = relay
        self.worker_id = worker_id

    def state(self) -> Any:
        return self._relay.worker_state(self.worker_id)

    @property
    def pid(self) -> int:
        return int(self.state().pid)

    @property
    def exitcode(self) -> int | None:
        st = self.state()
        return None if st.running else int(st.exit_code)

    @property
    def connected(self) -> bool:
        """Whether its host's agent is connected."""
        return bool(self.state().connected)

    def is_alive(self) -> bool:
        return bool(self.state().running)

    def kill(self) -> None:
        self._relay.kill(self.worker_id)

    def join(self, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout if timeout is not None else 1e9)
        while self.is_alive() and time.monotonic() < deadline:
            time.sleep(JOIN_POLL_S)


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
    Workers on other hosts (NOTE [node agents] in src/runtime/relay.cpp): local_workers of the world_size workers run
    here (default: all), the others on hosts whose node agents (``gfdit node-agent --engine HOST:PORT --workers K``)
    connect to ``listen`` ("HOST:PORT", port 0: any free one, ``node_port`` says which). The engine waits for them
    (within start_timeout_s); their workers get the ids after this host's, node by node, and the control plane's
    node_of says which host each runs on. Without a cost_model such an engine plans with none (a profile of this
    machine says nothing of the others). device applies to the local workers; each agent has its own. on_listen(host,
    port) is called once the node port listens, before the engine waits for agents (to tell them where it is).
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
        local_workers: int | None = None,
        listen: str | None = None,
        on_listen: Callable[[str, int], None] | None = None,
    ) -> None:
        import torch.distributed as dist

        if isinstance(world_size, bool):  # the rest of what the arguments must be, the engine loop checks
            raise InvalidUsage(f"gfdit.Engine: world_size {world_size!r} is not a number", param="world_size")
        overrides = _check_limits(limits or {})  # refused here, before any worker starts
        n_local = world_size if local_workers is None else local_workers
        if isinstance(world_size, int) and (
            isinstance(n_local, bool) or not isinstance(n_local, int) or not 0 <= n_local <= world_size
        ):
            raise InvalidUsage(
                f"gfdit.Engine: local_workers {local_workers!r} is not a number of workers in [0, {world_size}]",
                param="local_workers",
            )
        n_remote = world_size - n_local if isinstance(world_size, int) else 0
        where = parse_address(listen, "listen") if listen is not None else None
        if n_remote and where is None:
            raise InvalidUsage(
                f"gfdit.Engine: {n_remote} of the {world_size} workers run on other hosts: give listen='HOST:PORT', "
                "where their node agents connect",
                param="listen",
            )
        if n_remote and reprofile:
            raise InvalidUsage(
                "gfdit.Engine: reprofile measures a profile of this machine: not for workers on other hosts",
                param="reprofile",
            )
        if n_remote and cost_model is None:
            cost_model = False  # a profile of this machine says nothing of the other hosts
        if n_remote and isinstance(policy, str):
            rt.make_policy(policy)  # a bad name is refused before the agents are waited for
        devices = worker_devices(device, n_local) if isinstance(world_size, int) else []
        self.world_size = world_size
        self.model_name = model
        self._n_local = n_local
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
        deadline = time.monotonic() + start_timeout_s
        # the workers' rendezvous: every interface, for workers on other hosts too
        self._store = dist.TCPStore(
            "127.0.0.1", 0, None, True, timeout=datetime.timedelta(seconds=60), wait_for_workers=False
        )
        self._ctx = mp.get_context("spawn")
        self._devices = devices
        self._config = worker.WorkerConfig(
            world_size,
            "127.0.0.1",
            self._store.port,
            "",
            model,
            model_path,
            timeout_s,
            heap_bytes,
            threads_per_worker,
        )
        self._relay: Any = None
        self._node_of: list[int] = [0] * world_size if isinstance(world_size, int) else []
        if where is not None:
            # see NOTE [node agents] in src/runtime/relay.cpp
            self._relay = rt.NodeRelay(world_size, where[0], where[1], node_timeout_s())
            try:
                if on_listen is not None:
                    on_listen(where[0], int(self._relay.port))
                self._admit_nodes(n_remote, deadline, start_timeout_s)
            except BaseException:
                self._relay.close()
                raise
        try:
            self._loop = rt.EngineLoop(
                world_size,
                policy,
                cost_model,
                max_inflight_steps=max_inflight_steps,
                task_timeout_s=float(task_timeout_s),
                max_attempts=max_attempts,
                node_of=self._node_of if n_remote else [],
            )
        except InvalidUsage as e:
            if self._relay is not None:
                self._relay.close()
            if e.param is None:  # the policy's own message
                raise
            raise InvalidUsage(f"gfdit.Engine: {e.message}", param=e.param) from None
        self.policy_name = policy if isinstance(policy, str) else policy.name()
        self._config = dataclasses.replace(
            self._config,
            queue_name=self._loop.queue_name,
            node_ids=tuple(self._node_of) if n_remote else None,
        )
        self._procs: list[Any] = []
        try:
            if self._relay is not None:
                self._relay.start(self._loop.queue_name)
                for w in range(n_local, world_size):
                    self._loop.set_remote(w, self._relay)
            self._procs = [self._start_worker(w) for w in range(n_local)]
            self._procs += [RemoteProcess(self._relay, w) for w in range(n_local, world_size)]
            # the model the workers loaded (their hello), and the limits of its registry entry
            self.model_info: Any = self._loop.await_workers(
                self.worker_pids, max(1.0, deadline - time.monotonic())
            )
            self._apply_limits(overrides)
        except Error as e:
            self._abandon()
            raise RuntimeError(f"gfdit.Engine: {e.message}") from None
        except BaseException:
            self._abandon()
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
        self._nodes_thread: threading.Thread | None = None
        if self._relay is not None:
            self._nodes_thread = threading.Thread(target=self._admit_later, name="gfdit-nodes", daemon=True)
            self._nodes_thread.start()

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
        if self._nodes_thread is not None:
            self._nodes_thread.join(10.0)
        self._loop.shutdown()  # a SHUTDOWN task to every worker, those on other hosts through the relay
        deadline = time.monotonic() + timeout
        for p in self._procs:
            p.join(max(0.0, deadline - time.monotonic()))
        self._kill_all()
        if self._relay is not None:
            self._relay.close()  # the agents stop what is left of their workers and end
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
        """Process id of each worker (a worker on another host: its pid there, 0 until its agent reported it)."""
        return [int(p.pid or 0) for p in self._procs]  # every worker is started

    @property
    def node_port(self) -> int | None:
        """The port node agents connect to (``listen``), or None for an engine whose workers all run here."""
        return None if self._relay is None else int(self._relay.port)

    def nodes(self) -> list[dict]:
        """The hosts of the workers that run elsewhere (NOTE [node agents] in src/runtime/relay.cpp): node index,
        host, address, workers, connected, and why a lost one was lost."""
        if self._relay is None:
            return []
        return [
            {
                "node": n.node,
                "host": n.host,
                "address": n.address,
                "workers": list(n.workers),
                "connected": n.connected,
                "why": n.why,
            }
            for n in self._relay.nodes()
        ]

    def node_refusals(self) -> list[str]:
        """Why each connection to the node port was refused so far (garbage, another version, no place for it)."""
        return [] if self._relay is None else list(self._relay.refusals())

    def alive_workers(self) -> list[bool]:
        """Whether the control plane counts each worker as alive."""
        return list(self._loop.stats()["alive"])

    def stats(self) -> dict:
        """Control-plane counters: tasks, policy calls, lookahead hits, regroups, migrations, recoveries, task
        timeouts, control_cpu_ns (CPU time of the control thread), requests not yet pruned; the workers: alive,
        joining, worker_deaths, replacements, restarting (workers whose replacement is under way: NOTE
        [healing]), restart_error (why the latest replacement failed, "" if none did) and lost (workers of a host
        that was lost, waiting for an agent to take them over)."""
        out = dict(self._loop.stats())
        lost = {w for w, p in enumerate(self._procs) if isinstance(p, RemoteProcess) and not p.connected}
        with self._lock:
            out["restarting"] = sorted(
                w for w in range(self.world_size) if not out["alive"][w] and w not in lost
            )
            out["restart_error"] = self._restart_error
        out["lost"] = sorted(w for w in lost if not out["alive"][w])
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
        remote = isinstance(p, RemoteProcess)
        if live:
            if w in self._pending:  # joined
                self._pending.discard(w)
                self._failures[w] = 0
                log.warning("gfdit.Engine: worker %d replaced (pid %d)", w, p.pid)
            return
        if p.exitcode is None:  # a replacement loading its model (exitcode reaps a process that ended)
            return
        if remote and not p.connected:  # its host is lost: an agent that connects again takes it over
            self._pending.discard(w)
            return
        now = time.monotonic()
        if w in self._pending:  # the replacement exited before it joined
            self._pending.discard(w)
            reason = self._loop.take_replacement_error(w) or (
                f"exited with code {p.exitcode} before joining"
                + (f" ({p.state().why})" if remote and p.state().why else "")
            )
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
        if remote:  # its agent starts the new process (NOTE [node agents] in src/runtime/relay.cpp)
            self._relay.start_worker(w)
        else:
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
        for p in self._procs:
            p.join(5.0)

    def _abandon(self) -> None:
        """A start that failed: no worker, no agent and no name in /dev/shm is left."""
        self._kill_all()
        if self._relay is not None:
            self._relay.close()
        self._loop.shutdown()  # the rings' name goes now, not when the loop is collected

    # ---- workers on other hosts (NOTE [node agents] in src/runtime/relay.cpp) ----

    def _welcome(self, node: int, workers: list[int], joining: bool) -> Any:
        c = self._config
        w = rt.NodeWelcome()
        w.node = node
        w.workers = workers
        w.joining = joining
        w.world_size = self.world_size
        w.node_of = self._node_of
        w.model = c.model
        w.model_path = c.model_path or ""
        w.store_port = c.store_port
        w.timeout_s = float(c.timeout_s)
        w.heap_bytes = int(c.heap_bytes or 0)
        w.threads = int(c.threads)
        return w

    def _admit_nodes(self, needed: int, deadline: float, start_timeout_s: float) -> None:
        """Waits for agents that bring the `needed` workers that run elsewhere; then numbers them node by node after
        this host's, and welcomes each agent with its workers."""
        taken: list[Any] = []
        count = 0
        while count < needed:
            left = deadline - time.monotonic()
            if left <= 0:
                for p in taken:
                    self._relay.refuse(p.id, "the engine did not get all its workers in time")
                raise RuntimeError(
                    f"gfdit.Engine: node agents brought {count} of the {needed} workers that run on other hosts "
                    f"within {start_timeout_s} s (start them with: gfdit node-agent --engine HOST:{self._relay.port} "
                    "--workers K)"
                )
            p = self._relay.accept(min(left, NODE_ACCEPT_S))
            if p is None:
                continue
            k = p.hello.num_workers
            if not 1 <= k <= needed - count:
                self._relay.refuse(
                    p.id, f"the agent offers {k} workers; the engine waits for {needed - count} more at most"
                )
                continue
            taken.append(p)
            count += k
        first = self._n_local
        plan = []
        for node, p in enumerate(taken, start=1):
            ids = list(range(first, first + p.hello.num_workers))
            self._node_of[first : first + len(ids)] = [node] * len(ids)
            plan.append((p, node, ids))
            first += len(ids)
        for p, node, ids in plan:
            self._relay.admit(p.id, self._welcome(node, ids, joining=False))
            log.warning(
                "gfdit.Engine: node %d (host %s, %s) runs workers %s", node, p.hello.host, p.address, ids
            )

    def _admit_later(self) -> None:
        """Answers the agents that connect to the running engine (NOTE [healing])."""
        while not self._stopping.is_set():
            try:
                p = self._relay.accept(NODE_ACCEPT_S)
                if p is not None and not self._stopping.is_set():
                    self._take_over(p)
            except Exception:  # shutting down under us, or the agent left: the next one is answered
                if self._stopping.is_set():
                    return
                log.exception("gfdit.Engine: answering a node agent failed")

    def _take_over(self, p: Any) -> None:
        """An agent takes the workers of a lost host (once the control plane saw them dead) as replacements, or is
        refused with the reason."""
        if self._supervisor is None:
            self._relay.refuse(p.id, "the engine does not replace workers (replace_workers=False)")
            return
        st = self._loop.stats()
        lost: dict[int, list[int]] = {}
        for w in range(self._n_local, self.world_size):
            s = self._relay.worker_state(w)
            if not s.connected and not st["alive"][w] and not st["joining"][w]:
                lost.setdefault(s.node, []).append(w)
        fits = [(node, ws) for node, ws in sorted(lost.items()) if len(ws) <= p.hello.num_workers]
        if not fits:
            why = (
                "the engine has all its workers"
                if not lost
                else f"the agent offers {p.hello.num_workers} workers; a lost host had {min(map(len, lost.values()))}"
            )
            self._relay.refuse(p.id, why)
            return
        node, ws = fits[0]
        for w in ws:
            self._loop.prepare_replacement(w)
        self._pending.update(ws)  # the supervisor logs their join
        try:
            self._relay.admit(p.id, self._welcome(node, ws, joining=True))
        except Exception:
            self._pending.difference_update(ws)
            raise
        log.warning(
            "gfdit.Engine: host %s (%s) takes over workers %s of lost node %d",
            p.hello.host,
            p.address,
            ws,
            node,
        )
