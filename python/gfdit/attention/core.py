"""Sequence-parallel attention on group-free collectives: Ulysses, Ring, USP (both 2-D placements), Torus.

Every member of a group holds one shard [B, S_local, H, D] of q, k and v (the shards in group order make
up the sequence; S_local may differ between members) and gets back its shard of the exact non-causal
softmax attention over the whole sequence (scale 1/sqrt(D)). The heads need not divide by the Ulysses
degree: Ulysses member x of a grid with ulysses = u works on ``H // u + (x < H % u)`` heads
(``comm.even_head_splits``), so u may be anything up to H.

NOTE [attention call protocol]
1. A call's plan (``Plan`` in gfdit.attention.plan: the grid, every member's sequence length and heads)
   comes from one all_gather of a small int64 record per member (shapes, dtype, joint tokens, seq_splits, plan cache switch, a local
   error code). Every member validates the *same* gathered records, so bad input raises the same
   gfdit.InvalidUsage on every member and nobody is left waiting in a collective. When the caller passes
   ``seq_splits`` the validated plan is kept and later calls with the same arguments skip the exchange
   (NOTE [attention plan cache]); without it every call exchanges.
2. Every collective of a call carries a message tag: the exchange ``EXCHANGE_TAG``, the plan's
   collectives the plan's fingerprint (NOTE [plan disagreement]).
3. Collectives run either on the calling thread or on the single communication thread
   (gfdit.attention.pipeline), never on both at once: the world serialises calls (one collective at a time), so
   a blocking wait on one thread would stall the other thread's transfer.
4. Ring steps exchange K/V blocks with send/recv on the communication thread while the calling thread
   computes the current block (torch kernels and gfdit calls release the GIL). Members at even ring
   positions send before they receive, odd ones the reverse: a large send completes only once its peer
   drains the staging slots, so "everyone sends first" could deadlock, and the instance numbers of a
   2-member ring (one edge used both ways) must match on both ends.
5. Non-causal attention does not depend on the order of the keys, so where the joint (text) tokens sit
   ("front" or "rear") and in which order a member sees the sequence blocks change only rounding, never
   the result; the output rows always come back to the member that owns the queries.
6. CUDA tensors (all of a call's on the world's device: NOTE [device tensors] in gfdit.comm.devices) take the same
   steps with streams in place of the thread (NOTE [stream pipeline] in gfdit.attention.pipeline). The plan, its cache and the
   metadata exchange stay host-side (CPU int64 records over the host transport), so a call that hits the
   cache enqueues its work without waiting for the device.

NOTE [attention plan cache]
Plans are kept per (world, group ranks) in a small LRU (``PLAN_CAPACITY`` plans) under the key
(spec, resolved placement, B, H, D, dtype, joint tokens, seq_splits; CUDA calls add the device kind, so a
CPU call and a CUDA call of the same shapes never share a plan or a tag). Why members never disagree about
hit or miss when they pass the arguments of one call:
* The key is a function of the call's arguments that every member passes alike (spec, joint tokens, B, H,
  D, dtype, seq_splits; this member's own S_local is seq_splits[me], checked locally), so the members of
  one call compute one key.
* A group's cache changes only in calls on that group: a hit moves the plan to the end, and a plan is
  inserted (evicting the oldest) only after the exchange validated the records, whose outcome is the same
  on every member because they all read the same records. So on every member the cache of a group is a
  function of the keys of that group's validated calls, in order, which every member sees alike (every
  member takes part in every call of its groups, in the same order: NOTE [group-free collectives]). Calls
  on other groups never touch it; there is deliberately no bound across groups, since evicting one
  group's plans for another group's calls would make hits depend on calls some members do not share.
* Local shapes alone could not be a key: with uneven shards member 0's [10] rows fit both [10, 20] and
  [10, 30], and a member whose own shard did not change cannot know that another's did. Hence the cache
  needs seq_splits (every member's S_local, as gfdit.models passes it); calls without it exchange.
``PLAN_CACHE = False`` (or GFDIT_ATTENTION_PLAN_CACHE=0) turns the cache off; it must be set alike on
every member (the record carries it and the exchange refuses a mix).

NOTE [plan disagreement]
Members that do not pass the arguments of one call (one passes new shapes or seq_splits while the others
reuse a plan, or a member's own input is bad while the others hit) take different paths: some run the
exchange, others a cached plan, or different plans. The message tags (NOTE [message tags] in edge.h)
make that an error on the first message that crosses between two such members: the exchange sends to and
receives from every member with ``EXCHANGE_TAG``, and a plan's collectives carry that plan's fingerprint
(32 bits of a hash of the group and the key; the same on every member, whether computed from the gathered
records or from a cached plan). The receiver refuses the message before reading its bytes, so nothing is
ever computed from data of another shape; members blocked on a member that failed stop too (NOTE [failure
broadcast] in world.cpp), so nobody waits for its timeout. Every member then raises ``PlanMismatch``, a
gfdit.InvalidUsage that is also a gfdit.RemoteError: the loss is that the world is unusable afterwards on
every member (its edges are out of step; destroy it and init again, which the engine does on a
RemoteError). Bad input while *every* member exchanges still raises the plain InvalidUsage and leaves the
world usable. A 32-bit fingerprint can collide (about 2**-32 for two different plans); the receiver's
collective kind and size checks still apply then.
"""

