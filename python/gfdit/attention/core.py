"""Sequence-parallel attention on group-free collectives: Ulysses, Ring, USP (both 2-D placements), Torus.

Every member of a group holds one shard [B, S_local, H, D] of q, k and v (the shards in group order make
up the sequence; S_local may differ between members) and gets back its shard of the exact non-causal
softmax attention over the whole sequence (scale 1/sqrt(D)).

NOTE [attention call protocol]
1. Every call starts with one all_gather of a small int64 record per member (shapes, dtype, joint tokens,
   a local error code). Every member validates the *same* gathered records, so bad input raises the same
   gfdit.InvalidUsage on every member and nobody is left waiting in a collective. The gather is also the
   start barrier that makes reusing symmetric-heap workspaces safe (see torus.py).
2. Collectives run either on the calling thread or on the single communication thread
   (``_comm_executor``), never on both at once: the world serialises calls (one collective at a time), so
   a blocking wait on one thread would stall the other thread's transfer.
3. Ring steps exchange K/V blocks with send/recv on the communication thread while the calling thread
   computes the current block (torch kernels and gfdit calls release the GIL). Members at even ring
   positions send before they receive, odd ones the reverse: a large send completes only once its peer
   drains the staging slots, so "everyone sends first" could deadlock, and the instance numbers of a
   2-member ring (one edge used both ways) must match on both ends.
4. Non-causal attention does not depend on the order of the keys, so where the joint (text) tokens sit
   ("front" or "rear") and in which order a member sees the sequence blocks change only rounding, never
   the result; the output rows always come back to the member that owns the queries.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Sequence
from typing import Any

import torch

from gfdit import comm
from gfdit._C import InvalidUsage
from gfdit.attention.local import PartialMerger, block_attention
from gfdit.attention.spec import GridLayout, ParallelSpec, resolve_placement
from gfdit.topology import Topology

_FLOAT_DTYPES = {torch.float32: 1, torch.bfloat16: 2, torch.float16: 3}
_DTYPE_NAMES = {1: "float32", 2: "bfloat16", 3: "float16"}

# Local error codes carried in the metadata record (field 0).
_ERR_OK = 0
_ERR_NOT_TENSOR = 1
_ERR_NOT_4D = 2
_ERR_QKV_SHAPES = 3
_ERR_DTYPE = 4
_ERR_DEVICE = 5
_ERR_JOINT_PARTIAL = 6
_ERR_JOINT_SHAPE = 7
_ERR_JOINT_DTYPE = 8
_ERR_MESSAGES = {
    _ERR_NOT_TENSOR: "q, k and v must be torch tensors",
    _ERR_NOT_4D: "q, k and v must be 4-D [B, S_local, H, D]",
    _ERR_QKV_SHAPES: "q, k and v shards have different shapes",
    _ERR_DTYPE: "q, k and v must share one dtype of float32, bfloat16 or float16",
    _ERR_DEVICE: "q, k and v must be CPU tensors on this backend",
    _ERR_JOINT_PARTIAL: "give all of joint_q, joint_k, joint_v or none",
    _ERR_JOINT_SHAPE: "joint_q/k/v must be [B, S_joint, H, D] with the B, H, D of q",
    _ERR_JOINT_DTYPE: "joint_q/k/v must have the dtype of q",
}
_META_LEN = 8  # err, B, S, H, D, dtype, has_joint, S_joint

_executor: concurrent.futures.ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def _comm_executor() -> concurrent.futures.ThreadPoolExecutor:
    """The one communication thread of this process (FIFO; see NOTE [attention call protocol])."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="gfdit-attn-comm"
            )
        return _executor


