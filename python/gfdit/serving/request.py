"""What a caller of ``gfdit.Engine`` gives and gets: ``Request`` in, a ``RequestHandle`` back at once, a
``Result`` (with its ``Stage`` timeline) when the request ends, ``RequestFailed`` when it failed. A handle's
progress is pushed to it by the engine as it happens; reading it never waits for the engine."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from concurrent.futures import CancelledError
from typing import Any

from gfdit._C import runtime as rt

RequestState = rt.RequestState  # QUEUED, ENCODING, DENOISING, DECODING, DONE, FAILED, CANCELLED


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
    # the step cache: "fbcache:0.08", "teacache:0.1,warmup=2,max_skip=3", a gfdit.CacheSpec, or None (off); see
    # NOTE [step caches] in include/gfdit/step_cache.h
    cache: Any = None

    def message(self) -> Any:
        """This request as the typed message the engine checks (``gfdit._C.runtime.GenerationRequest``); a field
        of the wrong type raises gfdit.InvalidUsage naming it."""
        return rt.GenerationRequest(**dataclasses.asdict(self))  # the same fields, by the same names


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
    regroup: bool = False  # a denoise task on other ranks than the previous one (NOTE [regroups])
    batch: int = 1  # requests the task stepped in one batched forward, this one included (NOTE [batches])
    cached_steps: int = 0  # a denoise task: steps whose every transformer pass reused the step cache
    cached_passes: int = 0  # ... and the passes that did


@dataclasses.dataclass
class Result:
    request_id: int
    output: Any  # torch.Tensor | None
    state: str
    reason: str
    timeline: list[Stage]
    transitions: list[tuple[str, int, int]]  # (state, step, t_ns)

    @property
    def cached_steps(self) -> int:
        """Steps whose every transformer pass reused the step cache (0 without one; NOTE [step caches])."""
        return sum(s.cached_steps for s in self.timeline if s.kind == "denoise")

    @property
    def cached_passes(self) -> int:
        """Transformer passes that reused the step cache (a step with guidance runs two)."""
        return sum(s.cached_passes for s in self.timeline if s.kind == "denoise")


class RequestFailed(RuntimeError):
    """The request ended FAILED; the message says why."""


class RequestHandle:
    """What submit returns: wait for the result, read its progress, or cancel."""

    def __init__(self, engine: Any, request_id: int, num_steps: int) -> None:
        self._engine = engine
        self.request_id = request_id
        self.num_steps = num_steps
        self._event = threading.Event()
        self._result: Result | None = None
        self._progress: Any = None  # the last gfdit._C.runtime.RequestProgress the engine pushed
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
        """{"state", "step", "num_steps", "ranks"}: where the request is now, as the engine last said (its
        progress is pushed; this never waits). ranks: the ranks it runs on, or is paused on."""
        r = self._result
        if r is not None:
            return {
                "state": r.state,
                "step": r.transitions[-1][1] if r.transitions else 0,
                "num_steps": self.num_steps,
                "ranks": [],
            }
        p = self._progress
        if p is None:
            return {"state": "QUEUED", "step": 0, "num_steps": self.num_steps, "ranks": []}
        return {"state": p.state.name, "step": p.step, "num_steps": self.num_steps, "ranks": list(p.ranks)}

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
