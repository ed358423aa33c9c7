"""Group-free collectives on torch tensors.

Names and argument order follow ``torch.distributed``. Tensors are checked here, once, and cross into the
C++ core as (address, bytes); the core never sees torch. Where tensors may live: NOTE [device tensors] in
gfdit.comm.devices.
"""

from __future__ import annotations

import datetime
import math
import os
import threading
from collections.abc import Sequence
from typing import Any

import torch

from gfdit import _C, settings
from gfdit._C import InvalidUsage
from gfdit.comm.devices import (
    _require_cuda_transport,
    _stream_handle,
    check_placement,
    parse_device,
    resolve_device,
)
from gfdit.comm.dtypes import TORCH_TO_DTYPE as _DTYPES

_OPS = {"sum": _C.ReduceOp.sum, "max": _C.ReduceOp.max, "min": _C.ReduceOp.min, "prod": _C.ReduceOp.prod}

View = tuple  # (address, rows, row_bytes, stride)
_staging = threading.local()  # .now: a collective of this thread runs on host copies (World._via_host)


def _reduce_op(op: Any) -> Any:
    if isinstance(op, str):
        try:
            return _OPS[op.lower()]
        except KeyError:
            raise InvalidUsage(
                f"gfdit: unsupported reduce op {op!r}; use 'sum', 'max', 'min' or 'prod'"
            ) from None
    import torch.distributed as dist

    for name, torch_op in (
        ("sum", dist.ReduceOp.SUM),
        ("max", dist.ReduceOp.MAX),
        ("min", dist.ReduceOp.MIN),
        ("prod", dist.ReduceOp.PRODUCT),
    ):
        if op == torch_op:
            return _OPS[name]
    raise InvalidUsage(f"gfdit: unsupported reduce op {op!r}; use 'sum', 'max', 'min' or 'prod'")