# ------------------------------------------------------------------------------------------- validation
def _local_record(q: Any, k: Any, v: Any, jq: Any, jk: Any, jv: Any) -> tuple[list[int], str]:
    """This member's metadata record and, on error, a detailed local message."""
    rec = [0] * _META_LEN

    def fail(code: int, detail: str) -> tuple[list[int], str]:
        rec[0] = code
        return rec, detail

    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        return fail(_ERR_NOT_TENSOR, f"got {type(q).__name__}, {type(k).__name__}, {type(v).__name__}")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return fail(_ERR_NOT_4D, f"shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    b, s, h, d = (int(x) for x in q.shape)
    rec[1:5] = [b, s, h, d]
    if tuple(k.shape) != tuple(q.shape) or tuple(v.shape) != tuple(q.shape):
        return fail(_ERR_QKV_SHAPES, f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if q.dtype not in _FLOAT_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return fail(_ERR_DTYPE, f"got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.device.type != "cpu" or k.device.type != "cpu" or v.device.type != "cpu":
        return fail(_ERR_DEVICE, f"got {q.device}, {k.device}, {v.device}")
    rec[5] = _FLOAT_DTYPES[q.dtype]
    joints = (jq, jk, jv)
    given = [t is not None for t in joints]
    if any(given) and not all(given):
        return fail(_ERR_JOINT_PARTIAL, f"given: joint_q={given[0]}, joint_k={given[1]}, joint_v={given[2]}")
    if all(given):
        if not all(isinstance(t, torch.Tensor) for t in joints):
            return fail(_ERR_JOINT_SHAPE, "joint_q/k/v must be torch tensors")
        shapes = [tuple(t.shape) for t in joints]
        if (
            any(len(sh) != 4 for sh in shapes)
            or len(set(shapes)) != 1
            or (shapes[0][0], shapes[0][2], shapes[0][3]) != (b, h, d)
        ):
            return fail(_ERR_JOINT_SHAPE, f"joint shapes {shapes}, q shard {tuple(q.shape)}")
        if any(t.dtype != q.dtype for t in joints) or any(t.device.type != "cpu" for t in joints):
            return fail(_ERR_JOINT_DTYPE, f"joint dtypes {[t.dtype for t in joints]}, q {q.dtype}")
        rec[6] = 1
        rec[7] = shapes[0][1]
    return rec, ""


def _check_records(
    recs: list[list[int]], me: int, local_detail: str, spec: ParallelSpec, group_ranks: list[int]
) -> None:
    """Raises the same InvalidUsage on every member when any member's input is bad."""
    bad = [(i, r[0]) for i, r in enumerate(recs) if r[0] != _ERR_OK]
    if bad:
        parts = [
            f"member {i} (rank {group_ranks[i]}): {_ERR_MESSAGES.get(code, f'error {code}')}"
            for i, code in bad
        ]
        msg = "gfdit.attention: bad input on " + "; ".join(parts)
        if local_detail:
            msg += f" [here: {local_detail}]"
        raise InvalidUsage(msg)
    b, _, h, d, dt = recs[0][1], recs[0][2], recs[0][3], recs[0][4], recs[0][5]
    for i, r in enumerate(recs):
        if (r[1], r[3], r[4]) != (b, h, d):
            raise InvalidUsage(
                f"gfdit.attention: mismatched shard shapes: member {i} (rank {group_ranks[i]}) has "
                f"[B, S_local, H, D] = {r[1:5]}, member 0 (rank {group_ranks[0]}) has {recs[0][1:5]}; "
                "B, H and D must agree (only "
                "S_local may differ)"
            )
        if r[5] != dt:
            raise InvalidUsage(
                f"gfdit.attention: member {i} has dtype {_DTYPE_NAMES[r[5]]}, member 0 has {_DTYPE_NAMES[dt]}"
            )
        if (r[6], r[7]) != (recs[0][6], recs[0][7]):
            raise InvalidUsage(
                f"gfdit.attention: joint tokens differ between members: member {i} has "
                f"{f'{r[7]} joint tokens' if r[6] else 'none'}, member 0 has "
                f"{f'{recs[0][7]} joint tokens' if recs[0][6] else 'none'}"
            )
    if h % spec.ulysses != 0:
        raise InvalidUsage(
            f"gfdit.attention: {h} heads are not divisible by the Ulysses degree "
            f"{spec.ulysses}; "
            "choose a Ulysses degree that divides the number of heads"
        )


def _gather_records(world: comm.World, group: comm.Group, rec: list[int]) -> list[list[int]]:
    n = group.size()
    mine = torch.tensor(rec, dtype=torch.int64)
    out = torch.empty(n * _META_LEN, dtype=torch.int64)
    world.all_gather_into_tensor(out, mine, group=group)
    return out.view(n, _META_LEN).tolist()


# --------------------------------------------------------------------------------------------- pieces
def _sub_group(world: comm.World, group: comm.Group, members: Sequence[int]) -> comm.Group:
    if len(members) == group.size() and list(members) == list(range(group.size())):
        return group
    ranks = group.ranks
    return world.new_group([ranks[i] for i in members])


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
    if r > 1:
        max_blk = max(block_sizes)
        spare = [torch.empty(2 * b * h * max_blk * d, dtype=kv.dtype) for _ in range(2)]
        nxt_rank, prv_rank = ring_ranks[(ring_idx + 1) % r], ring_ranks[(ring_idx - 1) % r]
        send_first = ring_idx % 2 == 0
        executor = _comm_executor()
    for t in range(r):
        fut = None
        if t < r - 1:
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


def _exchange(
    world: comm.World, send_buf: torch.Tensor, recv_buf: torch.Tensor, dst: int, src: int, send_first: bool
) -> None:
    if send_first:
        world.send(send_buf, dst)
        world.recv(recv_buf, src)
    else:
        world.recv(recv_buf, src)
        world.send(send_buf, dst)


def _joint_partials_merge(
    world: comm.World,
    group: comm.Group,
    layout: GridLayout,
    part: torch.Tensor,
    heads: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Combines every member's joint-query partial [B, h, S_joint, D + 1] (out | lse) into joint_out.

    Members of one Ring group saw disjoint key sets of the same heads: merged through their lse. Ulysses
    groups own disjoint heads: concatenated.
    """
    n = group.size()
    b, hu, sj, d1 = part.shape
    gathered = torch.empty((n, b, hu, sj, d1), dtype=torch.float32)
    if n > 1:
        world.all_gather_into_tensor(gathered, part.contiguous(), group=group)
    else:
        gathered[0] = part
    u, r = layout.ulysses, layout.ring
    out = torch.empty((b, sj, heads, d1 - 1), dtype=dtype)
    for x in range(u):
        idx = [GridLayout.index(layout.placement, u, r, x, y) for y in range(r)]
        parts = gathered[idx]  # [r, B, hu, Sj, D + 1]
        o, lse = parts[..., :-1], parts[..., -1]
        m = torch.logsumexp(lse, dim=0)
        w = torch.exp(lse - m.unsqueeze(0)).nan_to_num_(0.0)
        merged = (o * w.unsqueeze(-1)).sum(dim=0)  # [B, hu, Sj, D]
        out[:, :, x * hu : (x + 1) * hu] = merged.transpose(1, 2).to(dtype)
    return out


class _Call:
    """What one validated call knows: the group, the grid and every member's sequence length."""

    def __init__(
        self, world: comm.World, group: comm.Group, spec: ParallelSpec, placement: str, recs: list[list[int]]
    ) -> None:
        self.world = world
        self.group = group
        self.spec = spec
        self.n = group.size()
        self.me = group.rank()
        self.layout = GridLayout.build(spec.ulysses, spec.ring, placement, self.me)
        self.splits = [r[2] for r in recs]
        self.b, self.h, self.d = recs[0][1], recs[0][3], recs[0][4]
        self.hu = self.h // spec.ulysses
        self.has_joint = bool(recs[0][6])
        self.s_joint = recs[0][7]
        u, r = spec.ulysses, spec.ring
        lay = self.layout
        self.ul_splits = [self.splits[m] for m in lay.ulysses_members]
        # Sequence a ring member holds after its Ulysses all-to-all: its whole Ulysses group's shards.
        self.ring_blocks = [
            sum(self.splits[GridLayout.index(placement, u, r, x, y)] for x in range(u)) for y in range(r)
        ]
        self._ul_group = None
        self._ring_ranks = [group.ranks[m] for m in lay.ring_members]

    @property
    def ul_group(self) -> comm.Group:
        if self._ul_group is None:
            self._ul_group = _sub_group(self.world, self.group, self.layout.ulysses_members)
        return self._ul_group


def _usp(
    call: _Call, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, joint: tuple | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """USP: Ulysses all-to-all (heads <-> sequence) along one grid axis, Ring along the other."""
    world, lay = call.world, call.layout
    u, hu, b, d = lay.ulysses, call.hu, call.b, call.d
    s_local = q.shape[1]
    dtype = q.dtype
    if u > 1:
        # One all-to-all for q, k and v: [B, S, u, 3, hu, D] viewed as u*3*hu "heads".
        packed = torch.stack([x.view(b, s_local, u, hu, d) for x in (q, k, v)], dim=3)
        packed = packed.reshape(b, s_local, u * 3 * hu, d)
        s_u = sum(call.ul_splits)
        gathered = torch.empty((b, s_u, 3 * hu, d), dtype=dtype)
        world.all_to_all_4d(gathered, packed, 2, 1, group=call.ul_group, seq_splits=call.ul_splits)
        g5 = gathered.view(b, s_u, 3, hu, d)
        q_b = g5[:, :, 0].transpose(1, 2)
        kv = g5[:, :, 1:3].permute(2, 0, 3, 1, 4).contiguous()  # [2, B, hu, S_u, D]
    else:
        s_u = s_local
        q_b = q.transpose(1, 2)
        kv = torch.stack([k.transpose(1, 2), v.transpose(1, 2)], dim=0)  # contiguous copy
    heads = slice(lay.ulysses_idx * hu, (lay.ulysses_idx + 1) * hu)
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
        out = torch.empty((b, s_local, call.h, d), dtype=dtype)
        world.all_to_all_4d(out, out_u, 1, 2, group=call.ul_group, seq_splits=call.ul_splits)
    else:
        out = out_u
    joint_out = None
    if joint is not None:
        jo, jl = jmerger.result(jq)
        joint_part = torch.cat([jo, jl.unsqueeze(-1)], dim=-1)
        joint_out = _joint_partials_merge(world, call.group, lay, joint_part, call.h, dtype)
    return out, joint_out


def _local(q, k, v, joint):
    """One member: plain attention (with the joint tokens as one more key block)."""
    q_b, k_b, v_b = (x.transpose(1, 2) for x in (q, k, v))
    merger = PartialMerger()
    merger.add_block(q_b, k_b, v_b)
    joint_out = None
    if joint is not None:
        jq, jk, jv = (t.transpose(1, 2) for t in joint)
        merger.add_block(q_b, jk, jv)
        jm = PartialMerger()
        jm.add_block(jq, jk, jv)
        jm.add_block(jq, k_b, v_b)
        joint_out = jm.result(jq)[0].transpose(1, 2).to(q.dtype).contiguous()
    out = merger.result(q_b)[0].transpose(1, 2).to(q.dtype).contiguous()
    return out, joint_out


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    group: comm.Group | None = None,
    spec: ParallelSpec | None = None,
    joint_q: torch.Tensor | None = None,
    joint_k: torch.Tensor | None = None,
    joint_v: torch.Tensor | None = None,
    joint: str = "front",
    topology: Topology | None = None,
) -> Any:
    """Exact non-causal softmax attention (scale 1/sqrt(D)) of a sequence split across ``group``.

    q, k, v: this member's shards [B, S_local, H, D] (group order = sequence order; S_local may differ
    between members). Returns this member's output shard [B, S_local, H, D]. With joint_q/k/v
    [B, S_joint, H, D] (replicated on every member, e.g. Qwen-Image's text tokens, placed at the "front"
    or "rear" of the sequence) returns (out, joint_out), joint_out [B, S_joint, H, D] on every member.

    group: a gfdit Group (None: the world). spec: ParallelSpec with ulysses * ring == len(group)
    (None: pure Ulysses). topology: for placement="auto" (None: ``Topology.from_env``).
    Every member of the group must call this with the same spec, group and joint arguments.
    """
    world = comm.get_world()
    g = world._group(group)
    n = g.size()
    if spec is None:
        spec = ParallelSpec(ulysses=n, ring=1, mode="usp", placement="ulysses-low")
    if not isinstance(spec, ParallelSpec):
        raise InvalidUsage(
            f"gfdit.attention: spec must be a gfdit.attention.ParallelSpec, got {type(spec).__name__}"
        )
    if spec.degree != n:
        raise InvalidUsage(
            f"gfdit.attention: spec ulysses={spec.ulysses} x ring={spec.ring} = {spec.degree} "
            f"members, but the group {g.ranks} has {n}"
        )
    if joint not in ("front", "rear"):
        raise InvalidUsage(f"gfdit.attention: joint must be 'front' or 'rear', got {joint!r}")
    if spec.placement == "auto" and spec.ulysses > 1 and spec.ring > 1:
        if topology is None:
            topology = Topology.from_env(world.world_size)
        placement = resolve_placement(spec, g.ranks, topology)
    else:
        placement = "ulysses-low" if spec.placement == "auto" else spec.placement

    rec, detail = _local_record(q, k, v, joint_q, joint_k, joint_v)
    recs = _gather_records(world, g, rec) if n > 1 else [rec]
    _check_records(recs, g.rank(), detail, spec, g.ranks)
    if spec.mode == "torus":
        from gfdit.attention.torus import check_torus

        check_torus(spec, recs[0][3])
    has_joint = bool(recs[0][6])
    q, k, v = (x.contiguous() for x in (q, k, v))
    joint_t = tuple(t.contiguous() for t in (joint_q, joint_k, joint_v)) if has_joint else None
    if n == 1:
        out, joint_out = _local(q, k, v, joint_t)
    else:
        call = _Call(world, g, spec, placement, recs)
        if spec.mode == "torus":
            from gfdit.attention.torus import torus

            out, joint_out = torus(call, q, k, v, joint_t)
        else:
            out, joint_out = _usp(call, q, k, v, joint_t)
    return (out, joint_out) if has_joint else out


__all__ = ["attention", "block_attention", "ring_attention"]
