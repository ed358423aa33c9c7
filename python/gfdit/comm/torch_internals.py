"""What gfdit's torch.distributed backend needs from torch that torch does not publish, each behind one
function here, so that a torch release that changes one of them fails in this module (and in
tests/python/test_torch_internals.py, which checks each against the installed torch) and nowhere else.

Checked against the pinned torch (the Makefile's TORCH_VERSION, 2.13.0):
- ``caller_local``: a local variable of torch's calling function, read from its frame. The creator hook and
  the subgroup fast path are not told which backend string the caller asked for ("cpu:gfdit,cuda:nccl" must
  be refused; ``new_group(backend="gloo")`` must not take gfdit's fast path), so they read it where torch
  holds it: ``backend_config`` in ``distributed_c10d._new_process_group_helper`` and ``backend`` in
  ``distributed_c10d._new_group_with_tag`` (NOTE [torch backend] in gfdit.comm.torch_backend); the creator
  is not told the ``device_id`` of ``init_process_group`` either, which is ``device_id`` there. A torch
  whose functions are named otherwise makes these reads return None: the check is skipped and the fast
  path not offered, which is correct, only slower.
- ``registered``: whether a backend name is registered (``dist.Backend._plugins``).
- ``completed_work``: a finished ``Work`` from a value (``torch._C._distributed_c10d._create_work_from_future``),
  since gfdit's collectives are done when they return.
"""

from __future__ import annotations

import sys
from typing import Any

import torch.distributed as dist
from torch.futures import Future

# The torch functions whose frames caller_local reads, and the local each holds.
CREATOR_CALLER = ("_new_process_group_helper", "backend_config")
CREATOR_DEVICE = ("_new_process_group_helper", "device_id")
NEW_GROUP_CALLER = ("_new_group_with_tag", "backend")


def caller_local(function: str, name: str, depth: int = 2) -> Any:
    """The local ``name`` of the function ``depth`` frames up from this one (2: the caller's caller), or
    None when that function is not ``function``."""
    frame = sys._getframe(depth)
    if frame.f_code.co_name != function:
        return None
    return frame.f_locals.get(name)


def registered(name: str) -> bool:
    """Whether torch.distributed knows a backend of this name (registered by any plugin)."""
    return name.upper() in dist.Backend._plugins


def completed_work(result: Any = None) -> Any:
    """A torch ``Work`` that has finished with ``result``."""
    # in torch's extension, but not in its stubs (torch/_C/_distributed_c10d.pyi)
    from torch._C._distributed_c10d import _create_work_from_future  # type: ignore[attr-defined]

    fut: Future = Future()
    fut.set_result(result)
    return _create_work_from_future(fut)