def _check(t: Any, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise InvalidUsage(f"gfdit: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type not in ("cpu", "cuda"):
        raise InvalidUsage(
            f"gfdit: {name} is on {t.device}; gfdit collectives take CPU tensors (or CUDA tensors on a "
            "world with a device)"
        )
    if t.dtype not in _DTYPES:
        raise InvalidUsage(
            f"gfdit: {name} has dtype {t.dtype}; supported: float32, float16, bfloat16, int32, int64, uint8, float64"
        )
    if not t.is_contiguous():
        raise InvalidUsage(f"gfdit: {name} is not contiguous; call .contiguous() first")
    return t


def _same_dtype(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    if a.dtype != b.dtype:
        raise InvalidUsage(f"gfdit: {what}: output dtype {a.dtype} differs from input dtype {b.dtype}")


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _shape_bytes(shape: Sequence[int] | int, dtype: torch.dtype) -> tuple[tuple[int, ...], int]:
    """A heap tensor's shape as a tuple and its size in bytes."""
    dims = (int(shape),) if isinstance(shape, int) else tuple(int(s) for s in shape)
    if dtype not in _DTYPES:
        raise InvalidUsage(f"gfdit: unsupported dtype {dtype}")
    return dims, math.prod(dims) * torch.empty((), dtype=dtype).element_size()


def _whole_of_parts(what: str, whole: tuple[str, torch.Tensor], part: torch.Tensor, n: int) -> None:
    """Refuses a gather's output (a scatter's input) that does not hold n parts of ``part``'s size."""
    name, t = whole
    if t.numel() != n * part.numel():
        raise InvalidUsage(
            f"gfdit: {what}: {name} has {t.numel()} elements, expected {n} x {part.numel()} for a group of {n}"
        )


def _contig(t: torch.Tensor) -> View:
    n = _nbytes(t)
    return (t.data_ptr(), 1, n, n)


class Group:
    """An ordered list of member ranks. Forming one is local: no communication, no allocation.

    Every rank may form every group, as with ``torch.distributed.new_group``; on a rank that is not a member
    the handle describes the group (``ranks``, ``size()``) and its collectives raise ``InvalidUsage``."""

    __slots__ = ("_world", "_g")

    def __init__(self, world: World, g: Any) -> None:
        self._world = world
        self._g = g

    @property
    def ranks(self) -> list[int]:
        """Global ranks of the members, in group order."""
        return self._g.ranks

    def size(self) -> int:
        """Number of members."""
        return self._g.size()

    def rank(self) -> int:
        """Index of the calling rank in the group, or -1 when it is not a member (as torch's get_rank)."""
        return self._g.rank()

    @property
    def is_member(self) -> bool:
        """Whether the calling rank is a member."""
        return self._g.is_member

    def __len__(self) -> int:
        return self._g.size()

    def __repr__(self) -> str:
        return f"gfdit.Group({self._g.ranks})"

    def all_gather_into_tensor(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        self._world.all_gather_into_tensor(out, inp, group=self)

    def all_to_all_single(
        self,
        out: torch.Tensor,
        inp: torch.Tensor,
        output_split_sizes: Sequence[int] | None = None,
        input_split_sizes: Sequence[int] | None = None,
    ) -> None:
        self._world.all_to_all_single(out, inp, output_split_sizes, input_split_sizes, group=self)

    def all_to_all_4d(
        self,
        out: torch.Tensor,
        inp: torch.Tensor,
        scatter_dim: int = 2,
        gather_dim: int = 1,
        seq_splits: Sequence[int] | None = None,
        head_splits: Sequence[int] | None = None,
    ) -> None:
        self._world.all_to_all_4d(
            out, inp, scatter_dim, gather_dim, group=self, seq_splits=seq_splits, head_splits=head_splits
        )

    def reduce_scatter_tensor(self, out: torch.Tensor, inp: torch.Tensor, op: Any = "sum") -> None:
        self._world.reduce_scatter_tensor(out, inp, op, group=self)

    def all_reduce(self, tensor: torch.Tensor, op: Any = "sum") -> None:
        self._world.all_reduce(tensor, op, group=self)

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        self._world.broadcast(tensor, src, group=self)

    def barrier(self) -> None:
        self._world.barrier(group=self)


class World:
    """One rank's handle on the group-free collectives world (see ``gfdit.init`` for the default one).

    device: None (host only: CPU tensors) or this rank's GPU (an index, "cuda:N", a torch.device, or "cuda"
    for ``default_device(rank)``); a world with a device also takes CUDA tensors on that device and makes it
    the current CUDA device of the process (NOTE [device tensors]). Every rank of a world passes a device or
    none."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        store: Any,
        timeout: float | datetime.timedelta = 300.0,
        heap_bytes: int | None = None,
        slot_bytes: int = 0,
        num_slots: int = 0,
        spin_us: int = -1,
        key_prefix: str = "gfdit",
        device: Any = None,
        shm_prefix: str = "gfdit",
    ) -> None:
        if isinstance(timeout, datetime.timedelta):
            timeout = timeout.total_seconds()
        if heap_bytes is None:
            heap_bytes = settings.get_int("GFDIT_HEAP_BYTES")
        if not (isinstance(rank, int) and isinstance(world_size, int)):
            raise InvalidUsage("gfdit: rank and world_size must be integers")
        index = resolve_device(device, rank, "gfdit.init device")
        args = (
            rank,
            world_size,
            store,
            float(timeout),
            int(heap_bytes),
            int(slot_bytes),
            int(num_slots),
            int(spin_us),
            key_prefix,
        )
        extra: dict[str, Any] = {} if shm_prefix == "gfdit" else {"shm_prefix": shm_prefix}
        if index is None:
            self._w = _C.World.create(*args, **extra)  # exactly the host-only call of builds without a device
        else:
            torch.cuda.set_device(index)
            self._w = _C.World.create(*args, device=index, **extra)
            reported = int(self._w.device) if int(self._w.staged_device) < 0 else int(self._w.staged_device)
            if reported != index:
                raise InvalidUsage(f"gfdit: asked for device {index}, the world reports {reported}")
        self._device_index = index
        # a device world across hosts: its CUDA tensors go through host memory (NOTE [device tensors across hosts])
        self._staged = index is not None and int(self._w.staged_device) >= 0
        self._whole = Group(self, self._w.world_group())
        self.rank = rank
        self.world_size = world_size

    # ---- where the ranks run ----

    def node_of(self, rank: int) -> int:
        """The node ``rank`` runs on: ranks whose hosts share memory share one, numbered in rank order
        (``GFDIT_NODE_IDS`` overrides; NOTE [network edges] in src/collectives/net_edges.h)."""
        return int(self._w.node_of(rank))

    def host_of(self, rank: int) -> str:
        """The host name ``rank`` reported."""
        return str(self._w.host_of(rank))

    def remote(self, rank: int) -> bool:
        """Whether this rank talks to ``rank`` over the network instead of shared memory."""
        return bool(self._w.remote(rank))

    @property
    def net_port(self) -> int:
        """The TCP port of this rank's network edges (-1: every peer shares its memory)."""
        return int(self._w.net_port)

    # ---- device ----

    @property
    def device(self) -> torch.device | None:
        """This rank's GPU (None: host only)."""
        return None if self._device_index is None else torch.device("cuda", self._device_index)

    @property
    def stages_device_tensors(self) -> bool:
        """Whether this world's CUDA tensors go through host memory: a world with a device that spans hosts
        (NOTE [device tensors across hosts] in gfdit.comm.devices)."""
        return self._staged

    # Tests set this on a host-only world to run the staging path of a device world across hosts with CPU
    # tensors (every collective then copies its tensors out to fresh host tensors and back).
    _stage_cpu_tensors = False

    def _stages(self, *tensors: Any) -> bool:
        if self._stage_cpu_tensors:
            return not getattr(_staging, "now", False)
        return self._staged and any(isinstance(t, torch.Tensor) and t.is_cuda for t in tensors)

    def _via_host(
        self,
        what: str,
        call: Any,
        tensors: dict[str, torch.Tensor],
        written: Sequence[str],
        fresh: Sequence[str] = (),
        **kwargs: Any,
    ) -> None:
        """Runs collective ``call`` on host copies of ``tensors`` (keyword arguments), then copies the
        ``written`` ones back; ``fresh`` ones are outputs whose earlier contents the collective does not read.
        NOTE [device tensors across hosts]."""
        for n, t in tensors.items():
            _check(t, n)
        if not self._stage_cpu_tensors:
            check_placement(what, [(n, t.device) for n, t in tensors.items()], self._device_index)
        host: dict[str, torch.Tensor] = {}
        for n, t in tensors.items():
            h = torch.empty(t.shape, dtype=t.dtype, pin_memory=t.is_cuda)
            if n not in fresh:
                h.copy_(t)  # device to host: waits for the work the current stream queued before
            host[n] = h
        _staging.now = True
        try:
            call(**host, **kwargs)
        finally:
            _staging.now = False
        for n in written:
            tensors[n].copy_(host[n])

    def check(self) -> None:
        """Raises the error a device found since the last collective (a bounded device-side wait that timed
        out: gfdit.Timeout naming the edge); nothing on a host-only world, whose waits raise at once."""
        if self._device_index is not None:
            self._w.check()

    def _stream(self, what: str, *named: tuple[str, torch.Tensor]) -> int:
        """0 for CPU tensors; for CUDA tensors the handle of the current stream of the world's device."""
        for _, t in named:
            if t.is_cuda:
                break
        else:
            return 0  # the host path: no more checks than before devices existed
        index = check_placement(what, [(n, t.device) for n, t in named], self._device_index)
        if index is None:
            return 0
        return _stream_handle(torch.cuda.current_stream(index))

    def _operands(self, what: str, out: torch.Tensor, inp: torch.Tensor) -> int:
        """Checks an (out, inp) pair of one dtype; the stream to enqueue on (0: the host path)."""
        _check(out, "out")
        _check(inp, "inp")
        _same_dtype(out, inp, what)
        return self._stream(what, ("out", out), ("inp", inp)) if out.is_cuda or inp.is_cuda else 0

    # ---- groups ----

    def new_group(self, ranks: Sequence[int]) -> Group:
        """A group of the given global ranks, in the given order (not sorted, unlike torch). Every rank may
        form every group; a non-member's handle refuses collectives."""
        return Group(self, self._w.new_group(ranks))

    def _group(self, group: Group | None) -> Group:
        if group is None:
            return self._whole
        if not isinstance(group, Group) or group._world is not self:
            raise InvalidUsage("gfdit: group was not formed by this world (use gfdit.new_group)")
        return group

    # ---- heap ----

    def empty(
        self, shape: Sequence[int] | int, dtype: torch.dtype = torch.float32, device: Any = None
    ) -> torch.Tensor:
        """A tensor in this rank's symmetric heap: collectives send it without staging.

        device None or "cpu": the host heap (shared memory). "cuda" (or the world's device): the device heap
        of a world made with ``device=``; its blocks are freed when the tensor is, so use them in the order
        of one stream, as the caching allocator's tensors (NOTE [device tensors]). A device world across hosts
        has no device heap: a plain CUDA tensor (NOTE [device tensors across hosts])."""
        shape, nbytes = _shape_bytes(shape, dtype)
        parsed = parse_device(device)
        if parsed is not None:
            return self._device_empty(parsed, device, shape, dtype, nbytes)
        block = self._w.heap_alloc(max(nbytes, 1))
        raw = torch.frombuffer(block, dtype=torch.uint8)  # holds `block`, which frees on release
        return raw[:nbytes].view(dtype).view(shape)

    def symmetric_empty(
        self,
        shape: Sequence[int] | int,
        dtype: torch.dtype = torch.float32,
        group: Group | None = None,
        device: Any = None,
    ) -> torch.Tensor:
        """A heap tensor at the same heap offset on every member of ``group`` (None: the world), so that
        one-sided puts (``put_with_signal``) can address the peers' copies by the local offset. Collective over
        the group; raises the same ``InvalidUsage`` on every member when their heaps have no common room.
        device: as for ``empty`` (the device heap of a world made with ``device=``)."""
        g = self._group(group)
        shape, nbytes = _shape_bytes(shape, dtype)
        parsed = parse_device(device)
        if parsed is None:
            block = self._w.symmetric_alloc(g._g, max(nbytes, 1))
            raw = torch.frombuffer(block, dtype=torch.uint8)  # holds `block`, which frees on release
        else:
            index = self._device_heap_index(parsed, device, "symmetric_empty")
            block = self._w.symmetric_alloc(g._g, max(nbytes, 1), device=True)
            raw = _device_block_tensor(block, max(nbytes, 1), index)
        return raw[:nbytes].view(dtype).view(shape)

    def _device_heap_index(self, parsed: int | str, device: Any, what: str) -> int:
        _require_cuda_transport(f"{what}(device={device!r})")
        index = self._device_index
        if index is None:
            raise InvalidUsage(
                f"gfdit: {what}(device={device!r}): this world is host only; pass device= to gfdit.init"
            )
        if self._staged:
            raise InvalidUsage(
                f"gfdit: {what}(device={device!r}): this world spans hosts and has no device heap (its CUDA "
                "tensors go through host memory: NOTE [device tensors across hosts])"
            )
        if parsed != "cuda" and parsed != index:
            raise InvalidUsage(
                f"gfdit: {what}(device={device!r}): this world's device heap is on cuda:{index}"
            )
        return index

    def _device_empty(
        self, parsed: int | str, device: Any, shape: tuple[int, ...], dtype: torch.dtype, nbytes: int
    ) -> torch.Tensor:
        staged = self._device_index if self._staged else None
        if staged is not None and parsed in ("cuda", staged):
            # no device heap across hosts; every collective stages its CUDA tensors anyway
            return torch.empty(shape, dtype=dtype, device=torch.device("cuda", staged))
        index = self._device_heap_index(parsed, device, "empty")
        block = self._w.heap_alloc(max(nbytes, 1), device=True)
        raw = _device_block_tensor(block, max(nbytes, 1), index)  # holds `block`, which frees on release
        return raw[:nbytes].view(dtype).view(shape)

    def is_heap_tensor(self, t: torch.Tensor) -> bool:
        """Whether t's bytes lie in this rank's symmetric heap."""
        return _nbytes(t) > 0 and self._w.in_heap(t.data_ptr(), _nbytes(t))

    # ---- collectives ----

    def all_gather_into_tensor(
        self, out: torch.Tensor, inp: torch.Tensor, group: Group | None = None
    ) -> None:
        if self._stages(out, inp):
            fn = self.all_gather_into_tensor
            return self._via_host(
                "all_gather_into_tensor", fn, {"out": out, "inp": inp}, ("out",), ("out",), group=group
            )
        g = self._group(group)
        stream = self._operands("all_gather_into_tensor", out, inp)
        _whole_of_parts("all_gather_into_tensor", ("out", out), inp, g.size())
        self._w.all_gather(g._g, inp.data_ptr(), out.data_ptr(), _nbytes(inp), stream)

    def all_to_all_single(
        self,
        out: torch.Tensor,
        inp: torch.Tensor,
        output_split_sizes: Sequence[int] | None = None,
        input_split_sizes: Sequence[int] | None = None,
        group: Group | None = None,
    ) -> None:
        if self._stages(out, inp):
            return self._via_host(
                "all_to_all_single",
                self.all_to_all_single,
                {"out": out, "inp": inp},
                ("out",),
                ("out",),
                output_split_sizes=output_split_sizes,
                input_split_sizes=input_split_sizes,
                group=group,
            )
        g = self._group(group)
        stream = self._operands("all_to_all_single", out, inp)
        n = g.size()
        if output_split_sizes is None and input_split_sizes is None:
            if inp.dim() == 0 or out.dim() == 0:
                raise InvalidUsage("gfdit: all_to_all_single: tensors must have at least one dimension")
            if inp.shape[0] % n != 0 or out.shape[0] % n != 0 or out.numel() != inp.numel():
                raise InvalidUsage(
                    f"gfdit: all_to_all_single: input {tuple(inp.shape)} and output "
                    f"{tuple(out.shape)} must hold as many elements, dim 0 divisible by the "
                    f"group size {n}"
                )
            self._w.all_to_all(g._g, inp.data_ptr(), out.data_ptr(), _nbytes(inp) // n, stream)
            return
        ins = self._split_views(inp, input_split_sizes, n, "input")
        outs = self._split_views(out, output_split_sizes, n, "output")
        self._w.all_to_all_v(g._g, ins, outs, stream)

    @staticmethod
    def _split_views(t: torch.Tensor, splits: Sequence[int] | None, n: int, what: str) -> list[View]:
        if t.dim() == 0:
            raise InvalidUsage(f"gfdit: all_to_all_single: {what} must have at least one dimension")
        rows = t.shape[0]
        if splits is None:
            if rows % n != 0:
                raise InvalidUsage(f"gfdit: all_to_all_single: {what} dim 0 ({rows}) is not divisible by {n}")
            splits = [rows // n] * n
        splits = [int(s) for s in splits]
        if len(splits) != n or any(s < 0 for s in splits) or sum(splits) != rows:
            raise InvalidUsage(
                f"gfdit: all_to_all_single: {what}_split_sizes {splits} must be {n} non-negative "
                f"sizes summing to dim 0 ({rows})"
            )
        row_bytes = _nbytes(t) // rows if rows else 0
        base = t.data_ptr()
        views = []
        off = 0
        for s in splits:
            b = s * row_bytes
            views.append((base + off, 1, b, b))
            off += b
        return views

    def all_to_all_4d(
        self,
        out: torch.Tensor,
        inp: torch.Tensor,
        scatter_dim: int = 2,
        gather_dim: int = 1,
        group: Group | None = None,
        seq_splits: Sequence[int] | None = None,
        head_splits: Sequence[int] | None = None,
    ) -> None:
        """Ulysses all-to-all on [B, S, H, D] tensors.

        scatter_dim=2, gather_dim=1: inp [B, S_local, H, D] -> out [B, S, H_j, D] on member j (heads
        scattered, sequence gathered; member j's shard lands at its sequence offset). scatter_dim=1,
        gather_dim=2: the reverse, inp [B, S, H_j, D] -> out [B, S_j, H, D].
        ``seq_splits`` gives each member's S_local when shards are uneven (default: equal).
        ``head_splits`` gives each member's head count H_j when the heads do not split evenly (default:
        H / n each); member j gets the heads ``sum(head_splits[:j]) ... + head_splits[j] - 1``.
        ``even_head_splits(H, n)`` is the split gfdit.attention uses: the first ``H % n`` members hold one
        more head.
        """
        if self._stages(out, inp):
            return self._via_host(
                "all_to_all_4d",
                self.all_to_all_4d,
                {"out": out, "inp": inp},
                ("out",),
                ("out",),
                scatter_dim=scatter_dim,
                gather_dim=gather_dim,
                group=group,
                seq_splits=seq_splits,
                head_splits=head_splits,
            )
        g = self._group(group)
        stream = self._operands("all_to_all_4d", out, inp)
        if inp.dim() != 4 or out.dim() != 4:
            raise InvalidUsage("gfdit: all_to_all_4d needs 4-D [B, S, H, D] tensors")
        n, me = g.size(), g.rank()
        es = inp.element_size()
        if (scatter_dim, gather_dim) == (2, 1):
            b, s_local, h, d = inp.shape
            heads = self._head_splits(head_splits, n, h, None)
            splits = self._seq_splits(seq_splits, n, me, s_local)
            s_total, h_me = sum(splits), heads[me]
            if tuple(out.shape) != (b, s_total, h_me, d):
                raise InvalidUsage(
                    f"gfdit: all_to_all_4d: out has shape {tuple(out.shape)}, expected {(b, s_total, h_me, d)}"
                )
            me_bytes = h_me * d * es  # one token's heads of this member in out
            hoffs = _offsets(heads)
            ins = [
                _view(inp.data_ptr() + hoffs[j] * d * es, b * s_local, heads[j] * d * es, h * d * es)
                for j in range(n)
            ]
            offs = _offsets(splits)
            outs = [
                _view(out.data_ptr() + offs[j] * me_bytes, b, splits[j] * me_bytes, s_total * me_bytes)
                for j in range(n)
            ]
        elif (scatter_dim, gather_dim) == (1, 2):
            b, s_total, h_me, d = inp.shape
            splits = self._seq_splits(seq_splits, n, me, None, s_total)
            heads = self._head_splits(head_splits, n, None, h_me, me)
            h = sum(heads)
            if tuple(out.shape) != (b, splits[me], h, d):
                raise InvalidUsage(
                    f"gfdit: all_to_all_4d: out has shape {tuple(out.shape)}, expected "
                    f"{(b, splits[me], h, d)}"
                )
            me_bytes = h_me * d * es
            offs = _offsets(splits)
            ins = [
                _view(inp.data_ptr() + offs[j] * me_bytes, b, splits[j] * me_bytes, s_total * me_bytes)
                for j in range(n)
            ]
            hoffs = _offsets(heads)
            outs = [
                _view(out.data_ptr() + hoffs[j] * d * es, b * splits[me], heads[j] * d * es, h * d * es)
                for j in range(n)
            ]
        else:
            raise InvalidUsage("gfdit: all_to_all_4d supports (scatter_dim, gather_dim) = (2, 1) or (1, 2)")
        self._w.all_to_all_v(g._g, ins, outs, stream)

    @staticmethod
    def _head_splits(
        head_splits: Sequence[int] | None, n: int, h_total: int | None, h_local: int | None, me: int = 0
    ) -> list[int]:
        """Every member's head count: from head_splits, else even (h_total / n, or h_local each)."""
        if head_splits is None:
            if h_total is None:
                assert h_local is not None  # the callers give h_total or h_local
                return [h_local] * n
            if h_total % n != 0:
                raise InvalidUsage(
                    f"gfdit: all_to_all_4d: {h_total} heads are not divisible by the group size {n}; "
                    "pass head_splits"
                )
            return [h_total // n] * n
        heads = [int(x) for x in head_splits]
        if len(heads) != n or any(x < 0 for x in heads):
            raise InvalidUsage(f"gfdit: all_to_all_4d: head_splits {heads} must have {n} non-negative sizes")
        if h_total is not None and sum(heads) != h_total:
            raise InvalidUsage(
                f"gfdit: all_to_all_4d: head_splits {heads} sum to {sum(heads)}, inp has {h_total}"
            )
        if h_local is not None and heads[me] != h_local:
            raise InvalidUsage(f"gfdit: all_to_all_4d: head_splits[{me}] = {heads[me]} but inp has {h_local}")
        return heads

    @staticmethod
    def _seq_splits(
        seq_splits: Sequence[int] | None, n: int, me: int, s_local: int | None, s_total: int | None = None
    ) -> list[int]:
        if seq_splits is None:
            if s_local is not None:
                return [s_local] * n
            assert s_total is not None  # the callers give s_local or s_total
            if s_total % n != 0:
                raise InvalidUsage(
                    f"gfdit: all_to_all_4d: sequence {s_total} is not divisible by {n}; pass seq_splits"
                )
            return [s_total // n] * n
        splits = [int(s) for s in seq_splits]
        if len(splits) != n or any(s < 0 for s in splits):
            raise InvalidUsage(f"gfdit: all_to_all_4d: seq_splits {splits} must have {n} non-negative sizes")
        if s_local is not None and splits[me] != s_local:
            raise InvalidUsage(f"gfdit: all_to_all_4d: seq_splits[{me}] = {splits[me]} but inp has {s_local}")
        if s_total is not None and sum(splits) != s_total:
            raise InvalidUsage(f"gfdit: all_to_all_4d: seq_splits sum to {sum(splits)}, inp has {s_total}")
        return splits

    def reduce_scatter_tensor(
        self, out: torch.Tensor, inp: torch.Tensor, op: Any = "sum", group: Group | None = None
    ) -> None:
        if self._stages(out, inp):
            fn = self.reduce_scatter_tensor
            return self._via_host(
                "reduce_scatter_tensor", fn, {"out": out, "inp": inp}, ("out",), ("out",), op=op, group=group
            )
        g = self._group(group)
        stream = self._operands("reduce_scatter_tensor", out, inp)
        _whole_of_parts("reduce_scatter_tensor", ("inp", inp), out, g.size())
        self._w.reduce_scatter(
            g._g,
            inp.data_ptr(),
            out.data_ptr(),
            out.numel(),
            _DTYPES[out.dtype],
            _reduce_op(op),
            stream,
        )

    def all_reduce(self, tensor: torch.Tensor, op: Any = "sum", group: Group | None = None) -> None:
        if self._stages(tensor):
            return self._via_host(
                "all_reduce", self.all_reduce, {"tensor": tensor}, ("tensor",), op=op, group=group
            )
        g = self._group(group)
        _check(tensor, "tensor")
        stream = self._stream("all_reduce", ("tensor", tensor)) if tensor.is_cuda else 0
        self._w.all_reduce(
            g._g, tensor.data_ptr(), tensor.numel(), _DTYPES[tensor.dtype], _reduce_op(op), stream
        )

    def broadcast(self, tensor: torch.Tensor, src: int, group: Group | None = None) -> None:
        if self._stages(tensor):
            return self._via_host(
                "broadcast", self.broadcast, {"tensor": tensor}, ("tensor",), src=src, group=group
            )
        g = self._group(group)
        _check(tensor, "tensor")
        stream = self._stream("broadcast", ("tensor", tensor)) if tensor.is_cuda else 0
        if g._g.index_of(int(src)) < 0:
            raise InvalidUsage(f"gfdit: broadcast source {src} is not in group {g.ranks}")
        self._w.broadcast(g._g, tensor.data_ptr(), _nbytes(tensor), int(src), stream)

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        if self._stages(tensor):
            return self._via_host("send", self.send, {"tensor": tensor}, (), dst=dst)
        _check(tensor, "tensor")
        stream = self._stream("send", ("tensor", tensor)) if tensor.is_cuda else 0
        self._w.send(tensor.data_ptr(), _nbytes(tensor), int(dst), stream)

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        if self._stages(tensor):
            return self._via_host("recv", self.recv, {"tensor": tensor}, ("tensor",), ("tensor",), src=src)
        _check(tensor, "tensor")
        stream = self._stream("recv", ("tensor", tensor)) if tensor.is_cuda else 0
        self._w.recv(tensor.data_ptr(), _nbytes(tensor), int(src), stream)

    def barrier(self, group: Group | None = None) -> None:
        self._w.barrier(self._group(group)._g)

    def put_with_signal(self, src: torch.Tensor, dst: torch.Tensor, peer: int) -> None:
        """Writes src into `peer`'s heap at the offset of the local heap tensor dst, then signals the peer."""
        _check(src, "src")
        _check(dst, "dst")
        if self._staged and (src.is_cuda or dst.is_cuda):
            raise InvalidUsage(
                "gfdit: put_with_signal: one-sided puts of CUDA tensors need the device heap, which a world "
                "across hosts does not have (NOTE [device tensors across hosts]); put CPU tensors"
            )
        stream = (
            self._stream("put_with_signal", ("src", src), ("dst", dst)) if src.is_cuda or dst.is_cuda else 0
        )
        if not self.is_heap_tensor(dst):
            raise InvalidUsage(
                "gfdit: put_with_signal: dst must be a heap tensor (gfdit.empty); its heap offset "
                "names the destination on the peer"
            )
        if _nbytes(src) > _nbytes(dst):
            raise InvalidUsage(
                f"gfdit: put_with_signal: src has {_nbytes(src)} bytes, dst only {_nbytes(dst)}"
            )
        offset = self._w.heap_offset(dst.data_ptr())
        self._w.put_with_signal(int(peer), src.data_ptr(), _nbytes(src), offset, stream)

    def wait_signal(self, peer: int, count: int = 1, stream: Any = None) -> None:
        """Waits until `count` more puts from `peer` have landed. stream None: on this thread; a
        torch.cuda.Stream of the world's device: the wait is enqueued there (for puts of CUDA tensors) and
        this returns at once."""
        if stream is None:
            self._w.wait_signal(int(peer), int(count))
            return
        _require_cuda_transport("wait_signal(stream=...)")
        if self._device_index is None or self._staged:
            raise InvalidUsage(
                "gfdit: wait_signal(stream=...): this world "
                + (
                    "is host only"
                    if self._device_index is None
                    else "spans hosts and has no device transport"
                )
            )
        self._w.wait_signal(int(peer), int(count), stream=_stream_handle(stream))

    def stats(self) -> Any:
        """Counters since creation: messages_sent, zero_copy_sends, staged_bytes, blocking_waits,
        collectives (instances run with peers), all_gathers."""
        return self._w.stats()

    @property
    def usable(self) -> bool:
        """False once an error broke this world (destroy it and init again)."""
        return bool(self._w.usable)

    @property
    def message_tag(self) -> int:
        """The tag of the messages this rank sends and expects (NOTE [message tags] in edge.h)."""
        return int(self._w.message_tag)

    def set_message_tag(self, tag: int) -> None:
        """Labels the messages of the collectives that follow (32 bit; 0 is the default). A receiver refuses
        a message whose tag differs from its own with gfdit.RemoteError, so members that disagree about
        what they are running fail on the first message between them."""
        tag = int(tag)
        if not 0 <= tag < 2**32:
            raise InvalidUsage(f"gfdit: set_message_tag: tag {tag} is not a 32-bit unsigned integer")
        self._w.set_message_tag(tag)


def _view(addr: int, rows: int, row_bytes: int, stride: int) -> View:
    if rows <= 1 or stride == row_bytes or row_bytes == 0:
        total = rows * row_bytes
        return (addr, 1, total, total)
    return (addr, rows, row_bytes, stride)


class _DeviceBlock:
    """A device heap block as the CUDA array interface (torch.as_tensor keeps it alive with the tensor)."""

    def __init__(self, block: Any, nbytes: int) -> None:
        self._block = block
        self.__cuda_array_interface__ = {
            "shape": (int(nbytes),),
            "typestr": "|u1",
            "data": (int(block.address), False),
            "version": 2,
        }


def _device_block_tensor(block: Any, nbytes: int, index: int) -> torch.Tensor:
    """A uint8 CUDA tensor over a device heap block (which frees when the tensor does)."""
    with torch.cuda.device(index):
        if hasattr(block, "__dlpack__"):
            raw = torch.from_dlpack(block)
        elif hasattr(block, "__cuda_array_interface__"):
            raw = torch.as_tensor(block)
        else:
            raw = torch.as_tensor(_DeviceBlock(block, nbytes))
    raw = raw.view(torch.uint8).reshape(-1)
    if raw.device != torch.device("cuda", index) or raw.numel() < nbytes:
        raise InvalidUsage(
            f"gfdit: empty(device=...): the device heap block came back as {raw.numel()} bytes on "
            f"{raw.device}, expected {nbytes} on cuda:{index}"
        )
    return raw


def even_head_splits(heads: int, n: int) -> list[int]:
    """Head counts of n members sharing ``heads`` heads: the first ``heads % n`` members hold one more."""
    base, extra = divmod(int(heads), int(n))
    return [base + (1 if j < extra else 0) for j in range(n)]


def _offsets(splits: Sequence[int]) -> list[int]:
    offs, acc = [], 0
    for s in splits:
        offs.append(acc)
        acc += s
    return offs


# ---- the default world, as torch.distributed has a default process group ----

_world: World | None = None
_NODE_IDS = "GFDIT_NODE_IDS"  # init writes it under torchrun; it is read through gfdit.settings


def init(
    rank: int | None = None,
    world_size: int | None = None,
    store: Any = None,
    timeout: float | datetime.timedelta = 300.0,
    heap_bytes: int | None = None,
    device: Any = None,
    **options: Any,
) -> World:
    """Joins the default world. Without a store, reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (as torchrun
    sets them) and opens a torch.distributed.TCPStore (under torchrun, a client of the store its agent serves).
    The world finds its nodes from the ranks' hosts; only where nodes are emulated on one host
    (GFDIT_NET_EDGES=nodes) without GFDIT_NODE_IDS, under torchrun, each rank's node is its torchrun node
    (GROUP_RANK), set as GFDIT_NODE_IDS in this process.

    device: None (host only, CPU tensors) or this rank's GPU: an index, "cuda:N", a torch.device, or "cuda"
    (``default_device``: LOCAL_RANK, else the rank, modulo the visible devices). The world then also takes
    CUDA tensors on that device, enqueued on the current stream (NOTE [device tensors]); a build without the
    CUDA transport raises gfdit.InvalidUsage."""
    global _world
    if _world is not None:
        raise InvalidUsage("gfdit: already initialised; call gfdit.destroy() first")
    if rank is None:
        rank = int(os.environ["RANK"])
    if world_size is None:
        world_size = int(os.environ["WORLD_SIZE"])
    resolve_device(device, rank, "gfdit.init device")  # refused before any store is opened
    if store is None:
        import torch.distributed as dist

        secs = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
        agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # torchrun's agent serves it
        store = dist.TCPStore(
            os.environ.get("MASTER_ADDR", "127.0.0.1"),
            int(os.environ["MASTER_PORT"]),
            world_size,
            rank == 0 and not agent_store,
            timeout=datetime.timedelta(seconds=secs),
        )
    if (
        "GROUP_RANK" in os.environ
        and settings.get("GFDIT_NET_EDGES") == "nodes"
        and not settings.get("GFDIT_NODE_IDS")
    ):
        # every rank's torchrun node, through the store (keyed by the restart: a restart may renumber the nodes),
        # written where the world's rendezvous reads the setting
        key = f"gfdit-nodes/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
        store.set(key + str(rank), os.environ["GROUP_RANK"])
        os.environ[_NODE_IDS] = ",".join(store.get(key + str(r)).decode() for r in range(world_size))
    _world = World(rank, world_size, store, timeout=timeout, heap_bytes=heap_bytes, device=device, **options)
    return _world


def destroy() -> None:
    """Leaves the default world. Heap tensors keep their memory mapped until they are freed."""
    global _world
    _world = None


def is_initialized() -> bool:
    return _world is not None


def get_world() -> World:
    if _world is None:
        raise InvalidUsage("gfdit: not initialised; call gfdit.init(rank, world_size, store) first")
    return _world


def get_rank() -> int:
    return get_world().rank


def get_world_size() -> int:
    return get_world().world_size


def new_group(ranks: Sequence[int]) -> Group:
    return get_world().new_group(ranks)


def empty(shape: Sequence[int] | int, dtype: torch.dtype = torch.float32, device: Any = None) -> torch.Tensor:
    """A tensor in the default world's symmetric heap (device="cuda": its device heap); see World.empty."""
    return get_world().empty(shape, dtype, device=device)


def is_heap_tensor(t: torch.Tensor) -> bool:
    return get_world().is_heap_tensor(t)


def all_gather_into_tensor(out: torch.Tensor, inp: torch.Tensor, group: Group | None = None) -> None:
    get_world().all_gather_into_tensor(out, inp, group=group)


def all_to_all_single(
    out: torch.Tensor,
    inp: torch.Tensor,
    output_split_sizes: Sequence[int] | None = None,
    input_split_sizes: Sequence[int] | None = None,
    group: Group | None = None,
) -> None:
    get_world().all_to_all_single(out, inp, output_split_sizes, input_split_sizes, group=group)


def all_to_all_4d(
    out: torch.Tensor,
    inp: torch.Tensor,
    scatter_dim: int = 2,
    gather_dim: int = 1,
    group: Group | None = None,
    seq_splits: Sequence[int] | None = None,
    head_splits: Sequence[int] | None = None,
) -> None:
    get_world().all_to_all_4d(
        out, inp, scatter_dim, gather_dim, group=group, seq_splits=seq_splits, head_splits=head_splits
    )


def reduce_scatter_tensor(
    out: torch.Tensor, inp: torch.Tensor, op: Any = "sum", group: Group | None = None
) -> None:
    get_world().reduce_scatter_tensor(out, inp, op, group=group)


def all_reduce(tensor: torch.Tensor, op: Any = "sum", group: Group | None = None) -> None:
    get_world().all_reduce(tensor, op, group=group)


def broadcast(tensor: torch.Tensor, src: int, group: Group | None = None) -> None:
    get_world().broadcast(tensor, src, group=group)


def send(tensor: torch.Tensor, dst: int) -> None:
    get_world().send(tensor, dst)


def recv(tensor: torch.Tensor, src: int) -> None:
    get_world().recv(tensor, src)


def barrier(group: Group | None = None) -> None:
    get_world().barrier(group=group)


def put_with_signal(src: torch.Tensor, dst: torch.Tensor, peer: int) -> None:
    get_world().put_with_signal(src, dst, peer)


def wait_signal(peer: int, count: int = 1, stream: Any = None) -> None:
    get_world().wait_signal(peer, count, stream=stream)


# the names torch.distributed users know, re-exported by gfdit.comm and gfdit
__all__ = [
    "Group",
    "World",
    "all_gather_into_tensor",
    "all_reduce",
    "all_to_all_4d",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "destroy",
    "empty",
    "even_head_splits",
    "get_rank",
    "get_world",
    "get_world_size",
    "init",
    "is_heap_tensor",
    "is_initialized",
    "new_group",
    "put_with_signal",
    "recv",
    "reduce_scatter_tensor",
    "send",
    "wait_signal",
]
