"""When the CUDA tests run: a GPU that torch sees and a gfdit build with the CUDA transport.

Without either they skip with the reason; ``GFDIT_CUDA_WORLDS`` (default "2,4") chooses the world sizes of
the multi-rank CUDA tests (every rank on its default GPU, so one GPU is shared by all ranks).
``GFDIT_TEST_RUN_S`` (default 150) bounds each ``world.run`` of a CUDA test and ``GFDIT_TEST_TIMEOUT_S``
(default 20) is the worlds' gfdit timeout (every device wait); bench/gpu_check.sh shortens both to fit its
time budget.
"""

from __future__ import annotations

import os

import pytest
import torch


def cuda_ready() -> tuple[bool, str]:
    if not torch.cuda.is_available():
        return False, f"no CUDA device (torch {torch.__version__}, CUDA {torch.version.cuda})"
    import gfdit

    if not gfdit.cuda_transport_available():
        return False, "this gfdit build has no CUDA transport"
    return True, ""


READY, WHY = cuda_ready()
requires_cuda = pytest.mark.skipif(not READY, reason=WHY or "CUDA ready")


def _env_seconds(name: str, default: float) -> float:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a number of seconds") from None
    if not seconds > 0:
        raise ValueError(f"{name}={value!r} must be positive")
    return seconds


def run_s() -> float:
    """Deadline of one ``world.run`` in the CUDA tests (GFDIT_TEST_RUN_S, else 150 s)."""
    return _env_seconds("GFDIT_TEST_RUN_S", 150.0)


def gfdit_timeout_s() -> float:
    """gfdit timeout of the CUDA tests' worlds (GFDIT_TEST_TIMEOUT_S, else 20 s): a hung device path is
    reported by gfdit within this, not by the run deadline."""
    return _env_seconds("GFDIT_TEST_TIMEOUT_S", 20.0)


def world(pool, n: int, heap_bytes: int):
    """An n-rank world from ``pool`` (conftest's world_pool) with every rank on its GPU, skipped where n is too
    big for this machine."""
    import mp_harness

    mp_harness.skip_if_too_big(n)
    return pool.get(n, timeout=gfdit_timeout_s(), gloo=False, device="cuda", heap_bytes=heap_bytes)


def world_sizes() -> list[int]:
    return [int(x) for x in os.environ.get("GFDIT_CUDA_WORLDS", "2,4").split(",") if x.strip()]


def diffusers_missing() -> str:
    """Why the model tests cannot run here ('' when they can)."""
    import importlib.util

    for mod in ("diffusers", "transformers"):
        if importlib.util.find_spec(mod) is None:
            return f"{mod} is not installed"
    return ""
