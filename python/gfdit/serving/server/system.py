"""``GET /health`` (200 only while every worker is alive and the control loop wakes, 503 with the reason
otherwise), ``GET /metrics`` (Prometheus) and ``GET /v1/models``."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gfdit.serving.server.schemas import Health, ModelList
from gfdit.serving.server.state import state_of

router = APIRouter()


@router.get("/health", response_model=Health, responses={503: {"model": Health}})
def health(request: Request) -> JSONResponse:
    server = state_of(request)
    stats = server.engine.stats()
    alive = list(stats["alive"])
    dead = [w for w, a in enumerate(alive) if not a]
    # the control loop wakes at least once per liveness interval while it runs; a count that stops means it
    # stalled
    now = time.monotonic()
    if stats.get("loop_wakeups") != server.loop_wakeups:
        server.loop_wakeups, server.loop_seen_since = stats.get("loop_wakeups"), now
    stalled_s = now - server.loop_seen_since
    reasons = []
    if dead:
        reasons.append("workers not alive: " + ", ".join(str(w) for w in dead))
    if stalled_s > server.loop_stall_s:
        reasons.append(f"the control loop made no progress for {stalled_s:.1f} s")
    if reasons:
        return JSONResponse(
            {"status": "unavailable", "reason": "; ".join(reasons), "alive": alive}, status_code=503
        )
    return JSONResponse({"status": "ok", "alive": alive})


@router.get("/metrics", response_class=Response)
def prometheus_metrics(request: Request) -> Response:
    server = state_of(request)
    server.check_key(request)
    return Response(generate_latest(server.metrics.registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/models", response_model=ModelList)
def models(request: Request) -> dict:
    server = state_of(request)
    server.check_key(request)
    return {
        "object": "list",
        "data": [{"id": server.model, "object": "model", "created": server.created, "owned_by": "gfdit"}],
    }