from __future__ import annotations

import collections
import operator
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from gfdit import comm, settings
from gfdit._C import DType, Error, InvalidUsage, RemoteError
from gfdit.attention.plan import EXCHANGE_TAG, Plan, digest, plan_key
from gfdit.attention.spec import ParallelSpec, resolve_placement
from gfdit.attention.usp import ring_attention, usp
from gfdit.comm.dtypes import TORCH_TO_DTYPE
from gfdit.comm.topology import Topology

_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # what attention computes in

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
_ERR_SEQ_SPLITS = 9
_ERR_MESSAGES = {
    _ERR_NOT_TENSOR: "q, k and v must be torch tensors",
    _ERR_NOT_4D: "q, k and v must be 4-D [B, S_local, H, D]",
    _ERR_QKV_SHAPES: "q, k and v shards have different shapes",
    _ERR_DTYPE: "q, k and v must share one dtype of float32, bfloat16 or float16",
    _ERR_DEVICE: (
        "q, k, v (and joint_q/k/v) must be on one device: the CPU, or the CUDA device of a world made with "
        "device= (gfdit.init)"
    ),
    _ERR_JOINT_PARTIAL: "give all of joint_q, joint_k, joint_v or none",
    _ERR_JOINT_SHAPE: "joint_q/k/v must be [B, S_joint, H, D] with the B, H, D of q",
    _ERR_JOINT_DTYPE: "joint_q/k/v must have the dtype of q",
    _ERR_SEQ_SPLITS: "seq_splits must be one non-negative length per member, this member's equal to its S_local",
}
# err, B, S, H, D, dtype, has_joint, S_joint, seq_splits given, seq_splits hash, plan cache on, device kind
_META_LEN = 12
_DEVICE_KINDS = {"cpu": 0, "cuda": 1}
_DEVICE_NAMES = {0: "CPU", 1: "CUDA"}

_TAG_MISMATCH = "message tag mismatch"

PLAN_CACHE = settings.get_bool("GFDIT_ATTENTION_PLAN_CACHE")
PLAN_CAPACITY = 16  # plans kept per group (NOTE [attention plan cache])


class PlanMismatch(InvalidUsage, RemoteError):
    """The members of a group did not pass the arguments of one attention call (NOTE [plan disagreement]).

    An InvalidUsage (the callers disagree) and a RemoteError (the world is unusable afterwards)."""


def _splits_hash(splits: Sequence[int]) -> int:
    return digest(tuple(int(x) for x in splits), 8) >> 2  # fits an int64


