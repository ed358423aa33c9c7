"""Every gfdit collective and dtype against torch.distributed (gloo) and a local reference, on 2-4 ranks
(a subset on 8): random shapes, empty tensors, tensors larger than a staging slot, heap and ordinary
tensors, unsorted subgroups, group methods, uneven all_to_all splits, the Ulysses 4-D shuffle (also with
uneven head and sequence splits), send/recv,
broadcast from a non-zero source, barrier and one-sided put_with_signal.

The ranks are persistent processes (see mp_harness.py); the case functions are in cases_collectives.py.
"""

from __future__ import annotations

import cases_collectives as cc
import mp_harness
import pytest
from cases_common import DTYPES

WORLD_SIZES = [2, 3, 4, 8]
GFDIT_TIMEOUT = 20.0  # bound of every gfdit wait in these worlds
RUN = 90.0  # hard bound of one case on all ranks (killed past it)


def pytest_generate_tests(metafunc):
    """World sizes of a test: 2-4, and 8 for tests marked ws8 (size 8 oversubscribes the machine), none above
    GFDIT_TEST_MAX_WORLD. Variants that would not run are not generated at all."""
    if "ws" in metafunc.fixturenames:
        wide = metafunc.definition.get_closest_marker("ws8") is not None
        sizes = [n for n in WORLD_SIZES if (n < 8 or wide) and n <= mp_harness.MAX_WORLD]
        metafunc.parametrize("ws", sizes, ids=[f"ws{n}" for n in sizes], indirect=True, scope="module")


@pytest.fixture(scope="module")
def ws(request):
    """World size; module-scoped so that pytest groups the tests of one world size together."""
    return request.param


@pytest.fixture
def world(ws, world_pool):
    """The persistent world of size ws."""
    return world_pool.get(ws, timeout=GFDIT_TIMEOUT)


def _subgroups(n):
    """Unsorted and partial groups that fit a world of n ranks."""
    groups = [[1, 0], [n - 1, 0]]
    if n >= 3:
        groups += [[2, 0], [2, 0, 1]]
    if n >= 4:
        groups += [[3, 1], [3, 0, 2], [1, 3]]
    if n >= 8:
        groups += [[7, 2, 5, 0], [6, 4], list(range(n - 1, -1, -1))]
    unique = []
    for g in groups:
        if g not in unique:
            unique.append(g)
    return unique


# ---------------------------------------------------------------------------------------------- all_gather
@pytest.mark.ws8
@pytest.mark.timeout(240)
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_gather(world, dtype):
    world.run(cc.case_all_gather, 11, dtype, timeout=RUN)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "uint8"])
def test_all_gather_large(world, dtype):
    world.run(
        cc.case_all_gather, 12, dtype, size="large", mems=[("plain", "plain"), ("heap", "heap")], timeout=RUN
    )


@pytest.mark.timeout(240)
def test_all_gather_empty(world):
    world.run(cc.case_all_gather, 13, "float32", size="empty", timeout=RUN)


@pytest.mark.ws8
@pytest.mark.timeout(240)
@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_all_gather_subgroups(world, dtype):
    for i, g in enumerate(_subgroups(world.world_size)):
        world.run(cc.case_all_gather, 14 + i, dtype, ranks=g, use_method=bool(i % 2), timeout=RUN)


