"""``create_app``: the ASGI app of ``gfdit serve``, an OpenAI-compatible HTTP front end over ``gfdit.Engine``.

Endpoints: ``GET /v1/models``; ``GET /health``; ``GET /metrics``; ``POST /v1/images/generations``; video jobs
under ``/v1/videos``; ``GET /`` the live page and ``GET /v1/timeline`` its data. Each lives in a router of its
own (gfdit.serving.server.system, .images, .videos, .live); the shared state is a ``ServerState``.

Bad input gets a 4xx with an OpenAI-style body, ``{"error": {"message", "type", "param", "code"}}``, whose
``param`` names the field. The event loop never blocks on the engine: each engine request settles an asyncio
future through ``RequestHandle.add_done_callback`` (no thread waits for results), admission keeps at most
``max_queue`` generations outstanding, and outputs are encoded on the loop when small (under a millisecond)
or on a small pool of threads when not.
"""

from __future__ import annotations

import contextlib
from typing import Any

from fastapi import FastAPI

from gfdit.serving.server import defaults, images, live, system, videos
from gfdit.serving.server.admission import Admission
from gfdit.serving.server.encoding import Encoders, png_b64
from gfdit.serving.server.errors import install_handlers
from gfdit.serving.server.jobs import VideoJobStore
from gfdit.serving.server.metrics import Metrics
from gfdit.serving.server.state import ServerState


def create_app(
    engine: Any,
    *,
    model: str,
    api_key: str | None = None,
    max_queue: int = defaults.MAX_QUEUE,
    max_n: int = defaults.MAX_N,
    max_body_bytes: int = defaults.MAX_BODY_BYTES,
    retry_after_s: int = 1,
    loop_stall_s: float = 1.0,
    job_ttl_s: float = defaults.JOB_TTL_S,
    max_video_bytes: int = defaults.MAX_VIDEO_BYTES,
) -> FastAPI:
    """The ASGI app serving ``engine`` under the model name ``model``.

    api_key: when given, /v1/* needs ``Authorization: Bearer <api_key>`` (compared in constant time).
    max_queue: images accepted and not yet answered, past which a request gets 429 with Retry-After.
    max_n: the largest ``n`` of one request. max_body_bytes: larger bodies get 413. retry_after_s: the least
    Retry-After of a 429 (the server asks for longer when its recent completion rate says the queue needs
    longer to make room). loop_stall_s: /health answers 503 when the control loop has not woken for this long.
    job_ttl_s: finished video jobs (and their MP4) are forgotten this long after they end. max_video_bytes: the
    MP4s of finished jobs kept in memory at most; past it the oldest finished jobs are forgotten early (the
    newest is kept whatever its size).
    """
    if isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 1:
        raise ValueError(f"gfdit serve: max_queue must be a positive integer, got {max_queue!r}")
    admission = Admission(max_queue, retry_after_s)
    server = ServerState(
        engine=engine,
        model=model,
        key=api_key.encode() if api_key else None,
        max_n=max_n,
        max_body_bytes=max_body_bytes,
        loop_stall_s=loop_stall_s,
        admission=admission,
        metrics=Metrics(engine, admission),
        jobs=VideoJobStore(job_ttl_s, max_video_bytes),
        encoders=Encoders(),
        live=live.ActivityRecorder(),
    )

    engine.add_progress_listener(server.live.on_progress)  # the live page hears where requests run

    @contextlib.asynccontextmanager
    async def lifespan(_: Any) -> Any:
        import torch

        png_b64(torch.zeros(3, 8, 8))  # imports and first-use costs now, not in the first answer
        yield
        server.encoders.close()

    app = FastAPI(title="gfdit", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.server = server
    install_handlers(app)
    for router in (system.router, live.router, images.router, videos.router):
        app.include_router(router)
    return app
