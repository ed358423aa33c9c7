"""Which node each rank runs on, so that parallel layouts can put fast and slow links to their best use."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from gfdit import settings
from gfdit._C import InvalidUsage

NODE_IDS_ENV = "GFDIT_NODE_IDS"


@dataclasses.dataclass(frozen=True)
class Topology:
    """The node id of every rank of the world: ``node_ids[rank]``. Ranks with equal ids share a node.

    ``Topology.of_world(world)`` is what the world found at its rendezvous: ranks whose hosts share memory share
    a node (``GFDIT_NODE_IDS`` overrides). ``Topology.from_env(world_size)`` reads ``GFDIT_NODE_IDS`` alone
    (e.g. ``"0,0,1,1"``); without it every rank is on node 0.
    """

    node_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        ids = tuple(self.node_ids)
        if not ids:
            raise InvalidUsage("gfdit: Topology needs the node id of at least one rank")
        try:
            ids = tuple(int(i) for i in ids)
        except (TypeError, ValueError):
            raise InvalidUsage(f"gfdit: Topology node ids must be integers, got {self.node_ids!r}") from None
        if any(i < 0 for i in ids):
            raise InvalidUsage(f"gfdit: Topology node ids must be non-negative, got {list(ids)}")
        object.__setattr__(self, "node_ids", ids)

    @classmethod
    def single_node(cls, world_size: int) -> Topology:
        """Every rank on node 0."""
        return cls((0,) * int(world_size))

    @classmethod
    def from_string(cls, text: str, world_size: int | None = None) -> Topology:
        """Parses ``"0,0,1,1"`` (one id per rank, commas or spaces between)."""
        parts = [p for p in text.replace(",", " ").split() if p]
        try:
            ids = tuple(int(p) for p in parts)
        except ValueError:
            raise InvalidUsage(f'gfdit: cannot parse node ids {text!r}; expected e.g. "0,0,1,1"') from None
        topo = cls(ids)
        if world_size is not None and len(ids) != world_size:
            raise InvalidUsage(
                f"gfdit: {len(ids)} node ids {list(ids)} given for a world of {world_size} ranks"
            )
        return topo

    @classmethod
    def of_world(cls, world: Any) -> Topology:
        """The nodes of a ``gfdit.comm.World``'s ranks, as its rendezvous derived them from their hosts."""
        return cls(tuple(world.node_of(r) for r in range(world.world_size)))

    @classmethod
    def from_env(cls, world_size: int | None = None) -> Topology:
        """From ``GFDIT_NODE_IDS``; all ranks on one node when it is unset or empty."""
        if world_size is None:
            from gfdit.comm.world import get_world_size

            world_size = get_world_size()
        text = settings.get(NODE_IDS_ENV).strip()
        if not text:
            return cls.single_node(world_size)
        return cls.from_string(text, world_size)

    @property
    def world_size(self) -> int:
        return len(self.node_ids)

    @property
    def num_nodes(self) -> int:
        return len(set(self.node_ids))

    def node_of(self, rank: int) -> int:
        """Node id of a global rank."""
        if not 0 <= rank < len(self.node_ids):
            raise InvalidUsage(f"gfdit: rank {rank} is outside the topology of {len(self.node_ids)} ranks")
        return self.node_ids[rank]

    def same_node(self, ranks: Sequence[int]) -> bool:
        """Whether all the given global ranks share one node."""
        return len({self.node_of(r) for r in ranks}) <= 1

    def ranks_on(self, node: int) -> list[int]:
        return [r for r, n in enumerate(self.node_ids) if n == node]
