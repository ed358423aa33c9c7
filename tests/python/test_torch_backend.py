"""The torch.distributed backend "gfdit" (gfdit.comm.torch_backend) against gloo, on the same ranks and inputs."""

from __future__ import annotations

import os
import subprocess
import sys

import cases_torch_backend as cases
import mp_harness
import pytest

pytestmark = [pytest.mark.timeout(300)]


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"ws{n}")
def world(request, world_pool):
    n = request.param
    if n > mp_harness.MAX_WORLD:
        pytest.skip(f"world size {n} above GFDIT_TEST_MAX_WORLD")
    w = world_pool.get(n, gloo=False, init_gfdit=False)
    assert w.run(cases.setup, timeout=120) == ["gfdit"] * n
    return w


def _no_errors(results: list) -> None:
    errors = [f"rank {r}: {e}" for r, errs in enumerate(results) for e in errs]
    assert not errors, "\n".join(errors[:20])


def test_collectives_equal_gloo(world):
    _no_errors(world.run(cases.collectives, 1, timeout=240))


def test_functional_collectives_equal_gloo(world):
    _no_errors(world.run(cases.functional, 2, timeout=120))


def test_every_rank_makes_every_group(world):
    n = world.world_size
    out = world.run(cases.every_rank_makes_every_group, timeout=120)
    for r, o in enumerate(out):
        peers = [p for p in range(n) if p != r]
        assert o["num_mine"] == n - 1
        # The groups this rank belongs to, in creation order: pairs (a, b) with a < b.
        pairs = [(a, b) for a in range(n) for b in range(a + 1, n) if r in (a, b)]
        assert o["sums"] == [float(a + 1 + b + 1) for a, b in pairs], peers


def test_device_mesh(world):
    if world.world_size % 2:
        pytest.skip("a 2 x n/2 mesh")
    _no_errors(world.run(cases.device_mesh, timeout=120))


def test_point_to_point(world):
    _no_errors(world.run(cases.point_to_point, 3, timeout=120))


def test_point_to_point_matches_per_direction(world):
    # A rank that waits on a send before posting the receive its peer sent first, sizes and dtypes that differ
    # each way, more messages than one header describes: as gloo, and both ranks sending first too.
    _no_errors(world.run(cases.p2p_directions, 4, timeout=120))


def test_point_to_point_pipelines(world):
    _no_errors(world.run(cases.p2p_pipeline, 5, timeout=120))


def test_point_to_point_errors_are_clear(world):
    n = world.world_size
    for r, got in enumerate(world.run(cases.p2p_errors, timeout=120)):
        assert "size mismatch" in got["posted mismatch"], got
        assert "sends 16 bytes" in got["posted mismatch"] and "takes 20" in got["posted mismatch"], got
        assert "deadlock" in got["deadlock"], got
        assert "has 12 bytes" in got["waiting mismatch"] and "takes 16" in got["waiting mismatch"], got
        assert got["then"] == [float((r ^ 1) + k) for k in range(3)], got
        assert got["after"] == float(n)


@pytest.mark.parametrize("device_dtypes", [None, ["float64", "int32"]], ids=["all-device", "host-and-device"])
def test_cuda_paths_with_stand_in_streams(world, device_dtypes):
    # The CUDA path (streams, events, Work.wait) on CPU tensors that the placement reports as on the device;
    # every comparison against gloo of the host path runs on it.
    for r, got in enumerate(world.run(cases.cuda_paths_on_cpu, 6, device_dtypes, timeout=240)):
        assert not got["errors"], f"rank {r}: " + "\n".join(got["errors"][:20])
        assert got["recorded"] > 0 and got["waited"] > 0, got
        assert got["unrecorded waits"] == 0, got


