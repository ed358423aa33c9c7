"""How one parallel call splits the token sequence across its group, and how it gathers it back.

NOTE [sequence shards]
The image/video token sequence of length S is cut into ``len(group)`` contiguous pieces in group order:
member i holds ``S // n + (1 if i < S % n else 0)`` tokens starting at the sum of the earlier pieces (the
first ``S % n`` members hold one more; a member may hold none when S < n). Every tensor indexed by the
token position (hidden states, rotary tables, per-token timesteps, modulation indices, control residuals)
is cut the same way, so row t of every local tensor is the same token. gfdit.attention accepts uneven
shards; the final gather pads every piece to the longest one, gathers once and drops the padding.
"""

from __future__ import annotations

import torch

from gfdit import comm
from gfdit._C import InvalidUsage
from gfdit.attention.spec import ParallelSpec


def even_splits(total: int, n: int) -> list[int]:
    """Sizes of the n contiguous pieces of a sequence of ``total`` tokens (see NOTE [sequence shards])."""
    base, extra = divmod(total, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


class SequenceShards:
    """One call's group, spec and (once the first token-indexed tensor is seen) its sequence split."""

    def __init__(self, world: comm.World, group: comm.Group, spec: ParallelSpec) -> None:
        self.world = world
        self.group = group
        self.spec = spec
        self.n = group.size()
        self.me = group.rank()
        self.total: int | None = None
        self.splits: list[int] = []
        self.offset = 0

    def _fix(self, total: int, what: str) -> None:
        if self.total is None:
            self.total = total
            self.splits = even_splits(total, self.n)
            self.offset = sum(self.splits[: self.me])
        elif total != self.total:
            raise InvalidUsage(
                f"gfdit.models: {what} has {total} tokens, but this call's sequence has {self.total}"
            )

    @property
    def local(self) -> int:
        return self.splits[self.me]

    def take(self, t: torch.Tensor, dim: int, what: str) -> torch.Tensor:
        """This member's piece of t along ``dim`` (a view; see NOTE [sequence shards])."""
        self._fix(int(t.shape[dim]), what)
        if self.n == 1:
            return t
        return t.narrow(dim, self.offset, self.local)

    def gather(self, t: torch.Tensor, dim: int) -> torch.Tensor:
        """The whole sequence from every member's piece t (pieces along ``dim``, in group order)."""
        if self.n == 1:
            return t
        if self.total is None:
            raise InvalidUsage("gfdit.models: nothing was split in this call, so there is nothing to gather")
        if t.shape[dim] != self.local:
            raise InvalidUsage(
                f"gfdit.models: gathering {t.shape[dim]} tokens, but this member holds {self.local}"
            )
        longest = max(self.splits)
        moved = t.movedim(dim, 0)
        padded = moved.new_zeros((longest,) + tuple(moved.shape[1:]))
        padded[: self.local] = moved
        out = padded.new_empty((self.n,) + tuple(padded.shape))
        self.world.all_gather_into_tensor(out, padded, group=self.group)
        whole = torch.cat([out[i, :s] for i, s in enumerate(self.splits)], dim=0)
        return whole.movedim(0, dim)
