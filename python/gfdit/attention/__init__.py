"""Sequence-parallel attention: Ulysses, Ring, USP (both placements) and Torus on group-free collectives.

``attention(q, k, v, group=g, spec=ParallelSpec(ulysses=u, ring=r, mode="usp"|"torus",
placement="ulysses-low"|"ring-low"|"auto"))`` returns this member's shard of exact attention over the
sequence split across the group; see ``gfdit.attention.core`` for the protocol and
``gfdit.attention.torus`` for the Torus pipeline.
"""

from gfdit.attention.core import PlanMismatch, attention, clear_plan_cache, plan_cache_info, ring_attention
from gfdit.attention.local import PartialMerger, block_attention
from gfdit.attention.spec import GridLayout, ParallelSpec, resolve_placement
from gfdit.comm.topology import Topology

__all__ = [
    "GridLayout",
    "ParallelSpec",
    "PartialMerger",
    "PlanMismatch",
    "Topology",
    "attention",
    "block_attention",
    "clear_plan_cache",
    "plan_cache_info",
    "resolve_placement",
    "ring_attention",
]
