"""Group descriptors, world state and build info in a single-rank world, in the pytest process itself."""

from __future__ import annotations

import datetime

import gfdit
import pytest
import torch
import torch.distributed as dist


def _store():
    timeout = datetime.timedelta(seconds=30)
    return dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timeout, wait_for_workers=False)


@pytest.fixture
def world1():
    assert not gfdit.is_initialized()
    store = _store()
    gfdit.init(0, 1, store, timeout=5.0)
    try:
        yield store
    finally:
        gfdit.destroy()
    assert not gfdit.is_initialized()


@pytest.mark.timeout(60)
def test_world_state(world1):
    assert gfdit.is_initialized()
    assert gfdit.get_rank() == 0
    assert gfdit.get_world_size() == 1


@pytest.mark.timeout(60)
def test_init_destroy_twice():
    for _ in range(2):
        gfdit.init(0, 1, _store(), timeout=5.0, heap_bytes=8 << 20)
        assert gfdit.is_initialized()
        t = torch.randn(5)
        ref = t.clone()
        gfdit.all_reduce(t)
        assert torch.equal(t, ref)
        gfdit.destroy()
        assert not gfdit.is_initialized()


@pytest.mark.timeout(60)
def test_new_group_descriptor(world1):
    g = gfdit.new_group([0])
    assert list(g.ranks) == [0]
    assert g.size() == 1
    assert g.rank() == 0
    assert g.is_member


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "ranks", [[], [0, 0], [1], [0, 1], [-1], [0, -1], [64], [0, 1000]], ids=lambda r: str(r).replace(" ", "")
)
def test_new_group_validation(world1, ranks):
    with pytest.raises(gfdit.InvalidUsage) as info:
        gfdit.new_group(ranks)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, gfdit.Error)
    assert str(info.value)


@pytest.mark.timeout(60)
def test_exception_hierarchy():
    assert issubclass(gfdit.InvalidUsage, gfdit.Error)
    assert issubclass(gfdit.InvalidUsage, ValueError)
    assert issubclass(gfdit.Timeout, gfdit.Error)
    assert issubclass(gfdit.Timeout, TimeoutError)
    assert issubclass(gfdit.RemoteError, gfdit.Timeout)
    assert issubclass(gfdit.Error, Exception)


@pytest.mark.timeout(60)
def test_forming_groups_is_local(world1):
    """Forming a group sends nothing and allocates nothing in the heap (its cost, about a microsecond, is
    measured by bench/bench_groups.py and bench/group_formation_bench.cpp)."""
    before = gfdit.get_world().stats()
    groups = [gfdit.new_group([0]) for _ in range(2000)]
    after = gfdit.get_world().stats()
    assert all(g.ranks == [0] and g.size() == 1 for g in groups)
    assert (after.messages_sent, after.collectives, after.staged_bytes) == (
        before.messages_sent,
        before.collectives,
        before.staged_bytes,
    )


