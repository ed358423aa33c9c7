"""gfdit: a serving runtime for Diffusion Transformers on group-free collectives.

The collectives mirror ``torch.distributed``: ``gfdit.init``, ``gfdit.new_group``, ``gfdit.all_reduce``, ...
The package is in layers (docs/architecture.md, "Layers"), each importing only the ones below it:
``gfdit.comm`` (worlds, groups, collectives, the torch.distributed backend), ``gfdit.attention``,
``gfdit.models``, ``gfdit.planning`` (cost models, workloads, traces, the simulator), ``gfdit.serving`` (the
engine, its workers, the HTTP server) and ``gfdit.tools`` (the ``gfdit`` command). This module only gathers
their public names.
"""

from gfdit import (
    attention,  # the package: gfdit.attention.attention(q, k, v, ...)
    models,  # diffusers is imported only when a model is wrapped
)
from gfdit._C import Error, InvalidUsage, RemoteError, Timeout
from gfdit._C import build_info as _build_info

# what a Python policy receives (Policy.schedule(view)): the view, its records, their predictions
from gfdit._C.runtime import CacheSpec, LayoutFamily, RequestCost, RequestRecord, SchedulerView
from gfdit.attention import ParallelSpec
from gfdit.comm import cuda_transport_available
from gfdit.comm import world as _world
from gfdit.comm.topology import Topology
from gfdit.comm.torch_backend import register as _register_torch_backend
from gfdit.comm.world import *  # noqa: F403 (the collectives: gfdit.init, gfdit.all_reduce, ...)
from gfdit.planning import cost
from gfdit.serving import engine as _engine
from gfdit.serving.engine import Decision, Engine, Layout, Policy
from gfdit.serving.request import Request, RequestFailed, RequestHandle, RequestState, Result, Stage
from gfdit.tools import profile_cache as _profile_cache

__version__ = "0.1.0"

_register_torch_backend()  # dist.init_process_group("gfdit"): see gfdit.comm.torch_backend
_engine.register_cost_model_default(_profile_cache.engine_cost_model)  # Engine() plans with a cached profile


def build_info() -> dict:
    """What this build was compiled with: CUDA and NVSHMEM support and versions, backends."""
    return dict(_build_info())


__all__ = [
    "CacheSpec",
    "Decision",
    "Engine",
    "Error",
    "InvalidUsage",
    "Layout",
    "LayoutFamily",
    "ParallelSpec",
]
__all__ += ["Policy"]
__all__ += ["RemoteError", "Request", "RequestCost", "RequestFailed", "RequestHandle", "RequestRecord"]
__all__ += ["RequestState", "Result", "SchedulerView", "Stage", "Timeout", "Topology", "attention"]
__all__ += ["build_info", "cost", "cuda_transport_available", "models"]
__all__ += _world.__all__
