"""Patch-parallel VAE decode (NOTE [patch-parallel decode] in gfdit.models.patch_decode): a group of ranks
decodes one latent, each member a band of its rows, and every member gets the whole output.

World of 3 (spawned ranks): for small VAEs of each family the pipelines use (Wan 2.1/2.2 with 16 latent
channels, Wan 2.2 TI2V-5B's 48-channel VAE with its residual up blocks and patch size 2, Qwen-Image's VAE),
the decode on [0, 1], [0, 1, 2] and [2, 0], with latents whose rows do not divide evenly, equals the VAE's
own one-rank decode within 1e-5 on [0, 1] pixels in float32 (every member's copy of the output); in
bfloat16 within one level of an 8-bit image (BF16_BOUND). The staged models' decode (tiny-wan, tiny-qwen-image: the latent's
un-normalisation, then the VAE) on a group equals their one-rank decode. A group with more members than the
latent has rows is refused on every member with gfdit.InvalidUsage naming the sizes.
"""

from __future__ import annotations

import cases_decode as cd
import mp_harness
import pytest

pytest.importorskip("diffusers")

F32_BOUND = 1e-5  # on [0, 1] pixels
# bfloat16: less than one level of an 8-bit image. On this CPU backend the bands give bit-identical output (the
# convolutions accumulate each output in float32 whatever the input's extent); a GPU library that picks its
# convolution algorithm by shape may round differently, which this bound leaves room for.
BF16_BOUND = 1 / 255
GROUPS = ([0, 1], [0, 1, 2], [2, 0])
# (family, latent frames, rows, cols): rows that 2 and 3 members do not split evenly
SHAPES = [("wan", 3, 7, 5), ("wan22-48", 3, 5, 4), ("qwen-image", 1, 7, 6)]


@pytest.fixture(scope="module")
def world(world_pool):
    mp_harness.skip_if_too_big(3)
    return world_pool.get(3, timeout=60.0, gloo=False)


def _pixels_error(out, ref) -> float:
    """Largest difference on [0, 1] pixels of two [-1, 1] VAE outputs."""
    return float((out - ref).abs().max()) * 0.5


@pytest.mark.multirank(3)
@pytest.mark.parametrize("family,frames,rows,cols", SHAPES)
def test_group_decode_equals_the_one_rank_decode(world, family, frames, rows, cols):
    for ranks in GROUPS:
        res = world.run(cd.case_decode, family, frames, rows, cols, ranks, timeout=300)
        ref = res[ranks[0]]["ref"]
        assert tuple(res[ranks[0]]["out"].shape) == tuple(ref.shape)
        assert float(ref.std()) > 0.1, "the reference output is flat: the comparison would say nothing"
        for k in ranks:
            err = _pixels_error(res[k]["out"], ref)
            assert err <= F32_BOUND, f"{family} on {ranks}: member {k} differs by {err:.2e} from one rank"
        assert all(res[k] is None for k in range(3) if k not in ranks)


@pytest.mark.multirank(3)
@pytest.mark.parametrize("family", ["wan", "qwen-image"])
def test_bfloat16_group_decode_is_close(world, family):
    _, frames, rows, cols = next(s for s in SHAPES if s[0] == family)
    res = world.run(cd.case_decode, family, frames, rows, cols, [0, 1, 2], "bfloat16", timeout=300)
    ref = res[0]["ref"]
    for k in range(3):
        err = _pixels_error(res[k]["out"], ref)
        assert err <= BF16_BOUND, f"bfloat16 {family}: member {k} differs by {err:.3f} from one rank"


@pytest.mark.multirank(3)
@pytest.mark.parametrize("name,frames", [("tiny-wan", 3), ("tiny-qwen-image", 1)])
def test_staged_model_decode_on_a_group(world, name, frames):
    res = world.run(cd.case_model_decode, name, 6, 4, frames, [1, 2, 0], timeout=300)
    ref = res[1]["ref"]
    for k in range(3):
        err = float((res[k]["out"] - ref).abs().max())
        assert err <= F32_BOUND, f"{name}: member {k} differs by {err:.2e} from one rank"


@pytest.mark.multirank(3)
def test_a_group_larger_than_the_latent_is_refused(world):
    messages = world.run(cd.case_refused, "wan", 2, [0, 1, 2], timeout=120)
    for m in messages:
        assert "decode group of 3 ranks" in m and "2)" in m, m
    # the world is still usable
    res = world.run(cd.case_decode, "wan", 1, 4, 4, [0, 1], timeout=120)
    assert _pixels_error(res[0]["out"], res[0]["ref"]) <= F32_BOUND


# ------------------------------------------------------------------------ the engine
class _OnBoth:
    """A gfdit.Policy (made on first use) that runs each request's steps on ranks [1, 0] with the decode
    degree it is given (NOTE [parallel decode] in src/runtime/control.cpp)."""

    @staticmethod
    def make(decode_degree: int):
        import gfdit

        class OnBoth(gfdit.Policy):
            def name(self) -> str:
                return f"on-both-decode-{decode_degree}"

            def schedule(self, view):
                if not {0, 1} <= set(view.free_ranks) or not view.ready:
                    return []
                r = view.ready[0]
                return [
                    gfdit.Decision(r.id, [1, 0], gfdit.Layout(ulysses=2), r.num_steps - r.step, decode_degree)
                ]

        return OnBoth()


@pytest.mark.multirank(2)
def test_the_engine_decodes_on_the_decisions_degree_with_the_same_output():
    """Steps on [1, 0]; the decode on both (decode_degree 2) gives the output of the decode on one
    (decode_degree 1) within 1e-5; a decode degree past the latent's rows fails that request only, naming
    both numbers."""
    import gfdit

    req = gfdit.Request(prompt="a heron in the reeds", height=64, width=64, num_frames=5, seed=4)
    outs, decodes = {}, {}
    for degree in (1, 2):
        with gfdit.Engine(model="tiny-wan", world_size=2, policy=_OnBoth.make(degree), timeout_s=60.0) as eng:
            res = eng.submit(req).result(timeout=300)
        outs[degree] = res.output
        decodes[degree] = [s.ranks for s in res.timeline if s.kind == "decode"]
    assert decodes == {1: [[1]], 2: [[1, 0]]}  # the holders in the group's order
    err = float((outs[2] - outs[1]).abs().max())
    assert err <= F32_BOUND, f"decode on two ranks differs by {err:.2e} from one"
    with gfdit.Engine(model="tiny-wan", world_size=2, policy=_OnBoth.make(9), timeout_s=60.0) as eng:
        with pytest.raises(gfdit.RequestFailed, match=r"decode_degree 9 .* 8 rows"):
            eng.submit(req).result(timeout=300)  # 64 px: 8 latent rows
