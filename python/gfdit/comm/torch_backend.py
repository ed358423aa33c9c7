"""The ``torch.distributed`` backend "gfdit": torch's process groups on group-free collectives.

``import gfdit`` registers it. Then, in code written for ``torch.distributed``, one line changes::

    dist.init_process_group("gfdit", rank=rank, world_size=n)    # was "gloo"

and ``dist.new_group``, the collectives of ``torch.distributed``, the functional collectives
(``torch.distributed._functional_collectives``) and ``DeviceMesh`` run on gfdit's world.

NOTE [torch backend]
- One gfdit ``World`` per default process group, made by the default group's creator through the store
  ``init_process_group`` set up: the only rendezvous. Every later group (``new_group``, a ``DeviceMesh``
  dimension, a flattened mesh) is a gfdit group descriptor over that world: no store, no communication, no
  allocation. Non-members never reach the creator: torch hands them ``GroupMember.NON_GROUP_MEMBER``.
- torch's Python layer calls a process group's methods by name and its C++ layer (the functional
  collectives) through the ``ProcessGroup`` trampoline, so one Python subclass of ``dist.ProcessGroup``
  serves both. A ``c10d::Backend`` cannot be subclassed from Python, which is why the backend is a whole
  process group; torch then skips other backends of a device map, so "cpu:gfdit,cuda:nccl" is refused.
- ``dist.new_group`` takes torch's fast path for process groups that make their own subgroups (a default group
  with a ``new_group`` method, which torch calls instead of its per-device creator loop): about 20 us instead
  of 60 us, most of it torch's own bookkeeping. That hook does not pass the requested backend, so the method is
  offered only to a call that asks for gfdit (read from torch's frame, gfdit.comm.torch_internals); any other
  call, or a torch whose frame differs, sees no such method and takes the ordinary creator path, which is
  correct, only slower.
- Collectives finish before they return (the CPU shared-memory backend has no stream to enqueue on); their
  ``Work`` is already completed.
- Point-to-point: ``isend``/``irecv`` (and ``batch_isend_irecv``) queue; the first ``wait()``, or the next
  collective, runs the queue. See NOTE [p2p order].
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.futures import Future

from gfdit import _C
from gfdit._C import InvalidUsage
from gfdit.comm import torch_internals
from gfdit.comm.dtypes import TORCH_TO_DTYPE as _DTYPES
from gfdit.comm.world import Group, World

BACKEND_NAME = "gfdit"


def register() -> None:
    """Registers "gfdit" with torch.distributed (idempotent; ``import gfdit`` calls it)."""
    if not dist.is_available() or torch_internals.registered(BACKEND_NAME):
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu"])


def _only_gfdit(config: str) -> bool:
    """Whether a backend string ("gfdit", "cpu:gfdit", "cpu:gfdit,cuda:nccl") gives every device to gfdit."""
    return all(part.rpartition(":")[2].strip().lower() == BACKEND_NAME for part in str(config).split(","))


def _create(opts: Any, backend_options: Any) -> ProcessGroupGfdit:
    """torch's creator hook: the default group makes the world; every other group is a descriptor."""
    ranks = [int(r) for r in opts.global_ranks_in_group]
    timeout = opts.timeout
    config = torch_internals.caller_local(*torch_internals.CREATOR_CALLER)
    if config is not None and not _only_gfdit(config):
        # torch keeps a Python process group as the group of every device: the other backend would be dropped.
        raise InvalidUsage(
            f"gfdit: backend {str(config)!r}: gfdit's torch.distributed backend takes every device of a group; "
            "use 'gfdit' (CPU tensors) alone, and another backend in groups of its own "
            "(dist.new_group(ranks, backend='nccl'))"
        )
    if not ranks:
        world = World(
            opts.group_rank,
            opts.group_size,
            opts.store,
            timeout=timeout,
            key_prefix="gfdit-pg",
        )
        return ProcessGroupGfdit(world, world._whole, _P2PQueue(world))
    default = dist.group.WORLD
    if not isinstance(default, ProcessGroupGfdit) or default._world is None:
        raise InvalidUsage(
            "gfdit: a group with backend 'gfdit' needs the default process group on gfdit too: "
            "dist.init_process_group('gfdit', ...)"
        )
    group = default._world.new_group(ranks)
    if group.rank() != opts.group_rank:
        raise InvalidUsage(
            f"gfdit: torch places this rank at {opts.group_rank} in {ranks}, gfdit at {group.rank()}"
        )
    return ProcessGroupGfdit(default._world, group, default._p2p)


