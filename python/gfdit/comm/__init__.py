"""The communication layer: group-free collectives on torch tensors (``World``, ``Group``, the default world
with torch.distributed's names), where tensors live (``devices``), the topology of the ranks, and the
torch.distributed backend "gfdit" (``torch_backend``, registered by ``import gfdit``)."""

from gfdit.comm import world
from gfdit.comm.devices import (
    check_placement,
    cuda_transport_available,
    default_device,
    parse_device,
    resolve_device,
)
from gfdit.comm.topology import Topology
from gfdit.comm.world import *  # noqa: F403 (the collectives, as world.__all__ lists them)

__all__ = ["Topology", "check_placement", "cuda_transport_available", "default_device"]
__all__ += ["parse_device", "resolve_device"]
__all__ += world.__all__
