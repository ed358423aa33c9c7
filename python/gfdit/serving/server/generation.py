"""From an HTTP body (validated by its model in gfdit.serving.server.schemas) to engine requests and back: the
fields images and videos share, the engine's check, submitting, and awaiting results on the event loop without
a waiting thread."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from concurrent.futures import CancelledError
from typing import Any

from fastapi import Request

from gfdit._C import InvalidUsage
from gfdit.serving.engine import Request as EngineRequest
from gfdit.serving.server.errors import APIError, ClientDisconnected, EngineCancelled, http_param
from gfdit.serving.server.schemas import GenerationRequest
from gfdit.serving.server.state import ServerState


def check_common(server: ServerState, b: GenerationRequest) -> tuple[int, int, int, str | None]:
    """Checks what only HTTP knows of the fields images and videos share (the model's name, a prompt that is
    not blank, a step cache on a server that does not take one from its requests); returns (width, height, seed,
    cache: the body's, else the server's default). Every value the engine checks (sizes against the model, steps,
    guidance, the deadline, seed, priority, the cache's settings and kind) is the engine's to refuse
    (``check``)."""
    if b.model is not None and b.model != server.model:
        raise APIError(
            404,
            f"the model {b.model!r} does not exist; served: {server.model!r}",
            param="model",
            code="model_not_found",
        )
    if not b.prompt.strip():
        raise APIError(400, "prompt must not be empty", param="prompt")
    width, height = b.width_height((server.info.defaults.width, server.info.defaults.height))
    if b.cache is not None and not server.request_cache:
        raise APIError(
            400,
            "this server does not take a request's step cache (gfdit serve --forbid-request-cache); every request "
            f"runs with its default, {server.cache or 'none'}",
            param="cache",
        )
    cache = b.cache if b.cache is not None else server.cache
    return width, height, secrets.randbits(31) if b.seed is None else b.seed, cache


def engine_request(
    b: GenerationRequest, width: int, height: int, num_frames: int, seed: int, cache: str | None = None
) -> EngineRequest:
    return EngineRequest(
        prompt=b.prompt,
        negative_prompt=b.negative_prompt,
        height=height,
        width=width,
        num_frames=num_frames,
        num_inference_steps=b.num_inference_steps,
        guidance_scale=b.guidance_scale,
        guidance_scale_2=b.guidance_scale_2,
        seed=seed,
        deadline_s=None if b.slo_ms is None else b.slo_ms / 1000.0,
        priority=b.priority,
        cache=cache,
    )


def check(server: ServerState, reqs: list[EngineRequest], derived: dict[str, str] | None = None) -> None:
    """Has the engine check the requests before anything else happens to them (admission): a refusal becomes a
    400 naming the field the engine named, or the request field an engine field was derived from (``derived``:
    engine field -> request field)."""
    try:
        for r in reqs:
            server.engine.check(r)
    except InvalidUsage as e:
        param = (derived or {}).get(e.param or "") or http_param(e.param)
        raise APIError(400, e.message, param=param) from None


def submit(server: ServerState, reqs: list[EngineRequest]) -> list[Any]:
    """Submits to the engine (returns at once): the n images of one request as one batch
    (``Engine.submit_batch``: the policy runs them together where batching pays); a refusal becomes a 400 naming the
    field the engine named, and nothing is queued."""
    try:
        if len(reqs) == 1:
            return [server.engine.submit(reqs[0])]
        return server.engine.submit_batch(reqs)
    except InvalidUsage as e:
        raise APIError(400, e.message, param=http_param(e.param)) from None


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


def result_of(handle: Any) -> asyncio.Future:
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


async def until_disconnect(request: Request, work: Any) -> Any:
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
