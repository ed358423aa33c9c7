"""What the routes of one app share (``ServerState``, at ``app.state.server``): the engine and what the
server knows of its model, the limits it was made with, admission, metrics, the video jobs, the encoders and
the live page's recorder."""

from __future__ import annotations

import dataclasses
import hmac
import time
from typing import Any

from fastapi import Request

from gfdit.serving.server.admission import Admission
from gfdit.serving.server.encoding import Encoders
from gfdit.serving.server.errors import APIError
from gfdit.serving.server.jobs import VideoJobStore
from gfdit.serving.server.live import ActivityRecorder
from gfdit.serving.server.metrics import Metrics


@dataclasses.dataclass
class ServerState:
    engine: Any
    model: str  # the name the server answers to
    key: bytes | None  # the API key; None: /v1/* is open
    max_n: int
    max_body_bytes: int
    loop_stall_s: float
    admission: Admission
    metrics: Metrics
    jobs: VideoJobStore
    encoders: Encoders
    live: ActivityRecorder
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
