"""Errors as ``gfdit serve`` answers them: an OpenAI-style body ``{"error": {"message", "type", "param",
"code"}}`` whose ``param`` names the request field, and the handlers that turn every failure into one."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException


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


class ClientDisconnected(Exception):
    """The client went away before its answer was ready."""


class EngineCancelled(Exception):
    """The engine cancelled a request (shutdown, or a cancel from elsewhere) while a client waited for it.

    Raised in place of concurrent.futures.CancelledError, which asyncio would turn into a cancellation of the
    waiting task itself: the client would get no answer at all."""


# The engine's names of the request fields that this API names otherwise: one size for height and width, and
# slo_ms (milliseconds) for the deadline.
_HTTP_PARAM = {"height": "size", "width": "size", "deadline_s": "slo_ms"}


def http_param(param: str | None) -> str | None:
    """The request field, as the HTTP API names it, of an engine error's ``param``."""
    return None if param is None else _HTTP_PARAM.get(param, param)


def error_body(message: str, *, param: str | None, type: str, code: str | None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def _allowed_methods(path: str, routes: list[Any]) -> str:
    """The methods of every route at ``path`` (Starlette names only the first matching route's, and this API
    serves GET and DELETE of one path from two routes)."""
    return ", ".join(sorted({m for r in routes if r.path_regex.match(path) for m in r.methods}))


# The generation routes count every refusal in /metrics by kind, also those made before their handler runs (a
# body too large, a field of the wrong type)
_GENERATION_KINDS = {"/v1/images/generations": "image", "/v1/videos": "video"}


def _count_refusal(request: Request, status: int) -> None:
    route = request.scope.get("route")
    kind = _GENERATION_KINDS.get(getattr(route, "path", request.url.path))
    server = getattr(request.app.state, "server", None)
    if kind is not None and request.method == "POST" and server is not None:
        server.metrics.count_error(kind, APIError(status, "refused"))


def _validation_param(loc: tuple) -> str | None:
    """The request field of a validation error's location: ("body", "n") names n; ("body",) (the body as a
    whole) and ("body", 12) (a position in malformed JSON) name none; deeper parts (a union's member) are
    dropped."""
    if len(loc) >= 2 and loc[0] in ("body", "query", "path", "header") and isinstance(loc[1], str):
        return loc[1]
    return None


def install_handlers(app: FastAPI, routes: list[Any]) -> None:
    """Answers every error with an OpenAI-style body: APIError as raised, FastAPI's own 404/405/validation
    errors (a 400 naming the field) with their detail, anything else as a 500 that names only the exception's
    type. ``routes``: the app's routes (the Allow header of a 405 lists the methods of those at its path)."""

    @app.exception_handler(APIError)
    async def _api_error(_: Request, e: APIError) -> JSONResponse:
        return JSONResponse(
            error_body(e.message, param=e.param, type=e.type, code=e.code),
            status_code=e.status,
            headers=e.headers,
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        kind = "not_found" if e.status_code == 404 else "invalid_request_error"
        headers = dict(getattr(e, "headers", None) or {})
        if e.status_code == 405:
            headers["Allow"] = _allowed_methods(request.url.path, routes)
        _count_refusal(request, e.status_code)
        return JSONResponse(
            error_body(str(e.detail), param=None, type=kind, code=None),
            status_code=e.status_code,
            headers=headers or None,
        )

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, e: RequestValidationError) -> JSONResponse:
        first: Any = e.errors()[0] if e.errors() else {}
        param = _validation_param(tuple(first.get("loc", ())))
        msg = first.get("msg", "invalid request")
        if first.get("type") == "json_invalid":
            msg = f"the request body is not valid JSON: {first.get('ctx', {}).get('error', msg)}"
        elif param is not None:
            msg = f"{param}: {msg}"
        _count_refusal(request, 400)
        return JSONResponse(
            error_body(msg, param=param, type="invalid_request_error", code=None), status_code=400
        )

    @app.exception_handler(Exception)
    async def _internal_error(_: Request, e: Exception) -> JSONResponse:
        return JSONResponse(
            error_body(f"internal error: {type(e).__name__}", param=None, type="server_error", code=None),
            status_code=500,
        )
