"""Where a world's tensors live: parsing device arguments, choosing a rank's GPU, and checking that one
collective's tensors share one place.

NOTE [device tensors]
A world made with ``device=`` (``gfdit.init(..., device="cuda:N")``) has a device data region on that GPU
beside its host region. A collective takes either CPU tensors (the host transport, as on a host-only world)
or CUDA tensors, all on the world's device; a mix in one call is refused. With CUDA tensors the call passes
``stream=`` the current CUDA stream of the world's device (``torch.cuda.current_stream(device)``): the C++
core enqueues the transfer on it and returns before the device has finished, as NCCL does, so the result is
ordered before whatever is enqueued on that stream afterwards. torch's legacy default stream has the handle
0, which the core reads as "host pointers", so it is passed as ``cudaStreamLegacy`` (1), the same stream
under its explicit name (``_stream_handle``). Device errors (a bounded device-side wait that timed out)
surface at the next collective or at ``World.check()``. Host collectives on a device world stay host-side
(gfdit.attention's metadata exchange is one). The build must have the CUDA transport
(``cuda_transport_available()``); without it every path that needs a device raises gfdit.InvalidUsage and
CPU behaviour is unchanged.

NOTE [device tensors across hosts]
The CUDA transport maps its peers' device memory with CUDA IPC, which reaches only the GPUs of one host, and
gfdit's NVSHMEM build is not wired to a transport yet. So a world made with ``device=`` whose ranks span
hosts (the C++ World reports ``staged_device``) has no device transport and no device heap: every
collective on CUDA tensors runs on host copies (``World._via_host``): the inputs are copied to pinned host
tensors (a synchronous copy, after what the current stream queued), the host collective runs (shared memory
inside a host, the network edges across), and the outputs are copied back on the current stream. Placement
is checked as on any device world. What does not stage is refused with gfdit.InvalidUsage: one-sided puts of
CUDA tensors and stream waits (``put_with_signal``, ``wait_signal(stream=)``) and ``symmetric_empty`` on
the device; ``empty(device=)`` gives a plain CUDA tensor. gfdit.attention's Torus therefore runs USP on
such a world (torus.py). Every group pays the two copies, also a group inside one host: its peers' device
memory is not mapped. This path has been tested with CPU tensors standing in for the device ones (the same
copies and calls); it has not run on GPUs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from gfdit import _C
from gfdit._C import InvalidUsage

# Whether this build has the CUDA transport, enabled (World.create(device=), collectives with stream=,
# heap_alloc(device=)); see NOTE [device tensors].
_HAS_CUDA_TRANSPORT = bool(_C.has_device_transport())
_CUDA_STREAM_LEGACY = 1  # cudaStreamLegacy: torch's default stream (handle 0) under a nonzero name
_NO_TRANSPORT = (
    "this build has no CUDA transport (gfdit._C.World lacks device support); rebuild gfdit with the CUDA "
    "transport, or use CPU tensors on a host-only world (device=None)"
)


def cuda_transport_available() -> bool:
    """Whether this build of gfdit can run collectives on CUDA tensors (NOTE [device tensors])."""
    return bool(_HAS_CUDA_TRANSPORT)


def _require_cuda_transport(what: str) -> None:
    if not cuda_transport_available():
        raise InvalidUsage(f"gfdit: {what}: {_NO_TRANSPORT}")


def parse_device(device: Any) -> int | str | None:
    """The device a world or model is asked for, without looking at the machine: None (host only) for
    None, "cpu" or torch.device("cpu"); an index for N, "cuda:N" or torch.device("cuda", N); "cuda" for
    "cuda" or torch.device("cuda") (this rank's default GPU, see ``default_device``). Anything else raises
    gfdit.InvalidUsage."""
    if device is None:
        return None
    if isinstance(device, bool):
        raise InvalidUsage(
            f"gfdit: device {device!r} is not a device; use None, an index, 'cuda' or 'cuda:N'"
        )
    if isinstance(device, int):
        if device < 0:
            raise InvalidUsage(f"gfdit: device index {device} is negative; use None for a host-only world")
        return int(device)
    if isinstance(device, str):
        try:
            device = torch.device(device.strip())
        except (RuntimeError, ValueError):
            raise InvalidUsage(
                f"gfdit: device {device!r} is not a device; use None, an index, 'cpu', 'cuda' or 'cuda:N'"
            ) from None
    if isinstance(device, torch.device):
        if device.type == "cpu":
            return None
        if device.type == "cuda":
            return "cuda" if device.index is None else int(device.index)
        raise InvalidUsage(
            f"gfdit: device {device} is not supported; gfdit runs on CPU tensors and CUDA tensors"
        )
    raise InvalidUsage(
        f"gfdit: device must be None, an int, a str or a torch.device, got {type(device).__name__}"
    )


def default_device(rank: int) -> int:
    """This rank's GPU when none is named: ``LOCAL_RANK`` (as torchrun sets it) or else the rank, modulo
    the number of visible devices (so a launcher that sets ``CUDA_VISIBLE_DEVICES`` to one device per
    process gets device 0)."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise InvalidUsage(
            f"gfdit: no CUDA device is visible to this process (torch {torch.__version__}, "
            f"CUDA {torch.version.cuda}, CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})"
        )
    local = os.environ.get("LOCAL_RANK")
    base = int(local) if local is not None and local.strip().lstrip("-").isdigit() else int(rank)
    return base % count


