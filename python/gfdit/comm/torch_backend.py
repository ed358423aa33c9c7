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
- CPU tensors: collectives finish before they return (the CPU shared-memory backend has no stream to enqueue
  on); their ``Work`` is already completed.
- CUDA tensors need a world with a device: ``init_process_group("gfdit", device_id=torch.device("cuda", i))``
  makes the world on device i (as ``gfdit.init(..., device=i)``; torch does not pass ``device_id`` to a
  backend's creator, so it is read from torch's frame, gfdit.comm.torch_internals); without it they are
  refused, naming ``device_id``. A call's tensors are all CPU or all on the world's device, and a CUDA call is
  enqueued on the current stream of that device (NOTE [device tensors] in gfdit.comm.devices), as NCCL's
  are. Its ``Work`` (_StreamWork) follows NCCL: ``wait()`` makes the stream current at the wait wait for the
  call (an event recorded after it), without blocking the host; ``is_completed()`` asks the event;
  ``synchronize()`` blocks the host until the device has finished; ``get_future()`` waits, then gives a
  completed future. Temporaries (staging for non-contiguous tensors, gathered lists) live on the tensors'
  device and are written on the same stream. This path has been tested on CPU only, with stand-in streams
  and events that run the same code on CPU tensors (tests/python/test_torch_backend.py); it has not run on
  a GPU.
- Point-to-point: ``isend``/``irecv`` (and ``batch_isend_irecv``) queue; the first ``wait()``, or the next
  collective, runs the queue. See NOTE [p2p order].
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.futures import Future

from gfdit import _C
from gfdit._C import InvalidUsage
from gfdit.comm import torch_internals
from gfdit.comm.devices import _stream_handle, check_placement
from gfdit.comm.dtypes import TORCH_TO_DTYPE as _DTYPES
from gfdit.comm.world import Group, World

BACKEND_NAME = "gfdit"


