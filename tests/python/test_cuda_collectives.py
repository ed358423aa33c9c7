"""gfdit collectives on CUDA tensors (a world made with device="cuda"), 2 and 4 ranks on the machine's GPUs
(one GPU shared by every rank when there is one): every collective and dtype against single-process torch on
the GPU, overlapping groups in one random order with CPU and CUDA collectives on the same edges and some on a
side stream, the device heap and one-sided puts, and the CPU/CUDA mixes a device world refuses.

Skipped without a GPU or without a gfdit build that has the CUDA transport (cuda_support).
"""

from __future__ import annotations

import cases_cuda as cc
import cuda_support
import pytest

pytestmark = cuda_support.requires_cuda
RUN = cuda_support.run_s()  # GFDIT_TEST_RUN_S, default 150 s
WORLDS = cuda_support.world_sizes()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("n", WORLDS)
def test_every_rank_on_its_device(world_pool, n):
    infos = cuda_support.world(world_pool, n, heap_bytes=64 << 20).run(cc.case_info, timeout=RUN)
    for info in infos:
        assert info["device"].startswith("cuda:"), info
        assert info["device"] == f"cuda:{info['current']}", info


@pytest.mark.timeout(600)
@pytest.mark.parametrize("n", WORLDS)
def test_collectives_every_dtype(world_pool, n):
    # 1 element, an odd size, and more than the staging slots hold per rank (the chunked path)
    sizes = [1, 4099, (5 << 20) // 4 + 7]
    checks = cuda_support.world(world_pool, n, heap_bytes=64 << 20).run(
        cc.case_collectives, 11 * n, list(cc.CUDA_DTYPES), sizes, timeout=RUN
    )
    assert all(c > 0 for c in checks)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("n", WORLDS)
def test_overlapping_groups_stress(world_pool, n):
    counts = cuda_support.world(world_pool, n, heap_bytes=64 << 20).run(
        cc.case_overlap_stress, 5 + n, 300, timeout=RUN
    )
    assert sum(c["cuda"] for c in counts) > 0 and sum(c["cpu"] for c in counts) > 0


@pytest.mark.timeout(600)
@pytest.mark.parametrize("n", WORLDS)
def test_device_heap_and_puts(world_pool, n):
    res = cuda_support.world(world_pool, n, heap_bytes=64 << 20).run(cc.case_device_heap, 3, timeout=RUN)
    if not res[0]["supported"]:
        pytest.skip(f"device heap refused: {res[0]['why']}")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("n", WORLDS)
def test_mixes_refused_and_world_usable(world_pool, n):
    got = cuda_support.world(world_pool, n, heap_bytes=64 << 20).run(cc.case_refusals, timeout=RUN)
    for r in got:
        for name in ("mix_all_gather", "mix_all_to_all", "mix_put"):
            assert "not a mix" in r[name], (name, r[name])
        if "other_device" in r:
            assert "world's device" in r["other_device"], r["other_device"]
        assert r["after"] == [float(n * (n + 1) // 2)] * 4
