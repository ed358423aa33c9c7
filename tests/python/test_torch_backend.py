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
