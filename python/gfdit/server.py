"""``gfdit serve``: an OpenAI-compatible HTTP front end over ``gfdit.Engine`` (FastAPI + uvicorn).

``create_app(engine, model=...)`` builds the ASGI app; ``gfdit serve`` starts an engine and serves it. Endpoints:
``GET /v1/models``; ``GET /health`` (200 only while every worker is alive and the control loop wakes, 503 with
the reason otherwise); ``GET /metrics`` (Prometheus); ``POST /v1/images/generations`` (OpenAI's images API:
model, prompt, n, size "WxH", response_format "b64_json" (PNG), user; plus negative_prompt,
num_inference_steps, guidance_scale, seed, slo_ms, priority); videos as asynchronous jobs: ``POST /v1/videos``
returns a job, ``GET /v1/videos/{id}`` its status and progress, ``GET /v1/videos/{id}/content`` the H.264 MP4
(PyAV), ``DELETE /v1/videos/{id}`` cancels and forgets it; finished jobs expire after a TTL. A client that
disconnects cancels its requests. ``GET /`` is the live page and ``GET /v1/timeline`` its data (gfdit.live).

Bad input gets a 4xx with an OpenAI-style body, ``{"error": {"message", "type", "param", "code"}}``, whose
``param`` names the field. The event loop never blocks on the engine: each engine request settles an asyncio
future through ``RequestHandle.add_done_callback`` (no thread waits for results), admission keeps at most
``max_queue`` generations outstanding, and outputs are encoded on the loop when small (under a millisecond)
or on a small pool of threads when not.
"""

# No `from __future__ import annotations`: FastAPI reads the endpoints' annotations (Request) at run time.

import argparse
import asyncio
import base64
import collections
import contextlib
import hmac
import io
import json
import math
import re
import secrets
import sys
import threading
import time
from concurrent.futures import CancelledError, ThreadPoolExecutor
from typing import Any

DEFAULT_MAX_QUEUE = 256
DEFAULT_MAX_N = 10
DEFAULT_MAX_BODY_BYTES = 1 << 20
DEFAULT_MAX_VIDEO_BYTES = 1 << 30
_INLINE_ENCODE_VALUES = 3 * 128 * 128  # outputs up to this many values are encoded on the loop (< 1 ms)
_RATE_WINDOW_S = 30.0  # the completion rate behind Retry-After is measured over this window
_SIZE = re.compile(r"^([1-9][0-9]{0,5})x([1-9][0-9]{0,5})$")
# Which request field an engine message is about (the engine names its own fields; "size" stands for both
# height and width, "slo_ms" for the deadline).
_PARAM_OF = (
    ("num_inference_steps", "num_inference_steps"),
    ("height", "size"),
    ("width", "size"),
    ("pixels", "size"),
    ("tokens", "size"),
    ("guidance_scale_2", "guidance_scale_2"),
    ("guidance_scale", "guidance_scale"),
    ("prompt", "prompt"),
    ("seed", "seed"),
    ("priority", "priority"),
    ("deadline", "slo_ms"),
)


class APIError(Exception):
    """An error answered as an OpenAI-style JSON body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        type: str = "invalid_request_error",
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.type = type
        self.code = code
        self.headers = headers


def _error_body(message: str, *, param: str | None, type: str, code: str | None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def _request_models() -> tuple[type, type]:
    """The bodies of POST /v1/images/generations and POST /v1/videos (built lazily: pydantic is a serving
    dependency). Unknown fields are ignored, as OpenAI's own clients may send fields a server does not use."""
    from pydantic import BaseModel, ConfigDict, StrictBool, StrictFloat, StrictInt, StrictStr

    class GenerationRequest(BaseModel):
        """The fields images and videos share: OpenAI's and gfdit's (steps, guidance, seed, scheduling)."""

        model_config = ConfigDict(extra="ignore")

        prompt: StrictStr
        model: StrictStr | None = None
        size: StrictStr | None = None
        user: StrictStr | None = None
        negative_prompt: StrictStr | None = None
        num_inference_steps: StrictInt | None = None
        guidance_scale: StrictFloat | None = None
        guidance_scale_2: StrictFloat | None = None
        seed: StrictInt | None = None
        slo_ms: StrictFloat | None = None
        priority: StrictInt = 0

    class ImageGenerationRequest(GenerationRequest):
        n: StrictInt | None = None
        response_format: StrictStr | None = None
        output_format: StrictStr | None = None
        stream: StrictBool | None = None

    class VideoGenerationRequest(GenerationRequest):
        seconds: StrictStr | StrictFloat | None = None  # OpenAI sends a string ("4")
        num_frames: StrictInt | None = None
        fps: StrictInt = 16

    return ImageGenerationRequest, VideoGenerationRequest


