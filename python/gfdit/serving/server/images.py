"""``POST /v1/images/generations``: OpenAI's images API (model, prompt, n, size "WxH", response_format
"b64_json" (PNG), user) plus gfdit's fields. A client that disconnects cancels its requests."""

from __future__ import annotations

import asyncio
import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from gfdit.serving.engine import RequestFailed
from gfdit.serving.server import generation as gen
from gfdit.serving.server.encoding import png_b64
from gfdit.serving.server.errors import APIError, ClientDisconnected, EngineCancelled, error_body
from gfdit.serving.server.schemas import ImageGenerationRequest, ImagesResponse, error_responses
from gfdit.serving.server.state import ServerState, state_of

router = APIRouter()


def to_engine_requests(server: ServerState, b: ImageGenerationRequest) -> list:
    n = 1 if b.n is None else b.n
    if n > server.max_n:  # the schema says so too (create_app publishes max_n)
        raise APIError(400, f"n {n} is over this server's max_n of {server.max_n}", param="n")
    width, height, seed, cache = gen.check_common(server, b)
    return [gen.engine_request(b, width, height, 1, seed + i, cache) for i in range(n)]


@router.post(
    "/v1/images/generations",
    response_model=ImagesResponse,
    responses=error_responses(400, 404, 413, 429, 499, 503),
)
async def generate_images(body: ImageGenerationRequest, request: Request) -> JSONResponse:
    """Generates ``n`` images; the answer carries ``Server-Timing``: ``engine`` (from submit to the engine's
    result), ``encode`` (PNG) and ``total`` (the server's whole handling), in milliseconds."""
    server = state_of(request)
    t0 = time.monotonic()
    try:
        response = await _generate(server, body, request, t0)
    except BaseException as e:
        server.metrics.count_error("image", e)
        raise
    if response.status_code == 200:
        server.metrics.latency.labels("image").observe(time.monotonic() - t0)
        server.metrics.requests.labels("image", "ok").inc()
    else:
        server.metrics.requests.labels("image", "disconnected").inc()
    return response


async def _generate(
    server: ServerState, body: ImageGenerationRequest, request: Request, t0: float
) -> JSONResponse:
    server.check_key(request)
    reqs = to_engine_requests(server, body)
    gen.check(server, reqs)  # bad fields are refused (400) before a full queue (429)
    server.admission.admit(len(reqs))
    handles = []
    try:
        t_submit = time.monotonic()
        handles = gen.submit(server, reqs)
        try:
            answers = await gen.until_disconnect(
                request, asyncio.gather(*(gen.result_of(h) for h in handles))
            )
        except RequestFailed as e:
            raise APIError(500, str(e), type="server_error", code="generation_failed") from None
        except EngineCancelled as e:
            raise APIError(503, str(e), type="server_error", code="cancelled") from None
        t_results = max(t for _, t in answers)
        results = [r for r, _ in answers]
        server.admission.finished(len(results))
        slo_s = reqs[0].deadline_s
        for r in results:
            server.metrics.observe(r, slo_s, "image")
            server.live.record(r)
        data = await server.encoders.run_all(png_b64, [r.output for r in results])
        t_encoded = time.monotonic()
    except BaseException as e:
        for h in handles:
            h.cancel()
        if isinstance(e, ClientDisconnected):
            # nobody reads this answer; 499 is the usual record of a client that closed first
            return JSONResponse(
                error_body("client disconnected", param=None, type="cancelled", code=None), 499
            )
        raise
    finally:
        server.admission.release(len(reqs))
    timing = {"engine": t_results - t_submit, "encode": t_encoded - t_results, "total": time.monotonic() - t0}
    return JSONResponse(
        {"created": int(time.time()), "data": [{"b64_json": d} for d in data]},
        headers={"Server-Timing": ", ".join(f"{k};dur={v * 1000:.3f}" for k, v in timing.items())},
    )
