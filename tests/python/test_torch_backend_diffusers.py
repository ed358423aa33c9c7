"""Third-party parallel DiT code, unchanged, on the "gfdit" torch.distributed backend: diffusers' context
parallelism (Ulysses and Ring) on tiny Wan and Qwen-Image transformers, and yunchang's USP attention. Each
runs with ``init_process_group("gfdit")`` and with ``init_process_group("gloo")``; the outputs must agree
with each other and with the plain one-process computation."""

from __future__ import annotations

import importlib.util

import cases_diffusers_cp as cases
import mp_harness
import pytest
import torch

pytest.importorskip("diffusers")
pytestmark = [pytest.mark.timeout(600)]

WAN = ("wan", {"frames": 2, "height": 8, "width": 8})  # 32 tokens
QWEN = ("qwen", {"height": 8, "width": 8, "text": 6})  # 64 (packed) image tokens; 6 text tokens

DIFFUSERS = [(m, inp, u, r) for (m, inp) in (WAN, QWEN) for (u, r) in ((2, 1), (1, 2))]
YUNCHANG = [(2, 2, 1), (2, 1, 2), (4, 2, 2)]  # (world, ulysses, ring)
HAVE_YUNCHANG = importlib.util.find_spec("yunchang") is not None

_RESULTS: dict = {}


def _run(world_pool, world_size: int, backend: str) -> dict:
    """Every case of one (world size, backend), in one rank world; cached for the module."""
    key = (world_size, backend)
    if key not in _RESULTS:
        if world_size > mp_harness.MAX_WORLD:
            pytest.skip(f"world size {world_size} above GFDIT_TEST_MAX_WORLD")
        w = world_pool.get(world_size, gloo=backend == "gloo", init_gfdit=False)
        res = {}
        if world_size == 2:
            for m, inp, u, r in DIFFUSERS:
                res[("diffusers", m, u, r)] = w.run(cases.diffusers_cp, backend, m, u, r, inp, timeout=300)[0]
        for ws, u, r in YUNCHANG if HAVE_YUNCHANG else ():
            if ws == world_size:
                res[("yunchang", u, r)] = w.run(cases.yunchang_usp, backend, u, r, 32, 4, 16, timeout=300)[0]
        _RESULTS[key] = res
    return _RESULTS[key]


@pytest.mark.parametrize(
    "model,inputs,ulysses,ring", DIFFUSERS, ids=lambda v: str(v) if not isinstance(v, dict) else ""
)
def test_diffusers_context_parallel(world_pool, model, inputs, ulysses, ring):
    gf = _run(world_pool, 2, "gfdit")[("diffusers", model, ulysses, ring)]
    gl = _run(world_pool, 2, "gloo")[("diffusers", model, ulysses, ring)]
    scale = gf["plain"].abs().max().item()
    assert torch.allclose(gf["out"], gl["out"], rtol=0, atol=1e-6 * scale), (
        (gf["out"] - gl["out"]).abs().max()
    )
    assert (gf["out"] - gf["plain"]).abs().max().item() <= 1e-5 * scale
    assert torch.equal(gf["plain"], gl["plain"])  # the same model and inputs on both sides


@pytest.mark.parametrize("world_size,ulysses,ring", YUNCHANG)
def test_yunchang_usp(world_pool, world_size, ulysses, ring):
    if not HAVE_YUNCHANG:
        pytest.skip("yunchang is not installed")
    gf = _run(world_pool, world_size, "gfdit")[("yunchang", ulysses, ring)]
    gl = _run(world_pool, world_size, "gloo")[("yunchang", ulysses, ring)]
    assert torch.allclose(gf["out"], gl["out"], rtol=0, atol=1e-6)
    assert (gf["out"].double() - gf["ref"]).abs().max().item() < 1e-5