def _mp4(video: Any, fps: int) -> bytes:
    """A video tensor [3, F, H, W] with values in [0, 1] as an H.264 MP4 (yuv420p)."""
    import av

    frames = _to_uint8(video).transpose(1, 2, 3, 0).copy()  # [F, H, W, 3]
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.height, stream.width = frames.shape[1], frames.shape[2]
        stream.pix_fmt = "yuv420p"
        for f in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


class VideoJob:
    """One asynchronous video generation: its engine request, then its MP4."""

    def __init__(
        self, job_id: str, model: str, handle: Any, width: int, height: int, num_frames: int
    ) -> None:
        self.id = job_id
        self.model = model
        self.handle = handle
        self.size = f"{width}x{height}"
        self.num_frames = num_frames
        self.created_at = int(time.time())
        self.status = "queued"  # queued, in_progress, completed, failed, cancelled
        self.completed_at: int | None = None
        self.finished_monotonic: float | None = None
        self.ended = asyncio.Event()  # set when the job has ended (long polls wait on it)
        self.content: bytes | None = None
        self.error: str | None = None

    def to_json(self, ttl_s: float, probe: bool = True) -> dict:
        """The OpenAI-style video object; probe asks the engine for progress (may wait: call off the loop)."""
        progress = 100 if self.status == "completed" else 0
        status = self.status
        if probe and self.finished_monotonic is None and not self.handle.done():
            st = (
                self.handle.status()
            )  # may wait up to a second when the request just ended: call off the loop
            if st["state"] != "QUEUED":
                status = "in_progress"
                progress = min(99, int(100 * st["step"] / max(1, st["num_steps"])))
        return {
            "id": self.id,
            "object": "video",
            "model": self.model,
            "status": status,
            "progress": progress,
            "created_at": self.created_at,
            "completed_at": self.completed_at,
            "expires_at": None if self.completed_at is None else int(self.completed_at + ttl_s),
            "size": self.size,
            "num_frames": self.num_frames,
            "error": None if self.error is None else {"message": self.error},
        }


def _png_b64(image: Any) -> str:
    """An image tensor [3, H, W] (or [3, 1, H, W] from a video model) with values in [0, 1] as a base64 PNG."""
    from PIL import Image

    if image.dim() == 4:
        image = image[:, 0]
    hwc = _to_uint8(image).transpose(1, 2, 0).copy()
    buf = io.BytesIO()
    Image.fromarray(hwc, mode="RGB").save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _to_uint8(t: Any) -> Any:
    """A float tensor with values in [0, 1] as a uint8 numpy array of the same shape (round half to even).

    NumPy, not torch: a torch operation here would wake torch's OpenMP pool in the server's process, whose
    threads then spin for a while after every image and take CPU from the workers on a small machine."""
    import numpy as np

    a = np.clip(np.nan_to_num(t.detach().cpu().numpy(), nan=0.0), 0.0, 1.0) * 255.0
    return np.rint(a).astype(np.uint8)


def _param_of(message: str) -> str | None:
    for word, param in _PARAM_OF:
        if word in message:
            return param
    return None


class ClientDisconnected(Exception):
    """The client went away before its answer was ready."""


class EngineCancelled(Exception):
    """The engine cancelled a request (shutdown, or a cancel from elsewhere) while a client waited for it.

    Raised in place of concurrent.futures.CancelledError, which asyncio would turn into a cancellation of the
    waiting task itself: the client would get no answer at all."""


def _settle(fut: asyncio.Future, handle: Any, arrived: float) -> None:
    """Gives ``fut`` the ended handle's (result, arrival time), or its error (on the event loop)."""
    if fut.done():  # the waiting request was cancelled
        return
    try:
        fut.set_result((handle.result(timeout=0), arrived))
    except CancelledError as e:
        fut.set_exception(EngineCancelled(str(e) or "cancelled"))
    except Exception as e:
        fut.set_exception(e)


