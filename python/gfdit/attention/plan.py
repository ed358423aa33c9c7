"""The plan of one attention call (``Plan``): the group, the grid, every member's sequence length and
heads, its cache key and its message tag (NOTE [attention plan cache], NOTE [plan disagreement] in
gfdit.attention.core)."""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Sequence
from typing import Any

from gfdit import comm
from gfdit._C import InvalidUsage
from gfdit.attention.spec import GridLayout, ParallelSpec

# Message tags (NOTE [plan disagreement]): the exchange's; plan fingerprints are never 0 or this.
EXCHANGE_TAG = 0x9F1D_E7C4


def digest(obj: Any, nbytes: int) -> int:
    """A hash of repr(obj) that is the same in every process (unlike hash(), which is salted)."""
    return int.from_bytes(hashlib.blake2b(repr(obj).encode(), digest_size=nbytes).digest(), "little")


def sub_group(world: comm.World, group: comm.Group, members: Sequence[int]) -> comm.Group:
    if len(members) == group.size() and list(members) == list(range(group.size())):
        return group
    ranks = group.ranks
    return world.new_group([ranks[i] for i in members])


class Plan:
    """What one validated call knows: the group, the grid, every member's sequence length and heads.

    Built from the gathered records; kept and reused by later calls with the same key (NOTE [attention
    plan cache]), so it holds nothing that belongs to one call, and only a weak reference to its world (a
    kept plan must not keep a destroyed world's regions mapped).
    """

    def __init__(
        self, world: comm.World, group: comm.Group, spec: ParallelSpec, placement: str, recs: list[list[int]]
    ) -> None:
        self._world = weakref.ref(world)
        self._group = group._g  # the descriptors, not comm.Group (which holds its world)
        self.spec = spec
        self.n = group.size()
        self.me = group.rank()
        self.layout = GridLayout.build(spec.ulysses, spec.ring, placement, self.me)
        self.splits = [r[2] for r in recs]
        self.b, self.h, self.d = recs[0][1], recs[0][3], recs[0][4]
        u, r = spec.ulysses, spec.ring
        lay = self.layout
        # Heads of each Ulysses member (by Ulysses index), the first H % u hold one more.
        self.head_splits = comm.even_head_splits(self.h, u)
        self.head_offsets = [sum(self.head_splits[:x]) for x in range(u)]
        self.hu = self.head_splits[lay.ulysses_idx]  # this member's heads
        self.head_lo = self.head_offsets[lay.ulysses_idx]
        self.has_joint = bool(recs[0][6])
        self.s_joint = recs[0][7]
        self.ul_splits = [self.splits[m] for m in lay.ulysses_members]
        # Sequence a ring member holds after its Ulysses all-to-all: its whole Ulysses group's shards.
        self.ring_blocks = [
            sum(self.splits[GridLayout.index(placement, u, r, x, y)] for x in range(u)) for y in range(r)
        ]
        self._ul_group = None
        self._ring_ranks = [group.ranks[m] for m in lay.ring_members]
        self.key = plan_key(
            spec,
            placement,
            recs[0][1],
            recs[0][3],
            recs[0][4],
            recs[0][5],
            recs[0][6],
            recs[0][7],
            self.splits,
            recs[0][11],
        )
        self.device_kind = recs[0][11]
        self.tag = plan_tag(group.ranks, self.key)

    @property
    def world(self) -> comm.World:
        world = self._world()
        if world is None:
            raise InvalidUsage("gfdit.attention: this plan's world was destroyed")
        return world

    @property
    def group(self) -> comm.Group:
        return comm.Group(self.world, self._group)

    @property
    def ul_group(self) -> comm.Group:
        if self._ul_group is None:
            self._ul_group = sub_group(self.world, self.group, self.layout.ulysses_members)._g
        return comm.Group(self.world, self._ul_group)


def plan_key(
    spec: ParallelSpec,
    placement: str,
    b: int,
    h: int,
    d: int,
    dtype: int,
    has_joint: int,
    s_joint: int,
    splits: Sequence[int],
    device_kind: int = 0,
) -> tuple:
    """See NOTE [attention plan cache]: the same on every member of one call. CUDA calls add the device
    kind (CPU keys, and so their tags, are those of builds without CUDA support)."""
    key = (
        (spec.ulysses, spec.ring, spec.mode, placement, spec.torus_chunks),
        (int(b), int(h), int(d), int(dtype), int(has_joint), int(s_joint) if has_joint else 0),
        tuple(int(x) for x in splits),
    )
    return key if device_kind == 0 else (*key, ("device", int(device_kind)))


def plan_tag(group_ranks: Sequence[int], key: tuple) -> int:
    """The plan's message tag (NOTE [plan disagreement]): 32 bits, never 0 nor the exchange's."""
    tag = digest((tuple(group_ranks), key), 4)
    if tag in (0, EXCHANGE_TAG):
        tag ^= 0x5A5A_5A5A
    return tag