def _local_record(
    q: Any,
    k: Any,
    v: Any,
    jq: Any,
    jk: Any,
    jv: Any,
    seq_splits: Any,
    n: int,
    me: int,
    world_device: torch.device | None = None,
) -> tuple[list[int], str, tuple[int, ...] | None]:
    """This member's metadata record, on error a detailed local message, and seq_splits as a tuple.

    world_device: the CUDA device CUDA tensors must be on (the world's); None accepts any device (one
    member: no collectives)."""
    rec = [0] * _META_LEN
    rec[10] = int(PLAN_CACHE)

    def fail(code: int, detail: str) -> tuple[list[int], str, None]:
        rec[0] = code
        return rec, detail, None

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
    if q.device.type not in _DEVICE_KINDS or k.device != q.device or v.device != q.device:
        return fail(_ERR_DEVICE, f"got {q.device}, {k.device}, {v.device}")
    if q.device.type == "cuda" and world_device is not None and q.device != world_device:
        return fail(_ERR_DEVICE, f"q is on {q.device}, this world's device is {world_device}")
    if q.device.type == "cuda" and world_device is None and n > 1:
        return fail(_ERR_DEVICE, f"q is on {q.device}, but this world is host only (gfdit.init device=None)")
    rec[11] = _DEVICE_KINDS[q.device.type]
    rec[5] = int(TORCH_TO_DTYPE[q.dtype])
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
        if any(t.dtype != q.dtype for t in joints):
            return fail(_ERR_JOINT_DTYPE, f"joint dtypes {[t.dtype for t in joints]}, q {q.dtype}")
        if any(t.device != q.device for t in joints):
            return fail(_ERR_DEVICE, f"joint devices {[str(t.device) for t in joints]}, q {q.device}")
        rec[6] = 1
        rec[7] = shapes[0][1]
    splits = None
    if seq_splits is not None:
        try:
            splits = tuple(operator.index(x) for x in seq_splits)
        except TypeError:
            splits = None
        if splits is None or len(splits) != n or any(x < 0 for x in splits) or splits[me] != s:
            return fail(
                _ERR_SEQ_SPLITS,
                f"seq_splits {seq_splits!r} for {n} members; this member (index {me}) has {s}",
            )
        rec[8] = 1
        rec[9] = _splits_hash(splits)
    return rec, "", splits


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
                f"gfdit.attention: member {i} has dtype {DType(r[5]).name}, member 0 has {DType(dt).name}"
            )
        if (r[6], r[7]) != (recs[0][6], recs[0][7]):
            raise InvalidUsage(
                f"gfdit.attention: joint tokens differ between members: member {i} has "
                f"{f'{r[7]} joint tokens' if r[6] else 'none'}, member 0 has "
                f"{f'{recs[0][7]} joint tokens' if recs[0][6] else 'none'}"
            )
    kinds = [r[11] for r in recs]
    if len(set(kinds)) != 1:
        raise InvalidUsage(
            "gfdit.attention: members pass tensors on different devices: "
            + ", ".join(f"rank {group_ranks[i]} {_DEVICE_NAMES.get(x, x)}" for i, x in enumerate(kinds))
            + "; every member of a call passes CPU tensors, or every member CUDA tensors"
        )
    caching = [r[10] for r in recs]
    if len(set(caching)) != 1:
        on = [group_ranks[i] for i, c in enumerate(caching) if c]
        raise InvalidUsage(
            f"gfdit.attention: the plan cache is on for ranks {on} and off for the others of group "
            f"{group_ranks}; set gfdit.attention.core.PLAN_CACHE (GFDIT_ATTENTION_PLAN_CACHE) alike everywhere"
        )
    given = [r[8] for r in recs]
    if len(set(given)) != 1:
        raise InvalidUsage(
            f"gfdit.attention: seq_splits given by ranks {[group_ranks[i] for i, g in enumerate(given) if g]} "
            f"but not by the others of group {group_ranks}; every member passes it, or none"
        )
    if given[0]:
        lengths = [r[2] for r in recs]
        want = _splits_hash(lengths)
        wrong = [i for i, r in enumerate(recs) if r[9] != want]
        if wrong:
            raise InvalidUsage(
                f"gfdit.attention: seq_splits of member {wrong[0]} (rank {group_ranks[wrong[0]]}) differ "
                f"from the members' shard lengths {lengths}"
                + (f" [here: seq_splits {local_detail}]" if local_detail else "")
            )
    if spec.ulysses > h:
        raise InvalidUsage(
            f"gfdit.attention: the Ulysses degree {spec.ulysses} exceeds the {h} heads; "
            "each Ulysses member needs at least one head"
        )


def _gather_records(world: comm.World, group: comm.Group, rec: list[int]) -> list[list[int]]:
    n = group.size()
    mine = torch.tensor(rec, dtype=torch.int64)
    out = torch.empty(n * _META_LEN, dtype=torch.int64)
    world.all_gather_into_tensor(out, mine, group=group)
    return out.view(n, _META_LEN).tolist()


