"""When the CUDA tests run: a GPU that torch sees and a gfdit build with the CUDA transport.

Without either they skip with the reason; ``GFDIT_CUDA_WORLDS`` (default "2,4") chooses the world sizes of
the multi-rank CUDA tests (every rank on its default GPU, so one GPU is shared by all ranks).
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


def world_sizes() -> list[int]:
    return [int(x) for x in os.environ.get("GFDIT_CUDA_WORLDS", "2,4").split(",") if x.strip()]


def diffusers_missing() -> str:
    """Why the model tests cannot run here ('' when they can)."""
    import importlib.util

    for mod in ("diffusers", "transformers"):
        if importlib.util.find_spec(mod) is None:
            return f"{mod} is not installed"
    return ""
