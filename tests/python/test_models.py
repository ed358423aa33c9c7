"""gfdit.models.parallelize against the plain single-process model, on worlds of 2 and 4 ranks.

Tiny Wan and Qwen-Image transformers (diffusers' own classes, seeded random weights, float32) run with
every layout: Ulysses, Ring, USP in both placements and Torus, relative error <= 1e-4 against the plain
model on the same inputs; uneven heads (models built with 3, 5 or 6 heads where the Ulysses degree does
not divide them); uneven shards (45 Wan tokens, 42 Qwen-Image tokens), batch 2, Wan 2.1 I2V image
context, Wan 2.2 TI2V per-token timesteps, Qwen-Image-Edit's zero_cond_t with a second image, an all-ones
text mask; a sequence of calls whose group and spec change from call to call (sub-groups in non-sorted
order, a group of one) on the same wrapper; bad calls refused with gfdit.InvalidUsage on every rank; unsupported models refused.

The ranks are persistent processes (mp_harness.World); each world runs its cases in one batch per test.
"""

from __future__ import annotations

import models_harness as mh
import mp_harness
import pytest

pytest.importorskip("diffusers")

GFDIT_TIMEOUT = 30.0
RUN = 120.0


def _grids(n: int) -> list:
    """Every layout of a group of n: (ulysses, ring, mode, placement)."""
    out = []
    for mode in ("usp", "torus"):
        out += [(n, 1, mode, "ulysses-low"), (1, n, mode, "ulysses-low")]
        if n == 4:
            out += [(2, 2, mode, "ulysses-low"), (2, 2, mode, "ring-low")]
    return out


def _name(case: dict) -> str:
    spec = case.get("spec")
    layout = (
        "default" if spec is None else f"u{spec['ulysses']}r{spec['ring']}-{spec['mode']}-{spec['placement']}"
    )
    return f"{case['model']}-{layout}-g{case.get('group')}-{case.get('inputs', {})}-{case.get('config', {})}"


def _layout_cases(n: int) -> list:
    cases = []
    seed = 100 * n
    for u, r, mode, placement in _grids(n):
        spec = {"ulysses": u, "ring": r, "mode": mode, "placement": placement}
        for model in ("wan", "qwen"):
            seed += 1
            cases.append({"model": model, "seed": seed, "spec": spec})
    usp = {"ulysses": n, "ring": 1, "mode": "usp", "placement": "ulysses-low"}
    ring = {"ulysses": 1, "ring": n, "mode": "usp", "placement": "ulysses-low"}
    variants = [
        {"model": "wan", "spec": usp, "inputs": {"batch": 2}},
        {"model": "wan", "spec": ring, "inputs": {"per_token_timestep": True}},
        {"model": "wan", "spec": usp, "inputs": {"frames": 2, "height": 4, "width": 4}},  # 8 tokens
        {
            "model": "wan",
            "spec": ring,
            "config": {"image_dim": 8, "added_kv_proj_dim": 64},  # Wan 2.1 I2V
            "inputs": {"text": 512, "image_tokens": 3},
        },
        {"model": "qwen", "spec": ring, "inputs": {"batch": 2, "text": 3}},
        {"model": "qwen", "spec": usp, "inputs": {"mask": True}},
        {
            "model": "qwen",
            "spec": usp,
            "config": {"zero_cond_t": True},
            "inputs": {"extra_shapes": ((1, 4, 3),)},
        },
    ]
    for case in variants:
        seed += 1
        cases.append({**case, "seed": seed})
    # Uneven heads: the Ulysses degree does not divide the model's heads.
    for heads, (u, r, mode, placement), group in _uneven_head_layouts(n):
        for model in ("wan", "qwen"):
            seed += 1
            spec = {"ulysses": u, "ring": r, "mode": mode, "placement": placement}
            cases.append(
                {
                    "model": model,
                    "seed": seed,
                    "spec": spec,
                    "config": {"num_attention_heads": heads},
                    "group": group,
                }
            )
    for case in cases:
        case["name"] = _name(case)
    return cases


def _uneven_head_layouts(n: int) -> list:
    """(heads, (ulysses, ring, mode, placement), group) with a Ulysses degree that does not divide the heads."""
    if n == 2:
        return [
            (3, (2, 1, "usp", "ulysses-low"), None),
            (3, (2, 1, "torus", "ulysses-low"), None),
            (5, (2, 1, "torus", "ulysses-low"), None),  # Torus chunks of 2 and 1 heads
        ]
    return [
        (6, (4, 1, "usp", "ulysses-low"), None),
        (6, (4, 1, "torus", "ulysses-low"), None),
        (3, (2, 2, "usp", "ulysses-low"), None),
        (3, (2, 2, "usp", "ring-low"), None),
        (5, (2, 2, "torus", "ring-low"), None),
        (5, (3, 1, "usp", "ulysses-low"), [3, 0, 1]),
        (5, (4, 1, "usp", "ulysses-low"), [1, 3, 0, 2]),
    ]


