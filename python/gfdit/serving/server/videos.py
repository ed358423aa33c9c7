"""Videos as asynchronous jobs: ``POST /v1/videos`` returns a job, ``GET /v1/videos/{id}`` its status and
progress (``?wait_s=`` long-polls until it ends), ``GET /v1/videos/{id}/content`` the H.264 MP4, ``DELETE
/v1/videos/{id}`` cancels and forgets it; finished jobs expire after a TTL (gfdit.serving.server.jobs)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import secrets
import time
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response

from gfdit.serving.engine import RequestFailed
from gfdit.serving.server import generation as gen
from gfdit.serving.server.encoding import mp4
from gfdit.serving.server.errors import APIError, EngineCancelled
from gfdit.serving.server.jobs import VideoJob
from gfdit.serving.server.schemas import VideoDeleted, VideoGenerationRequest, VideoJobObject, error_responses
from gfdit.serving.server.state import ServerState, state_of

router = APIRouter()
MAX_WAIT_S = 30.0


async def _finish(server: ServerState, job: VideoJob, fps: int, slo_s: float | None, t0: float) -> None:
    outcome, status, error = "ok", "completed", None
    try:
        result, _ = await gen.result_of(job.handle)
        server.admission.finished(1)
        server.live.record(result)
        job.status = "in_progress"
        job.content = await server.encoders.offload(mp4, result.output, fps)
        server.metrics.observe(result, slo_s, "video")
        server.metrics.latency.labels("video").observe(time.monotonic() - t0)
    except RequestFailed as e:
        status, error, outcome = "failed", str(e), "generation_failed"
    except (EngineCancelled, asyncio.CancelledError) as e:
        status, error, outcome = "cancelled", str(e) or "cancelled", "cancelled"
    except Exception as e:  # an encoder error fails the job, never the server
        status, error, outcome = "failed", f"{type(e).__name__}: {e}", "server_error"
    finally:
        server.admission.release(1)
        server.metrics.requests.labels("video", outcome).inc()
        job.end(status, error)
        server.jobs.sweep()  # a new MP4 may push the oldest past max_bytes


@router.post("/v1/videos", response_model=VideoJobObject, responses=error_responses(400, 404, 413, 429))
async def create_video(body: VideoGenerationRequest, request: Request) -> JSONResponse:
    server = state_of(request)
    t0 = time.monotonic()
    try:
        return await _create(server, body, request, t0)
    except BaseException as e:
        server.metrics.count_error("video", e)
        raise


async def _create(
    server: ServerState, b: VideoGenerationRequest, request: Request, t0: float
) -> JSONResponse:
    server.check_key(request)
    info = server.info
    if not info.is_video:
        raise APIError(
            400, f"the model {server.model!r} makes images; use /v1/images/generations", param="model"
        )
    width, height, seed, cache = gen.check_common(server, b)
    num_frames = b.num_frames
    if num_frames is None and b.seconds is not None:
        try:
            seconds = float(b.seconds)
        except ValueError:
            raise APIError(400, f"seconds {b.seconds!r} is not a number", param="seconds") from None
        # the frames must be a number too: 1e308 seconds are finite, their frames are not
        if not (math.isfinite(seconds * b.fps) and seconds > 0):
            raise APIError(
                400, f"seconds {b.seconds!r} is not a positive number of frames at fps", param="seconds"
            )
        t = int(info.vae_stride_t)
        num_frames = int(seconds * b.fps) // t * t + 1  # the VAE takes 1 + stride_t * k frames
    if num_frames is None:
        num_frames = server.info.defaults.num_frames
    req = gen.engine_request(b, width, height, num_frames, seed, cache)
    # bad fields are refused (400) before a full queue (429); frames counted from seconds are the seconds' fault
    gen.check(
        server, [req], {"num_frames": "seconds"} if b.num_frames is None and b.seconds is not None else {}
    )
    server.admission.admit(1)
    try:
        (handle,) = gen.submit(server, [req])
    except BaseException:
        server.admission.release(1)
        raise
    job = VideoJob("video_" + secrets.token_hex(12), server.model, handle, width, height, num_frames)
    server.jobs.add(job, _finish(server, job, b.fps, req.deadline_s, t0))
    return JSONResponse(job.to_json(server.jobs.ttl_s))


@router.get("/v1/videos/{video_id}", response_model=VideoJobObject, responses=error_responses(400, 404))
async def get_video(
    video_id: str,
    request: Request,
    wait_s: Annotated[
        float,
        Query(
            ge=0, le=MAX_WAIT_S, allow_inf_nan=False, description="wait until the job ends, this long at most"
        ),
    ] = 0.0,
) -> dict:
    """The job; with ``?wait_s=S`` (up to 30) the answer waits until the job ends or S seconds pass."""
    server = state_of(request)
    server.check_key(request)
    job = server.jobs.get(video_id)
    if wait_s > 0 and job.finished_monotonic is None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(job.ended.wait(), wait_s)
    return job.to_json(server.jobs.ttl_s)


@router.get(
    "/v1/videos/{video_id}/content",
    response_class=Response,
    responses=error_responses(
        404, 409, ok={"content": {"video/mp4": {"schema": {"type": "string", "format": "binary"}}}}
    ),
)
def get_video_content(video_id: str, request: Request) -> Response:
    server = state_of(request)
    server.check_key(request)
    job = server.jobs.get(video_id)
    if job.status != "completed" or job.content is None:
        raise APIError(
            409,
            f"video {video_id} is {job.status}; its content exists once completed",
            param="video_id",
            code="video_not_ready",
        )
    return Response(job.content, media_type="video/mp4")


@router.delete("/v1/videos/{video_id}", response_model=VideoDeleted, responses=error_responses(404))
def delete_video(video_id: str, request: Request) -> dict:
    server = state_of(request)
    server.check_key(request)
    job = server.jobs.get(video_id)
    job.handle.cancel()  # nothing if it ended already
    server.jobs.forget(video_id)
    return {"id": video_id, "object": "video.deleted", "deleted": True}
