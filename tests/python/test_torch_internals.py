"""What gfdit's torch.distributed backend takes from torch's internals (gfdit.comm.torch_internals), checked
against the installed torch, so that a torch release that moves one of them fails here by name."""

from __future__ import annotations

import re

import pytest
import torch
import torch.distributed.distributed_c10d as c10d
from gfdit.comm import torch_internals

MAKEFILE_TORCH = re.compile(r"^TORCH_VERSION := (\S+)$", re.M)


def test_torch_is_the_pinned_version():
    import os

    with open(os.path.join(os.path.dirname(__file__), "..", "..", "Makefile"), encoding="utf-8") as f:
        pinned = MAKEFILE_TORCH.search(f.read()).group(1)
    assert torch.__version__.split("+")[0] == pinned


@pytest.mark.parametrize(
    "caller",
    [torch_internals.CREATOR_CALLER, torch_internals.CREATOR_DEVICE, torch_internals.NEW_GROUP_CALLER],
)
def test_the_frames_read_hold_the_locals_read(caller):
    function, local = caller
    code = getattr(c10d, function).__code__
    assert code.co_name == function and local in code.co_varnames


def test_caller_local_reads_the_named_callers_local_only():
    def _new_process_group_helper():  # stands in for torch's function of that name
        backend_config = "cpu:gfdit,cuda:nccl"  # noqa: F841  (read from the frame)
        return probe()

    def probe():
        return torch_internals.caller_local(*torch_internals.CREATOR_CALLER)

    def elsewhere():
        backend_config = "gloo"  # noqa: F841
        return probe()

    assert _new_process_group_helper() == "cpu:gfdit,cuda:nccl"
    assert elsewhere() is None


def test_registered_and_completed_work():
    import gfdit  # noqa: F401  (registers the backend)

    assert torch_internals.registered("gfdit") and not torch_internals.registered("no-such-backend")
    work = torch_internals.completed_work([3])
    assert work.wait() and work.get_future().value() == [3]
