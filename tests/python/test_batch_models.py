"""The batched denoising step (``StagedModel.denoise_batch``, NOTE [batched step] in gfdit.models.staged) of
tiny-wan and tiny-qwen-image, float32, against ``denoise_step`` on each state alone.

Single process, no world: three requests with different prompts (different text lengths for Qwen-Image),
seeds, guidance scales and step counts, one of them two steps ahead, take one batched step: each latent is
within 1e-5 of its own step (the sampler's history, guided model outputs, within 1e-4), the schedule, step and
sampler counters are its own, the inputs are unchanged, and the transformer ran one forward per guidance pass
(Qwen-Image: the texts padded and masked); a whole batched trajectory of three steps decodes to the images of
the requests alone within 1e-5; the same with Wan's multistep UniPC sampler (per-state history) and with Wan
2.2's two experts (states on either side of the boundary run as one sub-batch per expert, each with its own
guidance_scale_2 rule). Requests without guidance batch; a list of one is denoise_step bit for bit; an empty
list, a finished state, different sizes and a mix of guided and unguided requests are refused with
gfdit.InvalidUsage. Qwen-Image's plain transformer with padded, masked text gives each member its unpadded
output within 1e-5, and padding does not move the text's rotary rows.
World of 2 (spawned ranks): the batched step on [0, 1] with Ulysses 2 (Qwen-Image: one sub-batch per text
length) and with CFG-parallel (spec cfg=2, one rank per pass, the whole batch in each pass) equals the one-rank
steps within 1e-5, with bit-identical states on both members.
"""

from __future__ import annotations

import traceback

import mp_harness
import pytest
import staged_harness as sh

pytest.importorskip("diffusers")

TOL = 1e-5  # float32, max abs difference on the latent / on [0, 1] pixels
# the multistep solvers' history holds (guided) model outputs, whose rounding the guidance scale multiplies
HISTORY_TOL = 1e-4
NAMES = ("tiny-wan", "tiny-qwen-image")
# (prompt, seed, guidance_scale, num_inference_steps): the prompts' byte lengths differ (Qwen-Image's text
# lengths), the step counts too; every scale > 1
REQUESTS = [
    ("a small red fox", 1, 4.0, 4),
    ("a lighthouse on a cliff at dusk, waves breaking below", 2, 2.5, 5),
    ("cat", 3, 6.0, 4),
]


def _state(m, prompt: str, seed: int, scale: float, steps: int | None = None, **size):
    shape = m.latent_shape(**size)
    cond = m.encode(prompt, guidance_scale=scale)
    return m.initial_state(
        cond,
        m.init_latent(seed, shape),
        num_inference_steps=steps,
        guidance_scale=scale,
        grid=tuple(shape[2:]),
    )


def _mixed_states(m) -> list:
    """The REQUESTS' states, the first two steps ahead of the others."""
    states = [_state(m, *r) for r in REQUESTS]
    for k in range(2):
        states[0] = m.denoise_step(states[0], k)
    return states


def _max_diff(a, b) -> float:
    return float((a.double() - b.double()).abs().max())


class _Calls:
    """Counts a transformer's forward calls and their batch sizes."""

    def __init__(self, *modules) -> None:
        self.batches: list[int] = []
        self.handles = [m.register_forward_pre_hook(self._hook, with_kwargs=True) for m in modules]

    def _hook(self, _module, args, kwargs):
        hs = kwargs.get("hidden_states", args[0] if args else None)
        self.batches.append(int(hs.shape[0]))

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        for h in self.handles:
            h.remove()


def _check_same_step(got, want, tol: float = TOL) -> float:
    """The batched state against the state stepped alone: latent (and UniPC's last sample) within tol, the
    sampler's history within HISTORY_TOL, the rest equal; returns the latent's difference."""
    import torch

    assert got.step_idx == want.step_idx and got.grid == want.grid
    assert got.guidance_scale == want.guidance_scale and got.guidance_scale_2 == want.guidance_scale_2
    assert (got.lower_order_nums, got.this_order) == (want.lower_order_nums, want.this_order)
    assert torch.equal(got.sigmas, want.sigmas) and torch.equal(got.timesteps, want.timesteps)
    assert torch.equal(got.prompt_embeds, want.prompt_embeds)
    assert got.latent.dtype == want.latent.dtype and got.latent.shape == want.latent.shape
    err = _max_diff(got.latent, want.latent)
    assert err <= tol, err
    for name in ("history", "last_sample"):
        a, b = getattr(got, name), getattr(want, name)
        assert (a is None) == (b is None), name
        if a is not None:
            assert a.shape == b.shape and a.dtype == b.dtype
            assert _max_diff(a, b) <= (HISTORY_TOL if name == "history" else tol), (name, _max_diff(a, b))
    if want.history_timesteps is not None:
        assert torch.equal(got.history_timesteps, want.history_timesteps)
    return err


