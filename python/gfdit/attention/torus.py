"""Torus attention: the Ulysses all-to-all chunked by heads, pipelined against the ring, with one-sided puts.

The group is the same ``ulysses x ring`` grid as USP (``GridLayout``). Each member's hu = H / ulysses heads
are split into C chunks of hc heads (``ParallelSpec.torus_chunks``; default the largest divisor of hu up
to 4). Chunk c of Ulysses member x is the heads x*hu + c*hc ... x*hu + (c+1)*hc - 1.

Algorithm, per member (all transfers on the one communication thread, in this order, so every member
issues the same sequence; the calling thread only computes and waits on futures):

    put_fwd(0)                               # q/k/v of chunk 0 to every Ulysses peer (put_with_signal)
    for c in 0 .. C-1:
        wait_fwd(c)                          # chunk c's q/k/v from every Ulysses peer have landed
        put_fwd(c + 1)                       # transfer of the next chunk, queued before the ring steps
        ring attention of chunk c            # send/recv steps queued behind put_fwd(c + 1): the next
                                             # chunk's all-to-all overlaps this chunk's first ring block
        put_out(c)                           # chunk c's output rows back to their owners (one-sided)
    wait_out(all)                            # every peer's output chunks have landed

Workspace: one symmetric-heap block per call (``gfdit.empty``) of the same size on every member, so that
a member's local offset names the same place on every peer (``put_with_signal`` addresses the peer's
heap by the local tensor's offset). It holds a receive area for every (chunk, source) pair, so nothing
is overwritten within a call and no credits are needed; the start-of-call all_gather (NOTE [attention
call protocol], 1) keeps a fast member from writing call N+1's data while a slow one still reads call N.
The offsets are all_gathered once per call: if they differ on some member (its heap history differs, or
its heap is full), every member falls back to USP for that call, which gives the same result.

Put counting: ``wait_signal(peer, n)`` counts every put from ``peer``, whatever it carried. A peer's puts
to this member come in the fixed order fwd0, fwd1, out0, fwd2, out1, ..., out(C-1) (``_put_order``),
so waiting for "chunk c has landed" is waiting until the count reaches fwd(c)'s position in that order.

Simplifications: the ring inside each chunk is the USP ring (send/recv, double-buffered) rather than
puts; the output all-to-all of chunk c is issued after its ring finishes, not overlapped with the
ring of chunk c + 1 on the receiving side beyond what the FIFO communication thread gives.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch

from gfdit import comm
from gfdit._C import InvalidUsage
from gfdit.attention.core import _Call, _comm_executor, _joint_partials_merge, ring_attention
from gfdit.attention.local import PartialMerger
from gfdit.attention.spec import GridLayout, ParallelSpec

_PAD = 256  # spare elements at the end of the workspace: empty puts still need a non-empty heap view


def chunks_for(spec: ParallelSpec, heads: int) -> int:
    hu = heads // spec.ulysses
    if spec.torus_chunks is not None:
        return spec.torus_chunks
    return max(c for c in range(1, min(4, hu) + 1) if hu % c == 0)


def check_torus(spec: ParallelSpec, heads: int) -> None:
    hu = heads // spec.ulysses
    c = chunks_for(spec, heads)
    if hu % c != 0:
        raise InvalidUsage(
            f"gfdit.attention: torus_chunks={c} does not divide the {hu} heads per Ulysses "
            "member "
            f"({heads} heads / ulysses {spec.ulysses})"
        )


def _put_order(num_chunks: int) -> dict[str, int]:
    """1-based position of each put in the sequence one peer sends to another (see module docstring)."""
    order = ["f0"]
    for c in range(num_chunks):
        if c + 1 < num_chunks:
            order.append(f"f{c + 1}")
        order.append(f"o{c}")
    return {name: i + 1 for i, name in enumerate(order)}


class _PutWaiter:
    """Turns "wait until put #pos from peer has landed" into relative wait_signal calls."""

    def __init__(self, world: comm.World, peers: Sequence[int]) -> None:
        self.world = world
        self.seen = {p: 0 for p in peers}

    def wait_upto(self, peers: Sequence[int], pos: int) -> None:
        for p in peers:
            need = pos - self.seen[p]
            if need > 0:
                self.world.wait_signal(p, need)
                self.seen[p] = pos


def torus(
    call: _Call, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, joint: tuple | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    world, lay, group = call.world, call.layout, call.group
    u, r, placement = lay.ulysses, lay.ring, lay.placement
    b, h, d, hu = call.b, call.h, call.d, call.hu
    dtype = q.dtype
    num_c = chunks_for(call.spec, h)
    hc = hu // num_c
    s_me = q.shape[1]
    splits, ul_splits = call.splits, call.ul_splits
    # Same sizes on every member: the largest Ulysses-group sequence and the largest shard of the group.
    s_u_max = max(call.ring_blocks)
    s_max = max(splits)
    fwd_chunk = 3 * b * s_u_max * hc * d  # receive area of one chunk: [u sources][3, B, hc, S_x, D]
    out_chunk = u * b * s_max * hc * d  # output area of one chunk: u slots of B * S_max * hc * D
    total = num_c * (fwd_chunk + out_chunk) + _PAD

    ws = None
    offset = -1
    try:
        ws = world.empty((total,), dtype=dtype)
        offset = int(world._w.heap_offset(ws.data_ptr()))
    except InvalidUsage:
        ws = None
    offs = torch.empty(group.size(), dtype=torch.int64)
    world.all_gather_into_tensor(offs, torch.tensor([offset], dtype=torch.int64), group=group)
    offs_l = offs.tolist()
    uls, _ = GridLayout.groups(u, r, placement)
    usable = all(o >= 0 for o in offs_l) and all(len({offs_l[m] for m in g}) == 1 for g in uls)
    if not usable:
        warnings.warn(
            "gfdit.attention: torus workspace is not at the same heap offset on every Ulysses peer "
            f"(offsets {offs_l}); using USP for this call",
            RuntimeWarning,
            stacklevel=3,
        )
        ws = None
        from gfdit.attention.core import _usp

        return _usp(call, q, k, v, joint)

    me_u = lay.ulysses_idx
    ul_ranks = [group.ranks[m] for m in lay.ulysses_members]
    peers = [p for i, p in enumerate(ul_ranks) if i != me_u]
    prefix = [sum(ul_splits[:x]) for x in range(u)]
    pos = _put_order(num_c)
    waiter = _PutWaiter(world, peers)
    ex = _comm_executor()

    def fwd_view(c: int, x: int) -> torch.Tensor:
        """Receive area of chunk c from Ulysses member x: [3, B, hc, S_x, D]."""
        off = c * fwd_chunk + 3 * b * prefix[x] * hc * d
        n_el = 3 * b * ul_splits[x] * hc * d
        return ws[off : off + n_el].view(3, b, hc, ul_splits[x], d)

    def out_view(c: int, x: int, s_owner: int) -> torch.Tensor:
        """Output area of chunk c from Ulysses member x on a member holding s_owner rows: [B, S, hc, D]."""
        off = num_c * fwd_chunk + c * out_chunk + x * b * s_max * hc * d
        return ws[off : off + b * s_owner * hc * d].view(b, s_owner, hc, d)

    def put(src: torch.Tensor, dst_local: torch.Tensor, peer: int) -> None:
        if dst_local.numel() == 0:  # an empty piece still counts as a put; give it a non-empty heap view
            base = dst_local.data_ptr() - ws.data_ptr()
            dst_local = ws[base // ws.element_size() :][:1]
        world.put_with_signal(src, dst_local, peer)

    def put_fwd(c: int) -> None:
        # This member's q/k/v rows for the chunk-c heads of each Ulysses member x.
        for x in range(u):
            lo = x * hu + c * hc
            # [3, B, hc, S, D]
            piece = torch.stack([t[:, :, lo : lo + hc].transpose(1, 2) for t in (q, k, v)], dim=0)
            dst = fwd_view(c, me_u)
            if x == me_u:
                dst.copy_(piece)
            else:
                put(piece.contiguous(), dst, ul_ranks[x])

    def put_out(c: int, out_c: torch.Tensor) -> None:
        # out_c: [B, hc, S_u, D] float32 for the chunk-c heads of this member; rows of member x go back to x.
        for x in range(u):
            rows = out_c[:, :, prefix[x] : prefix[x] + ul_splits[x]].transpose(1, 2).to(dtype).contiguous()
            dst = out_view(c, me_u, ul_splits[x])
            if x == me_u:
                dst.copy_(rows)
            else:
                put(rows, dst, ul_ranks[x])

    futures = [ex.submit(put_fwd, 0)]
    joint_parts = []
    heads0 = me_u * hu
    try:
        for c in range(num_c):
            got = ex.submit(waiter.wait_upto, peers, pos[f"f{c}"])
            if c + 1 < num_c:
                futures.append(ex.submit(put_fwd, c + 1))
            got.result()
            recv = torch.cat([fwd_view(c, x) for x in range(u)], dim=3)  # [3, B, hc, S_u, D]
            q_b, kv = recv[0], recv[1:3].contiguous()
            merger = PartialMerger()
            if joint is not None:
                sl = slice(heads0 + c * hc, heads0 + (c + 1) * hc)
                jq, jk, jv = (t[:, :, sl].transpose(1, 2) for t in joint)
                merger.add_block(q_b, jk, jv)
                jm = PartialMerger()
                if lay.ring_idx == 0:
                    jm.add_block(jq, jk, jv)
                jm.add_block(jq, kv[0], kv[1])
                jo, jl = jm.result(jq)
                joint_parts.append(torch.cat([jo, jl.unsqueeze(-1)], dim=-1))
            ring_attention(world, q_b, kv, call.ring_blocks, call._ring_ranks, lay.ring_idx, merger)
            out_c, _ = merger.result(q_b)
            futures.append(ex.submit(put_out, c, out_c))
        done = ex.submit(waiter.wait_upto, peers, pos[f"o{num_c - 1}"])
        done.result()
    finally:
        for f in futures:
            f.result()
    # Assemble [B, S_me, H, D]: head x*hu + c*hc + i comes from area (c, x).
    # Area (c, x) holds a contiguous [B, S_me, hc, D] at its start (its slot is sized for S_max rows).
    area = ws[num_c * fwd_chunk : num_c * fwd_chunk + num_c * out_chunk].view(num_c, u, b * s_max * hc * d)
    area = area[:, :, : b * s_me * hc * d].view(num_c, u, b, s_me, hc, d)
    out = torch.empty((b, s_me, h, d), dtype=dtype)  # a copy: the workspace goes back to the heap
    out.view(b, s_me, u, num_c, hc, d).copy_(area.permute(2, 3, 1, 0, 4, 5))
    joint_out = None
    if joint is not None:
        part = torch.cat(joint_parts, dim=1)  # [B, hu, S_joint, D + 1]
        joint_out = _joint_partials_merge(world, group, lay, part, h, dtype)
    area = ws = None  # the workspace goes back to the heap before the caller continues
    return out, joint_out