class _PlanCache:
    """The plans of one group on one world: an LRU of PLAN_CAPACITY (NOTE [attention plan cache])."""

    __slots__ = ("plans", "hits", "misses")

    def __init__(self) -> None:
        self.plans: collections.OrderedDict[tuple, Plan] = collections.OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple) -> Plan | None:
        plan = self.plans.get(key)
        if plan is None:
            self.misses += 1
            return None
        self.plans.move_to_end(key)
        self.hits += 1
        return plan

    def put(self, key: tuple, plan: Plan) -> None:
        self.plans[key] = plan
        self.plans.move_to_end(key)
        while len(self.plans) > PLAN_CAPACITY:
            self.plans.popitem(last=False)


_caches: weakref.WeakKeyDictionary[comm.World, dict[tuple[int, ...], _PlanCache]] = (
    weakref.WeakKeyDictionary()
)
_caches_lock = threading.Lock()


def _group_cache(world: comm.World, group: comm.Group) -> _PlanCache:
    with _caches_lock:
        per_world = _caches.setdefault(world, {})
        ranks = tuple(group.ranks)
        cache = per_world.get(ranks)
        if cache is None:
            cache = per_world[ranks] = _PlanCache()
        return cache


def plan_cache_info(world: comm.World | None = None) -> dict[str, int]:
    """Plans kept, hits and misses over every group of ``world`` (None: the default world)."""
    world = comm.get_world() if world is None else world
    with _caches_lock:
        caches = list(_caches.get(world, {}).values())
    return {
        "groups": len(caches),
        "plans": sum(len(c.plans) for c in caches),
        "hits": sum(c.hits for c in caches),
        "misses": sum(c.misses for c in caches),
    }


def clear_plan_cache() -> None:
    """Forgets every kept plan. Collective in effect: call it on every member alike (or on none)."""
    with _caches_lock:
        _caches.clear()


