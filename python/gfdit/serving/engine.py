"""``gfdit.Engine``: a thin facade over the C++ control plane (docs/architecture.md, "The runtime").

The control plane (``gfdit._C.runtime.EngineLoop``: requests, the trajectory task graph, the policy,
completions, deadlines, recovery) runs on its own C++ thread without the GIL; it takes the GIL only to ask
a policy written in Python. This module checks requests at ``submit``, starts one worker process per rank
(``gfdit.serving.worker``), hands finished requests to their handles (one thread that waits in C++), and maps
decoded outputs from shared memory without copying them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing as mp
import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError
from typing import Any

import torch

from gfdit._C import Error, InvalidUsage
from gfdit._C import runtime as rt
from gfdit._errors import user_message
from gfdit.attention.spec import ParallelSpec
from gfdit.comm.devices import parse_device, resolve_device
from gfdit.serving import worker

RequestState = rt.RequestState
TaskKind = rt.TaskKind
Policy = rt.Policy
Decision = rt.Decision
Layout = rt.Layout

# The registry entry behind each name gfdit.models.load accepts (limits and cost model).
_ARCH_OF = {"wan2.1": "wan2.1-1.3b"}
_DTYPES = {
    0: torch.float32,
    1: torch.float16,
    2: torch.bfloat16,
    3: torch.int32,
    4: torch.int64,
    5: torch.uint8,
}
# Limits an engine enforces besides the model's strides; defaults from the model's registry entry.
LIMIT_FIELDS = ("max_steps", "max_pixels", "max_frames", "max_tokens")


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
    guidance_scale_2: float | None = None  # Wan 2.2's low-noise expert (WanPipeline's guidance_scale_2)
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
    cfg: int = 1  # 2: CFG-parallel (the first half of ranks ran the conditional pass, the second the other)


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
    """What submit returns: wait for the result, ask for progress, or cancel."""

    def __init__(self, engine: Engine, request_id: int, num_steps: int) -> None:
        self._engine = engine
        self.request_id = request_id
        self.num_steps = num_steps
        self._event = threading.Event()
        self._result: Result | None = None
        self._callbacks: list[Callable[[RequestHandle], None]] = []
        self._callbacks_lock = threading.Lock()

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

    def status(self) -> dict:
        """{"state", "step", "num_steps", "ranks"}: where the request is now."""
        if not self.done():
            st = self._engine._loop.status(self.request_id)
            if st is not None:
                return {
                    "state": st["state"].name,
                    "step": st["step"],
                    "num_steps": self.num_steps,
                    "ranks": list(st["ranks"]),
                }
            self._event.wait(1.0)  # it ended a moment ago: its result is on the way
        r = self._result
        return {
            "state": r.state if r else "UNKNOWN",
            "step": r.transitions[-1][1] if r else 0,
            "num_steps": self.num_steps,
            "ranks": [],
        }

    def cancel(self) -> None:
        """Cancels the request: it ends CANCELLED at once; work in flight is dropped."""
        if not self.done():
            self._engine._loop.cancel(self.request_id)

    def add_done_callback(self, fn: Callable[[RequestHandle], None]) -> None:
        """Calls ``fn(handle)`` once the request has ended (DONE, FAILED or CANCELLED), or at once if it has.

        fn runs on the engine's result thread: it must be quick and must not wait for the engine (an asyncio
        program hands the handle to its loop with ``loop.call_soon_threadsafe``). What fn raises is dropped."""
        with self._callbacks_lock:
            if not self._event.is_set():
                self._callbacks.append(fn)
                return
        fn(self)

    def _finish(self, result: Result) -> None:
        self._result = result
        with self._callbacks_lock:
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            try:
                fn(self)
            except Exception:  # a caller's bug must not stop the results of every other request
                pass


def worker_devices(device: Any, world_size: int) -> list[str | None]:
    """Every worker's device for ``Engine(device=...)`` ("cuda:N", or None for the CPU), checked here so that
    a bad value or a build without the CUDA transport is refused before any worker starts."""
    import os

    if device is None:
        device = os.environ.get("GFDIT_DEVICE") or None
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


class Engine:
    """Starts one worker per rank and serves requests on them.

    model: a name for gfdit.models.load ("tiny-wan", "tiny-qwen-image", "wan2.2", "wan2.1", "qwen-image");
    model_path for real weights. policy: "fcfs", "static:D" or a gfdit.Policy object. max_inflight_steps:
    steps of one request dispatched ahead of completions. timeout_s: the workers' collective timeout.
    task_timeout_s: a task not done this long past its expected end fails, its workers are stopped and its
    request retried (max_attempts times) or failed. limits: overrides of max_steps, max_pixels, max_frames,
    max_tokens. cost_model: a gfdit._C.cost.CostModel the control plane and policies may consult.
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
        heap_bytes: int = 64 << 20,
        threads_per_worker: int = 1,
        start_timeout_s: float = 120.0,
        task_timeout_s: float = 300.0,
        max_attempts: int = 3,
        limits: dict | None = None,
        cost_model: Any = None,
        device: Any = None,
    ) -> None:
        import datetime

        import torch.distributed as dist

        if isinstance(world_size, bool) or not isinstance(world_size, int) or not 1 <= world_size <= 64:
            raise InvalidUsage(f"gfdit.Engine: world_size {world_size!r} is outside [1, 64]")
        if max_inflight_steps < 1:
            raise InvalidUsage("gfdit.Engine: max_inflight_steps must be >= 1")
        if not (task_timeout_s >= 0 and math.isfinite(task_timeout_s)):
            raise InvalidUsage("gfdit.Engine: task_timeout_s must be a finite number >= 0 (0: no deadline)")
        devices = worker_devices(device, world_size)  # refused here, before any worker starts
        self.world_size = world_size
        self.model_name = model
        self.cost_model = cost_model
        self._closed = False
        self._loop = rt.EngineLoop(
            world_size,
            policy,
            cost_model,
            max_inflight_steps=max_inflight_steps,
            task_timeout_s=float(task_timeout_s),
            max_attempts=max_attempts,
        )
        self.policy_name = policy if isinstance(policy, str) else policy.name()
        self._store = dist.TCPStore(
            "127.0.0.1", 0, None, True, timeout=datetime.timedelta(seconds=60), wait_for_workers=False
        )
        ctx = mp.get_context("spawn")

        self._procs = []
        for w in range(world_size):
            p = ctx.Process(
                target=worker.main,
                name=f"gfdit-worker-{w}",
                daemon=True,
                args=(
                    w,
                    world_size,
                    "127.0.0.1",
                    self._store.port,
                    self._loop.queue_name,
                    self._loop.output_prefix,
                    self._loop.world_shm_prefix,
                    model,
                    model_path,
                    timeout_s,
                    heap_bytes,
                    threads_per_worker,
                    devices[w],
                ),
            )
            p.start()
            self._procs.append(p)
        try:
            hello = self._loop.await_workers([p.pid for p in self._procs], start_timeout_s)
        except Error as e:
            self._kill_all()
            raise RuntimeError(f"gfdit.Engine: {user_message(e)}") from None
        except BaseException:
            self._kill_all()
            raise
        self.model_info: dict = json.loads(hello[0])
        self._limits = self._make_limits(model, limits or {})
        self._handles: dict[int, RequestHandle] = {}
        self._lock = threading.Lock()
        self._loop.start()
        self._thread = threading.Thread(target=self._collect, name="gfdit-results", daemon=True)
        self._thread.start()

    # ---- public ----

    def submit(self, request: Request) -> RequestHandle:
        """Checks a request against the model and queues it; returns at once. Bad fields raise
        gfdit.InvalidUsage naming the field."""
        if self._closed:
            raise InvalidUsage("gfdit.Engine: submit after shutdown")
        if not isinstance(request, Request):
            raise InvalidUsage("gfdit.Engine.submit takes a gfdit.Request")
        d = self.model_info["defaults"]
        r = request
        if not isinstance(r.prompt, str):
            raise InvalidUsage("gfdit.Request: prompt must be a string")
        if r.negative_prompt is not None and not isinstance(r.negative_prompt, str):
            raise InvalidUsage("gfdit.Request: negative_prompt must be a string or None")
        fields = {}
        for name, default in (
            ("height", d["height"]),
            ("width", d["width"]),
            ("num_frames", d["num_frames"]),
            ("num_inference_steps", d["num_inference_steps"]),
        ):
            v = getattr(r, name)
            if v is None:
                v = default
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidUsage(f"gfdit.Request: {name} must be a positive integer, got {v!r}")
            fields[name] = v
        g = d["guidance_scale"] if r.guidance_scale is None else r.guidance_scale
        if isinstance(g, bool) or not isinstance(g, (int, float)) or not math.isfinite(g):
            raise InvalidUsage(f"gfdit.Request: guidance_scale must be a finite number, got {g!r}")
        g2 = r.guidance_scale_2
        if g2 is not None and (
            isinstance(g2, bool) or not isinstance(g2, (int, float)) or not math.isfinite(g2)
        ):
            raise InvalidUsage(f"gfdit.Request: guidance_scale_2 must be a finite number, got {g2!r}")
        if isinstance(r.seed, bool) or not isinstance(r.seed, int) or not -(2**63) <= r.seed < 2**64:
            raise InvalidUsage(f"gfdit.Request: seed must be a 64-bit integer, got {r.seed!r}")
        if (
            isinstance(r.priority, bool)
            or not isinstance(r.priority, int)
            or not -(2**31) <= r.priority < 2**31
        ):
            raise InvalidUsage(f"gfdit.Request: priority must be a 32-bit integer, got {r.priority!r}")
        deadline = math.inf
        if r.deadline_s is not None:
            if (
                isinstance(r.deadline_s, bool)
                or not isinstance(r.deadline_s, (int, float))
                or not (math.isfinite(r.deadline_s) and r.deadline_s > 0)
            ):
                raise InvalidUsage(
                    f"gfdit.Request: deadline_s must be a positive number, got {r.deadline_s!r}"
                )
            deadline = float(r.deadline_s)
        try:
            tokens = self._limits.check(
                fields["height"],
                fields["width"],
                fields["num_frames"],
                fields["num_inference_steps"],
                float(g),
            )
        except InvalidUsage as e:
            raise InvalidUsage(f"gfdit.Request: {user_message(e)}") from None
        payload = json.dumps(
            {
                "prompt": r.prompt,
                "negative_prompt": r.negative_prompt,
                **fields,
                "guidance_scale": float(g),
                **({} if g2 is None else {"guidance_scale_2": float(g2)}),
                "seed": r.seed,
            }
        ).encode()
        if len(payload) > rt.MAX_PAYLOAD_BYTES:
            raise InvalidUsage(
                f"gfdit.Request: prompt and negative_prompt take {len(payload)} bytes as JSON; at most "
                f"{rt.MAX_PAYLOAD_BYTES}"
            )
        with self._lock:
            rid = self._loop.submit(
                fields["height"],
                fields["width"],
                fields["num_frames"],
                fields["num_inference_steps"],
                float(g),
                tokens,
                deadline,
                r.priority,
                self._max_degree,
                payload,
                num_heads=self._num_heads,
            )
            # registered before the lock is released, so _collect always finds it
            handle = self._handles[rid] = RequestHandle(self, rid, fields["num_inference_steps"])
        return handle

    def shutdown(self, timeout: float = 30.0) -> None:
        """Ends requests in flight as CANCELLED, stops the workers; leaves no process and no shared memory."""
        if self._closed:
            return
        self._closed = True
        self._loop.shutdown()
        deadline = time.monotonic() + timeout
        for p in self._procs:
            p.join(max(0.0, deadline - time.monotonic()))
        self._kill_all()
        self._thread.join(5.0)
        rt.unlink_outputs(self._loop.output_prefix)
        # a worker killed while its world formed left its region's name (gfdit/world.h)
        rt.unlink_outputs("/" + self._loop.world_shm_prefix + "-")

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
        """State of every request submitted and not yet finished."""
        with self._lock:
            ids = list(self._handles)
        out = {}
        for rid in ids:
            s = self._loop.status(rid)
            if s is not None:
                out[rid] = s["state"].name
        return out

    @property
    def worker_pids(self) -> list[int]:
        """Process id of each worker."""
        return [p.pid for p in self._procs]

    def alive_workers(self) -> list[bool]:
        """Whether the control plane counts each worker as alive."""
        return list(self._loop.stats()["alive"])

    def stats(self) -> dict:
        """Control-plane counters: tasks, policy calls, lookahead hits, regroups, migrations, recoveries, task
        timeouts, control_cpu_ns (CPU time of the control thread), requests not yet pruned."""
        return dict(self._loop.stats())

    # ---- internals ----

    def _make_limits(self, model: str, overrides: dict) -> Any:
        info = self.model_info
        lim = rt.RequestLimits()
        arch = _ARCH_OF.get(model, model)
        try:
            lim = rt.RequestLimits.of(arch)
        except InvalidUsage:
            lim.max_frames = 257
        # the loaded model's own strides decide what it can patch
        lim.vae_stride_s = int(info["vae_stride_s"])
        lim.patch_s = int(info["patch_s"])
        lim.temporal_stride = int(info["vae_stride_t"])
        lim.patch_t = int(info["patch_t"])
        lim.is_video = bool(info["is_video"])
        if not lim.is_video:
            lim.max_frames = 1
        for k, v in overrides.items():
            if k not in LIMIT_FIELDS:
                raise InvalidUsage(f"gfdit.Engine: unknown limit {k!r}; known: {', '.join(LIMIT_FIELDS)}")
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidUsage(f"gfdit.Engine: limit {k} must be a positive integer, got {v!r}")
            setattr(lim, k, v)
        # A request may get every rank: Ulysses splits the heads (unevenly past their divisors), Ring and
        # CFG-parallel the rest; the layouts keep Ulysses within the heads.
        self._max_degree = self.world_size
        self._num_heads = int(info["heads"])
        return lim

    @property
    def limits(self) -> dict:
        """What submit checks requests against."""
        return {k: getattr(self._limits, k) for k in LIMIT_FIELDS}

    def _collect(self) -> None:
        """Hands finished requests to their handles (the only thread that waits for results)."""
        while True:
            batch = self._loop.wait_results(0.5)
            for rr in batch:
                with self._lock:
                    handle = self._handles.pop(rr.id)
                handle._finish(self._result_of(rr))
            if not batch and self._loop.closed:
                return

    def _result_of(self, rr: Any) -> Result:
        output = None
        if rr.state == RequestState.DONE and rr.output.name:
            buf = rt.open_output(rr.output)
            output = torch.frombuffer(buf, dtype=_DTYPES[int(rr.output.dtype)]).view(*rr.output.shape)
        elif rr.output.name:
            rt.discard_output(rr.output)
        timeline = [
            Stage(
                kind=s.kind.name.lower(),
                ranks=list(s.ranks),
                ulysses=s.layout.ulysses,
                ring=s.layout.ring,
                mode=ParallelSpec.of(s.layout).mode,
                cfg=s.layout.cfg,
                step_begin=s.step_begin,
                num_steps=s.num_steps,
                dispatch_ns=s.dispatch_ns,
                start_ns=s.start_ns,
                end_ns=s.end_ns,
            )
            for s in rr.stages
        ]
        transitions = [(t.state.name, t.step, t.t_ns) for t in rr.transitions]
        return Result(
            request_id=rr.id,
            output=output,
            state=rr.state.name,
            reason=rr.reason,
            timeline=timeline,
            transitions=transitions,
        )

    def _kill_all(self) -> None:
        for p in self._procs:
            if p.is_alive():
                p.kill()
            p.join(5.0)
