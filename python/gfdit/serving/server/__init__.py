"""``gfdit serve``: an OpenAI-compatible HTTP front end over ``gfdit.Engine``, in parts: the request and
response models (``schemas``), errors (``errors``), admission (``admission``), metrics (``metrics``), output
encoding (``encoding``), video jobs (``jobs``), the state the routes share (``state``), the request path
(``generation``), one router per concern (``system``, ``images``, ``videos``, ``live``), the app (``app``) and the
command (``main``).

``create_app`` and ``serving`` are imported on first use, so that ``gfdit`` (whose ``serve`` subcommand lives in
``main``) runs without FastAPI installed."""

from __future__ import annotations

from typing import Any

from gfdit.serving.server.main import add_arguments, run, serving

__all__ = ["add_arguments", "create_app", "run", "serving"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from gfdit.serving.server.app import create_app

        return create_app
    raise AttributeError(f"module 'gfdit.serving.server' has no attribute {name!r}")
