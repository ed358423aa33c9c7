"""Where an attention call's transfers run while its compute goes on: the one communication thread of
the process on the CPU, or one communication stream per device on CUDA.

NOTE [stream pipeline]
On CUDA the communication thread becomes one communication stream per device (``StreamExecutor``) and
``submit(fn)`` keeps the thread's meaning: fn's transfers run after everything the calling thread enqueued
on the current (compute) stream before the submit (the communication stream waits on an event recorded
there: the compute that produced the send buffers and last read the receive buffers), and in submit order
among themselves (one stream, FIFO, as the one thread). ``future.result()`` makes the compute stream wait on
an event recorded after fn, where the CPU path blocks the thread. Ring step t thus enqueues the K/V exchange
of step t + 1 on the communication stream, computes block t on the compute stream, and orders the next
step's compute after the exchange with an event. fn runs on the calling thread (it only enqueues work), so
host-side errors raise at submit. Tensors given to fn stay referenced, and the compute stream waits for the
communication stream (``join``) before the call returns, so the caching allocator never reuses a buffer
that a transfer still reads or writes (the caller's tensors and the call's outputs are used on the compute
stream afterwards, after that wait).
"""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any

import torch

_executor: concurrent.futures.ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def _comm_executor() -> concurrent.futures.ThreadPoolExecutor:
    """The one communication thread of this process (FIFO; see NOTE [attention call protocol] in gfdit.attention.core)."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="gfdit-attn-comm"
            )
        return _executor


class _StreamFuture:
    """What ``StreamExecutor.submit`` returns: ``result()`` orders the compute stream after the work."""

    __slots__ = ("_done", "_compute")

    def __init__(self, done: Any, compute: Any) -> None:
        self._done = done
        self._compute = compute

    def result(self) -> None:
        self._compute.wait_event(self._done)


class StreamExecutor:
    """The communication thread's counterpart on CUDA: a communication stream (NOTE [stream pipeline])."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.compute = torch.cuda.current_stream(device)
        self.comm = _comm_stream(device)
        self._held: list[tuple] = []

    def submit(self, fn: Any, *args: Any) -> _StreamFuture:
        ready = torch.cuda.Event()
        ready.record(self.compute)  # after the compute that made fn's inputs and last read its outputs
        self.comm.wait_event(ready)
        self._held.append(args)  # the buffers stay allocated until join (see NOTE [stream pipeline])
        with torch.cuda.stream(self.comm):
            fn(*args)
            done = torch.cuda.Event()
            done.record(self.comm)
        return _StreamFuture(done, self.compute)

    def join(self) -> None:
        """The compute stream waits for every transfer submitted so far; the held buffers are released."""
        self.compute.wait_stream(self.comm)
        self._held.clear()


_comm_streams: dict[int, Any] = {}


def _comm_stream(device: torch.device) -> Any:
    """The one communication stream of this process on a device (FIFO, as the communication thread)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    with _executor_lock:
        stream = _comm_streams.get(index)
        if stream is None:
            stream = _comm_streams[index] = torch.cuda.Stream(device=index)
        return stream


def executor_for(device: torch.device) -> Any:
    """Where a call's transfers run: the communication thread, or on CUDA a communication stream."""
    if device.type == "cuda":
        return StreamExecutor(device)
    return _comm_executor()
