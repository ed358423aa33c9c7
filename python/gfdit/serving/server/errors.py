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


def install_handlers(app: FastAPI) -> None:
    """Answers every error with an OpenAI-style body: APIError as raised, FastAPI's own 404/405/validation
    errors with their detail, anything else as a 500 that names only the exception's type."""

    @app.exception_handler(APIError)
    async def _api_error(_: Request, e: APIError) -> JSONResponse:
        return JSONResponse(
            error_body(e.message, param=e.param, type=e.type, code=e.code),
            status_code=e.status,
            headers=e.headers,
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
        kind = "not_found" if e.status_code == 404 else "invalid_request_error"
        return JSONResponse(
            error_body(str(e.detail), param=None, type=kind, code=None),
            status_code=e.status_code,
            headers=getattr(e, "headers", None),
        )

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, e: RequestValidationError) -> JSONResponse:
        first: Any = e.errors()[0] if e.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        return JSONResponse(
            error_body(
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
            error_body(f"internal error: {type(e).__name__}", param=None, type="server_error", code=None),
            status_code=500,
        )