def _local(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    joint: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
    joint_front: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One member: one scaled_dot_product_attention over the whole sequence (the joint tokens concatenated
    where the model puts them), in the inputs' dtype: the computation diffusers' own attention processors
    run, so a one-rank call gives their output bit for bit in bf16 too (a log-sum-exp merge of blocks in
    float32 rounds differently)."""
    if joint is None:
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return out.transpose(1, 2).contiguous(), None
    s_joint = joint[0].shape[1]
    parts = [(jt, t) if joint_front else (t, jt) for jt, t in zip(joint, (q, k, v), strict=True)]
    full_q, full_k, full_v = (torch.cat(p, dim=1).transpose(1, 2) for p in parts)
    out = F.scaled_dot_product_attention(full_q, full_k, full_v).transpose(1, 2)
    if joint_front:
        return out[:, s_joint:].contiguous(), out[:, :s_joint].contiguous()
    return out[:, : q.shape[1]].contiguous(), out[:, q.shape[1] :].contiguous()


def _joint_inputs(
    jq: torch.Tensor | None, jk: torch.Tensor | None, jv: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """joint_q/k/v, contiguous, of a call whose record has the joint tokens (field 6: _local_record found
    all three tensors)."""
    assert jq is not None and jk is not None and jv is not None
    return jq.contiguous(), jk.contiguous(), jv.contiguous()


def _plan_mismatch(exc: Error, group: comm.Group, ran: str, local_detail: str) -> PlanMismatch:
    """A PlanMismatch naming the problem, from the tag-mismatch error a collective of the call raised."""
    text = str(exc).replace(f"tag 0x{EXCHANGE_TAG:x}", f"tag 0x{EXCHANGE_TAG:x} (the metadata exchange)")
    msg = (
        f"gfdit.attention: the members of group {group.ranks} disagree about this call: they did not all pass "
        "the arguments of one call (e.g. one member's shapes or seq_splits changed while the others reused a "
        f"cached plan), so some ran the metadata exchange and others a cached plan, or different plans; this "
        f"member ran {ran}. The world is unusable now: destroy it and init again."
    )
    if local_detail:
        msg += f" This member's own input is bad too: {local_detail}."
    return PlanMismatch(f"{msg} ({text})")


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
    seq_splits: Sequence[int] | None = None,
) -> Any:
    """Exact non-causal softmax attention (scale 1/sqrt(D)) of a sequence split across ``group``.

    q, k, v: this member's shards [B, S_local, H, D] (group order = sequence order; S_local may differ
    between members), CPU tensors or CUDA tensors on the world's device (``gfdit.init(device=...)``; the
    work is then enqueued on the current stream, NOTE [stream pipeline]), alike on every member. Returns
    this member's output shard [B, S_local, H, D] on the inputs' device. With joint_q/k/v
    [B, S_joint, H, D] (replicated on every member, e.g. Qwen-Image's text tokens, placed at the "front"
    or "rear" of the sequence) returns (out, joint_out), joint_out [B, S_joint, H, D] on every member.

    group: a gfdit Group (None: the world). spec: ParallelSpec with ulysses * ring == len(group)
    (None: pure Ulysses); ulysses may be anything up to H (uneven heads: the first H % ulysses Ulysses
    members take one more). topology: for placement="auto" (None: ``Topology.of_world``, the nodes the world found).
    seq_splits: every member's S_local, in group order (the same list on every member). With it the
    validated plan is kept and later calls with the same arguments skip the metadata exchange (NOTE
    [attention plan cache]); without it every call exchanges.
    Every member of the group must call this with the same spec, group, joint arguments and seq_splits;
    members that do not raise ``PlanMismatch`` (NOTE [plan disagreement]).
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
    if spec.cfg != 1:
        raise InvalidUsage(
            f"gfdit.attention: spec cfg={spec.cfg}: one attention call is one pass; CFG-parallel splits a "
            "denoising step's two guidance passes across the group (StagedModel.denoise_step); pass "
            "spec.per_pass() here"
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
            topology = Topology.of_world(world)
        placement = resolve_placement(spec, g.ranks, topology)
    else:
        placement = "ulysses-low" if spec.placement == "auto" else spec.placement

    me = g.rank()
    world_device = world.device if n > 1 else None  # one member runs no collective: any device
    rec, detail, splits = _local_record(q, k, v, joint_q, joint_k, joint_v, seq_splits, n, me, world_device)
    if n == 1:
        _check_records([rec], 0, detail, spec, g.ranks)
        if spec.mode == "torus":
            from gfdit.attention.torus import check_torus

            check_torus(spec, rec[3])
        joint_t = _joint_inputs(joint_q, joint_k, joint_v) if rec[6] else None
        out, joint_out = _local(q.contiguous(), k.contiguous(), v.contiguous(), joint_t, joint == "front")
        return (out, joint_out) if rec[6] else out

    cache = _group_cache(world, g) if PLAN_CACHE and splits is not None else None
    call = None
    if cache is not None and splits is not None:  # a bad local record has no splits: the exchange
        call = cache.get(
            plan_key(spec, placement, rec[1], rec[3], rec[4], rec[5], rec[6], rec[7], splits, rec[11])
        )
    saved_tag = world.message_tag
    ran = f"the cached plan (tag 0x{call.tag:x})" if call is not None else "the metadata exchange"
    try:
        if call is None:
            world.set_message_tag(EXCHANGE_TAG)
            recs = _gather_records(world, g, rec)
            _check_records(recs, me, detail, spec, g.ranks)
            if spec.mode == "torus":
                from gfdit.attention.torus import check_torus

                check_torus(spec, recs[0][3])
            call = Plan(world, g, spec, placement, recs)
            if cache is not None and recs[0][8]:
                cache.put(call.key, call)
            ran = f"the metadata exchange, then plan 0x{call.tag:x}"
        world.set_message_tag(call.tag)
        q, k, v = (x.contiguous() for x in (q, k, v))
        joint_t = _joint_inputs(joint_q, joint_k, joint_v) if call.has_joint else None
        if spec.mode == "torus":
            from gfdit.attention.torus import torus

            out, joint_out = torus(call, q, k, v, joint_t)
        else:
            out, joint_out = usp(call, q, k, v, joint_t)
    except Error as exc:
        if _TAG_MISMATCH in str(exc) and not isinstance(exc, PlanMismatch):
            raise _plan_mismatch(exc, g, ran, detail) from exc
        raise
    finally:
        world.set_message_tag(saved_tag)
    return (out, joint_out) if call.has_joint else out


__all__ = [
    "PlanMismatch",
    "attention",
    "clear_plan_cache",
    "plan_cache_info",
    "ring_attention",
]
