"""What the routes of one app share (``ServerState``, at ``app.state.server``): the engine and what the
server knows of its model, the limits it was made with, admission, metrics, the video jobs, the encoders and
the live page's recorder, and the probe /health asks the engine through."""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from fastapi import Request

from gfdit.serving.server.admission import Admission
from gfdit.serving.server.encoding import Encoders
from gfdit.serving.server.errors import APIError
from gfdit.serving.server.jobs import VideoJobStore
from gfdit.serving.server.live import ActivityRecorder
from gfdit.serving.server.metrics import Metrics

HEALTH_TIMEOUT_S = 0.5  # /health waits this long for the engine's stats, then answers 503


class EngineProbe:
    """``engine.stats()`` asked on a thread of its own with a timeout, so that /health answers whatever the
    engine is doing (its control plane may hold the lock that stats() takes). One call at a time: while one is
    stuck, later probes wait on it rather than pile up threads."""

    def __init__(self, engine: Any, timeout_s: float = HEALTH_TIMEOUT_S) -> None:
        self._engine = engine
        self.timeout_s = timeout_s
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gfdit-serve-health")
        self._pending: Future | None = None

    async def stats(self) -> dict | None:
        """The engine's stats, or None when they did not come within timeout_s (what stats() raises, raised)."""
        if self._pending is None or self._pending.done():
            self._pending = self._pool.submit(self._engine.stats)
        try:
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(self._pending)), self.timeout_s)
        except asyncio.TimeoutError:
            return None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


@dataclasses.dataclass
class ServerState:
    engine: Any
    model: str  # the name the server answers to
    key: bytes | None  # the API key; None: /v1/* is open
    world_size: int
    max_n: int
    loop_stall_s: float
    admission: Admission
    metrics: Metrics
    jobs: VideoJobStore
    encoders: Encoders
    live: ActivityRecorder
    health: EngineProbe
    cache: str | None = None  # the step cache of a request that names none (gfdit serve --cache)
    request_cache: bool = True  # whether a request may name its own (False: --forbid-request-cache)
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))
    # /health: the control loop's wake-up count last seen, and since when (monotonic)
    loop_wakeups: int = -1
    loop_seen_since: float = dataclasses.field(default_factory=time.monotonic)

    @property
    def info(self) -> Any:
        """What the engine's workers reported of the model (a gfdit._C.runtime.ModelInfo: heads, strides,
        defaults)."""
        return self.engine.model_info

    def defaults_json(self) -> dict:
        """The model's serving defaults with the request fields' names (the live page's prompt box)."""
        d = self.info.defaults
        return {
            "height": d.height,
            "width": d.width,
            "num_frames": d.num_frames,
            "num_inference_steps": d.num_steps,
            "guidance_scale": d.guidance_scale,
        }

    def check_key(self, request: Request) -> None:
        """Raises the 401 APIError unless the request carries ``Authorization: Bearer <key>`` (when a key is
        set; compared in constant time)."""
        if self.key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        # hmac.compare_digest takes the same time wherever the two differ (only a length mismatch shows)
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.key):
            raise APIError(
                401,
                "missing or wrong API key: send 'Authorization: Bearer <key>'",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )


def state_of(request: Request) -> ServerState:
    """The ServerState of the app serving ``request``."""
    return request.app.state.server