# ---------------------------------------------------------------------------------------------- all_to_all
@pytest.mark.timeout(240)
@pytest.mark.parametrize("split", ["even", "even_explicit", "uneven"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_to_all_single(world, dtype, split):
    world.run(cc.case_all_to_all_single, 21, dtype, split=split, timeout=RUN)


@pytest.mark.ws8
@pytest.mark.timeout(240)
def test_all_to_all_single_uneven_float32(world):
    world.run(cc.case_all_to_all_single, 22, "float32", split="uneven", tail=(2, 3), timeout=RUN)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_all_to_all_single_large(world, dtype):
    world.run(
        cc.case_all_to_all_single,
        23,
        dtype,
        split="large",
        tail=(64,),
        mems=[("plain", "plain"), ("heap", "heap")],
        timeout=RUN,
    )


@pytest.mark.timeout(240)
def test_all_to_all_single_empty(world):
    world.run(cc.case_all_to_all_single, 24, "int64", split="empty", timeout=RUN)


@pytest.mark.ws8
@pytest.mark.timeout(240)
@pytest.mark.parametrize("split", ["even", "uneven"])
def test_all_to_all_single_subgroups(world, split):
    for i, g in enumerate(_subgroups(world.world_size)):
        world.run(
            cc.case_all_to_all_single,
            25 + i,
            "bfloat16",
            ranks=g,
            split=split,
            use_method=bool(i % 2),
            mems=[("heap", "plain"), ("plain", "heap")],
            timeout=RUN,
        )


# ------------------------------------------------------------------------------------------ reduce_scatter
@pytest.mark.timeout(240)
@pytest.mark.parametrize("op", ["sum", "max", "min"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_scatter(world, dtype, op):
    op_form = "torch" if op == "max" else "str"  # ReduceOp is accepted as well as the string
    world.run(cc.case_reduce_scatter, 31, dtype, op=op, op_form=op_form, timeout=RUN)


@pytest.mark.ws8
@pytest.mark.timeout(240)
def test_reduce_scatter_sum_float32(world):
    world.run(cc.case_reduce_scatter, 32, "float32", op="sum", timeout=RUN)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_reduce_scatter_large(world, dtype):
    world.run(cc.case_reduce_scatter, 33, dtype, op="sum", size="large", timeout=RUN)


@pytest.mark.timeout(240)
def test_reduce_scatter_empty(world):
    world.run(cc.case_reduce_scatter, 34, "float16", size="empty", timeout=RUN)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("op", ["sum", "min"])
def test_reduce_scatter_subgroups(world, op):
    for i, g in enumerate(_subgroups(world.world_size)):
        world.run(
            cc.case_reduce_scatter, 35 + i, "int32", op=op, ranks=g, use_method=bool(i % 2), timeout=RUN
        )


# ---------------------------------------------------------------------------------------------- all_reduce
@pytest.mark.timeout(240)
@pytest.mark.parametrize("op", ["sum", "max", "min"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_reduce(world, dtype, op):
    op_form = "torch" if op == "min" else "str"
    world.run(cc.case_all_reduce, 41, dtype, op=op, op_form=op_form, timeout=RUN)


@pytest.mark.ws8
@pytest.mark.timeout(240)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32"])
def test_all_reduce_sum_ws8(world, dtype):
    world.run(cc.case_all_reduce, 42, dtype, op="sum", timeout=RUN)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("dtype", ["float32", "float16", "int64"])
def test_all_reduce_large(world, dtype):
    world.run(cc.case_all_reduce, 43, dtype, op="sum", size="large", timeout=RUN)


@pytest.mark.timeout(240)
def test_all_reduce_empty(world):
    world.run(cc.case_all_reduce, 44, "bfloat16", size="empty", timeout=RUN)


@pytest.mark.ws8
@pytest.mark.timeout(240)
@pytest.mark.parametrize("dtype", ["float32", "uint8"])
def test_all_reduce_subgroups(world, dtype):
    for i, g in enumerate(_subgroups(world.world_size)):
        world.run(cc.case_all_reduce, 45 + i, dtype, op="sum", ranks=g, use_method=bool(i % 2), timeout=RUN)


# ----------------------------------------------------------------------------------------------- broadcast
@pytest.mark.ws8
@pytest.mark.timeout(240)
@pytest.mark.parametrize("dtype", DTYPES)
def test_broadcast(world, dtype):
    n = world.world_size
    for src in sorted({n - 1, 1, 0}):
        world.run(cc.case_broadcast, 51 + src, dtype, src, timeout=RUN)


@pytest.mark.timeout(240)
def test_broadcast_large_and_empty(world):
    world.run(cc.case_broadcast, 61, "float32", world.world_size - 1, size="large", timeout=RUN)
    world.run(cc.case_broadcast, 62, "int32", 1, size="empty", timeout=RUN)


@pytest.mark.ws8
@pytest.mark.timeout(240)
def test_broadcast_subgroups(world):
    for i, g in enumerate(_subgroups(world.world_size)):
        src = g[-1] if i % 2 else g[0]  # a member that is not the group's first, half the time
        world.run(cc.case_broadcast, 63 + i, "float16", src, ranks=g, use_method=bool(i % 2), timeout=RUN)


# ------------------------------------------------------------------------------------------- send / recv
def _transfers(n):
    """A global order of point-to-point transfers: a ring, its reverse, and some repeated pairs."""
    ring = [(i, (i + 1) % n) for i in range(n)]
    back = [((i + 1) % n, i) for i in range(n)]
    extra = [(n - 1, 0), (n - 1, 0), (0, n - 1), (1, 0)]
    return ring + back + extra


@pytest.mark.ws8
@pytest.mark.timeout(240)
@pytest.mark.parametrize("dtype", DTYPES)
def test_send_recv(world, dtype):
    world.run(cc.case_send_recv, 71, dtype, _transfers(world.world_size), timeout=RUN)


@pytest.mark.timeout(240)
def test_send_recv_large_and_empty(world):
    n = world.world_size
    world.run(cc.case_send_recv, 72, "bfloat16", [(0, n - 1), (n - 1, 0), (1, 0)], size="large", timeout=RUN)
    world.run(cc.case_send_recv, 73, "uint8", [(0, 1), (1, 0)], size="empty", timeout=RUN)


# ------------------------------------------------------------------------------------------------- barrier
def _check_barrier(times, members):
    spans = [times[r] for r in members]
    last_enter = max(s[0] for s in spans)
    first_leave = min(s[1] for s in spans)
    assert first_leave >= last_enter - 0.005, (
        f"a member left the barrier of {members} {last_enter - first_leave:.3f}s before the last one entered"
    )


@pytest.mark.ws8
@pytest.mark.timeout(240)
def test_barrier(world):
    n = world.world_size
    _check_barrier(world.run(cc.case_barrier, timeout=RUN), list(range(n)))
    for i, g in enumerate(_subgroups(n)[:3]):
        times = world.run(cc.case_barrier, ranks=g, use_method=bool(i % 2), delay=0.1, timeout=RUN)
        _check_barrier(times, g)
        assert all(times[r] is None for r in range(n) if r not in g)


# -------------------------------------------------------------------------------------------- all_to_all_4d
@pytest.mark.ws8
@pytest.mark.timeout(240)
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_to_all_4d(world, dtype):
    if world.world_size >= 8 and dtype not in ("bfloat16", "float32"):
        pytest.skip("world size 8 runs the 4-D shuffle on two dtypes only")
    world.run(cc.case_all_to_all_4d, 81, dtype, timeout=RUN)


@pytest.mark.timeout(240)
def test_all_to_all_4d_large(world):
    world.run(cc.case_all_to_all_4d, 82, "float32", large=True, timeout=RUN)


@pytest.mark.ws8
@pytest.mark.timeout(240)
def test_all_to_all_4d_subgroups(world):
    for i, g in enumerate(_subgroups(world.world_size)):
        world.run(cc.case_all_to_all_4d, 83 + i, "float16", ranks=g, use_method=bool(i % 2), timeout=RUN)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_all_to_all_4d_uneven_heads(world, dtype):
    world.run(cc.case_all_to_all_4d_head_splits, 91, dtype, timeout=RUN)
    for i, g in enumerate(_subgroups(world.world_size)[:3]):
        world.run(
            cc.case_all_to_all_4d_head_splits, 92 + i, dtype, ranks=g, use_method=bool(i % 2), timeout=RUN
        )


# ------------------------------------------------------------------------------------------ group descriptor
@pytest.mark.timeout(240)
def test_group_order_is_kept(world):
    for g in _subgroups(world.world_size):
        seen = world.run(cc.case_group_descriptor, g, timeout=RUN)
        for r in range(world.world_size):
            if r in g:
                assert seen[r] == (g, len(g), g.index(r)), f"group {g} seen by rank {r}: {seen[r]}"
            else:
                assert seen[r] is None


# ------------------------------------------------------------------------------------------ put_with_signal
@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", [2, 3])
def test_put_with_signal(n):
    """One-sided puts need matching heap offsets, so they run in a world fresh from setup, where every rank
    makes the same sequence of heap allocations."""
    world = mp_harness.World(n, timeout=GFDIT_TIMEOUT, heap_bytes=32 << 20, gloo=False)
    try:
        for i, dtype in enumerate(["float32", "bfloat16", "uint8", "int64"]):
            world.run(cc.case_put_with_signal, 91 + i, dtype, timeout=RUN)
    finally:
        world.close()
