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
from gfdit._C.runtime import LayoutFamily, RequestCost, RequestRecord, SchedulerView
from gfdit.attention import ParallelSpec
from gfdit.comm import (
    Group,
    World,
    all_gather_into_tensor,
    all_reduce,
    all_to_all_4d,
    all_to_all_single,
    barrier,
    broadcast,
    cuda_transport_available,
    destroy,
    empty,
    get_rank,
    get_world,
    get_world_size,
    init,
    is_heap_tensor,
    is_initialized,
    new_group,
    put_with_signal,
    recv,
    reduce_scatter_tensor,
    send,
    wait_signal,
)
from gfdit.comm.topology import Topology
from gfdit.comm.torch_backend import register as _register_torch_backend
from gfdit.planning import cost
from gfdit.serving.engine import Decision, Engine, Layout, Policy
from gfdit.serving.request import Request, RequestFailed, RequestHandle, RequestState, Result, Stage

__version__ = "0.1.0"

_register_torch_backend()  # dist.init_process_group("gfdit"): see gfdit.comm.torch_backend


def build_info() -> dict:
    """What this build was compiled with: CUDA and NVSHMEM support and versions, backends."""
    return dict(_build_info())


__all__ = [
    "Decision",
    "Engine",
    "Error",
    "Layout",
    "Policy",
    "LayoutFamily",
    "Request",
    "RequestCost",
    "RequestFailed",
    "RequestHandle",
    "RequestRecord",
    "RequestState",
    "Result",
    "SchedulerView",
    "Stage",
    "ParallelSpec",
    "Topology",
    "attention",
    "cost",
    "models",
    "Group",
    "InvalidUsage",
    "RemoteError",
    "Timeout",
    "World",
    "all_gather_into_tensor",
    "all_reduce",
    "all_to_all_4d",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "build_info",
    "cuda_transport_available",
    "destroy",
    "empty",
    "get_rank",
    "get_world",
    "get_world_size",
    "init",
    "is_heap_tensor",
    "is_initialized",
    "new_group",
    "put_with_signal",
    "recv",
    "reduce_scatter_tensor",
    "send",
    "wait_signal",
]
