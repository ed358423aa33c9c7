"""The parallel layout of a step: ``ulysses x ring`` members per attention call (the algorithm and the
placement), and CFG-parallel (``cfg``: the two guidance passes on two halves of the group)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from gfdit._C import InvalidUsage
from gfdit._C import runtime as _rt
from gfdit.comm.topology import Topology

# The names of the runtime's LayoutMode and Placement (include/gfdit/layout.h), in their order there.
MODES: tuple[str, ...] = tuple(_rt.layout_mode_name(m) for m in _rt.LayoutMode.__members__.values())
PLACEMENTS: tuple[str, ...] = tuple(_rt.placement_name(p) for p in _rt.Placement.__members__.values())


@dataclasses.dataclass(frozen=True)
class ParallelSpec:
    """How a group of ``ulysses * ring`` members splits one attention.

    mode: "usp" (Ulysses all-to-all along one axis of the member grid, Ring along the other) or "torus"
    (the same grid, with the Ulysses all-to-all chunked by heads and pipelined against the ring; see
    ``gfdit.attention.torus``). placement: "ulysses-low" puts Ulysses among consecutive group members
    (member index = ring_idx * ulysses + ulysses_idx), "ring-low" the reverse, "auto" puts Ring on the axis
    whose members share a node and Ulysses on the axis that crosses nodes (see ``resolve_placement``).
    torus_chunks: head groups of the Torus pipeline (None: as many as the per-member heads allow, at most 4).
    cfg: 1 (a step with guidance runs its conditional and unconditional passes one after the other on the
    whole group) or 2 (CFG-parallel: the first half of the group runs the conditional pass and the second half
    the unconditional one, each half with the ``ulysses x ring`` layout of ``per_pass()``; staged models'
    ``denoise_step`` do this). One attention call or transformer pass always uses a cfg-1 spec.
    """

    ulysses: int = 1
    ring: int = 1
    mode: str = "usp"
    placement: str = "auto"
    torus_chunks: int | None = None
    cfg: int = 1

    def __post_init__(self) -> None:
        for name in ("ulysses", "ring"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidUsage(f"gfdit: ParallelSpec.{name} must be a positive integer, got {v!r}")
        if isinstance(self.cfg, bool) or not isinstance(self.cfg, int) or self.cfg not in (1, 2):
            raise InvalidUsage(f"gfdit: ParallelSpec.cfg must be 1 or 2, got {self.cfg!r}")
        if self.mode not in MODES:
            raise InvalidUsage(f"gfdit: ParallelSpec.mode {self.mode!r} is not one of {', '.join(MODES)}")
        if self.placement not in PLACEMENTS:
            raise InvalidUsage(
                f"gfdit: ParallelSpec.placement {self.placement!r} is not one of {', '.join(PLACEMENTS)}"
            )
        if self.torus_chunks is not None and (
            isinstance(self.torus_chunks, bool)
            or not isinstance(self.torus_chunks, int)
            or self.torus_chunks < 1
        ):
            raise InvalidUsage(
                f"gfdit: ParallelSpec.torus_chunks must be a positive integer or None, got "
                f"{self.torus_chunks!r}"
            )

    @property
    def degree(self) -> int:
        """Members the spec needs: ulysses * ring * cfg."""
        return self.ulysses * self.ring * self.cfg

    @property
    def pass_degree(self) -> int:
        """Members one transformer pass (one attention call) spans: ulysses * ring."""
        return self.ulysses * self.ring

    def per_pass(self) -> ParallelSpec:
        """The spec of one pass: this one with cfg 1 (itself when cfg is 1)."""
        return self if self.cfg == 1 else dataclasses.replace(self, cfg=1)

    @classmethod
    def of(cls, layout: Any) -> ParallelSpec:
        """The spec of a runtime ``gfdit.Layout`` (what a worker runs a denoise task with); cfg carries over."""
        return cls(
            ulysses=int(layout.ulysses),
            ring=int(layout.ring),
            mode=_rt.layout_mode_name(layout.mode),
            placement=_rt.placement_name(layout.placement),
            cfg=int(layout.cfg),
        )

    def layout(self) -> Any:
        """This spec as the runtime's ``gfdit.Layout`` (for a Decision of a Python policy); cfg carries over."""
        return _rt.Layout(
            ulysses=self.ulysses,
            ring=self.ring,
            mode=self.mode,  # the runtime's Layout takes the names
            placement=self.placement,
            cfg=self.cfg,
        )