def _sequence_cases(n: int) -> list:
    """Calls on the same wrappers whose group and spec change every time (non-members skip a call)."""

    def spec(u, r, mode="usp", placement="ulysses-low"):
        return {"ulysses": u, "ring": r, "mode": mode, "placement": placement}

    if n == 4:
        steps = [
            ([0, 1, 2, 3], spec(2, 2)),
            ([2, 0], spec(1, 2)),
            ([1], None),
            ([3, 1, 0, 2], spec(2, 2, "torus", "ring-low")),
            ([3, 2], spec(2, 1)),
            ([1, 3, 0], spec(1, 3, "torus")),
            (None, None),
            ([0, 1, 2, 3], spec(4, 1, "torus")),
        ]
    else:
        steps = [
            ([0, 1], spec(2, 1)),
            ([1], None),
            ([1, 0], spec(1, 2, "torus")),
            (None, None),
            ([0], spec(1, 1)),
        ]
    cases = []
    for i, (group, sp) in enumerate(steps):
        for model in ("wan", "qwen"):
            case = {"model": model, "seed": 1000 + 10 * i, "group": group, "spec": sp}
            case["name"] = f"step{i}-" + _name(case)
            cases.append(case)
    return cases


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"ws{n}")
def world(request, world_pool):
    mp_harness.skip_if_too_big(request.param)
    return world_pool.get(request.param, timeout=GFDIT_TIMEOUT, gloo=False)


def _run(world, cases, batches=1):
    per = (len(cases) + batches - 1) // batches
    reports = []
    for i in range(0, len(cases), per):
        for rank_reports in world.run(mh.case_batch, cases[i : i + per], timeout=RUN):
            reports += rank_reports
    bad = [r for r in reports if not r["ok"]]
    assert not bad, "\n".join(
        f"{r['name']} rank {r['rank']}: " + (r.get("error") or f"err {r['err']:.3g} restored {r['restored']}")
        for r in bad
    )
    return reports


def _members(case: dict, n: int) -> int:
    return len(case["group"]) if case.get("group") else n


@pytest.mark.timeout(240)
def test_every_layout_matches_plain_model(world):
    cases = _layout_cases(world.world_size)
    reports = _run(world, cases)
    assert len(reports) == sum(_members(c, world.world_size) for c in cases), "some cases did not run"


@pytest.mark.timeout(240)
def test_group_and_spec_change_between_calls(world):
    cases = _sequence_cases(world.world_size)
    reports = _run(world, cases)
    assert len(reports) == sum(_members(c, world.world_size) for c in cases), "some cases did not run"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "kind,needle",
    [
        ("spec_size", "members, but the group"),
        ("heads", "fewer than the Ulysses degree"),
        ("padded_mask", "text mask"),
        ("bad_args", "bad arguments"),
    ],
)
def test_bad_calls_refused_on_every_rank(world, kind, needle):
    results = world.run(mh.case_bad_call, kind, timeout=60)
    for rank, res in enumerate(results):
        assert needle in res["message"], f"rank {rank}: {res['message']}"
        assert "InvalidUsage" in res["types"] and "ValueError" in res["types"], f"rank {rank}: {res}"
        assert res["after_err"] <= mh.F32_RTOL and res["restored"], f"rank {rank}: {res}"


# ------------------------------------------------------------------------ single-process (no world needed)
def test_unsupported_models_refused():
    import gfdit
    import gfdit.models as gm
    import torch

    for thing in (torch.nn.Linear(2, 2), object(), None):
        with pytest.raises(gfdit.InvalidUsage, match="unsupported model"):
            gm.parallelize(thing)
    from diffusers import WanTransformer3DModel
    from gfdit.models.tiny import WAN_CONFIG

    class NotQuiteWan(WanTransformer3DModel):  # a subclass may change forward: refused, not guessed at
        pass

    with pytest.raises(gfdit.InvalidUsage, match="NotQuiteWan"):
        gm.parallelize(NotQuiteWan(**WAN_CONFIG))


def test_wrapper_shares_weights():
    import gfdit.models as gm
    from gfdit.models import tiny

    model = tiny.tiny_wan(0)
    wrapper = gm.parallelize(model)
    assert wrapper.module is model and gm.parallelize(wrapper) is wrapper
    assert all(a is b for a, b in zip(wrapper.parameters(), model.parameters()))
    assert sum(1 for _ in wrapper.parameters()) == sum(1 for _ in model.parameters())


def test_even_splits():
    from gfdit.models import even_splits

    assert even_splits(45, 4) == [12, 11, 11, 11]
    assert even_splits(3, 4) == [1, 1, 1, 0]
    assert even_splits(42, 2) == [21, 21]