# ------------------------------------------------------------------------ single process
@pytest.mark.parametrize("name", [*NAMES, "tiny-wan@unipc"])
def test_batched_step_equals_each_alone(name):
    import gfdit.models as gm

    m = sh.model(name)
    states = _mixed_states(m)
    assert [s.step_idx for s in states] == [2, 0, 0]
    if name == "tiny-qwen-image":
        assert len({s.prompt_embeds.shape[1] for s in states}) == 3  # three text lengths
    before = [gm.state_digest(s) for s in states]
    with _Calls(m.transformer) as calls:
        got = m.denoise_batch(states)
    assert calls.batches == [3, 3]  # one forward per guidance pass (Qwen-Image: the texts padded)
    assert [gm.state_digest(s) for s in states] == before  # the inputs are not modified
    want = [m.denoise_step(s, s.step_idx) for s in states]
    errs = [_check_same_step(g, w) for g, w in zip(got, want)]
    print(f"{name} batched step: max |latent difference| per state {errs}")
    # the next batched step from there (the first state's last, with the sampler's history of three steps)
    again = m.denoise_batch(got)
    assert again[0].done
    for g, w in zip(again, [m.denoise_step(s, s.step_idx) for s in got]):
        _check_same_step(g, w)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", NAMES)
def test_batched_trajectory_decodes_as_each_alone(name):
    m = sh.model(name)
    states = [_state(m, prompt, seed, scale, 3) for prompt, seed, scale, _ in REQUESTS]
    alone = list(states)
    for k in range(3):
        states = m.denoise_batch(states)
        alone = [m.denoise_step(s, k) for s in alone]
        for g, w in zip(states, alone):
            _check_same_step(g, w)
    assert all(s.done for s in states)
    errs = [_max_diff(m.decode(g), m.decode(w)) for g, w in zip(states, alone)]
    print(f"{name} batched trajectory: max |pixel difference| per request {errs}")
    assert max(errs) <= TOL, errs


@pytest.mark.parametrize("name", NAMES)
def test_unguided_batch_one_state_and_refusals(name):
    import gfdit
    import gfdit.models as gm

    m = sh.model(name)
    plain = [_state(m, prompt, seed, 1.0, steps) for prompt, seed, _, steps in REQUESTS]
    plain[1] = m.denoise_step(plain[1], 0)
    with _Calls(m.transformer) as calls:
        got = m.denoise_batch(plain)
    assert calls.batches == [3]  # one pass
    for g, w in zip(got, [m.denoise_step(s, s.step_idx) for s in plain]):
        assert g.negative_prompt_embeds is None
        _check_same_step(g, w)
    # a list of one is denoise_step, bit for bit
    guided = _mixed_states(m)
    for s in (guided[0], guided[1], plain[1]):
        (one,) = m.denoise_batch([s])
        assert gm.state_digest(one) == gm.state_digest(m.denoise_step(s, s.step_idx))
    # refused
    with pytest.raises(gfdit.InvalidUsage, match="kept apart by rule"):
        m.denoise_batch([guided[0], plain[0]])
    with pytest.raises(gfdit.InvalidUsage, match="empty list"):
        m.denoise_batch([])
    with pytest.raises(gfdit.InvalidUsage, match="list of DenoiseState"):
        m.denoise_batch(guided[0])
    size = {"height": 2 * m.defaults.height}
    with pytest.raises(gfdit.InvalidUsage, match="latent grid"):
        m.denoise_batch([guided[1], _state(m, "a bigger one", 4, 4.0, **size)])
    done = guided[2]
    for k in range(done.num_steps):
        done = m.denoise_step(done, k)
    with pytest.raises(gfdit.InvalidUsage, match="state 1 has finished"):
        m.denoise_batch([guided[1], done])
    with pytest.raises(gfdit.InvalidUsage, match="finished"):
        m.denoise_batch([done])


def test_wan_two_experts_split_into_sub_batches():
    # Wan 2.2 A14B: transformer above boundary_ratio * 1000, transformer_2 below, each a sub-batch; the
    # low-noise steps use each state's guidance_scale_2 when it has one
    m = sh.two_experts(sh.model("tiny-wan@unipc"), sh.SCHEDULERS["unipc"])
    shape = m.latent_shape()

    def state(prompt, seed, scale, scale_2):
        cond = m.encode(prompt, guidance_scale=scale)
        return m.initial_state(
            cond,
            m.init_latent(seed, shape),
            num_inference_steps=6,
            guidance_scale=scale,
            guidance_scale_2=scale_2,
        )

    states = [state("a fox", 1, 4.0, 3.0), state("a dog", 2, 5.0, None), state("a cat", 3, 3.0, 2.0)]
    high = [float(t) >= 875 for t in states[0].timesteps]
    late = high.index(False)  # the first low-noise step
    for k in range(late):
        states[0] = m.denoise_step(states[0], k)
    states[2] = m.denoise_step(states[2], 0)
    for k in range(late + 1):
        states[1] = m.denoise_step(states[1], k)
    assert high[states[2].step_idx] and not high[states[0].step_idx]
    # states 0 and 1 on transformer_2, state 2 on transformer: two sub-batches, in that order
    with _Calls(m.transformer, m.transformer_2) as calls:
        got = m.denoise_batch(states)
    assert sorted(calls.batches) == [1, 1, 2, 2], calls.batches
    for g, w in zip(got, [m.denoise_step(s, s.step_idx) for s in states]):
        _check_same_step(g, w)


