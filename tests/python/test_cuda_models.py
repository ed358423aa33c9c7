"""Staged tiny models on CUDA: one denoise step at world 2 (Ulysses, Ring, CFG-parallel) and 4 (2 x 2)
against the same step on one member, with the state on the GPU and the schedule on the CPU (NOTE [state
placement]), then migrated from rank 0 to everyone with the device collectives (bit-identical).

Skipped without a GPU, without a gfdit build that has the CUDA transport, or without diffusers.
"""

from __future__ import annotations

import cases_cuda as cc
import cuda_support
import pytest

pytestmark = [
    cuda_support.requires_cuda,
    pytest.mark.skipif(
        bool(cuda_support.diffusers_missing()), reason=cuda_support.diffusers_missing() or "ok"
    ),
]
RUN = cuda_support.run_s()  # GFDIT_TEST_RUN_S, default 150 s
REL_TOL = 1e-3
SPECS = {
    2: [{"ulysses": 2, "ring": 1}, {"ulysses": 1, "ring": 2}, {"ulysses": 1, "ring": 1, "cfg": 2}],
    4: [{"ulysses": 2, "ring": 2}],
}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("model", ["tiny-wan", "tiny-qwen-image"])
@pytest.mark.parametrize("n", [n for n in cuda_support.world_sizes() if n in SPECS])
def test_denoise_step_matches_one_member(world_pool, model, n):
    world = cuda_support.world(world_pool, n, heap_bytes=64 << 20)
    for spec in SPECS[n]:
        res = world.run(cc.case_model_step, model, spec, 5, timeout=RUN)
        for r in res:
            assert r["rel"] <= REL_TOL, (spec, r)
            assert r["latent_device"].startswith("cuda"), r
            assert r["migrated_device"].startswith("cuda"), r
            assert r["schedule_device"] == "cpu", r
        assert len({r["digest"] for r in res} | {res[0]["par_digest"]}) == 1, (spec, res)