def resolve_device(device: Any, rank: int = 0, what: str = "device") -> int | None:
    """The CUDA device index a world or model runs on (None: host only). Checks, in this order: the value
    (``parse_device``), that this build has the CUDA transport, that torch sees CUDA, and the index."""
    parsed = parse_device(device)
    if parsed is None:
        return None
    _require_cuda_transport(f"{what}={device!r}")
    if not torch.cuda.is_available():
        raise InvalidUsage(
            f"gfdit: {what}={device!r}, but torch sees no CUDA device (torch {torch.__version__}, CUDA "
            f"{torch.version.cuda})"
        )
    index = default_device(rank) if parsed == "cuda" else int(parsed)
    count = torch.cuda.device_count()
    if index >= count:
        raise InvalidUsage(f"gfdit: {what}={device!r}: device {index} does not exist ({count} visible)")
    return index


def check_placement(
    what: str, devices: Sequence[tuple[str, torch.device]], world_device: int | None
) -> int | None:
    """Where one collective's tensors live: None for CPU tensors, the device index for CUDA tensors on the
    world's device. A mix of CPU and CUDA tensors, CUDA tensors on a host-only world, and CUDA tensors on
    another device raise gfdit.InvalidUsage naming them (NOTE [device tensors])."""
    cuda = [(n, d) for n, d in devices if d.type == "cuda"]
    if not cuda:
        return None
    if len(cuda) != len(devices):
        host = [n for n, d in devices if d.type != "cuda"]
        raise InvalidUsage(
            f"gfdit: {what}: {', '.join(host)} on cpu but {', '.join(f'{n} on {d}' for n, d in cuda)}; one "
            "collective takes CPU tensors or CUDA tensors on the world's device, not a mix"
        )
    if world_device is None:
        n, d = cuda[0]
        reason = (
            _NO_TRANSPORT
            if not cuda_transport_available()
            else ("this world is host only; pass device= to gfdit.init for CUDA tensors")
        )
        raise InvalidUsage(f"gfdit: {what}: {n} is on {d}, but {reason}")
    for n, d in cuda:
        index = torch.cuda.current_device() if d.index is None else d.index
        if index != world_device:
            raise InvalidUsage(
                f"gfdit: {what}: {n} is on {d}, but this world's device is cuda:{world_device}; every CUDA "
                "tensor of a collective lives on the world's device"
            )
    return world_device


def _stream_handle(stream: Any) -> int:
    """The cudaStream_t (as an int) of a torch.cuda.Stream for the C++ core; torch's legacy default stream
    (handle 0) as cudaStreamLegacy, since 0 means "host pointers" there (NOTE [device tensors])."""
    handle = int(stream.cuda_stream)
    return handle if handle != 0 else _CUDA_STREAM_LEGACY
