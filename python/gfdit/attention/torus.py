"""Torus attention: the Ulysses all-to-all chunked by heads, pipelined against the ring, with one-sided puts.

The group is the same ``ulysses x ring`` grid as USP (``GridLayout``). Ulysses member x holds h_x heads
(``comm.even_head_splits``: H / ulysses each, or one more on the first H % ulysses members when the heads
do not divide), split into C chunks (``ParallelSpec.torus_chunks``, the same C on every member). With even
heads C must divide h_x and defaults to its largest divisor up to 4, so every chunk has h_x / C heads; with
uneven heads C may be at most the smallest h_x (default: that, up to 4) and chunk c of member x has
``h_x // C + (c < h_x % C)`` heads. Chunk c of member x is the next heads of x after its earlier chunks.

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

Workspace: one heap block per call at the same offset on every member (``World.symmetric_empty``, NOTE
[symmetric allocation]), sized for the largest chunk of any member, so that a member's local offset names the
same place on every peer (``put_with_signal`` addresses the peer's heap by the local tensor's offset). It
holds a receive area for every (chunk, source) pair, so nothing is overwritten within a call and no credits
are needed. The allocation's exchange (one all_gather when the heaps agree, more rounds after a migration
made them differ) is also the start barrier that keeps a fast member from writing call N+1's data while a
slow one still reads call N (so Torus keeps one collective per call of its own even when the call's plan is
cached, NOTE [attention plan cache]). Only when some member's heap has no room for it does every member run
USP for that call (with a warning), which gives the same result.

Put counting: ``wait_signal(peer, n)`` counts every put from ``peer``, whatever it carried. A peer's puts
to this member come in the fixed order fwd0, fwd1, out0, fwd2, out1, ..., out(C-1) (``_put_order``),
so waiting for "chunk c has landed" is waiting until the count reaches fwd(c)'s position in that order.

Simplifications: the ring inside each chunk is the USP ring (send/recv, double-buffered) rather than
puts; the output all-to-all of chunk c is issued after its ring finishes, not overlapped with the
ring of chunk c + 1 on the receiving side beyond what the FIFO communication thread gives.

CUDA tensors: the workspace comes from the device heap (``gfdit.empty(device=...)``) and the
communication thread is the communication stream (NOTE [stream pipeline] in core.py): puts and
``wait_signal`` are enqueued on it, so "chunk c has landed" is a device-side wait followed by an event the
compute stream waits on. The host all_gather of the offsets is no longer a barrier of the devices (the host
runs ahead of them), so every peer first receives a zero-byte put from each Ulysses peer, sent once that
peer's stream has finished everything before the call (the previous call's reads of the same heap block
included), and waits for them on its stream before its first put into that peer: the put order starts with
that ready put ``r``. A device heap that cannot hold the workspace falls back to USP, as on CPU.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch

from gfdit import comm
from gfdit._C import InvalidUsage
from gfdit.attention.local import PartialMerger
from gfdit.attention.pipeline import StreamExecutor, executor_for
from gfdit.attention.plan import Plan
from gfdit.attention.spec import ParallelSpec
from gfdit.attention.usp import merge_joint_partials, ring_attention, usp

_PAD = 256  # spare elements at the end of the workspace: empty puts still need a non-empty heap view


def chunks_for(spec: ParallelSpec, heads: int) -> int:
    """The number of head chunks C of a Torus call (see the module docstring)."""
    if spec.torus_chunks is not None:
        return spec.torus_chunks
    hs = comm.even_head_splits(heads, spec.ulysses)
    h_min = max(1, min(hs))
    if len(set(hs)) == 1:
        return max(c for c in range(1, min(4, h_min) + 1) if h_min % c == 0)
    return min(4, h_min)


def check_torus(spec: ParallelSpec, heads: int) -> None:
    if spec.ulysses > heads:
        raise InvalidUsage(
            f"gfdit.attention: the Ulysses degree {spec.ulysses} exceeds the {heads} heads; "
            "each Ulysses member needs at least one head"
        )
    hs = comm.even_head_splits(heads, spec.ulysses)
    c = chunks_for(spec, heads)
    if len(set(hs)) == 1 and hs[0] % c != 0:
        raise InvalidUsage(
            f"gfdit.attention: torus_chunks={c} does not divide the {hs[0]} heads per Ulysses "
            "member "
            f"({heads} heads / ulysses {spec.ulysses})"
        )
    if c > min(hs):
        raise InvalidUsage(
            f"gfdit.attention: torus_chunks={c} exceeds the {min(hs)} heads of the smallest Ulysses member "
            f"({heads} heads over ulysses {spec.ulysses}: {hs})"
        )


def chunk_heads(head_splits: Sequence[int], num_chunks: int) -> list[list[int]]:
    """chunk_heads(...)[x][c]: the heads of chunk c of Ulysses member x."""
    return [
        [h // num_chunks + (1 if c < h % num_chunks else 0) for c in range(num_chunks)] for h in head_splits
    ]


def _put_order(num_chunks: int, ready: bool = False) -> dict[str, int]:
    """1-based position of each put in the sequence one peer sends to another (see module docstring); with
    ``ready`` (CUDA) the zero-byte ready put comes first."""
    order = ["r", "f0"] if ready else ["f0"]
    for c in range(num_chunks):
        if c + 1 < num_chunks:
            order.append(f"f{c + 1}")
        order.append(f"o{c}")
    return {name: i + 1 for i, name in enumerate(order)}


class _PutWaiter:
    """Turns "wait until put #pos from peer has landed" into relative wait_signal calls."""

    def __init__(self, world: comm.World, peers: Sequence[int], device: torch.device | None = None) -> None:
        self.world = world
        self.seen = {p: 0 for p in peers}
        self.device = device  # CUDA: the waits are enqueued on the current stream

    def wait_upto(self, peers: Sequence[int], pos: int) -> None:
        stream = None if self.device is None else torch.cuda.current_stream(self.device)
        for p in peers:
            need = pos - self.seen[p]
            if need > 0:
                self.world.wait_signal(p, need, stream=stream)
                self.seen[p] = pos


def _uses_streams(t: torch.Tensor) -> bool:
    """Whether a call runs its transfers on streams: CUDA tensors (a test seam: tests/python/cases_cuda.py
    runs these paths on CPU tensors with stand-in streams)."""
    return t.device.type == "cuda"


def torus(
    call: Plan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, joint: tuple | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    world, lay, group = call.world, call.layout, call.group
    u = lay.ulysses
    b, h, d = call.b, call.h, call.d
    dtype = q.dtype
    num_c = chunks_for(call.spec, h)
    ch = chunk_heads(call.head_splits, num_c)  # ch[x][c]: heads of chunk c of Ulysses member x
    cho = [[sum(row[:c]) for c in range(num_c)] for row in ch]  # their offsets within the member's heads
    ho = call.head_offsets
    hc_max = max(max(row) for row in ch)
    s_me = q.shape[1]
    splits, ul_splits = call.splits, call.ul_splits
    # Same sizes on every member: the largest Ulysses-group sequence and the largest shard of the group.
    s_u_max = max(call.ring_blocks)
    s_max = max(splits)
    fwd_chunk = 3 * b * s_u_max * hc_max * d  # receive area of one chunk: [u sources][3, B, hc, S_x, D]
    out_chunk = u * b * s_max * hc_max * d  # output area of one chunk: u slots of B * S_max * hc * D
    total = num_c * (fwd_chunk + out_chunk) + _PAD

    on_cuda = _uses_streams(q)
    if (
        on_cuda and world.stages_device_tensors
    ):  # no device heap to put into (NOTE [device tensors across hosts])
        return usp(call, q, k, v, joint)
    # One workspace at the same heap offset on every member (NOTE [symmetric allocation]); the allocation's
    # exchange is also the host side's start barrier (on CUDA the ready puts order the devices). Only a heap too
    # full for it on some member makes every member run USP instead (they all see the same outcome).
    try:
        ws = world.symmetric_empty((total,), dtype=dtype, group=group, device=q.device if on_cuda else None)
    except InvalidUsage as exc:
        warnings.warn(
            f"gfdit.attention: no room for the torus workspace ({total} elements) in every member's heap "
            f"({exc}); using USP for this call",
            RuntimeWarning,
            stacklevel=3,
        )
        return usp(call, q, k, v, joint)

    me_u = lay.ulysses_idx
    ul_ranks = [group.ranks[m] for m in lay.ulysses_members]
    peers = [p for i, p in enumerate(ul_ranks) if i != me_u]
    prefix = [sum(ul_splits[:x]) for x in range(u)]
    pos = _put_order(num_c, ready=on_cuda)
    waiter = _PutWaiter(world, peers, q.device if on_cuda else None)
    ex = executor_for(q.device)  # the communication thread, or stream (NOTE [stream pipeline])

    def fwd_view(c: int, x: int, hc: int) -> torch.Tensor:
        """Receive area of chunk c from Ulysses member x on a member whose chunk c has hc heads:
        [3, B, hc, S_x, D]."""
        off = c * fwd_chunk + 3 * b * prefix[x] * hc * d
        n_el = 3 * b * ul_splits[x] * hc * d
        return ws[off : off + n_el].view(3, b, hc, ul_splits[x], d)

    def out_view(c: int, x: int, s_owner: int, hc: int) -> torch.Tensor:
        """Output area of chunk c (hc heads) from Ulysses member x on a member holding s_owner rows:
        [B, S, hc, D]."""
        off = num_c * fwd_chunk + c * out_chunk + x * b * s_max * hc_max * d
        return ws[off : off + b * s_owner * hc * d].view(b, s_owner, hc, d)

    def put(src: torch.Tensor, dst_local: torch.Tensor, peer: int) -> None:
        if dst_local.numel() == 0:  # an empty piece still counts as a put; give it a non-empty heap view
            base = dst_local.data_ptr() - ws.data_ptr()
            dst_local = ws[base // ws.element_size() :][:1]
        world.put_with_signal(src, dst_local, peer)

    def put_fwd(c: int) -> None:
        # This member's q/k/v rows for the chunk-c heads of each Ulysses member x.
        for x in range(u):
            lo, hc = ho[x] + cho[x][c], ch[x][c]
            # [3, B, hc, S, D]
            piece = torch.stack([t[:, :, lo : lo + hc].transpose(1, 2) for t in (q, k, v)], dim=0)
            dst = fwd_view(c, me_u, hc)
            if x == me_u:
                dst.copy_(piece)
            else:
                put(piece.contiguous(), dst, ul_ranks[x])

    def put_out(c: int, out_c: torch.Tensor) -> None:
        # out_c: [B, hc, S_u, D] float32 for the chunk-c heads of this member; rows of member x go back to x.
        for x in range(u):
            rows = out_c[:, :, prefix[x] : prefix[x] + ul_splits[x]].transpose(1, 2).to(dtype).contiguous()
            dst = out_view(c, me_u, ul_splits[x], ch[me_u][c])
            if x == me_u:
                dst.copy_(rows)
            else:
                put(rows, dst, ul_ranks[x])

    def ready() -> None:
        # CUDA: nobody puts into a peer's workspace before the peer's stream is done with what came before
        for p in peers:
            world.put_with_signal(ws[:0], ws[-1:], p)
        waiter.wait_upto(peers, pos["r"])

    futures = [ex.submit(ready)] if on_cuda else []
    futures.append(ex.submit(put_fwd, 0))
    joint_parts = []
    try:
        for c in range(num_c):
            got = ex.submit(waiter.wait_upto, peers, pos[f"f{c}"])
            if c + 1 < num_c:
                futures.append(ex.submit(put_fwd, c + 1))
            got.result()
            recv = torch.cat([fwd_view(c, x, ch[me_u][c]) for x in range(u)], dim=3)  # [3, B, hc, S_u, D]
            q_b, kv = recv[0], recv[1:3].contiguous()
            merger = PartialMerger()
            if joint is not None:
                lo = ho[me_u] + cho[me_u][c]
                sl = slice(lo, lo + ch[me_u][c])
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
        if isinstance(ex, StreamExecutor):
            ex.join()
    # Assemble [B, S_me, H, D]: the heads of chunk c of Ulysses member x come from area (c, x), which holds
    # a contiguous [B, S_me, ch[x][c], D] at its start (its slot is sized for S_max rows of hc_max heads).
    out = torch.empty((b, s_me, h, d), dtype=dtype, device=q.device)  # a copy: the workspace goes back
    areas = ws[num_c * fwd_chunk : num_c * fwd_chunk + num_c * out_chunk].view(
        num_c, u, b * s_max * hc_max * d
    )
    if all(n_h == hc_max for row in ch for n_h in row):  # even chunks: one strided copy
        area = areas[:, :, : b * s_me * hc_max * d].view(num_c, u, b, s_me, hc_max, d)
        out.view(b, s_me, u, num_c, hc_max, d).copy_(area.permute(2, 3, 1, 0, 4, 5))
    else:
        for x in range(u):
            for c in range(num_c):
                lo, hc = ho[x] + cho[x][c], ch[x][c]
                out[:, :, lo : lo + hc].copy_(areas[c, x, : b * s_me * hc * d].view(b, s_me, hc, d))
    joint_out = None
    if joint is not None:
        part = torch.cat(joint_parts, dim=1)  # [B, h_me, S_joint, D + 1]
        joint_out = merge_joint_partials(world, group, lay, part, call.head_splits, dtype)
    # the workspace goes back to the heap before the caller continues (None rather than del: area is bound on
    # one branch only)
    areas = area = ws = None  # type: ignore[assignment]
    return out, joint_out