def register() -> None:
    """Registers "gfdit" with torch.distributed (idempotent; ``import gfdit`` calls it)."""
    if not dist.is_available() or torch_internals.registered(BACKEND_NAME):
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu", "cuda"])


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
        # init_process_group(device_id=torch.device("cuda", i)) gives the world that device (NOTE [torch backend])
        device = torch_internals.caller_local(*torch_internals.CREATOR_DEVICE)
        world = World(
            opts.group_rank,
            opts.group_size,
            opts.store,
            timeout=timeout,
            key_prefix="gfdit-pg",
            device=device,
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


def _tensor(t: Any, what: str, op: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise InvalidUsage(f"gfdit backend: {op}: {what} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type not in ("cpu", "cuda"):
        raise InvalidUsage(
            f"gfdit backend: {op}: {what} is on {t.device}; the torch.distributed backend takes CPU tensors, "
            "and CUDA tensors on a world with a device"
        )
    return t


def _placement(world: World, op: str, named: Sequence[tuple[str, torch.Tensor]]) -> Any:
    """Where one call runs: None for CPU tensors (the host path); for CUDA tensors on the world's device, the
    current stream of that device (a torch.cuda.Stream), on which the core enqueues the call."""
    for what, t in named:
        _tensor(t, what, op)
    if not any(t.is_cuda for _, t in named):
        return None
    if world.device is None:
        what, t = next((w, t) for w, t in named if t.is_cuda)
        raise InvalidUsage(
            f"gfdit backend: {op}: {what} is on {t.device}, but this process group's world has no device; "
            "pass device_id=torch.device('cuda', local_rank) to dist.init_process_group('gfdit', ...)"
        )
    if world.stages_device_tensors:
        raise InvalidUsage(
            f"gfdit backend: {op}: this process group's world spans hosts, where the backend takes CPU tensors "
            "only (gfdit.comm's own collectives stage CUDA tensors there: NOTE [device tensors across hosts])"
        )
    index = check_placement(f"gfdit backend: {op}", [(w, t.device) for w, t in named], world._device_index)
    return torch.cuda.current_stream(index)


def _handle(stream: Any) -> int:
    """The stream argument of the core: 0 for the host path."""
    return 0 if stream is None else _stream_handle(stream)


class _StreamWork(dist.Work):
    """The work of a collective enqueued on a CUDA stream, as NCCL's: ``wait()`` makes the current stream wait
    for it (the host does not), ``synchronize()`` blocks the host until the device has finished it."""

    def __init__(self, world: World, stream: Any, result: Any) -> None:
        super().__init__()
        self._world = world
        self._event = torch.cuda.Event()
        self._event.record(stream)
        self._result = result

    def wait(self, timeout: Any = None) -> bool:
        self._world.check()  # a device-side wait that expired since (NOTE [device tensors])
        torch.cuda.current_stream(self._world.device).wait_event(self._event)
        return True

    def is_completed(self) -> bool:
        return bool(self._event.query())

    def synchronize(self) -> None:
        self._event.synchronize()

    def get_future(self) -> Any:
        self.wait()
        fut: Future = Future()
        fut.set_result(self._result)
        return fut


def _work(world: World, stream: Any, result: Any = None) -> Any:
    """The Work a call returns: already completed on the host path; on a stream, see _StreamWork."""
    if stream is None:
        return torch_internals.completed_work(result)
    return _StreamWork(world, stream, result)


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
        self.buf = t if t.is_contiguous() else torch.empty(t.shape, dtype=t.dtype, device=t.device)

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


_HEADER_MSGS = 8  # messages each way that one header describes
# header: [queued sends, blocked on a receive, send bytes x M, send on the device x M, posted receive bytes x M]
_HEADER_LEN = 2 + 3 * _HEADER_MSGS
_NONE = (0, 1, 0, 0)  # an empty view of all_to_all_v


def _record(stream: Any) -> Any:
    """A CUDA event recorded on stream (None for the host path)."""
    if stream is None:
        return None
    event = torch.cuda.Event()
    event.record(stream)
    return event


def _view(t: torch.Tensor) -> tuple[int, int, int, int]:
    n = t.numel()
    return (t.data_ptr(), 1, n, n)


class _Send:
    """A queued send: its bytes, where they live (stream None: host memory), when they are ready."""

    __slots__ = ("peer", "data", "stream", "ready", "done", "event", "error")

    def __init__(self, peer: int, t: torch.Tensor, stream: Any) -> None:
        self.peer = peer
        self.data = _bytes(t.contiguous())
        self.stream = stream
        self.ready = _record(stream)  # the bytes (and their contiguous copy) are written at this point
        self.done = False
        self.event: Any = None  # CUDA: the device has sent the bytes once this event completes
        self.error: str | None = None


class _Recv:
    """A posted receive, until a message from its peer fills it."""

    __slots__ = ("peer", "out", "nbytes", "stream", "ready", "done", "event", "error")

    def __init__(self, peer: int, t: torch.Tensor, stream: Any) -> None:
        self.peer = peer
        self.out = _Out(t)
        self.nbytes = _nbytes(t)
        self.stream = stream
        self.ready = _record(stream)  # earlier work on the tensor is ordered before the write
        self.done = False
        self.event: Any = None
        self.error: str | None = None


class _P2PQueue:
    """Queued point-to-point messages of one world (global ranks), matched per direction.

    NOTE [p2p order]
    gfdit's collectives on a group of two wait for both members, so a message cannot wait at the sender for a
    receive the way gloo's does; instead a send is eager: it completes once the message has reached the peer's
    process, into the receive posted there or, when none is, into that peer's queue of unexpected messages,
    which satisfies the next receive from this rank without communication. Messages between two ranks keep
    their order in each direction (tags are not matched, only 0 is accepted).
    - A flush (a ``wait()`` on a send or receive, or the next collective) visits the rank pairs it has queued
      sends or posted receives with, in one global order, by (lower rank, higher rank). At a pair both ranks
      run a session on the group [lower, higher]: a header (queued sends, their sizes and places, the sizes of
      the posted receives, and whether the rank is blocked on a receive from the other), then steps, each an
      all_to_all_v carrying at most the next message each way, until neither has a queued send. Both ranks
      decide from the same two headers: a message larger or smaller than the receive it lands in fails on
      both with InvalidUsage (the pair's queued operations are dropped, the world stays usable), and so do
      two ranks blocked on receives from each other with nothing to send (gloo would wait for its timeout).
    - A ``wait()`` on a receive that is still empty after the visits re-enters the pair, where it waits for
      the peer's next flush that has business with this rank.
    - Deadlock-free where every flush has business with the same peers as they have with it (rings,
      all-pairs exchanges, batch_isend_irecv of matched operations, pipelines): every rank visits its pairs
      in the same global order, so the smallest unfinished pair always has both ranks at it. On two ranks
      every program that runs on gloo runs, and some that do not (both ranks sending first). With three or
      more a rank waits at a pair until its peer arrives, which gloo does not make it do: ranks 0, 1, 2 with
      0: isend(1), isend(2), wait both; 1: recv(2), recv(0); 2: recv(0), send(1) run on gloo, but here 0
      waits at (0, 1) while 1 waits at (1, 2) for 2, which waits at (0, 2) for 0; the world's timeout ends it.
    - A send or receive posted before a collective is matched before it: the peer must post its counterpart
      before its own collective too, or the session meets the collective and the world breaks with a
      RemoteError naming the mismatch.
    - CUDA tensors: see NOTE [torch backend]; their messages move on the current stream of the flush,
      after the streams they were posted on (events), and host and device messages of one step move in two
      transfers, host first.
    """

    def __init__(self, world: World) -> None:
        self._world = world
        self._sends: dict[int, deque[_Send]] = {}
        self._recvs: dict[int, deque[_Recv]] = {}
        self._unexpected: dict[int, deque[tuple[torch.Tensor, Any]]] = {}
        self._pairs: dict[int, Any] = {}
        self._headers = array("q", [0] * (3 * _HEADER_LEN))  # mine, then [lower's, higher's]
        self._headers_at = self._headers.buffer_info()[0]

    def __bool__(self) -> bool:
        return bool(self._sends) or bool(self._recvs)

    def send(self, t: torch.Tensor, peer: int, stream: Any) -> _Send:
        op = _Send(peer, t, stream)
        self._sends.setdefault(peer, deque()).append(op)
        return op

    def recv(self, t: torch.Tensor, peer: int, stream: Any) -> _Recv:
        op = _Recv(peer, t, stream)
        waiting = self._unexpected.get(peer)
        if not waiting:  # a message waits only while no receive is posted: it would have filled that one
            self._recvs.setdefault(peer, deque()).append(op)
            return op
        buf, event = waiting[0]
        if buf.numel() != op.nbytes:
            raise InvalidUsage(
                f"gfdit backend: recv: the next message from rank {peer} has {buf.numel()} bytes, the receive "
                f"takes {op.nbytes} ({tuple(t.shape)} {t.dtype}); sizes must match"
            )
        waiting.popleft()
        if not waiting:
            del self._unexpected[peer]
        if event is not None:
            torch.cuda.current_stream(self._world.device).wait_event(event)
        self._fill(op, buf)
        return op

    def _fill(self, op: _Recv, buf: torch.Tensor) -> None:
        """Copies a message that arrived elsewhere into op's tensor (on the current stream)."""
        _bytes(op.out.buf).copy_(buf)
        op.out.finish()
        op.event = _record(op.stream)
        op.done = True

    def flush(self, need: Sequence[_Recv] = ()) -> None:
        """Visits every pair with queued operations, then waits until the receives of ``need`` are filled."""
        me = self._world.rank
        order = {p: (min(me, p), max(me, p)) for p in range(self._world.world_size)}
        errors: list[str] = []
        for peer in sorted(set(self._sends) | set(self._recvs), key=order.__getitem__):
            self._visit(peer, need, errors)
        while True:
            waiting = [r.peer for r in need if not r.done and r.error is None]
            if not waiting:
                break
            self._visit(min(waiting, key=order.__getitem__), need, errors)
        errors += [r.error for r in need if r.error is not None and r.error not in errors]
        if errors:
            raise InvalidUsage("; ".join(errors))

    def _visit(self, peer: int, need: Sequence[_Recv], errors: list[str]) -> None:
        try:
            self._session(peer, need)
        except InvalidUsage as exc:  # the peer raises it too; the other pairs still get their visit
            errors.append(str(exc))

    def _session(self, peer: int, need: Sequence[_Recv]) -> None:
        me = self._world.rank
        w = self._world._w
        group = self._pairs.get(peer)
        if group is None:
            group = self._pairs[peer] = w.new_group(sorted((me, peer)))
        mine_idx = 0 if me < peer else 1
        m = _HEADER_MSGS
        while True:
            sends = list(self._sends.get(peer, ()))[:m]
            recvs = list(self._recvs.get(peer, ()))[:m]
            mine = [-1] * _HEADER_LEN
            mine[0] = len(self._sends.get(peer, ()))
            mine[1] = int(any(r.peer == peer and not r.done for r in need))
            for k, s in enumerate(sends):
                mine[2 + k] = s.data.numel()
                mine[2 + m + k] = int(s.stream is not None)
            for k, r in enumerate(recvs):
                mine[2 + 2 * m + k] = r.nbytes
            h, n = self._headers, _HEADER_LEN
            h[:n] = array("q", mine)
            w.all_gather(group, self._headers_at, self._headers_at + 8 * n, 8 * n)
            theirs = h[n * (2 - mine_idx) : n * (3 - mine_idx)].tolist()
            if mine[0] == 0 and theirs[0] == 0:
                if mine[1] and theirs[1]:
                    self._drop(
                        peer,
                        f"gfdit backend: ranks {min(me, peer)} and {max(me, peer)} each wait for a message from "
                        "the other and neither has one queued for the other (a deadlock)",
                    )
                return
            self._check_sizes(peer, mine, theirs)
            self._steps(peer, group, mine_idx, sends, recvs, theirs)
            if mine[0] <= m and theirs[0] <= m:
                return

    def _check_sizes(self, peer: int, mine: list[int], theirs: list[int]) -> None:
        """Refuses, on both ranks alike, a message whose size differs from the receive it lands in."""
        m = _HEADER_MSGS
        me = self._world.rank
        lo, hi = (mine, theirs) if me < peer else (theirs, mine)
        bad = []
        for src, dst, a, b in (
            (min(me, peer), max(me, peer), lo, hi),
            (max(me, peer), min(me, peer), hi, lo),
        ):
            for k in range(min(a[0], m)):
                sent, takes = a[2 + k], b[2 + 2 * m + k]
                if takes >= 0 and sent != takes:
                    bad.append(f"rank {src} sends {sent} bytes to rank {dst}, whose receive takes {takes}")
        if bad:
            self._drop(peer, f"gfdit backend: point-to-point size mismatch: {'; '.join(bad)}")

    def _drop(self, peer: int, why: str) -> None:
        """Fails every queued operation with peer; both ranks of the pair do the same, so the pair stays in step."""
        for op in (*self._sends.pop(peer, ()), *self._recvs.pop(peer, ())):
            op.error = why
        self._unexpected.pop(peer, None)
        raise InvalidUsage(why)

    def _steps(
        self, peer: int, group: Any, mine_idx: int, sends: list[_Send], recvs: list[_Recv], theirs: list[int]
    ) -> None:
        m = _HEADER_MSGS
        w = self._world._w
        incoming = min(theirs[0], m)
        flush_stream = None
        for k in range(max(len(sends), incoming)):
            s = sends[k] if k < len(sends) else None
            r = recvs[k] if k < len(recvs) and k < incoming else None
            dest = None
            kind_in = bool(theirs[2 + m + k]) if k < incoming else None
            direct = r is not None and (r.stream is not None) == kind_in
            if kind_in is not None:
                if direct:
                    assert r is not None
                    dest = _bytes(r.out.buf)
                else:  # no receive posted, or one on the other side of the host/device line: a buffer of its own
                    dest = torch.empty(
                        theirs[2 + k], dtype=torch.uint8, device=self._world.device if kind_in else None
                    )
            kind_out = None if s is None else s.stream is not None
            for on_device in [d for d in (False, True) if d in (kind_out, kind_in)]:  # host first
                ins: list[Any] = [_NONE, _NONE]
                outs: list[Any] = [_NONE, _NONE]
                if s is not None and kind_out == on_device:
                    ins[1 - mine_idx] = _view(s.data)
                if dest is not None and kind_in == on_device:
                    outs[1 - mine_idx] = _view(dest)
                handle = 0
                if on_device:
                    if flush_stream is None:
                        flush_stream = torch.cuda.current_stream(self._world.device)
                    for op in (s, r):
                        if op is not None and op.ready is not None:
                            flush_stream.wait_event(op.ready)
                    handle = _stream_handle(flush_stream)
                w.all_to_all_v(group, ins, outs, handle)
            if s is not None:
                self._sends[peer].popleft()
                s.event = _record(flush_stream) if kind_out else None
                s.done = True
            if kind_in is None:
                continue
            assert dest is not None
            if r is None:
                self._unexpected.setdefault(peer, deque()).append(
                    (dest, _record(flush_stream) if kind_in else None)
                )
                continue
            self._recvs[peer].popleft()
            if not direct:
                _bytes(r.out.buf).copy_(dest)  # across the host/device line, on the current stream
            r.out.finish()
            if r.stream is not None:  # device memory was written on the current stream (the flush's)
                r.event = _record(torch.cuda.current_stream(self._world.device))
            r.done = True
        for q in (self._sends, self._recvs):
            if not q.get(peer, True):
                del q[peer]


class _P2PWork(dist.Work):
    """Queued sends and receives: waiting runs the queue (NOTE [p2p order]); with CUDA tensors the current
    stream then waits for their transfers, as NCCL's work does."""

    def __init__(self, queue: _P2PQueue, ops: list[_Send | _Recv], result: list[torch.Tensor]) -> None:
        super().__init__()
        self._queue = queue
        self._ops = ops
        self._result = result

    def wait(self, timeout: Any = None) -> bool:
        if not all(op.done for op in self._ops):
            self._queue.flush([op for op in self._ops if isinstance(op, _Recv)])
        errors = [op.error for op in self._ops if op.error is not None]
        if errors:
            raise InvalidUsage(errors[0])
        for op in self._ops:
            if op.event is not None:
                torch.cuda.current_stream(self._queue._world.device).wait_event(op.event)
        return True

    def is_completed(self) -> bool:
        return all(op.done and (op.event is None or op.event.query()) for op in self._ops)

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

    def _start(self, op: str, *named: tuple[str, torch.Tensor]) -> tuple[Any, Any]:
        """(the core world, the stream) for one call: its tensors checked, then queued messages run first."""
        world = self._live(op)
        stream = _placement(world, op, named)
        if self._p2p:
            self._p2p.flush()  # program order: queued point-to-point messages first
        return world._w, stream

    def _live(self, op: str) -> World:
        if self._world is None:
            raise InvalidUsage(f"gfdit backend: {op} on a process group that was shut down")
        return self._world

    def _work(self, stream: Any, result: Any = None) -> Any:
        return _work(self._live("wait"), stream, result)

    def shutdown(self) -> None:
        self._world = None

    def abort(self) -> None:
        self._world = None

    def _get_backend(self, device: Any) -> Any:
        # torch asks a group for a device's backend object (init_process_group(device_id=...) checks whether
        # it supports splitting); this group is its own backend on every device.
        return self

    supports_splitting = False

    # ---- reductions ----

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:  # type: ignore[override]
        w, stream = self._start("all_reduce", *(("tensor", t) for t in tensors))
        op, avg = _reduce_op(_opt(opts, "reduceOp", dist.ReduceOp.SUM), "all_reduce")
        for t in tensors:
            dt = _reducible(t, "all_reduce")
            _check_average(t, avg, "all_reduce")
            o = _Out(t)
            if o.buf is not t:
                o.buf.copy_(t)
            w.all_reduce(self._g, o.buf.data_ptr(), t.numel(), dt, op, _handle(stream))
            if avg:
                o.buf.div_(self._n)
            o.finish()
        return self._work(stream, tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        return self.allreduce(tensors, opts)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:  # type: ignore[override]
        # Every member computes the sum; only the root's tensor takes it, as torch specifies.
        w, stream = self._start("reduce", *(("tensor", t) for t in tensors))
        op, avg = _reduce_op(_opt(opts, "reduceOp", dist.ReduceOp.SUM), "reduce")
        root = int(_opt(opts, "rootRank", 0))
        for t in tensors:
            dt = _reducible(t, "reduce")
            _check_average(t, avg, "reduce")
            buf = t.contiguous().clone()
            w.all_reduce(self._g, buf.data_ptr(), t.numel(), dt, op, _handle(stream))
            if avg:
                buf.div_(self._n)
            if self.rank() == root:
                t.copy_(buf)
        return self._work(stream, tensors)

    def reduce_scatter_single(self, out: torch.Tensor, inp: torch.Tensor, opts: Any = None) -> Any:
        w, stream = self._start("reduce_scatter_tensor", ("output", out), ("input", inp))
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
            o.buf = torch.empty(
                out.shape, dtype=out.dtype, device=out.device
            )  # inside the input: reduce aside
        w.reduce_scatter(self._g, src.data_ptr(), o.buf.data_ptr(), out.numel(), dt, op, _handle(stream))
        if avg:
            o.buf.div_(self._n)
        if o.buf is not out:
            out.copy_(o.buf)
        return self._work(stream, out)

    _reduce_scatter_base = reduce_scatter_single  # type: ignore[assignment]

    def reduce_scatter_single_coalesced(
        self, outs: list[torch.Tensor], inps: list[torch.Tensor], opts: Any = None
    ) -> Any:
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outs, inps, strict=True)]
        return works[-1] if works else self._work(None, outs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced  # type: ignore[assignment]

    def reduce_scatter(  # type: ignore[override]
        self, outs: list[torch.Tensor], in_lists: list[list[torch.Tensor]], opts: Any = None
    ) -> Any:
        work = self._work(None, outs)
        for o, parts in zip(outs, in_lists, strict=True):
            if len(parts) != self._n:
                raise InvalidUsage(
                    f"gfdit backend: reduce_scatter: {len(parts)} inputs for a group of {self._n}"
                )
            work = self.reduce_scatter_single(o, torch.cat([p.reshape(-1) for p in parts]), opts)
        return work

    # ---- copies (any dtype: they move bytes) ----

    def all_gather_single(self, out: torch.Tensor, inp: torch.Tensor, opts: Any = None) -> Any:
        w, stream = self._start("all_gather_into_tensor", ("output", out), ("input", inp))
        if out.dtype != inp.dtype or out.numel() != self._n * inp.numel():
            raise InvalidUsage(
                f"gfdit backend: all_gather_into_tensor: output {tuple(out.shape)} {out.dtype} must hold "
                f"{self._n} x input {tuple(inp.shape)} {inp.dtype}"
            )
        src = _bytes(inp.contiguous())
        o = _Out(out)
        w.all_gather(self._g, src.data_ptr(), o.buf.data_ptr(), src.numel(), _handle(stream))
        o.finish()
        return self._work(stream, out)

    _allgather_base = all_gather_single  # type: ignore[assignment]

    def all_gather_single_coalesced(
        self, outs: list[torch.Tensor], inps: list[torch.Tensor], opts: Any = None
    ) -> Any:
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outs, inps, strict=True)]
        return works[-1] if works else self._work(None, outs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced  # type: ignore[assignment]

    def allgather(  # type: ignore[override]
        self, out_lists: list[list[torch.Tensor]], inps: list[torch.Tensor], opts: Any = None
    ) -> Any:
        work = self._work(None, out_lists)
        for outs, inp in zip(out_lists, inps, strict=True):
            if len(outs) != self._n:
                raise InvalidUsage(f"gfdit backend: all_gather: {len(outs)} outputs for a group of {self._n}")
            _placement(
                self._live("all_gather"), "all_gather", [("input", inp), *(("output", o) for o in outs)]
            )
            for o in outs:
                if o.dtype != inp.dtype or o.numel() != inp.numel():
                    raise InvalidUsage(
                        f"gfdit backend: all_gather: output {tuple(o.shape)} {o.dtype} differs from input "
                        f"{tuple(inp.shape)} {inp.dtype}"
                    )
            buf = torch.empty((self._n, *inp.shape), dtype=inp.dtype, device=inp.device)
            work = self.all_gather_single(buf, inp)
            for k, o in enumerate(outs):
                o.copy_(buf[k].view(o.shape))
        return work

    allgather_coalesced = allgather  # type: ignore[assignment]

    def _check_root_parts(self, parts: list[torch.Tensor], like: torch.Tensor, what: str, kind: str) -> None:
        """The root's list of a rooted collective: one tensor per member, each of like's device, dtype and size."""
        if len(parts) != self._n or any(
            p.dtype != like.dtype or p.numel() != like.numel() or p.device != like.device for p in parts
        ):
            raise InvalidUsage(
                f"gfdit backend: {what}: the root needs {self._n} {kind} of {tuple(like.shape)} {like.dtype} "
                f"on {like.device}"
            )

    def gather(  # type: ignore[override]
        self, out_lists: list[list[torch.Tensor]], inps: list[torch.Tensor], opts: Any = None
    ) -> Any:
        # An all-gather that only the root keeps: gfdit has no rooted gather, and DiT code gathers little.
        root = int(_opt(opts, "rootRank", 0))
        if self.rank() == root:
            for k, inp in enumerate(inps):
                self._check_root_parts(out_lists[k], inp, "gather", "outputs")
        work = self._work(None, out_lists)
        for k, inp in enumerate(inps):
            buf = torch.empty((self._n, *inp.shape), dtype=inp.dtype, device=inp.device)
            work = self.all_gather_single(buf, inp)
            if self.rank() == root:
                for j, o in enumerate(out_lists[k]):
                    o.copy_(buf[j].view(o.shape))
        return work

    def scatter(  # type: ignore[override]
        self, outs: list[torch.Tensor], in_lists: list[list[torch.Tensor]], opts: Any = None
    ) -> Any:
        # An all-to-all in which only the root sends.
        root = int(_opt(opts, "rootRank", 0))
        work = self._work(None, outs)
        for k, out in enumerate(outs):
            _tensor(out, "output", "scatter")
            nb = _nbytes(out)
            if self.rank() == root:
                parts = in_lists[k]
                self._check_root_parts(parts, out, "scatter", "inputs")
                src = torch.cat([_bytes(p.contiguous()) for p in parts])
                in_splits = [nb] * self._n
            else:
                src = torch.empty(0, dtype=torch.uint8, device=out.device)
                in_splits = [0] * self._n
            out_splits = [nb if j == root else 0 for j in range(self._n)]
            work = self._all_to_all_bytes(out, src, out_splits, in_splits, "scatter")
        return work

    def all_to_all_single(
        self,
        out: torch.Tensor,
        inp: torch.Tensor,
        output_split_sizes: Sequence[int],
        input_split_sizes: Sequence[int],
        opts: Any = None,
    ) -> Any:
        _tensor(out, "output", "all_to_all_single")
        _tensor(inp, "input", "all_to_all_single")
        if out.dtype != inp.dtype:
            raise InvalidUsage(
                f"gfdit backend: all_to_all_single: output {out.dtype} differs from input {inp.dtype}"
            )
        out_b = self._split_bytes(out, output_split_sizes, "output")
        in_b = self._split_bytes(inp, input_split_sizes, "input")
        return self._all_to_all_bytes(out, _bytes(inp.contiguous()), out_b, in_b, "all_to_all_single")

    alltoall_base = all_to_all_single  # type: ignore[assignment]

    def alltoall(self, outs: list[torch.Tensor], inps: list[torch.Tensor], opts: Any = None) -> Any:
        if len(outs) != self._n or len(inps) != self._n:
            raise InvalidUsage(f"gfdit backend: all_to_all: needs {self._n} inputs and outputs")
        dtypes = {t.dtype for t in (*outs, *inps)}
        if len(dtypes) != 1:
            raise InvalidUsage(
                f"gfdit backend: all_to_all: tensors of several dtypes {sorted(map(str, dtypes))}"
            )
        _placement(self._live("all_to_all"), "all_to_all", [("tensor", t) for t in (*outs, *inps)])
        src = torch.cat([_bytes(t.contiguous()) for t in inps])
        buf = torch.empty(sum(_nbytes(t) for t in outs), dtype=torch.uint8, device=outs[0].device)
        work = self._all_to_all_bytes(
            buf, src, [_nbytes(t) for t in outs], [_nbytes(t) for t in inps], "all_to_all"
        )
        off = 0
        for t in outs:
            n = _nbytes(t)
            t.copy_(buf[off : off + n].view(t.dtype).view(t.shape))
            off += n
        return work

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
    ) -> Any:
        w, stream = self._start(op, ("output", out), ("input", src))
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
        w.all_to_all_v(self._g, ins, outs, _handle(stream))
        o.finish()
        return self._work(stream, out)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:  # type: ignore[override]
        w, stream = self._start("broadcast", *(("tensor", t) for t in tensors))
        root = self._ranks[int(_opt(opts, "rootRank", 0))]
        for t in tensors:
            o = _Out(t)
            if o.buf is not t:
                o.buf.copy_(t)
            b = _bytes(o.buf)
            w.broadcast(self._g, b.data_ptr(), b.numel(), root, _handle(stream))
            o.finish()
        return self._work(stream, tensors)

    def barrier(self, opts: Any = None) -> Any:
        w, _ = self._start("barrier")
        w.barrier(self._g)
        return self._work(None)

    # ---- point-to-point (queued: NOTE [p2p order]) ----

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> Any:
        peer = self._peer(dst, tag, "send")
        world = self._live("send")
        ops: list[_Send | _Recv] = [
            self._p2p.send(t, peer, _placement(world, "send", [("tensor", t)])) for t in tensors
        ]
        return _P2PWork(self._p2p, ops, tensors)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> Any:
        peer = self._peer(src, tag, "recv")
        world = self._live("recv")
        ops: list[_Send | _Recv] = [
            self._p2p.recv(t, peer, _placement(world, "recv", [("tensor", t)])) for t in tensors
        ]
        return _P2PWork(self._p2p, ops, tensors)

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
        return torch_internals.completed_work()


def _opt(opts: Any, name: str, default: Any) -> Any:
    return default if opts is None else getattr(opts, name, default)