def group_of(pg: Any = None) -> Group:
    """The gfdit group behind a torch process group on the gfdit backend (None: the default group), so that
    gfdit's own operations (``all_to_all_4d``, ``gfdit.attention``) run on groups that torch code made."""
    if pg is None:
        pg = dist.group.WORLD
        if pg is None:
            raise InvalidUsage(
                "gfdit: no default process group; call dist.init_process_group('gfdit', ...) first"
            )
    if pg is dist.GroupMember.NON_GROUP_MEMBER:
        raise InvalidUsage("gfdit: this rank is not a member of that process group")
    if not isinstance(pg, ProcessGroupGfdit) or pg._world is None:
        raise InvalidUsage(f"gfdit: {pg!r} is not a live process group of the gfdit backend")
    return pg._group


def _done(result: Any = None) -> Any:
    return torch_internals.completed_work(result)


def _cpu(t: Any, what: str, op: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise InvalidUsage(f"gfdit backend: {op}: {what} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise InvalidUsage(
            f"gfdit backend: {op}: {what} is on {t.device}; the torch.distributed backend runs on CPU tensors"
        )
    return t


def _reducible(t: torch.Tensor, op: str) -> Any:
    dt = _DTYPES.get(t.dtype)
    if dt is None:
        raise InvalidUsage(
            f"gfdit backend: {op} of {t.dtype} is not supported; reductions take float32, float64, float16, "
            "bfloat16, int32, int64 or uint8 (copies take any dtype)"
        )
    return dt


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's bytes as a 1-D uint8 view (copies need no dtype)."""
    flat = t.reshape(-1)
    return flat if flat.dtype == torch.uint8 else flat.view(torch.uint8)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class _Out:
    """An output tensor as the core needs it (contiguous); writes back on ``finish`` when it was not."""

    __slots__ = ("t", "buf")

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t
        self.buf = t if t.is_contiguous() else torch.empty(t.shape, dtype=t.dtype)

    def finish(self) -> None:
        if self.buf is not self.t:
            self.t.copy_(self.buf)


def _reduce_op(op: Any, what: str) -> tuple[Any, bool]:
    """(gfdit op, divide by the group size afterwards)."""
    R = dist.ReduceOp
    if op == R.SUM:
        return _C.ReduceOp.sum, False
    if op == R.AVG:
        return _C.ReduceOp.sum, True
    if op == R.MAX:
        return _C.ReduceOp.max, False
    if op == R.MIN:
        return _C.ReduceOp.min, False
    if op == R.PRODUCT:
        return _C.ReduceOp.prod, False
    raise InvalidUsage(
        f"gfdit backend: {what}: reduce op {op} is not supported; use SUM, AVG, MAX, MIN or PRODUCT"
    )


def _check_average(t: torch.Tensor, avg: bool, what: str) -> None:
    """Refuses AVG on an integer tensor before any collective has touched it."""
    if avg and not t.is_floating_point():
        raise InvalidUsage(f"gfdit backend: {what}: AVG needs a floating-point tensor, got {t.dtype}")


class _P2PQueue:
    """Queued point-to-point messages of one world (global ranks), run in a deadlock-free order.

    NOTE [p2p order]
    gfdit's collectives on a group of two wait for both members, so running queued sends and receives one by
    one in program order could deadlock (every rank of a ring sending first). A flush instead walks the
    rank pairs it has messages with in one global order, by (lower rank, higher rank); at each pair it runs
    steps until that pair's queues are empty, each step an all_to_all on the group [lower, higher] that
    carries at most the next message each way. Every rank visits its pairs in the same global order, so the
    smallest unfinished pair always has both ranks at it: no cycle, no deadlock. Messages between two ranks
    keep their order, as torch requires (tags are not matched, only 0 is accepted).
    """

    def __init__(self, world: World) -> None:
        self._world = world
        self._sends: dict[int, list[torch.Tensor]] = {}
        self._recvs: dict[int, list[_Out]] = {}
        self._pairs: dict[int, Any] = {}

    def __bool__(self) -> bool:
        return bool(self._sends) or bool(self._recvs)

    def send(self, t: torch.Tensor, peer: int) -> None:
        self._sends.setdefault(peer, []).append(_bytes(t.contiguous()))

    def recv(self, t: torch.Tensor, peer: int) -> None:
        self._recvs.setdefault(peer, []).append(_Out(t))

    def flush(self) -> None:
        me = self._world.rank
        w = self._world._w
        sends, recvs = self._sends, self._recvs
        self._sends, self._recvs = {}, {}
        for peer in sorted(set(sends) | set(recvs), key=lambda p: (min(me, p), max(me, p))):
            group = self._pairs.get(peer)
            if group is None:
                group = self._pairs[peer] = w.new_group(sorted((me, peer)))
            mine = 0 if me < peer else 1
            out_q, in_q = sends.get(peer, []), recvs.get(peer, [])
            for k in range(max(len(out_q), len(in_q))):
                src = out_q[k] if k < len(out_q) else None
                dst = in_q[k] if k < len(in_q) else None
                ins: list[Any] = [(0, 1, 0, 0), (0, 1, 0, 0)]
                outs: list[Any] = [(0, 1, 0, 0), (0, 1, 0, 0)]
                if src is not None:
                    n = src.numel()
                    ins[1 - mine] = (src.data_ptr(), 1, n, n)
                if dst is not None:
                    buf = _bytes(dst.buf)
                    n = buf.numel()
                    outs[1 - mine] = (buf.data_ptr(), 1, n, n)
                w.all_to_all_v(group, ins, outs)
                if dst is not None:
                    dst.finish()


class _P2PWork(dist.Work):
    """A queued send or receive: waiting runs the queue (NOTE [p2p order])."""

    def __init__(self, queue: _P2PQueue, result: list[torch.Tensor]) -> None:
        super().__init__()
        self._queue = queue
        self._result = result

    def wait(self, timeout: Any = None) -> bool:
        if self._queue:
            self._queue.flush()
        return True

    def is_completed(self) -> bool:
        return not self._queue

    def get_future(self) -> Any:
        self.wait()
        fut: Future = Future()
        fut.set_result(self._result)
        return fut


class ProcessGroupGfdit(dist.ProcessGroup):
    """A torch process group whose collectives are gfdit's (see NOTE [torch backend])."""

    # torch's stubs declare ProcessGroup's front-end overloads (a tensor and an op, a list and options, ...);
    # the collectives here take what torch's Python and C++ layers pass a Python process group (lists of
    # tensors and an options object), so mypy finds them incompatible overrides: each has an ignore[override]
    # (ignore[assignment] for the aliases). The stubs also lack the constructor ProcessGroup(rank, size).
    def __init__(self, world: World, group: Group, p2p: _P2PQueue) -> None:
        super().__init__(group.rank(), group.size())  # type: ignore[call-arg, arg-type]
        self._world: World | None = world
        self._group = group
        self._g = group._g
        self._ranks = group.ranks
        self._n = group.size()
        self._p2p = p2p
        self._name = ""
        self._desc = ""

    # ---- subgroups: torch's fast path (NOTE [torch backend]) ----

    @property
    def new_group(self) -> Any:
        backend = torch_internals.caller_local(*torch_internals.NEW_GROUP_CALLER)
        if backend is None or not _only_gfdit(backend) or self._world is None:
            raise AttributeError("new_group")  # torch then makes the group through the creator
        return self._new_group

    def _new_group(
        self,
        ranks: list[int],
        timeout: Any = None,
        pg_options: Any = None,
        group_name: str = "",
        group_desc: str = "",
    ) -> ProcessGroupGfdit | None:
        assert self._world is not None
        ranks = [int(r) for r in ranks]
        if self._world.rank not in ranks:
            return None  # torch's NON_GROUP_MEMBER
        pg = ProcessGroupGfdit(self._world, self._world.new_group(ranks), self._p2p)
        pg._name = group_name or ""
        pg._desc = group_desc or ""
        return pg

    # ---- identity (torch keeps names on backends; this group has none, so it keeps them itself) ----

    def getBackendName(self) -> str:
        return BACKEND_NAME

    def getGroupName(self) -> str:
        return self._name

    def setGroupName(self, name: str) -> None:
        self._name = name

    def getGroupDesc(self) -> str:
        return self._desc

    def setGroupDesc(self, desc: str) -> None:
        self._desc = desc

    def __repr__(self) -> str:
        return f"ProcessGroupGfdit(ranks={self._ranks}, rank={self.rank()})"

    def _w(self, op: str) -> Any:
        if self._world is None:
            raise InvalidUsage(f"gfdit backend: {op} on a process group that was shut down")
        if self._p2p:
            self._p2p.flush()  # program order: queued point-to-point messages first
        return self._world._w

    def shutdown(self) -> None:
        self._world = None

    def abort(self) -> None:
        self._world = None

    # ---- reductions ----

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:  # type: ignore[override]
        w = self._w("all_reduce")
        op, avg = _reduce_op(_opt(opts, "reduceOp", dist.ReduceOp.SUM), "all_reduce")
        for t in tensors:
            _cpu(t, "tensor", "all_reduce")
            dt = _reducible(t, "all_reduce")
            _check_average(t, avg, "all_reduce")
            o = _Out(t)
            if o.buf is not t:
                o.buf.copy_(t)
            w.all_reduce(self._g, o.buf.data_ptr(), t.numel(), dt, op)
            if avg:
                o.buf.div_(self._n)
            o.finish()
        return _done(tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        return self.allreduce(tensors, opts)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:  # type: ignore[override]
        # Every member computes the sum; only the root's tensor takes it, as torch specifies.
        w = self._w("reduce")
        op, avg = _reduce_op(_opt(opts, "reduceOp", dist.ReduceOp.SUM), "reduce")
        root = int(_opt(opts, "rootRank", 0))
        for t in tensors:
            _cpu(t, "tensor", "reduce")
            dt = _reducible(t, "reduce")
            _check_average(t, avg, "reduce")
            buf = t.contiguous().clone()
            w.all_reduce(self._g, buf.data_ptr(), t.numel(), dt, op)
            if avg:
                buf.div_(self._n)
            if self.rank() == root:
                t.copy_(buf)
        return _done(tensors)

    def reduce_scatter_single(self, out: torch.Tensor, inp: torch.Tensor, opts: Any = None) -> Any:
        w = self._w("reduce_scatter_tensor")
        _cpu(out, "output", "reduce_scatter_tensor")
        _cpu(inp, "input", "reduce_scatter_tensor")
        if out.dtype != inp.dtype or inp.numel() != self._n * out.numel():
            raise InvalidUsage(
                f"gfdit backend: reduce_scatter_tensor: input {tuple(inp.shape)} {inp.dtype} must hold "
                f"{self._n} x output {tuple(out.shape)} {out.dtype}"
            )
        dt = _reducible(out, "reduce_scatter_tensor")
        op, avg = _reduce_op(_opt(opts, "reduceOp", dist.ReduceOp.SUM), "reduce_scatter_tensor")
        _check_average(out, avg, "reduce_scatter_tensor")
        src = inp.contiguous()
        o = _Out(out)
        a, b = o.buf.data_ptr(), src.data_ptr()
        if out.numel() and a < b + _nbytes(src) and b < a + _nbytes(o.buf):
            o.buf = torch.empty(out.shape, dtype=out.dtype)  # an output inside the input: reduce aside
        w.reduce_scatter(self._g, src.data_ptr(), o.buf.data_ptr(), out.numel(), dt, op)
        if avg:
            o.buf.div_(self._n)
        if o.buf is not out:
            out.copy_(o.buf)
        return _done(out)

    _reduce_scatter_base = reduce_scatter_single  # type: ignore[assignment]

    def reduce_scatter_single_coalesced(
        self, outs: list[torch.Tensor], inps: list[torch.Tensor], opts: Any = None
    ) -> Any:
        for o, i in zip(outs, inps, strict=True):
            self.reduce_scatter_single(o, i, opts)
        return _done(outs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced  # type: ignore[assignment]

    def reduce_scatter(  # type: ignore[override]
        self, outs: list[torch.Tensor], in_lists: list[list[torch.Tensor]], opts: Any = None
    ) -> Any:
        for o, parts in zip(outs, in_lists, strict=True):
            if len(parts) != self._n:
                raise InvalidUsage(
                    f"gfdit backend: reduce_scatter: {len(parts)} inputs for a group of {self._n}"
                )
            self.reduce_scatter_single(o, torch.cat([p.reshape(-1) for p in parts]), opts)
        return _done(outs)

    # ---- copies (any dtype: they move bytes) ----

    def all_gather_single(self, out: torch.Tensor, inp: torch.Tensor, opts: Any = None) -> Any:
        w = self._w("all_gather_into_tensor")
        _cpu(out, "output", "all_gather_into_tensor")
        _cpu(inp, "input", "all_gather_into_tensor")
        if out.dtype != inp.dtype or out.numel() != self._n * inp.numel():
            raise InvalidUsage(
                f"gfdit backend: all_gather_into_tensor: output {tuple(out.shape)} {out.dtype} must hold "
                f"{self._n} x input {tuple(inp.shape)} {inp.dtype}"
            )
        src = _bytes(inp.contiguous())
        o = _Out(out)
        w.all_gather(self._g, src.data_ptr(), o.buf.data_ptr(), src.numel())
        o.finish()
        return _done(out)

    _allgather_base = all_gather_single  # type: ignore[assignment]

    def all_gather_single_coalesced(
        self, outs: list[torch.Tensor], inps: list[torch.Tensor], opts: Any = None
    ) -> Any:
        for o, i in zip(outs, inps, strict=True):
            self.all_gather_single(o, i, opts)
        return _done(outs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced  # type: ignore[assignment]

    def allgather(  # type: ignore[override]
        self, out_lists: list[list[torch.Tensor]], inps: list[torch.Tensor], opts: Any = None
    ) -> Any:
        for outs, inp in zip(out_lists, inps, strict=True):
            if len(outs) != self._n:
                raise InvalidUsage(f"gfdit backend: all_gather: {len(outs)} outputs for a group of {self._n}")
            for o in outs:
                _cpu(o, "output", "all_gather")
                if o.dtype != inp.dtype or o.numel() != inp.numel():
                    raise InvalidUsage(
                        f"gfdit backend: all_gather: output {tuple(o.shape)} {o.dtype} differs from input "
                        f"{tuple(inp.shape)} {inp.dtype}"
                    )
            buf = torch.empty((self._n, *inp.shape), dtype=inp.dtype)
            self.all_gather_single(buf, inp)
            for k, o in enumerate(outs):
                o.copy_(buf[k].view(o.shape))
        return _done(out_lists)

    allgather_coalesced = allgather  # type: ignore[assignment]

    def _check_root_parts(self, parts: list[torch.Tensor], like: torch.Tensor, what: str, kind: str) -> None:
        """The root's list of a rooted collective: one CPU tensor per member, each of like's dtype and size."""
        if len(parts) != self._n or any(
            p.dtype != like.dtype or p.numel() != like.numel() or p.is_cuda for p in parts
        ):
            raise InvalidUsage(
                f"gfdit backend: {what}: the root needs {self._n} CPU {kind} of {tuple(like.shape)} {like.dtype}"
            )

    def gather(  # type: ignore[override]
        self, out_lists: list[list[torch.Tensor]], inps: list[torch.Tensor], opts: Any = None
    ) -> Any:
        # An all-gather that only the root keeps: gfdit has no rooted gather, and DiT code gathers little.
        root = int(_opt(opts, "rootRank", 0))
        if self.rank() == root:
            for k, inp in enumerate(inps):
                self._check_root_parts(out_lists[k], inp, "gather", "outputs")
        for k, inp in enumerate(inps):
            buf = torch.empty((self._n, *inp.shape), dtype=inp.dtype)
            self.all_gather_single(buf, inp)
            if self.rank() == root:
                for j, o in enumerate(out_lists[k]):
                    o.copy_(buf[j].view(o.shape))
        return _done(out_lists)

    def scatter(  # type: ignore[override]
        self, outs: list[torch.Tensor], in_lists: list[list[torch.Tensor]], opts: Any = None
    ) -> Any:
        # An all-to-all in which only the root sends.
        root = int(_opt(opts, "rootRank", 0))
        for k, out in enumerate(outs):
            _cpu(out, "output", "scatter")
            nb = _nbytes(out)
            if self.rank() == root:
                parts = in_lists[k]
                self._check_root_parts(parts, out, "scatter", "inputs")
                src = torch.cat([_bytes(p.contiguous()) for p in parts])
                in_splits = [nb] * self._n
            else:
                src = torch.empty(0, dtype=torch.uint8)
                in_splits = [0] * self._n
            out_splits = [nb if j == root else 0 for j in range(self._n)]
            self._all_to_all_bytes(out, src, out_splits, in_splits, "scatter")
        return _done(outs)

    def all_to_all_single(
        self,
        out: torch.Tensor,
        inp: torch.Tensor,
        output_split_sizes: Sequence[int],
        input_split_sizes: Sequence[int],
        opts: Any = None,
    ) -> Any:
        _cpu(out, "output", "all_to_all_single")
        _cpu(inp, "input", "all_to_all_single")
        if out.dtype != inp.dtype:
            raise InvalidUsage(
                f"gfdit backend: all_to_all_single: output {out.dtype} differs from input {inp.dtype}"
            )
        out_b = self._split_bytes(out, output_split_sizes, "output")
        in_b = self._split_bytes(inp, input_split_sizes, "input")
        self._all_to_all_bytes(out, _bytes(inp.contiguous()), out_b, in_b, "all_to_all_single")
        return _done(out)

    alltoall_base = all_to_all_single  # type: ignore[assignment]

    def alltoall(self, outs: list[torch.Tensor], inps: list[torch.Tensor], opts: Any = None) -> Any:
        if len(outs) != self._n or len(inps) != self._n:
            raise InvalidUsage(f"gfdit backend: all_to_all: needs {self._n} inputs and outputs")
        dtypes = {t.dtype for t in (*outs, *inps)}
        if len(dtypes) != 1:
            raise InvalidUsage(
                f"gfdit backend: all_to_all: tensors of several dtypes {sorted(map(str, dtypes))}"
            )
        for t in (*outs, *inps):
            _cpu(t, "tensor", "all_to_all")
        src = torch.cat([_bytes(t.contiguous()) for t in inps])
        buf = torch.empty(sum(_nbytes(t) for t in outs), dtype=torch.uint8)
        self._all_to_all_bytes(buf, src, [_nbytes(t) for t in outs], [_nbytes(t) for t in inps], "all_to_all")
        off = 0
        for t in outs:
            n = _nbytes(t)
            t.copy_(buf[off : off + n].view(t.dtype).view(t.shape))
            off += n
        return _done(outs)

    def _split_bytes(self, t: torch.Tensor, splits: Sequence[int] | None, what: str) -> list[int]:
        rows = t.shape[0] if t.dim() else 1
        row_bytes = _nbytes(t) // rows if rows else 0
        if not splits:
            if rows % self._n:
                raise InvalidUsage(
                    f"gfdit backend: all_to_all_single: {what} dim 0 ({rows}) is not divisible by the group "
                    f"size {self._n}; pass split sizes"
                )
            return [rows // self._n * row_bytes] * self._n
        splits = [int(s) for s in splits]
        if len(splits) != self._n or any(s < 0 for s in splits) or sum(splits) != rows:
            raise InvalidUsage(
                f"gfdit backend: all_to_all_single: {what} split sizes {splits} must be {self._n} non-negative "
                f"sizes summing to dim 0 ({rows})"
            )
        return [s * row_bytes for s in splits]

    def _all_to_all_bytes(
        self, out: torch.Tensor, src: torch.Tensor, out_b: list[int], in_b: list[int], op: str
    ) -> None:
        w = self._w(op)
        o = _Out(out)
        dst = _bytes(o.buf)
        if sum(out_b) != dst.numel() or sum(in_b) != src.numel():
            raise InvalidUsage(f"gfdit backend: {op}: split sizes do not cover the tensors")
        ins, outs = [], []
        a = src.data_ptr()
        for b in in_b:
            ins.append((a, 1, b, b))
            a += b
        a = dst.data_ptr()
        for b in out_b:
            outs.append((a, 1, b, b))
            a += b
        w.all_to_all_v(self._g, ins, outs)
        o.finish()

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:  # type: ignore[override]
        w = self._w("broadcast")
        root = self._ranks[int(_opt(opts, "rootRank", 0))]
        for t in tensors:
            _cpu(t, "tensor", "broadcast")
            o = _Out(t)
            if o.buf is not t:
                o.buf.copy_(t)
            b = _bytes(o.buf)
            w.broadcast(self._g, b.data_ptr(), b.numel(), root)
            o.finish()
        return _done(tensors)

    def barrier(self, opts: Any = None) -> Any:
        self._w("barrier").barrier(self._g)
        return _done()

    # ---- point-to-point (queued: NOTE [p2p order]) ----

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> Any:
        peer = self._peer(dst, tag, "send")
        for t in tensors:
            self._p2p.send(_cpu(t, "tensor", "send"), peer)
        return _P2PWork(self._p2p, tensors)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> Any:
        peer = self._peer(src, tag, "recv")
        for t in tensors:
            self._p2p.recv(_cpu(t, "tensor", "recv"), peer)
        return _P2PWork(self._p2p, tensors)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> Any:
        raise InvalidUsage("gfdit backend: recv from any source is not supported; name the source rank")

    recvAnysource = recv_anysource

    def _peer(self, group_rank: int, tag: int, op: str) -> int:
        if self._world is None:
            raise InvalidUsage(f"gfdit backend: {op} on a process group that was shut down")
        if tag:
            raise InvalidUsage(
                f"gfdit backend: {op}: tag {tag}; messages between two ranks match in order, use tag 0"
            )
        if not 0 <= group_rank < self._n or group_rank == self.rank():
            raise InvalidUsage(
                f"gfdit backend: {op}: peer {group_rank} in a group of {self._n} (this rank is {self.rank()})"
            )
        return self._ranks[group_rank]

    # ---- the rest of the ProcessGroup surface, named so that a caller learns what is missing ----

    def monitored_barrier(self, *args: Any, **kwargs: Any) -> Any:
        raise InvalidUsage("gfdit backend: monitored_barrier is not supported (every gfdit wait is bounded)")

    def _start_coalescing(self, device: Any) -> None:
        pass  # collectives finish as they are called: nothing to coalesce

    def _end_coalescing(self, device: Any) -> Any:
        return _done()


def _opt(opts: Any, name: str, default: Any) -> Any:
    return default if opts is None else getattr(opts, name, default)