def _result_of(handle: Any) -> asyncio.Future:
    """A future of the handle's (result, monotonic time it arrived), settled on the running loop.

    The engine's result thread hands the handle over with call_soon_threadsafe: no thread waits for it, and
    the answer costs one wake-up of the loop after the engine's result."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    def done(h: Any) -> None:
        arrived = time.monotonic()
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            loop.call_soon_threadsafe(_settle, fut, h, arrived)

    handle.add_done_callback(done)
    return fut


async def _encode(pool: ThreadPoolExecutor, fn: Any, *args: Any) -> Any:
    """fn(*args) on the event loop when the output is small (a thread hop would cost more than the work),
    else on ``pool`` so the loop keeps answering."""
    if args[0].numel() <= _INLINE_ENCODE_VALUES:
        return fn(*args)
    return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)


async def _until_disconnect(request: Any, work: Any) -> Any:
    """Awaits ``work`` unless the client disconnects first (then raises ClientDisconnected).

    The body has been read, so the next ASGI message can only be ``http.disconnect``: waiting for it
    costs nothing while the work runs, and the caller cancels the engine requests when it comes.
    """
    work = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(request.receive())
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not work.done() and gone.done() and gone.result().get("type") == "http.disconnect":
            work.cancel()
            raise ClientDisconnected()
        return await work
    finally:
        gone.cancel()


class _Metrics:
    """The server's Prometheus metrics, in a registry of its own (one per app)."""

    def __init__(self, engine: Any, admission: "_Admission") -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = r = CollectorRegistry()
        self._engine = engine
        buckets = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
        states = Gauge("gfdit_requests_in_engine", "engine requests by state", ["state"], registry=r)
        for state in ("QUEUED", "RUNNING"):
            states.labels(state).set_function(lambda s=state: self._count(s))
        Gauge("gfdit_outstanding_images", "images accepted and not yet answered", registry=r).set_function(
            lambda: admission.pending
        )
        self.requests = Counter(
            "gfdit_http_requests",
            "generation requests (images: one per HTTP request; videos: one per job) by kind and outcome",
            ["kind", "outcome"],
            registry=r,
        )
        self.latency = Histogram(
            "gfdit_request_latency_seconds",
            "end-to-end latency of a generation as the server saw it (videos: until the MP4 is ready)",
            ["kind"],
            buckets=buckets,
            registry=r,
        )
        self.stage = Histogram(
            "gfdit_stage_seconds",
            "time of one stage task on its ranks (denoise: per step)",
            ["stage"],
            buckets=buckets,
            registry=r,
        )
        self.slo = Counter(
            "gfdit_slo_requests",
            "generations with slo_ms by whether they met it",
            ["kind", "result"],
            registry=r,
        )
        self.busy = Counter(
            "gfdit_rank_busy_seconds", "seconds each rank spent running tasks", ["rank"], registry=r
        )
        for w in range(len(engine.alive_workers())):
            self.busy.labels(str(w))
        self.regroups = Gauge(
            "gfdit_regroups", "regroupings by the control plane so far (use rate())", registry=r
        )
        self.regroups.set_function(lambda: engine.stats().get("regroups", 0))
        self._done: collections.deque[float] = collections.deque()  # monotonic times of recent answers
        self._done_lock = threading.Lock()

    def _count(self, state: str) -> int:
        states = self._engine.requests().values()
        if state == "QUEUED":
            return sum(1 for s in states if s == "QUEUED")
        return sum(1 for s in states if s != "QUEUED")

    def finished(self, count: int = 1) -> None:
        """Records ``count`` generations answered now (the completion rate that Retry-After is derived from)."""
        now = time.monotonic()
        with self._done_lock:
            self._done.extend([now] * count)
            while self._done and now - self._done[0] > _RATE_WINDOW_S:
                self._done.popleft()

    def completion_rate(self) -> float:
        """Generations answered per second over the last _RATE_WINDOW_S seconds (0 before any)."""
        now = time.monotonic()
        with self._done_lock:
            while self._done and now - self._done[0] > _RATE_WINDOW_S:
                self._done.popleft()
            if not self._done:
                return 0.0
            return len(self._done) / max(now - self._done[0], 1.0)

    def observe(self, result: Any, slo_s: float | None, kind: str) -> None:
        for st in result.timeline:
            if st.start_ns and st.end_ns > st.start_ns:
                dt = (st.end_ns - st.start_ns) / 1e9
                self.stage.labels(st.kind).observe(dt / max(1, st.num_steps))
                for rank in st.ranks:
                    self.busy.labels(str(rank)).inc(dt)
        if slo_s is not None and result.transitions:
            e2e = (result.transitions[-1][2] - result.transitions[0][2]) / 1e9
            self.slo.labels(kind, "met" if e2e <= slo_s else "missed").inc()


class _Admission:
    """Counts images accepted and not yet answered; refuses past max_queue."""

    def __init__(self, max_queue: int) -> None:
        self.max_queue = max_queue
        self.pending = 0
        self._lock = threading.Lock()

    def acquire(self, count: int) -> bool:
        with self._lock:
            if self.pending + count > self.max_queue:
                return False
            self.pending += count
            return True

    def release(self, count: int) -> None:
        with self._lock:
            self.pending -= count