def test_qwen_masked_text_equals_unpadded():
    import torch

    m = sh.model("tiny-qwen-image")
    model = m.transformer
    short = m.encode("a fox", guidance_scale=1.0).prompt_embeds
    long = m.encode("a lighthouse on a cliff at dusk", guidance_scale=1.0).prompt_embeds
    n, longest = short.shape[1], long.shape[1]
    assert n < longest
    _, h, w = m.latent_shape()[2:]
    img_shapes = [[(1, h // 2, w // 2)]]
    g = torch.Generator().manual_seed(5)
    x = torch.randn((2, (h // 2) * (w // 2), int(model.config.in_channels)), generator=g)
    t = torch.tensor([0.7, 0.3])
    text = torch.zeros((2, longest, short.shape[2]))
    text[0, :n], text[1] = short[0], long[0]
    mask = torch.zeros((2, longest), dtype=torch.bool)
    mask[0, :n], mask[1] = True, True
    with torch.no_grad():
        batched = model(
            hidden_states=x,
            timestep=t,
            encoder_hidden_states=text,
            encoder_hidden_states_mask=mask,
            img_shapes=img_shapes * 2,
            return_dict=False,
        )[0]
        for i, emb in enumerate((short, long)):
            alone = model(
                hidden_states=x[i : i + 1],
                timestep=t[i : i + 1],
                encoder_hidden_states=emb,
                img_shapes=img_shapes,
                return_dict=False,
            )[0]
            assert _max_diff(batched[i : i + 1], alone) <= TOL
        # without the mask the padding matters: the check above is not vacuous
        unmasked = model(
            hidden_states=x[:1],
            timestep=t[:1],
            encoder_hidden_states=text[:1],
            img_shapes=img_shapes,
            return_dict=False,
        )[0]
        assert _max_diff(unmasked, batched[:1]) > 1e-3
        # the text's rotary rows do not move with the padding: they start after the image's
        _, txt_short = model.pos_embed(img_shapes, max_txt_seq_len=n, device=x.device)
        _, txt_long = model.pos_embed(img_shapes, max_txt_seq_len=longest, device=x.device)
        assert torch.equal(txt_long[:n], txt_short)


# ------------------------------------------------------------------------ world of 2
def case_batch_on_pair(ctx, name: str, spec: dict) -> dict:
    """One batched step of the mixed states on [0, 1] with ``spec``: the next states' latents, digests and
    the transformer calls' batch sizes on this rank. Failures are returned, not raised."""
    import gfdit
    import gfdit.models as gm
    import torch

    torch.set_num_threads(1)
    out: dict = {"rank": ctx.rank, "error": None}
    try:
        m = sh.model(name)
        states = _mixed_states(m)
        with _Calls(m.transformer) as calls:
            got = m.denoise_batch(states, group=gfdit.new_group([0, 1]), spec=gfdit.ParallelSpec(**spec))
        out["latents"] = [s.latent for s in got]
        out["digests"] = [gm.state_digest(s) for s in got]
        out["batches"] = calls.batches
    except Exception as exc:  # noqa: BLE001 - reported to the test
        out["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
    return out


@pytest.fixture(scope="module")
def world(world_pool):
    mp_harness.skip_if_too_big(2)
    return world_pool.get(2, timeout=60.0, gloo=False)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("spec", [{"ulysses": 2}, {"cfg": 2}], ids=["ulysses2", "cfg2"])
def test_batched_step_on_a_pair_equals_one_rank(world, name, spec):
    reports = world.run(case_batch_on_pair, name, spec, timeout=120)
    errors = [r["error"] for r in reports if r["error"]]
    assert not errors, "\n".join(errors)
    assert reports[0]["digests"] == reports[1]["digests"], "the members hold different states"
    m = sh.model(name)
    want = [m.denoise_step(s, s.step_idx) for s in _mixed_states(m)]
    errs = [_max_diff(g, w.latent) for g, w in zip(reports[0]["latents"], want)]
    print(f"{name} {spec}: max |latent difference| per state {errs}; calls {[r['batches'] for r in reports]}")
    assert max(errs) <= TOL, errs
    if spec.get("cfg") == 2:  # each rank runs its pass for the whole batch (one member: Qwen-Image masks)
        assert all(r["batches"] == [3] for r in reports)
    elif name == "tiny-wan":
        assert all(r["batches"] == [3, 3] for r in reports)
    else:  # gfdit.attention takes no mask: the three text lengths apart, the " " negatives together
        assert all(r["batches"] == [1, 1, 1, 3] for r in reports)
