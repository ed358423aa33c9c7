"""USP: the Ulysses all-to-all (heads <-> sequence) along one axis of a group's grid and Ring attention along
the other (NOTE [attention call protocol] in gfdit.attention.core). The ring and the merge of the joint
tokens' partials are also what the Torus pipeline (gfdit.attention.torus) builds on."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gfdit import comm
from gfdit.attention.local import PartialMerger
from gfdit.attention.pipeline import StreamExecutor, executor_for
from gfdit.attention.plan import Plan
from gfdit.attention.spec import GridLayout


def ring_attention(
    world: comm.World,
    q_b: torch.Tensor,
    kv: torch.Tensor,
    block_sizes: Sequence[int],
    ring_ranks: Sequence[int],
    ring_idx: int,
    merger: PartialMerger,
) -> None:
    """Ring attention of this member's queries q_b [B, h, Sq, D] over every ring member's K/V block.

    kv: this member's block [2, B, h, S_blk, D], contiguous. block_sizes[y]: S_blk of ring member y.
    The block held at step t is ring member (ring_idx - t)'s; it is sent to the next member while the
    next one arrives from the previous member (NOTE [attention call protocol], 3), double-buffered.
    """
    r = len(ring_ranks)
    _, b, h, _, d = kv.shape
    cur = kv
    executor = None
    if r > 1:
        max_blk = max(block_sizes)
        spare = [torch.empty(2 * b * h * max_blk * d, dtype=kv.dtype, device=kv.device) for _ in range(2)]
        nxt_rank, prv_rank = ring_ranks[(ring_idx + 1) % r], ring_ranks[(ring_idx - 1) % r]
        send_first = ring_idx % 2 == 0
        executor = executor_for(kv.device)  # a thread, or a stream on CUDA (NOTE [stream pipeline])
    try:
        for t in range(r):
            fut = None
            if executor is not None and t < r - 1:  # there is an executor when r > 1
                s_next = block_sizes[(ring_idx - t - 1) % r]
                nxt = spare[t % 2][: 2 * b * h * s_next * d].view(2, b, h, s_next, d)
                fut = executor.submit(_exchange, world, cur, nxt, nxt_rank, prv_rank, send_first)
            try:
                merger.add_block(q_b, cur[0], cur[1])
            finally:
                if fut is not None:
                    fut.result()  # the transfer finishes (or raises) before its buffers are touched again
            if fut is not None:
                cur = nxt
    finally:
        if isinstance(executor, StreamExecutor):
            executor.join()


def _exchange(
    world: comm.World, send_buf: torch.Tensor, recv_buf: torch.Tensor, dst: int, src: int, send_first: bool
) -> None:
    if send_first:
        world.send(send_buf, dst)
        world.recv(recv_buf, src)
    else:
        world.recv(recv_buf, src)
        world.send(send_buf, dst)


def merge_joint_partials(
    world: comm.World,
    group: comm.Group,
    layout: GridLayout,
    part: torch.Tensor,
    head_splits: Sequence[int],
    dtype: torch.dtype,
) -> torch.Tensor:
    """Combines every member's joint-query partial [B, h_x, S_joint, D + 1] (out | lse) into joint_out.

    Members of one Ring group saw disjoint key sets of the same heads: merged through their lse. Ulysses
    groups own disjoint heads (head_splits[x] of Ulysses member x): concatenated. Partials are padded to
    the largest head count, so one all_gather of equal blocks carries them.
    """
    n = group.size()
    b, hu, sj, d1 = part.shape
    h_max = max(head_splits)
    if hu != h_max:
        padded = part.new_zeros((b, h_max, sj, d1))
        padded[:, :hu] = part
        part = padded
    gathered = torch.empty((n, b, h_max, sj, d1), dtype=torch.float32, device=part.device)
    if n > 1:
        world.all_gather_into_tensor(gathered, part.contiguous(), group=group)
    else:
        gathered[0] = part
    u, r = layout.ulysses, layout.ring
    heads = sum(head_splits)
    out = torch.empty((b, sj, heads, d1 - 1), dtype=dtype, device=part.device)
    lo = 0
    for x in range(u):
        hx = head_splits[x]
        idx = [GridLayout.index(layout.placement, u, r, x, y) for y in range(r)]
        parts = gathered[idx][:, :, :hx]  # [r, B, h_x, Sj, D + 1]
        o, lse = parts[..., :-1], parts[..., -1]
        m = torch.logsumexp(lse, dim=0)
        w = torch.exp(lse - m.unsqueeze(0)).nan_to_num_(0.0)
        merged = (o * w.unsqueeze(-1)).sum(dim=0)  # [B, h_x, Sj, D]
        out[:, :, lo : lo + hx] = merged.transpose(1, 2).to(dtype)
        lo += hx
    return out


def usp(
    call: Plan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, joint: tuple | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """USP: Ulysses all-to-all (heads <-> sequence) along one grid axis, Ring along the other."""
    world, lay = call.world, call.layout
    u, hu, b, d = lay.ulysses, call.hu, call.b, call.d
    s_local = q.shape[1]
    dtype = q.dtype
    if u > 1:
        # One all-to-all for q, k and v: Ulysses member x gets [q | k | v] of its heads, 3 * h_x "heads".
        hs, ho = call.head_splits, call.head_offsets
        packed = torch.cat([t[:, :, ho[x] : ho[x] + hs[x]] for x in range(u) for t in (q, k, v)], dim=2)
        s_u = sum(call.ul_splits)
        gathered = torch.empty((b, s_u, 3 * hu, d), dtype=dtype, device=q.device)
        world.all_to_all_4d(
            gathered,
            packed,
            2,
            1,
            group=call.ul_group,
            seq_splits=call.ul_splits,
            head_splits=[3 * x for x in hs],
        )
        g5 = gathered.view(b, s_u, 3, hu, d)
        q_b = g5[:, :, 0].transpose(1, 2)
        kv = g5[:, :, 1:3].permute(2, 0, 3, 1, 4).contiguous()  # [2, B, hu, S_u, D]
    else:
        s_u = s_local
        q_b = q.transpose(1, 2)
        kv = torch.stack([k.transpose(1, 2), v.transpose(1, 2)], dim=0)  # contiguous copy
    heads = slice(call.head_lo, call.head_lo + hu)
    merger = PartialMerger()
    joint_part = None
    if joint is not None:
        jq, jk, jv = (t[:, :, heads].transpose(1, 2) for t in joint)
        merger.add_block(q_b, jk, jv)
        jmerger = PartialMerger()
        if lay.ring_idx == 0:
            jmerger.add_block(jq, jk, jv)  # joint keys count once for the joint queries
        jmerger.add_block(jq, kv[0], kv[1])  # this member's sequence block, before the ring moves it
    ring_attention(world, q_b, kv, call.ring_blocks, call._ring_ranks, lay.ring_idx, merger)
    out_b, _ = merger.result(q_b)  # [B, hu, S_u, D] float32
    out_u = out_b.transpose(1, 2).to(dtype).contiguous()  # [B, S_u, hu, D]
    if u > 1:
        out = torch.empty((b, s_local, call.h, d), dtype=dtype, device=q.device)
        world.all_to_all_4d(
            out, out_u, 1, 2, group=call.ul_group, seq_splits=call.ul_splits, head_splits=call.head_splits
        )
    else:
        out = out_u
    joint_out = None
    if joint is not None:
        jo, jl = jmerger.result(jq)
        joint_part = torch.cat([jo, jl.unsqueeze(-1)], dim=-1)
        joint_out = merge_joint_partials(world, call.group, lay, joint_part, call.head_splits, dtype)
    return out, joint_out