def create_app(
    engine: Any,
    *,
    model: str,
    api_key: str | None = None,
    max_queue: int = DEFAULT_MAX_QUEUE,
    max_n: int = DEFAULT_MAX_N,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    retry_after_s: int = 1,
    loop_stall_s: float = 1.0,
    job_ttl_s: float = 3600.0,
    max_video_bytes: int = DEFAULT_MAX_VIDEO_BYTES,
) -> Any:
    """The ASGI app serving ``engine`` under the model name ``model``.

    api_key: when given, /v1/* needs ``Authorization: Bearer <api_key>`` (compared in constant time).
    max_queue: images accepted and not yet answered, past which a request gets 429 with Retry-After.
    max_n: the largest ``n`` of one request. max_body_bytes: larger bodies get 413. retry_after_s: the least
    Retry-After of a 429 (the server asks for longer when its recent completion rate says the queue needs
    longer to make room). loop_stall_s: /health answers 503 when the control loop has not woken for this long.
    job_ttl_s: finished video jobs (and their MP4) are forgotten this long after they end. max_video_bytes: the
    MP4s of finished jobs kept in memory at most; past it the oldest finished jobs are forgotten early (the
    newest is kept whatever its size).

    Each image answer carries a ``Server-Timing`` header: ``engine`` (from submit to the engine's result),
    ``encode`` (PNG) and ``total`` (the server's whole handling), in milliseconds.
    """
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response
    from pydantic import ValidationError
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from gfdit._C import InvalidUsage
    from gfdit.engine import Request as EngineRequest
    from gfdit.engine import RequestFailed
    from gfdit.live import add_live_routes

    if isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 1:
        raise ValueError(f"gfdit serve: max_queue must be a positive integer, got {max_queue!r}")
    image_model, video_model = _request_models()
    key = api_key.encode() if api_key else None
    admission = _Admission(max_queue)
    encoders = ThreadPoolExecutor(max_workers=2, thread_name_prefix="gfdit-serve-encode")
    created = int(time.time())
    info = engine.model_info
    stride = int(info["vae_stride_s"]) * int(info["patch_s"])
    defaults = info["defaults"]

    @contextlib.asynccontextmanager
    async def lifespan(_: Any) -> Any:
        import torch

        _png_b64(torch.zeros(3, 8, 8))  # imports and first-use costs now, not in the first answer
        yield
        encoders.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="gfdit", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.engine = engine
    app.state.admission = admission
    metrics = app.state.metrics = _Metrics(engine, admission)
    progress = {"wakeups": -1, "since": time.monotonic()}

    @app.exception_handler(APIError)
    async def _api_error(_: Request, e: APIError) -> JSONResponse:
        return JSONResponse(
            _error_body(e.message, param=e.param, type=e.type, code=e.code),
            status_code=e.status,
            headers=e.headers,
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
        kind = "not_found" if e.status_code == 404 else "invalid_request_error"
        return JSONResponse(
            _error_body(str(e.detail), param=None, type=kind, code=None),
            status_code=e.status_code,
            headers=getattr(e, "headers", None),
        )

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0] if e.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        return JSONResponse(
            _error_body(
                first.get("msg", "invalid request"),
                param=".".join(loc) or None,
                type="invalid_request_error",
                code=None,
            ),
            status_code=400,
        )

    @app.exception_handler(Exception)
    async def _internal_error(_: Request, e: Exception) -> JSONResponse:
        return JSONResponse(
            _error_body(f"internal error: {type(e).__name__}", param=None, type="server_error", code=None),
            status_code=500,
        )

    def retry_after(count: int) -> str:
        """Seconds until ``count`` more images likely fit: the time the recent completion rate needs to answer
        that many, at least retry_after_s and at most a minute."""
        rate = metrics.completion_rate()
        wait = count / rate if rate > 0 else retry_after_s
        return str(int(min(60, max(retry_after_s, math.ceil(wait)))))

    def queue_full(count: int) -> APIError:
        return APIError(
            429,
            f"the queue is full ({admission.max_queue} generations outstanding); retry later",
            type="rate_limit_error",
            code="queue_full",
            headers={"Retry-After": retry_after(count)},
        )

    def check_key(request: Request) -> None:
        if key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        # hmac.compare_digest takes the same time wherever the two differ (only a length mismatch shows)
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key):
            raise APIError(
                401,
                "missing or wrong API key: send 'Authorization: Bearer <key>'",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )

    @app.get("/health")
    def health() -> JSONResponse:
        stats = engine.stats()
        alive = list(stats["alive"])
        dead = [w for w, a in enumerate(alive) if not a]
        # the control loop wakes at least every ~100 ms while it runs; a count that stops means it stalled
        now = time.monotonic()
        if stats.get("loop_wakeups") != progress["wakeups"]:
            progress["wakeups"], progress["since"] = stats.get("loop_wakeups"), now
        stalled_s = now - progress["since"]
        reasons = []
        if dead:
            reasons.append("workers not alive: " + ", ".join(str(w) for w in dead))
        if stalled_s > loop_stall_s:
            reasons.append(f"the control loop made no progress for {stalled_s:.1f} s")
        if reasons:
            return JSONResponse(
                {"status": "unavailable", "reason": "; ".join(reasons), "alive": alive}, status_code=503
            )
        return JSONResponse({"status": "ok", "alive": alive})

    @app.get("/metrics")
    def prometheus_metrics(request: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        check_key(request)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    def models(request: Request) -> dict:
        check_key(request)
        return {
            "object": "list",
            "data": [{"id": model, "object": "model", "created": created, "owned_by": "gfdit"}],
        }

    live = add_live_routes(app, engine, model=model, check_key=check_key)  # GET / and /v1/timeline

    async def read_json(request: Request) -> Any:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > max_body_bytes:
            raise APIError(413, f"request body of {length} bytes exceeds the limit of {max_body_bytes}")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > max_body_bytes:
                raise APIError(413, f"request body exceeds the limit of {max_body_bytes} bytes")
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            raise APIError(400, f"the request body is not valid JSON: {e}") from None
        if not isinstance(data, dict):
            raise APIError(400, "the request body must be a JSON object")
        return data

    def parse(body_model: type, data: dict) -> Any:
        try:
            return body_model.model_validate(data)
        except ValidationError as e:
            first = e.errors()[0]
            param = ".".join(str(p) for p in first["loc"]) or None
            raise APIError(400, f"{param}: {first['msg']}", param=param) from None

    def check_common(b: Any) -> tuple[int, int, int]:
        """Checks the fields images and videos share; returns (width, height, seed)."""
        if b.model is not None and b.model != model:
            raise APIError(
                404,
                f"the model {b.model!r} does not exist; served: {model!r}",
                param="model",
                code="model_not_found",
            )
        if not b.prompt.strip():
            raise APIError(400, "prompt must not be empty", param="prompt")
        width, height = defaults["width"], defaults["height"]
        if b.size not in (None, "auto"):
            m = _SIZE.match(b.size)
            if m is None:
                raise APIError(400, f"size {b.size!r} is not of the form 'WIDTHxHEIGHT'", param="size")
            width, height = int(m.group(1)), int(m.group(2))
            if width % stride or height % stride:
                raise APIError(
                    400, f"size {b.size}: width and height must be multiples of {stride}", param="size"
                )
            max_pixels = engine.limits["max_pixels"]
            if width * height > max_pixels:
                raise APIError(400, f"size {b.size} has more than {max_pixels} pixels", param="size")
        max_steps = engine.limits["max_steps"]
        if b.num_inference_steps is not None and not 1 <= b.num_inference_steps <= max_steps:
            raise APIError(
                400,
                f"num_inference_steps {b.num_inference_steps} is outside [1, {max_steps}]",
                param="num_inference_steps",
            )
        if b.guidance_scale is not None and not (math.isfinite(b.guidance_scale) and b.guidance_scale >= 0):
            raise APIError(400, "guidance_scale must be a finite number >= 0", param="guidance_scale")
        if b.guidance_scale_2 is not None and not (
            math.isfinite(b.guidance_scale_2) and b.guidance_scale_2 >= 0
        ):
            raise APIError(400, "guidance_scale_2 must be a finite number >= 0", param="guidance_scale_2")
        if b.slo_ms is not None and not (math.isfinite(b.slo_ms) and b.slo_ms > 0):
            raise APIError(400, "slo_ms must be a positive number", param="slo_ms")
        if b.seed is not None and not 0 <= b.seed < 2**63:
            raise APIError(400, "seed must be in [0, 2^63)", param="seed")
        if not -(2**31) <= b.priority < 2**31:
            raise APIError(400, "priority must be a 32-bit integer", param="priority")
        return width, height, secrets.randbits(31) if b.seed is None else b.seed

    def engine_request(b: Any, width: int, height: int, num_frames: int, seed: int) -> Any:
        return EngineRequest(
            prompt=b.prompt,
            negative_prompt=b.negative_prompt,
            height=height,
            width=width,
            num_frames=num_frames,
            num_inference_steps=b.num_inference_steps,
            guidance_scale=b.guidance_scale,
            guidance_scale_2=b.guidance_scale_2,
            seed=seed % 2**63,
            deadline_s=None if b.slo_ms is None else b.slo_ms / 1000.0,
            priority=b.priority,
        )

    def submit(reqs: list[Any]) -> list[Any]:
        """Submits to the engine (returns at once); a refusal becomes a 400 naming the field."""
        handles = []
        try:
            for r in reqs:
                handles.append(engine.submit(r))
        except InvalidUsage as e:
            for h in handles:
                h.cancel()
            msg = str(e).removeprefix("gfdit.Request: ")
            param = _param_of(msg)
            if msg.startswith("prompt and negative_prompt"):  # too long together: name the longer
                r0 = reqs[0]
                param = "prompt" if len(r0.prompt) >= len(r0.negative_prompt or "") else "negative_prompt"
            raise APIError(400, msg, param=param) from None
        live.track(handles)
        return handles

    def to_engine_requests(b: Any) -> list[Any]:
        n = 1 if b.n is None else b.n
        if not 1 <= n <= max_n:
            raise APIError(400, f"n {n} is outside [1, {max_n}]", param="n")
        if b.stream:
            raise APIError(400, "streaming is not supported", param="stream")
        if b.output_format not in (None, "png"):
            raise APIError(
                400, f"output_format {b.output_format!r} is not supported; use 'png'", param="output_format"
            )
        if b.response_format not in (None, "b64_json"):
            raise APIError(
                400,
                f"response_format {b.response_format!r} is not supported; use 'b64_json'",
                param="response_format",
            )
        width, height, seed = check_common(b)
        return [engine_request(b, width, height, 1, seed + i) for i in range(n)]

    def count_error(kind: str, e: BaseException) -> None:
        if isinstance(e, APIError):
            metrics.requests.labels(
                kind, e.code or ("bad_request" if e.status < 500 else "server_error")
            ).inc()
        else:
            metrics.requests.labels(kind, "server_error").inc()

    @app.post("/v1/images/generations")
    async def generate_images(request: Request) -> JSONResponse:
        t0 = time.monotonic()
        try:
            response = await _generate_images(request, t0)
        except BaseException as e:
            count_error("image", e)
            raise
        if response.status_code == 200:
            metrics.latency.labels("image").observe(time.monotonic() - t0)
            metrics.requests.labels("image", "ok").inc()
        else:
            metrics.requests.labels("image", "disconnected").inc()
        return response

    async def _generate_images(request: Request, t0: float) -> JSONResponse:
        check_key(request)
        reqs = to_engine_requests(parse(image_model, await read_json(request)))
        if not admission.acquire(len(reqs)):
            raise queue_full(len(reqs))
        handles = []
        try:
            t_submit = time.monotonic()
            handles = submit(reqs)
            try:
                answers = await _until_disconnect(request, asyncio.gather(*(_result_of(h) for h in handles)))
            except RequestFailed as e:
                raise APIError(500, str(e), type="server_error", code="generation_failed") from None
            except EngineCancelled as e:
                raise APIError(503, str(e), type="server_error", code="cancelled") from None
            t_results = max(t for _, t in answers)
            results = [r for r, _ in answers]
            metrics.finished(len(results))
            slo_s = reqs[0].deadline_s
            for r in results:
                metrics.observe(r, slo_s, "image")
                live.record(r)
            data = await asyncio.gather(*(_encode(encoders, _png_b64, r.output) for r in results))
            t_encoded = time.monotonic()
        except BaseException as e:
            for h in handles:
                h.cancel()
            if isinstance(e, ClientDisconnected):
                # nobody reads this answer; 499 is the usual record of a client that closed first
                return JSONResponse(
                    _error_body("client disconnected", param=None, type="cancelled", code=None), 499
                )
            raise
        finally:
            admission.release(len(reqs))
        timing = {
            "engine": t_results - t_submit,
            "encode": t_encoded - t_results,
            "total": time.monotonic() - t0,
        }
        return JSONResponse(
            {"created": int(time.time()), "data": [{"b64_json": d} for d in data]},
            headers={"Server-Timing": ", ".join(f"{k};dur={v * 1000:.3f}" for k, v in timing.items())},
        )

    jobs: dict[str, VideoJob] = {}
    job_tasks: set[asyncio.Task] = set()

    def sweep_jobs() -> None:
        """Forgets finished jobs past their TTL, then the oldest finished ones while their MP4s exceed
        max_video_bytes."""
        now = time.monotonic()
        finished = sorted(
            (j for j in list(jobs.values()) if j.finished_monotonic is not None),
            key=lambda j: j.finished_monotonic,
        )
        kept = 0
        for i, j in enumerate(reversed(finished)):  # the newest first; the newest is kept whatever its size
            kept += len(j.content or b"")
            if now - j.finished_monotonic > job_ttl_s or (i > 0 and kept > max_video_bytes):
                jobs.pop(j.id, None)

    def job_of(video_id: str) -> VideoJob:
        sweep_jobs()
        job = jobs.get(video_id)
        if job is None:
            raise APIError(
                404,
                f"no video job {video_id!r} (unknown, deleted or expired)",
                param="video_id",
                code="not_found",
            )
        return job

    async def finish_job(job: VideoJob, fps: int, slo_s: float | None, t0: float) -> None:
        loop = asyncio.get_running_loop()
        outcome = "ok"
        try:
            result, _ = await _result_of(job.handle)
            metrics.finished(1)
            live.record(result)
            job.status = "in_progress"
            job.content = await loop.run_in_executor(encoders, _mp4, result.output, fps)
            metrics.observe(result, slo_s, "video")
            metrics.latency.labels("video").observe(time.monotonic() - t0)
            job.status = "completed"
        except RequestFailed as e:
            job.status, job.error, outcome = "failed", str(e), "generation_failed"
        except (EngineCancelled, asyncio.CancelledError) as e:
            job.status, job.error, outcome = "cancelled", str(e) or "cancelled", "cancelled"
        except Exception as e:  # an encoder error fails the job, never the server
            job.status, job.error, outcome = "failed", f"{type(e).__name__}: {e}", "server_error"
        finally:
            admission.release(1)
            metrics.requests.labels("video", outcome).inc()
            job.completed_at = int(time.time())
            job.finished_monotonic = time.monotonic()
            job.ended.set()
            sweep_jobs()  # a new MP4 may push the oldest past max_video_bytes

    @app.post("/v1/videos")
    async def create_video(request: Request) -> JSONResponse:
        t0 = time.monotonic()
        try:
            return await _create_video(request, t0)
        except BaseException as e:
            count_error("video", e)
            raise

    async def _create_video(request: Request, t0: float) -> JSONResponse:
        check_key(request)
        if not info["is_video"]:
            raise APIError(
                400, f"the model {model!r} makes images; use /v1/images/generations", param="model"
            )
        b = parse(video_model, await read_json(request))
        width, height, seed = check_common(b)
        if not 1 <= b.fps <= 120:
            raise APIError(400, "fps must be in [1, 120]", param="fps")
        num_frames = b.num_frames
        if num_frames is None and b.seconds is not None:
            try:
                seconds = float(b.seconds)
            except ValueError:
                raise APIError(400, f"seconds {b.seconds!r} is not a number", param="seconds") from None
            if not (math.isfinite(seconds) and seconds > 0):
                raise APIError(400, "seconds must be a positive number", param="seconds")
            t = int(info["vae_stride_t"])
            num_frames = int(seconds * b.fps) // t * t + 1  # the VAE takes 1 + stride_t * k frames
        if num_frames is None:
            num_frames = defaults["num_frames"]
        max_frames = engine.limits["max_frames"]
        if not 1 <= num_frames <= max_frames:
            raise APIError(400, f"num_frames {num_frames} is outside [1, {max_frames}]", param="num_frames")
        req = engine_request(b, width, height, num_frames, seed)
        if not admission.acquire(1):
            raise queue_full(1)
        try:
            (handle,) = submit([req])
        except BaseException:
            admission.release(1)
            raise
        sweep_jobs()
        job = VideoJob("video_" + secrets.token_hex(12), model, handle, width, height, num_frames)
        jobs[job.id] = job
        task = asyncio.ensure_future(finish_job(job, b.fps, req.deadline_s, t0))
        job_tasks.add(task)
        task.add_done_callback(job_tasks.discard)
        return JSONResponse(job.to_json(job_ttl_s, probe=False))

    @app.get("/v1/videos/{video_id}")
    async def get_video(video_id: str, request: Request) -> dict:
        """The job; with ``?wait_s=S`` (up to 30) the answer waits until the job ends or S seconds pass."""
        from starlette.concurrency import run_in_threadpool

        check_key(request)
        job = job_of(video_id)
        raw = request.query_params.get("wait_s", "0")
        try:
            wait_s = float(raw)
        except ValueError:
            wait_s = math.nan
        if not 0 <= wait_s <= 30:
            raise APIError(400, f"wait_s {raw!r} is not a number of seconds in [0, 30]", param="wait_s")
        if wait_s > 0 and job.finished_monotonic is None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(job.ended.wait(), wait_s)
        return await run_in_threadpool(job.to_json, job_ttl_s)  # status() may wait a moment

    @app.get("/v1/videos/{video_id}/content")
    def get_video_content(video_id: str, request: Request) -> Response:
        check_key(request)
        job = job_of(video_id)
        if job.status != "completed" or job.content is None:
            raise APIError(
                409,
                f"video {video_id} is {job.status}; its content exists once completed",
                param="video_id",
                code="video_not_ready",
            )
        return Response(job.content, media_type="video/mp4")

    @app.delete("/v1/videos/{video_id}")
    def delete_video(video_id: str, request: Request) -> dict:
        check_key(request)
        job = job_of(video_id)
        job.handle.cancel()  # nothing if it ended already
        jobs.pop(video_id, None)
        return {"id": video_id, "object": "video.deleted", "deleted": True}

    return app


@contextlib.contextmanager
def serving(app: Any, host: str = "127.0.0.1", port: int = 0, start_timeout_s: float = 30.0) -> Any:
    """Serves ``app`` with uvicorn on a thread of this process (port 0: a free one); yields its URL.

    For embedding a server beside an engine, tests and benchmarks. The socket is made as TCP explicitly:
    asyncio turns Nagle's algorithm off only on sockets whose protocol is IPPROTO_TCP, and without that a
    reply's body waits for the client's delayed ACK of its headers (40 ms on Linux) on a kept-alive
    connection.
    """
    import socket

    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="gfdit-serve", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        if not server.started:
            raise RuntimeError(f"gfdit.server.serving: the server did not start within {start_timeout_s} s")
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


# ---- gfdit serve ----


def add_arguments(p: argparse.ArgumentParser, command: str) -> None:
    p.add_argument(
        "--model", default="tiny-qwen-image", help="tiny-wan, tiny-qwen-image, wan2.2, wan2.1, qwen-image"
    )
    p.add_argument("--path", default=None, help="local folder with the model's weights (real models)")
    p.add_argument("--world-size", type=int, default=2, help="worker processes (ranks)")
    p.add_argument("--policy", default="fcfs", help="fcfs, srtf, edf, priority, static:D")
    p.add_argument(
        "--profile",
        default=None,
        help="a profile of this model on this machine (gfdit profile): the policies' cost model",
    )
    p.add_argument(
        "--cluster",
        default="cpu",
        help="without --profile, the policies' cost model is the analytic one of this cluster (cpu, h20x8, "
        "h200x8, ...; 'none': none, and the policies cannot tell whether more ranks help)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1/*")
    p.add_argument(
        "--max-queue",
        type=int,
        default=DEFAULT_MAX_QUEUE,
        help="generations (images and video jobs) outstanding before 429",
    )
    p.add_argument("--job-ttl-s", type=float, default=3600.0, help="how long a finished video job is kept")
    p.add_argument(
        "--max-video-mb",
        type=float,
        default=DEFAULT_MAX_VIDEO_BYTES / 2**20,
        help="MP4s of finished video jobs kept in memory at most; past it the oldest jobs are forgotten",
    )
    p.add_argument(
        "--grace-s",
        type=float,
        default=30.0,
        help="on SIGTERM/SIGINT, seconds to let requests in flight finish before they are cancelled",
    )


def run(args: argparse.Namespace, command: str) -> int:
    import uvicorn

    from gfdit._C import Error
    from gfdit.engine import Engine

    if args.max_queue < 1:
        print("gfdit serve: --max-queue must be >= 1", file=sys.stderr)
        return 2
    if not (args.job_ttl_s > 0 and args.max_video_mb >= 0):
        print("gfdit serve: --job-ttl-s must be > 0 and --max-video-mb >= 0", file=sys.stderr)
        return 2
    try:
        from gfdit.cost import cost_model as make_cost_model

        cost_model = None
        if args.profile is not None:
            cost_model = make_cost_model(args.model, profile=args.profile)
        elif args.cluster != "none":
            cost_model = make_cost_model(args.model, args.cluster)
        engine = Engine(
            model=args.model,
            model_path=args.path,
            world_size=args.world_size,
            policy=args.policy,
            cost_model=cost_model,
        )
    except (Error, RuntimeError, ValueError, OSError) as e:
        print(f"gfdit serve: {e}", file=sys.stderr)
        return 2
    with engine:
        app = create_app(
            engine,
            model=args.model,
            api_key=args.api_key,
            max_queue=args.max_queue,
            job_ttl_s=args.job_ttl_s,
            max_video_bytes=int(args.max_video_mb * 2**20),
        )
        config = uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_level="info",
            timeout_graceful_shutdown=max(0.0, args.grace_s),
        )
        _draining_server_class()(config).run()
    return 0


def _draining_server_class() -> type:
    """uvicorn's server, except that a SIGTERM or SIGINT is not raised again once serving ends.

    On the signal uvicorn stops accepting and waits for requests in flight up to the grace period; then ``run``
    returns, and the engine's shutdown cancels what is left and stops every worker (re-raising the signal, as
    uvicorn does, would kill the process before that). Built lazily: uvicorn is a serving dependency.
    """
    import signal

    import uvicorn

    class DrainingServer(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Any:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            original = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in original.items():
                    signal.signal(sig, handler)

    return DrainingServer
