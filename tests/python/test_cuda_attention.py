"""gfdit.attention on CUDA tensors: every mode (Ulysses, Ring, USP in both placements, Torus) at 2 and 4 ranks
sharing the machine's GPU, against single-process attention on the GPU (torch's scaled_dot_product_attention
over the whole sequence) and a float64 reference; joint tokens, uneven shards and heads, float32 and bfloat16;
cached plans, whose calls must not synchronise with the device (torch.cuda.set_sync_debug_mode("error")).

Skipped without a GPU or without a gfdit build that has the CUDA transport (cuda_support).
"""

from __future__ import annotations

import attn_harness as ah
import cuda_support
import pytest

pytestmark = cuda_support.requires_cuda
RUN = cuda_support.run_s()  # GFDIT_TEST_RUN_S, default 150 s
WORLDS = cuda_support.world_sizes()


def _uneven(total: int, n: int) -> list[int]:
    """n uneven shard lengths summing to total (the last one takes the rest)."""
    head = [3 + 5 * i for i in range(n - 1)]
    return head + [total - sum(head)]


def cuda_cases(n: int) -> list:
    grids = [(n, 1), (1, n)] + ([(2, n // 2)] if n == 4 else [])
    cases = []
    seed = 0
    shapes = (
        {"shape": (1, 512, 4, 64), "dtype": "float32", "rtol": 1e-4},
        {"shape": (1, 1024, 8, 128), "dtype": "bfloat16", "atol": 2e-2, "cached": True, "no_sync": True},
        # uneven shards, 5 heads (uneven at Ulysses 2 and 4), joint tokens
        {"shape": (2, 60, 5, 32), "splits": _uneven(60, n), "joint": 9, "dtype": "float32", "rtol": 1e-4},
    )
    for u, r in grids:
        for mode in ("usp", "torus"):
            placements = ["ulysses-low", "ring-low"] if u > 1 and r > 1 else ["auto"]
            for placement in placements:
                spec = {"ulysses": u, "ring": r, "mode": mode, "placement": placement}
                for kw in shapes:
                    seed += 1
                    name = f"cuda-n{n}-u{u}r{r}-{mode}-{placement}-{kw['shape']}-{kw['dtype']}"
                    cases.append({"name": name, "spec": spec, "seed": 900 + seed, "device": "cuda", **kw})
    return cases


@pytest.mark.timeout(900)
@pytest.mark.parametrize("n", WORLDS)
def test_attention_every_mode(world_pool, n):
    cases = cuda_cases(n)
    reports = cuda_support.world(world_pool, n, heap_bytes=256 << 20).run(ah.case_batch, cases, timeout=RUN)
    flat = [rep for per_rank in reports for rep in per_rank]
    bad = [rep for rep in flat if not rep["ok"]]
    assert not bad, bad[:5]
    assert len(flat) == len(cases) * n
    # cached plans: the second call of a cached case exchanges no metadata (0 all_gathers besides Torus's)
    for rep in flat:
        if "cached" in rep["name"] and "usp" in rep["name"]:
            assert rep["all_gathers"][1] == 0, rep