@dataclasses.dataclass(frozen=True)
class GridLayout:
    """One member's view of the ``ulysses x ring`` grid of a group (all indices are group indices)."""

    ulysses: int
    ring: int
    placement: str  # "ulysses-low" | "ring-low" (resolved)
    ulysses_idx: int
    ring_idx: int
    ulysses_members: tuple[int, ...]  # group indices of this member's Ulysses group, in Ulysses order
    ring_members: tuple[int, ...]  # group indices of this member's Ring group, in ring order

    @staticmethod
    def index(placement: str, ulysses: int, ring: int, ulysses_idx: int, ring_idx: int) -> int:
        if placement == "ulysses-low":
            return ring_idx * ulysses + ulysses_idx
        return ulysses_idx * ring + ring_idx

    @staticmethod
    def coords(placement: str, ulysses: int, ring: int, member: int) -> tuple[int, int]:
        """(ulysses_idx, ring_idx) of a group member."""
        if placement == "ulysses-low":
            return member % ulysses, member // ulysses
        return member // ring, member % ring

    @classmethod
    def build(cls, ulysses: int, ring: int, placement: str, member: int) -> GridLayout:
        ui, ri = cls.coords(placement, ulysses, ring, member)
        return cls(
            ulysses=ulysses,
            ring=ring,
            placement=placement,
            ulysses_idx=ui,
            ring_idx=ri,
            ulysses_members=tuple(cls.index(placement, ulysses, ring, x, ri) for x in range(ulysses)),
            ring_members=tuple(cls.index(placement, ulysses, ring, ui, y) for y in range(ring)),
        )

    @classmethod
    def groups(cls, ulysses: int, ring: int, placement: str) -> tuple[list[list[int]], list[list[int]]]:
        """All Ulysses groups and all Ring groups of the grid, as lists of group indices."""
        uls = [[cls.index(placement, ulysses, ring, x, y) for x in range(ulysses)] for y in range(ring)]
        rings = [[cls.index(placement, ulysses, ring, x, y) for y in range(ring)] for x in range(ulysses)]
        return uls, rings


def resolve_placement(spec: ParallelSpec, group_ranks: Sequence[int], topology: Topology | None) -> str:
    """The concrete placement of ``spec`` on a group whose members are ``group_ranks`` (global ranks).

    "auto" puts Ring on the axis whose groups stay inside one node and Ulysses on the axis that crosses
    nodes (SwiftFusion's placement: the ring's many point-to-point steps use fast intra-node links, the
    one all-to-all crosses the slow ones). When both or neither axis keeps its ring groups inside nodes,
    the placement whose ring groups span fewer nodes wins; a tie (e.g. everything on one node) gives
    "ulysses-low", the usual USP choice.
    """
    if spec.placement != "auto":
        return spec.placement
    u, r = spec.ulysses, spec.ring
    if u == 1 or r == 1 or topology is None:
        return "ulysses-low"
    if max(group_ranks) >= topology.world_size:
        raise InvalidUsage(
            f"gfdit: topology covers {topology.world_size} ranks but the group has rank {max(group_ranks)}"
        )

    def cost(placement: str) -> tuple[int, int]:
        uls, rings = GridLayout.groups(u, r, placement)
        ring_nodes = sum(len({topology.node_of(group_ranks[i]) for i in g}) - 1 for g in rings)
        ulysses_nodes = sum(len({topology.node_of(group_ranks[i]) for i in g}) - 1 for g in uls)
        # First: ring groups crossing nodes (bad); second: Ulysses groups *not* crossing is neutral.
        return ring_nodes, -ulysses_nodes

    ul, rl = cost("ulysses-low"), cost("ring-low")
    if rl < ul:
        return "ring-low"
    return "ulysses-low"
