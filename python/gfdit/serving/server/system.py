"""``GET /health`` (200 "ok" while every worker is alive, 200 "degraded" while some are, 503 with the reason
when none is, the engine is closed, or its control loop does not answer or makes no progress), ``GET /metrics``
(Prometheus) and ``GET /v1/models``."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gfdit.serving.server.schemas import Health, ModelList, error_responses
from gfdit.serving.server.state import ServerState, state_of

router = APIRouter()


def _health_body(status: str, reason: str | None, stats: dict, world_size: int) -> dict:
    alive = [bool(a) for a in stats.get("alive", [])]
    # the workers' deaths and replacements (NOTE [healing] in gfdit.serving.engine); 0 for an engine stand-in
    return {
        "status": status,
        "alive": alive,
        "alive_workers": sum(alive),
        "world_size": world_size,
        "restarting": [int(w) for w in stats.get("restarting", [])],
        "deaths": int(stats.get("worker_deaths", 0)),
        "replacements": int(stats.get("replacements", 0)),
        "reason": reason,
    }


def _health_state(server: ServerState, stats: dict) -> tuple[str, str | None]:
    """(status, reason) of the engine whose stats these are."""
    alive = list(stats["alive"])
    if server.engine.closed:
        return "unavailable", "the engine is closed"
    # the control loop wakes at least once per liveness interval while it runs; a count that stops means it
    # stalled
    now = time.monotonic()
    if stats.get("loop_wakeups") != server.loop_wakeups:
        server.loop_wakeups, server.loop_seen_since = int(stats.get("loop_wakeups", -1)), now
    stalled_s = now - server.loop_seen_since
    if stalled_s > server.loop_stall_s:
        return "unavailable", f"the control loop made no progress for {stalled_s:.1f} s"
    dead = [w for w, a in enumerate(alive) if not a]
    if len(dead) == len(alive):
        return "unavailable", "no worker alive"
    if dead:
        return "degraded", "workers not alive: " + ", ".join(str(w) for w in dead)
    return "ok", None


@router.get(
    "/health",
    response_model=Health,
    responses={
        503: {
            "model": Health,
            "description": "no worker alive, the engine closed, or its control loop not answering or stalled",
        }
    },
)
async def health(request: Request) -> JSONResponse:
    """Needs no key (probes). Answers within about HEALTH_TIMEOUT_S whatever the engine is doing: "degraded"
    (200) while some workers serve and others are dead or being replaced."""
    server = state_of(request)
    stats: dict = {}
    reason: str | None
    try:
        got = await server.health.stats()
    except Exception as e:
        status, reason = "unavailable", f"the engine does not answer: {type(e).__name__}: {e}"
    else:
        if got is None:
            status, reason = "unavailable", "control loop not answering"
        else:
            stats = got
            status, reason = _health_state(server, stats)
    body = _health_body(status, reason, stats, server.world_size)
    return JSONResponse(body, status_code=503 if status == "unavailable" else 200)


@router.get(
    "/metrics",
    response_class=Response,
    responses=error_responses(
        ok={"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Prometheus text"}
    ),
)
def prometheus_metrics(request: Request) -> Response:
    server = state_of(request)
    server.check_key(request)
    return Response(generate_latest(server.metrics.registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/models", response_model=ModelList, responses=error_responses())
def models(request: Request) -> dict:
    server = state_of(request)
    server.check_key(request)
    return {
        "object": "list",
        "data": [{"id": server.model, "object": "model", "created": server.created, "owned_by": "gfdit"}],
    }