@pytest.mark.timeout(60)
def test_group_methods_single_rank(world1):
    g = gfdit.new_group([0])
    x = torch.randn(4, 3)
    out = torch.empty(4, 3)
    g.all_gather_into_tensor(out, x)
    assert torch.equal(out, x)
    out = torch.empty(4, 3)
    g.all_to_all_single(out, x)
    assert torch.equal(out, x)
    out = torch.empty(4, 3)
    g.all_to_all_single(out, x, output_split_sizes=[4], input_split_sizes=[4])
    assert torch.equal(out, x)
    out = torch.empty(4, 3)
    g.reduce_scatter_tensor(out, x, op="max")
    assert torch.equal(out, x)
    t = x.clone()
    g.all_reduce(t, op="sum")
    assert torch.equal(t, x)
    t = x.clone()
    g.all_reduce(t, op=dist.ReduceOp.MIN)
    assert torch.equal(t, x)
    t = x.clone()
    g.broadcast(t, 0)
    assert torch.equal(t, x)
    g.barrier()
    x4 = torch.randn(2, 3, 4, 5)
    out4 = torch.empty(2, 3, 4, 5)
    g.all_to_all_4d(out4, x4, scatter_dim=2, gather_dim=1)
    assert torch.equal(out4, x4)
    # Module functions with group=None mean the whole (one-rank) world.
    out = torch.empty(4, 3)
    gfdit.all_gather_into_tensor(out, x)
    assert torch.equal(out, x)
    gfdit.barrier()


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.uint8]
)
def test_heap_tensor(world1, dtype):
    x = gfdit.empty((16, 8), dtype=dtype)
    assert isinstance(x, torch.Tensor)
    assert tuple(x.shape) == (16, 8) and x.dtype == dtype and x.is_contiguous()
    assert gfdit.is_heap_tensor(x)
    assert gfdit.is_heap_tensor(x[3])  # a view inside the heap
    assert not gfdit.is_heap_tensor(torch.empty(16, 8, dtype=dtype))
    ref = torch.randint(1, 100, (16, 8)).to(dtype)
    x.copy_(ref)
    y = gfdit.empty((16, 8), dtype=dtype)
    assert x.data_ptr() != y.data_ptr()
    y.fill_(1)
    assert torch.equal(x, ref)  # blocks do not overlap
    out = gfdit.empty((16, 8), dtype=dtype)
    gfdit.all_gather_into_tensor(out, x)
    assert torch.equal(out, ref)


@pytest.mark.timeout(60)
def test_heap_is_reused_after_free(world1):
    """Freed heap tensors give their space back: allocating far more than the heap in total works."""
    for _ in range(64):
        x = gfdit.empty((4 << 20,), dtype=torch.uint8)
        x.fill_(3)
        del x


@pytest.mark.timeout(60)
def test_build_info():
    info = gfdit.build_info()
    assert isinstance(info, dict)
    assert isinstance(info["cuda"], bool)
    assert isinstance(info["nvshmem"], bool)
    assert isinstance(info["version"], str) and info["version"]
    assert isinstance(info["tma"], bool) and isinstance(info["tma_active"], bool)
    assert info["cpu_copy_paths"] and set(info["cpu_copy_paths"]) <= {"memcpy", "stream"}
    assert "cpu" in info["copy_tables"]
    if info["cuda"]:
        assert info["cuda_architectures"]
        assert "cuda-ipc" in info["backends"]
        assert set(info["cuda_copy_paths"]) <= {"sm", "tma", "ce"}
        assert info["copy_tables"]["cuda_default"] == "65536:sm,16777216:tma,inf:ce"
        if not info["tma_active"]:
            assert "tma" not in info["cuda_copy_paths"]
        assert (info["nvshmem_version"] is not None) == info["nvshmem"]


@pytest.mark.timeout(60)
def test_collective_before_init_is_refused():
    assert not gfdit.is_initialized()
    with pytest.raises(gfdit.Error):
        gfdit.all_reduce(torch.randn(3))
    with pytest.raises(gfdit.Error):
        gfdit.new_group([0])


@pytest.mark.timeout(60)
def test_transport_selection_without_a_device(world1):
    # A collective on a stream needs a world with a device transport; a host world says so instead of
    # touching the pointers, and a device heap needs one too.
    from gfdit import _C

    w = gfdit.get_world()._w
    assert w.device == -1
    x = torch.ones(4)
    for call in (
        lambda: w.all_reduce(w.world_group(), x.data_ptr(), 4, _C.DType.float32, _C.ReduceOp.sum, stream=1),
        lambda: w.barrier(w.world_group(), stream=1),
        lambda: w.all_gather(w.world_group(), x.data_ptr(), x.data_ptr(), 16, stream=1),
    ):
        with pytest.raises(gfdit.InvalidUsage, match="device transport"):
            call()
    with pytest.raises(gfdit.InvalidUsage, match="no device heap"):
        w.heap_alloc(16, device=True)
    w.check()  # nothing to report on a host world
    assert x.tolist() == [1.0] * 4


@pytest.mark.timeout(60)
def test_a_device_world_without_a_device_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the device world would be made")
    from gfdit import _C

    with pytest.raises(gfdit.Error, match="CUDA|device transport"):
        _C.World.create(0, 1, _store(), 5.0, 1 << 20, key_prefix="dev", device=0)