def test_unsupported_is_refused_by_name(world):
    out = world.run(cases.refused, timeout=120)
    for msgs in out:
        got = dict(msgs)
        assert "int16" in got["int16 all_reduce"]
        assert "BAND" in got["BAND"] or "reduce op" in got["BAND"]
        assert "meta" in got["meta tensor"] and "CPU" in got["meta tensor"]
        assert "any source" in got["recv from any source"]
        assert "tag 5" in got["tag"]
        assert "monitored_barrier" in got["monitored_barrier"]
        assert "AVG" in got["AVG int"] and got["avg int untouched"] == [0, 1, 2]
        for name in ("CUDA all_reduce", "CUDA all_gather", "CUDA send"):  # a host-only world names device_id
            assert "no device" in got[name] and "device_id" in got[name], (name, got[name])
        assert got["after"] == float(len(out))


def test_gfdit_groups_on_the_backend_world(world):
    n = world.world_size
    for r, o in enumerate(world.run(cases.gfdit_groups, timeout=120)):
        assert o["ranks"] == [(r + 1) % n] and o["rank"] == -1 and not o["is_member"]
        assert "not a member" in o["refused"], o["refused"]
        assert o["whole"] == list(range(n))
        assert o["pair_sum"] == (3.0 if r < 2 else r + 1.0)


_ONE_RANK = """
import datetime, sys, torch, torch.distributed as dist, gfdit
store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=30))
try:
    dist.init_process_group(sys.argv[1], store=store, rank=0, world_size=1)
except gfdit.InvalidUsage as exc:
    print("refused:", exc)
    sys.exit(0)
t = torch.ones(3)
dist.all_reduce(t)
print("ran:", dist.get_backend(), type(dist.new_group([0])).__name__, t.tolist())
"""


@pytest.mark.parametrize(
    "backend,expect",
    [
        ("gfdit", "ran: gfdit ProcessGroupGfdit"),
        ("cpu:gfdit", "ran: cpu:gfdit ProcessGroupGfdit"),
        ("cpu:gfdit,cuda:gloo", "refused: gfdit: backend 'cpu:gfdit,cuda:gloo'"),
        ("cuda:gloo,cpu:gfdit", "refused: gfdit: backend 'cuda:gloo,cpu:gfdit'"),
    ],
)
def test_device_maps(backend, expect):
    # A device map that gives another device to another backend would lose it (torch keeps one Python process
    # group for all devices): refused at init, naming the map.
    out = subprocess.run(
        [sys.executable, "-c", _ONE_RANK, backend],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith(expect), out.stdout + out.stderr[-2000:]


def test_device_id_gives_the_world_its_device(monkeypatch):
    # torch does not pass init_process_group's device_id to a backend's creator; the creator reads it from
    # torch's frame (a function of that name with those locals stands in for torch here) and makes the world
    # on that device. No GPU here: the World is a stand-in that records what it was given.
    import datetime
    from types import SimpleNamespace

    import torch
    from gfdit.comm import torch_backend as tb

    made = []

    class StandInWorld:
        def __init__(self, *args, device=None, **kwargs):
            made.append(device)
            self._whole = SimpleNamespace(rank=lambda: 0, size=lambda: 1, _g=None, ranks=[0])

    monkeypatch.setattr(tb, "World", StandInWorld)
    opts = SimpleNamespace(
        global_ranks_in_group=[],
        timeout=datetime.timedelta(seconds=5),
        group_rank=0,
        group_size=1,
        store=None,
    )

    def _new_process_group_helper(device_id):
        backend_config = "cpu:gfdit,cuda:gfdit"  # noqa: F841 - read from this frame by the creator
        return tb._create(opts, None)

    from gfdit.comm import torch_internals
    from torch.distributed import distributed_c10d as c10d

    function, local = torch_internals.CREATOR_DEVICE  # torch's own function holds that local
    assert local in getattr(c10d, function).__code__.co_varnames
    pg = _new_process_group_helper(torch.device("cuda", 1))
    assert made == [torch.device("cuda", 1)]
    # torch then asks the group for the device's backend (whether it supports splitting): it is its own.
    assert pg._get_backend(torch.device("cuda", 1)) is pg and not pg.supports_splitting
    _new_process_group_helper(None)
    assert made[-1] is None  # no device_id: a host-only world, as before
