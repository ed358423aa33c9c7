"""``create_app``: the ASGI app of ``gfdit serve``, an OpenAI-compatible HTTP front end over ``gfdit.Engine``.

Endpoints: ``GET /v1/models``; ``GET /health``; ``GET /metrics``; ``POST /v1/images/generations``; video jobs
under ``/v1/videos``; ``GET /`` the live page and ``GET /v1/timeline`` its data; ``GET /openapi.json`` the
OpenAPI schema of all of them and ``GET /docs`` its pages. Each lives in a router of its own
(gfdit.serving.server.system, .images, .videos, .live); the shared state is a ``ServerState``.

Bad input gets a 4xx with an OpenAI-style body, ``{"error": {"message", "type", "param", "code"}}``, whose
``param`` names the field; the schema lists every error status of each route with that body. The event loop
never blocks on the engine: each engine request settles an asyncio future through
``RequestHandle.add_done_callback`` (no thread waits for results), /health asks the engine on a thread with a
timeout, admission keeps at most ``max_queue`` generations outstanding, and outputs are encoded on a small pool
of threads unless one request's output is tiny.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException

from gfdit.serving.server import defaults, images, live, system, videos
from gfdit.serving.server.admission import Admission
from gfdit.serving.server.encoding import Encoders, png_b64
from gfdit.serving.server.errors import error_body, install_handlers
from gfdit.serving.server.jobs import VideoJobStore
from gfdit.serving.server.metrics import Metrics
from gfdit.serving.server.schemas import error_response_object
from gfdit.serving.server.state import EngineProbe, ServerState


class BodyLimit:
    """ASGI middleware: a request body over ``max_bytes`` is refused with 413, by its Content-Length before it
    is read, else once the bytes read pass the limit (a chunked body)."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = Headers(scope=scope).get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            message = f"request body of {length} bytes exceeds the limit of {self.max_bytes}"
            body = error_body(message, param=None, type="invalid_request_error", code=None)
            await JSONResponse(body, status_code=413)(scope, receive, send)
            return
        seen = 0

        async def limited() -> Any:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    # FastAPI passes an HTTPException raised while it reads the body on to the handlers
                    raise StarletteHTTPException(
                        413, f"request body exceeds the limit of {self.max_bytes} bytes"
                    )
            return message

        await self.app(scope, limited, send)


def _published_schema(app: FastAPI, *, max_n: int, keyed: bool) -> dict:
    """FastAPI's schema of the routes, made true for this app: errors are 400s with the OpenAI body (FastAPI
    would list a 422 that this server never answers), ``n`` is at most max_n, and with an API key the routes
    under /v1 and /metrics say they need a bearer token and may answer 401."""
    schema = FastAPI.openapi(app)
    for path, operations in schema["paths"].items():
        for op in operations.values():
            op["responses"].pop("422", None)
            if keyed and (path.startswith("/v1/") or path == "/metrics"):
                op["security"] = [{"bearer": []}]
                op["responses"]["401"] = error_response_object(401)
    components = schema.setdefault("components", {})
    for name in ("HTTPValidationError", "ValidationError"):
        components.get("schemas", {}).pop(name, None)
    n = components["schemas"]["ImageGenerationRequest"]["properties"]["n"]
    next(s for s in n["anyOf"] if s.get("type") == "integer")["maximum"] = max_n
    if keyed:
        components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    return schema


def _checked_cache(engine: Any, cache: str | None) -> str | None:
    """The server's default step cache in canonical text, or None: a spec the engine's model refuses is refused
    now (gfdit.InvalidUsage naming cache), not at every request."""
    if cache is None:
        return None
    from gfdit.serving.request import Request as EngineRequest

    engine.check(EngineRequest(prompt="-", cache=cache))
    spec = EngineRequest(prompt="-", cache=cache).message().cache
    return str(spec) if spec.on() else None


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
    cache: str | None = None,
    request_cache: bool = True,
) -> FastAPI:
    """The ASGI app serving ``engine`` under the model name ``model``.

    api_key: when given, /v1/* needs ``Authorization: Bearer <api_key>`` (compared in constant time).
    max_queue: images accepted and not yet answered, past which a request gets 429 with Retry-After.
    max_n: the largest ``n`` of one request. max_body_bytes: larger bodies get 413. retry_after_s: the least
    Retry-After of a 429 (the server asks for longer when its recent completion rate says the queue needs
    longer to make room). loop_stall_s: /health answers 503 when the control loop has not woken for this long.
    job_ttl_s: finished video jobs (and their MP4) are forgotten this long after they end. max_video_bytes: the
    MP4s of finished jobs kept in memory at most; past it the oldest finished jobs are forgotten early (the
    newest is kept whatever its size). cache: the step cache of a request that names none (its text; None: none),
    checked here against the engine's model; request_cache: whether a request may name its own (False: a body's
    ``cache`` is refused with 400).
    """
    if isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 1:
        raise ValueError(f"gfdit serve: max_queue must be a positive integer, got {max_queue!r}")
    admission = Admission(max_queue, retry_after_s)
    server = ServerState(
        engine=engine,
        model=model,
        key=api_key.encode() if api_key else None,
        world_size=len(engine.alive_workers()),
        max_n=max_n,
        loop_stall_s=loop_stall_s,
        admission=admission,
        metrics=Metrics(engine, admission),
        jobs=VideoJobStore(job_ttl_s, max_video_bytes),
        encoders=Encoders(),
        live=live.ActivityRecorder(),
        health=EngineProbe(engine),
        cache=_checked_cache(engine, cache),
        request_cache=bool(request_cache),
    )

    engine.add_progress_listener(server.live.on_progress)  # the live page hears where requests run

    @contextlib.asynccontextmanager
    async def lifespan(_: Any) -> Any:
        import torch

        png_b64(torch.zeros(3, 8, 8))  # imports and first-use costs now, not in the first answer
        yield
        server.encoders.close()
        server.health.close()

    app = FastAPI(
        title="gfdit",
        version=importlib.metadata.version("gfdit"),
        description="An OpenAI-compatible server of diffusion transformers (images and video jobs).",
        redoc_url=None,
        lifespan=lifespan,
    )
    app.state.server = server
    routers = (system.router, live.router, images.router, videos.router)
    install_handlers(app, [route for router in routers for route in router.routes])
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    for router in routers:
        app.include_router(router)
    published: dict = {}

    def openapi() -> dict:
        if not published:
            published.update(_published_schema(app, max_n=max_n, keyed=server.key is not None))
        return published

    app.openapi = openapi  # type: ignore[method-assign]
    return app
