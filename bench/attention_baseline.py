"""The baseline of bench_attention.py: USP sequence-parallel attention on torch.distributed (gloo).

The same algorithm as gfdit.attention's USP path (``ulysses x ring`` grid, placement "ulysses-low": member
index = ring_idx * ulysses + ulysses_idx), written the way one would write it with torch.distributed:

* Ulysses: q, k and v are packed into one [u, 3, B, S_local, H/u, D] tensor (destination first, made
  contiguous by a permute + copy), exchanged with one ``dist.all_to_all_single`` on the Ulysses group, and
  unpacked into [3, B, H/u, S_u, D]; the output goes back the same way.
* Ring: the K/V block [2, B, h, S_blk, D] travels round the ring with ``dist.isend``/``dist.irecv``
  (gloo's own threads move it) while the current block is computed, double-buffered.
* Local compute and merge: gfdit's own ``PartialMerger`` (flash attention for CPU + the same log-sum-exp
  merge), so that gfdit and the baseline differ only in their communication. Patching
  ``PartialMerger.add_block`` (bench_attention.py's comm-only mode) removes the compute from both alike.

Ulysses alone is ``GlooUSP(u=n, r=1)``, Ring alone ``GlooUSP(u=1, r=n)``. Even sequence shards only.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from gfdit.attention.local import PartialMerger


class GlooUSP:
    """USP attention of a ``ulysses x ring`` grid over the whole gloo world (every rank constructs it)."""

    def __init__(self, ulysses: int, ring: int) -> None:
        n, rank = dist.get_world_size(), dist.get_rank()
        if ulysses * ring != n:
            raise ValueError(f"ulysses {ulysses} x ring {ring} != world size {n}")
        self.u, self.r = ulysses, ring
        self.x, self.y = rank % ulysses, rank // ulysses  # (ulysses_idx, ring_idx), "ulysses-low"
        self.ul_group = None
        if ulysses > 1:
            # dist.new_group is collective over the whole world: every rank creates every Ulysses group.
            for y in range(ring):
                ranks = [y * ulysses + x for x in range(ulysses)]
                g = dist.new_group(ranks) if ulysses < n else dist.group.WORLD
                if y == self.y:
                    self.ul_group = g
        self.ring_ranks = [y * ulysses + self.x for y in range(ring)]

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q, k, v: this rank's shard [B, S_local, H, D]; returns its output shard [B, S_local, H, D]."""
        b, s, h, d = q.shape
        u, dtype = self.u, q.dtype
        hu = h // u
        if u > 1:
            send = torch.stack([q, k, v]).view(3, b, s, u, hu, d).permute(3, 0, 1, 2, 4, 5).contiguous()
            recv = torch.empty_like(send)  # [u (source), 3, B, S_local, hu, D]
            dist.all_to_all_single(recv, send, group=self.ul_group)
            qkv = recv.permute(1, 2, 4, 0, 3, 5).reshape(3, b, hu, u * s, d)  # copy: [3, B, hu, S_u, D]
            q_b, kv = qkv[0], qkv[1:3]
        else:
            q_b = q.transpose(1, 2)
            kv = torch.stack([k.transpose(1, 2), v.transpose(1, 2)])  # contiguous [2, B, H, S, D]
        merger = PartialMerger()
        self._ring(q_b, kv, merger)
        out_b, _ = merger.result(q_b)  # [B, hu, S_u, D] float32
        if u > 1:
            # [u (destination), B, S_local, hu, D]
            send = out_b.to(dtype).view(b, hu, u, s, d).permute(2, 0, 3, 1, 4).contiguous()
            recv = torch.empty_like(send)  # [u (head group), B, S_local, hu, D]
            dist.all_to_all_single(recv, send, group=self.ul_group)
            return recv.permute(1, 2, 0, 3, 4).reshape(b, s, h, d)
        return out_b.transpose(1, 2).to(dtype).contiguous()

    def _ring(self, q_b: torch.Tensor, kv: torch.Tensor, merger: PartialMerger) -> None:
        r = self.r
        cur = kv
        if r > 1:
            spare = [torch.empty_like(kv) for _ in range(2)]
            nxt_rank, prv_rank = self.ring_ranks[(self.y + 1) % r], self.ring_ranks[(self.y - 1) % r]
        for t in range(r):
            works = []
            if t < r - 1:
                nxt = spare[t % 2]
                works = [dist.isend(cur, nxt_rank), dist.irecv(nxt, prv_rank)]
            merger.add_block(q_b, cur[0], cur[1])  # overlaps the transfer
            for w in works:
                w.wait()
            if works:
                cur = nxt
