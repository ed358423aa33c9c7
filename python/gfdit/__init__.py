"""gfdit: a serving runtime for Diffusion Transformers on group-free collectives.

The collectives mirror ``torch.distributed``: ``gfdit.init``, ``gfdit.new_group``, ``gfdit.all_reduce``, ...
"""

from gfdit import (
    attention,  # noqa: E402  (the package: gfdit.attention.attention(q, k, v, ...))
    models,  # noqa: E402  (diffusers is imported only when a model is wrapped)
)
from gfdit._C import Error, InvalidUsage, RemoteError, Timeout
from gfdit._C import build_info as _build_info
from gfdit.attention import ParallelSpec  # noqa: E402
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
from gfdit.engine import Decision, Engine, Layout, Policy, Request, RequestFailed, Result  # noqa: E402
from gfdit.process_group import register as _register_torch_backend  # noqa: E402
from gfdit.topology import Topology  # noqa: E402

__version__ = "0.1.0"

_register_torch_backend()  # dist.init_process_group("gfdit"): see gfdit.process_group


def build_info() -> dict:
    """What this build was compiled with: CUDA and NVSHMEM support and versions, backends."""
    return dict(_build_info())


__all__ = [
    "Decision",
    "Engine",
    "Error",
    "Layout",
    "Policy",
    "Request",
    "RequestFailed",
    "Result",
    "ParallelSpec",
    "Topology",
    "attention",
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
