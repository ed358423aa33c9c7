"""Step caches (FBCache, TeaCache) in the portable denoise state, gfdit.models.cache (its notes: see
NOTE [step cache algorithms], see NOTE [sharded step cache]).

Models: deep tiny Wan and Qwen-Image folders (gfdit.models.loading.save_deep: 24 blocks in diffusers' default
initialisation, NOTE [deep tiny models]), float32, at their default sizes (Wan 32x48x9: 18 tokens; Qwen-Image
48x80: 15 tokens), 8-12 steps with guidance 4.

Single process:
- Caching off: a trajectory with ``cache=None`` is bit for bit the one without the argument (state digests),
  batches included.
- fbcache against cache-dit 1.5.3 itself (``cache_dit.enable_cache`` with DBCacheConfig(Fn_compute_blocks=1,
  Bn_compute_blocks=0, enable_separate_cfg=True) on diffusers' WanPipeline / QwenImagePipeline over the same
  folder, its own transformer object): the same steps reuse the cache in each pass (cache-dit's cached_steps
  and cfg_cached_steps), with max_skip unbounded and at 1 and 2 against max_continuous_cached_steps, and the
  final latents agree within 1e-5 of their largest value (float32; both run the same float32 ops in the same
  order on one rank, and gfdit's only different op is the decision's sum in float64 where cache-dit takes
  float32 means, which moves no decision here: in practice the latents are bit-identical).
- teacache against a reference written here: a plain loop over the diffusers blocks (TeaCache's own way,
  as TeaCache4Wan2.1 replaces WanModel.forward), driven by the pipelines (WanPipeline / QwenImagePipeline) with
  their even / odd transformer calls as the two passes: the same steps skip per pass, latents within 1e-5.
- Batches: each state of a denoise_batch (fbcache at two thresholds, teacache, no cache; several prompts)
  equals its run alone within 1e-5 and reuses the cache at the same steps.
- Bad input: a kind the model lacks, a spec without the attributes, Qwen-Image with zero_cond_t or ControlNet
  residuals: gfdit.InvalidUsage naming ``cache``. remap_cache_ranks renumbers layouts and resets a pass that
  lost a rank.
World of 2: the decision is one value on every member, with members whose local ratios lie on both sides of
the threshold (crafted sums through ``agreed_ratios``; a Qwen-Image trajectory on uneven shards, 8 + 7 tokens,
whose threshold is put between the members' local ratios at the first decision): identical on every member
and equal to the one-rank run's.
World of 4: schedules of groups with gathers and migrations (4 ranks cfg 1 -> gather -> 2 ranks CFG-parallel
-> gather -> migrate to 1; and with no gather, where the cache starts again) equal the one-rank cached run
(within 1e-5) and reuse the cache at the same steps, every member agreeing on the counters.
"""

from __future__ import annotations

import dataclasses
import traceback

import mp_harness
import pytest

pytest.importorskip("diffusers")

import torch  # noqa: E402

PROMPT = "a small red fox jumps over a lazy dog"
NEGATIVE = "blurry, static"
TOL = 1e-5  # max |latent difference| relative to the latent's largest value (float32)
LOADERS = {"wan": "wan2.1", "qwen": "qwen-image"}
DEEP = {"wan": "tiny-wan", "qwen": "tiny-qwen-image"}

_MODELS: dict = {}


def _model(folder: str, family: str):
    """The staged model of a deep folder, loaded once per process."""
    import gfdit.models as gm

    key = (folder, family)
    if key not in _MODELS:
        _MODELS[key] = gm.load(LOADERS[family], path=folder)
    return _MODELS[key]


def _start(m, seed: int, steps: int, cache, prompt: str = PROMPT):
    shape = m.latent_shape()
    cond = m.encode(prompt, negative_prompt=NEGATIVE, guidance_scale=4.0)
    kwargs = {} if cache is None else {"cache": cache}
    return m.initial_state(
        cond,
        m.init_latent(seed, shape),
        num_inference_steps=steps,
        guidance_scale=4.0,
        grid=tuple(shape[2:]),
        **kwargs,
    )


def _flags(state) -> tuple[bool, ...]:
    """Which passes reused the cache at the step that made ``state`` (a pass's skips count is 0 after a full
    step)."""
    return tuple(pc.skips > 0 for pc in state.cache.pass_caches)


def _counters(state) -> tuple[int, int, int]:
    c = state.cache
    return c.cached_steps, c.cached_passes, c.passes


def _rel(a, b) -> float:
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


def _alone(m, seed: int, steps: int, cache, prompt: str = PROMPT):
    """The one-process run (no gfdit world): the final state and each step's flags."""
    state = _start(m, seed, steps, cache, prompt)
    flags = []
    for k in range(steps):
        state = m.denoise_step(state, k)
        flags.append(_flags(state))
    return state, flags


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from gfdit.models.loading import save_deep

    root = tmp_path_factory.mktemp("deep")
    return {f: save_deep(DEEP[f], root / f) for f in ("wan", "qwen")}


def _config(kind: str, threshold: float, warmup: int, max_skip: int = -1):
    from gfdit.models.cache import CacheConfig

    return CacheConfig(kind, threshold, warmup, max_skip)


# ------------------------------------------------------------------------ single process
def test_caching_off_is_bit_identical():
    import gfdit.models as gm
    import staged_harness as sh

    for name in ("tiny-wan", "tiny-qwen-image"):
        m = sh.model(name)
        a = sh.start(m, PROMPT, 3, steps=3)
        b = m.initial_state(
            m.encode(PROMPT),
            m.init_latent(3, m.latent_shape()),
            num_inference_steps=3,
            cache=None,
            grid=tuple(m.latent_shape()[2:]),
        )
        assert b.cache is None and gm.state_digest(a) == gm.state_digest(b)
        for k in range(3):
            a, b = m.denoise_step(a, k), m.denoise_step(b, k)
            assert gm.state_digest(a) == gm.state_digest(b), (name, k)
        states = [sh.start(m, PROMPT, s, steps=3) for s in (1, 2)]
        plain = m.denoise_batch(states)
        again = m.denoise_batch([dataclasses.replace(s, cache=None) for s in states])
        assert [gm.state_digest(s) for s in plain] == [gm.state_digest(s) for s in again]
        assert all(s.cache is None for s in plain)
        # a cached state packs, unpacks and digests with its cache; the version says so
        cached = m.initial_state(
            m.encode(PROMPT),
            m.init_latent(3, m.latent_shape()),
            num_inference_steps=3,
            grid=tuple(m.latent_shape()[2:]),
            cache=_config("fbcache", 0.5, 1),
        )
        cached = m.denoise_step(cached, 0)
        back = gm.unpack_state(*gm.pack_state(cached))
        assert gm.state_digest(back) == gm.state_digest(cached)
        assert back.cache == dataclasses.replace(back.cache)  # a frozen record
        assert torch.equal(back.cache.pass_caches[1].residual, cached.cache.pass_caches[1].residual)


def _pipeline(m, family: str, transformer=None) -> tuple:
    """The diffusers pipeline of staged model ``m``'s parts (``transformer``: its own unless another is given),
    quiet, and the size options of the tests' requests."""
    t = m.transformer if transformer is None else transformer
    scheduler = m.sampler.scheduler_class.from_config(m.scheduler_config)
    if family == "wan":
        from diffusers import WanPipeline

        pipe = WanPipeline(
            tokenizer=m.tokenizer, text_encoder=m.text_encoder, vae=m.vae, transformer=t, scheduler=scheduler
        )
        opts = {"height": 32, "width": 48, "num_frames": 9, "guidance_scale": 4.0}
    else:
        from diffusers import QwenImagePipeline

        pipe = QwenImagePipeline(
            scheduler=scheduler, vae=m.vae, text_encoder=m.text_encoder, tokenizer=m.tokenizer, transformer=t
        )
        pipe.prompt_template_encode_start_idx = m.prompt_template_drop
        opts = {"height": 48, "width": 80, "true_cfg_scale": 4.0}
    pipe.set_progress_bar_config(disable=True)
    return pipe, opts


def _latent(pipe, opts: dict, m, steps: int, seed: int) -> torch.Tensor:
    """The final latent of the tests' request through a diffusers pipeline (``_pipeline``)."""
    out = pipe(
        PROMPT,
        negative_prompt=NEGATIVE,
        num_inference_steps=steps,
        generator=torch.Generator().manual_seed(seed),
        output_type="latent",
        max_sequence_length=m.defaults.max_sequence_length,
        **opts,
    )
    return out.frames if hasattr(out, "frames") else out.images


def _cache_dit_run(folder: str, family: str, config, steps: int, seed: int):
    """The pipeline with cache-dit on a model loaded afresh from ``folder`` (cache-dit patches the transformer
    it is given): the final latent and the per-pass cached steps."""
    import cache_dit
    import gfdit.models as gm
    from cache_dit import DBCacheConfig

    m = gm.load(LOADERS[family], path=folder)
    pipe, opts = _pipeline(m, family)
    cache_dit.enable_cache(
        pipe,
        cache_config=DBCacheConfig(
            Fn_compute_blocks=1,
            Bn_compute_blocks=0,
            residual_diff_threshold=config.threshold,
            max_warmup_steps=config.warmup,
            max_continuous_cached_steps=config.max_skip,
            enable_separate_cfg=True,
        ),
    )
    try:
        latent = _latent(pipe, opts, m, steps, seed)
        stats = cache_dit.summary(pipe, logging=False)[0]
    finally:
        cache_dit.disable_cache(pipe)
    return latent, list(stats.cached_steps), list(stats.cfg_cached_steps)


# (family, threshold, warmup, max_skip): Wan's first-block residual changes 7-17% per step here, Qwen-Image's
# 35-60% (its deep tiny model at 48x80 and 12 steps is far from the trained models' regime), so each family
# gets a threshold inside its range; max_skip 1 and 2 against cache-dit's max_continuous_cached_steps.
CACHE_DIT_CASES = [
    ("wan", 0.12, 3, -1),
    ("wan", 0.2, 2, 1),
    ("wan", 0.2, 2, 2),
    ("qwen", 0.45, 3, -1),
]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("family,threshold,warmup,max_skip", CACHE_DIT_CASES)
def test_fbcache_matches_cache_dit(folders, family, threshold, warmup, max_skip):
    pytest.importorskip("cache_dit")
    config = _config("fbcache", threshold, warmup, max_skip)
    steps, seed = 12, 3
    want_latent, want_cond, want_uncond = _cache_dit_run(folders[family], family, config, steps, seed)
    m = _model(folders[family], family)
    state, flags = _alone(m, seed, steps, config)
    got_cond = [k for k, f in enumerate(flags) if f[0]]
    got_uncond = [k for k, f in enumerate(flags) if f[1]]
    err = _rel(state.latent, want_latent.float())
    print(
        f"{family} {config}: cache-dit {want_cond} {want_uncond}, gfdit {got_cond} {got_uncond}, err {err:.3g}"
    )
    assert want_cond, "cache-dit reused nothing: the case tests nothing"
    assert (got_cond, got_uncond) == (want_cond, want_uncond)
    assert err <= TOL
    assert _counters(state) == (
        len(set(got_cond) & set(got_uncond)),
        len(got_cond) + len(got_uncond),
        2 * steps,
    )


class _TeaCacheReference:
    """TeaCache as its own repository writes it (TeaCache4Wan2.1's teacache_forward, TeaCache4FLUX): the
    transformer's forward replaced by a plain loop over the diffusers blocks, a call counter whose even and odd
    calls are the conditional and unconditional passes, per pass the previous modulated input, the
    accumulated distance (identity rescale) and the residual of every block; ret_steps = warmup steps and the
    last step compute. Written apart from gfdit.models.cache on purpose."""

    def __init__(self, model, family: str, threshold: float, warmup: int, steps: int) -> None:
        self.model, self.family = model, family
        self.threshold, self.warmup, self.steps = threshold, warmup, steps
        self.cnt = 0
        self.prev = [None, None]
        self.acc = [0.0, 0.0]
        self.residual = [None, None]
        self.skipped: list[list[int]] = [[], []]

    def decide(self, p: int, k: int, modulated) -> bool:
        if k < self.warmup or k == self.steps - 1 or self.prev[p] is None:
            calc = True
            self.acc[p] = 0.0
        else:
            prev = self.prev[p]
            self.acc[p] += ((modulated - prev).abs().mean() / prev.abs().mean()).item()
            if self.acc[p] < self.threshold:
                calc = False
            else:
                calc = True
                self.acc[p] = 0.0
        self.prev[p] = modulated.clone()
        return calc

    def wan_forward(self, hidden_states, timestep, encoder_hidden_states, return_dict=True, **_):
        m = self.model
        p, k = self.cnt % 2, self.cnt // 2
        self.cnt += 1
        b, _, f, h, w = hidden_states.shape
        pt, ph, pw = m.config.patch_size
        rotary = m.rope(hidden_states)
        x = m.patch_embedding(hidden_states).flatten(2).transpose(1, 2).contiguous()
        temb, proj, text, _ = m.condition_embedder(timestep, encoder_hidden_states, None)
        proj = proj.unflatten(1, (6, -1))
        blk = m.blocks[0]
        shift, scale = (blk.scale_shift_table + proj.float()).chunk(6, dim=1)[:2]
        modulated = (blk.norm1(x.float()) * (1 + scale) + shift).type_as(x)
        if self.decide(p, k, modulated):
            x0 = x
            for block in m.blocks:
                x = block(x, text, proj, rotary)
            self.residual[p] = x - x0
        else:
            self.skipped[p].append(k)
            x = x + self.residual[p]
        shift, scale = (m.scale_shift_table + temb.unsqueeze(1)).chunk(2, dim=1)
        x = (m.norm_out(x.float()) * (1 + scale) + shift).type_as(x)
        x = m.proj_out(x).reshape(b, f // pt, h // ph, w // pw, pt, ph, pw, -1)
        out = x.permute(0, 7, 1, 4, 2, 5, 3, 6).flatten(6, 7).flatten(4, 5).flatten(2, 3)
        return (out,)

    def qwen_forward(self, hidden_states, encoder_hidden_states, encoder_hidden_states_mask, timestep,
                     img_shapes, return_dict=True, attention_kwargs=None, **_):  # fmt: skip
        from diffusers.models.transformers.transformer_qwenimage import compute_text_seq_len_from_mask

        m = self.model
        p, k = self.cnt % 2, self.cnt // 2
        self.cnt += 1
        x = m.img_in(hidden_states)
        timestep = timestep.to(x.dtype)
        text = m.txt_in(m.txt_norm(encoder_hidden_states))
        text_len, _, mask = compute_text_seq_len_from_mask(text, encoder_hidden_states_mask)
        temb = m.time_text_embed(timestep, x, None)
        rotary = m.pos_embed(img_shapes, max_txt_seq_len=text_len, device=x.device)
        blk = m.transformer_blocks[0]
        shift, scale, _ = blk.img_mod(temb).chunk(2, dim=-1)[0].chunk(3, dim=-1)
        modulated = blk.img_norm1(x) * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)
        if self.decide(p, k, modulated):
            x0 = x
            for block in m.transformer_blocks:
                text, x = block(
                    hidden_states=x,
                    encoder_hidden_states=text,
                    encoder_hidden_states_mask=mask,
                    temb=temb,
                    image_rotary_emb=rotary,
                    joint_attention_kwargs=attention_kwargs,
                )
            self.residual[p] = x - x0
        else:
            self.skipped[p].append(k)
            x = x + self.residual[p]
        return (m.proj_out(m.norm_out(x, temb)),)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("family,threshold", [("wan", 0.25), ("qwen", 0.1)])
def test_teacache_matches_a_plain_reference(folders, family, threshold):
    import gfdit.models as gm

    steps, seed, warmup = 10, 5, 1
    config = _config("teacache", threshold, warmup)
    m = _model(folders[family], family)
    state, flags = _alone(m, seed, steps, config)
    ref_model = gm.load(LOADERS[family], path=folders[family])  # the reference patches its transformer
    t = ref_model.transformer
    ref = _TeaCacheReference(t, family, threshold, warmup, steps)
    t.forward = ref.wan_forward if family == "wan" else ref.qwen_forward
    pipe, opts = _pipeline(ref_model, family, t)
    want = _latent(pipe, opts, m, steps, seed)
    got = [[k for k, f in enumerate(flags) if f[p]] for p in (0, 1)]
    err = _rel(state.latent, want.float())
    print(f"{family} teacache {threshold}: reference skips {ref.skipped}, gfdit {got}, err {err:.3g}")
    assert ref.skipped[0] and ref.skipped[1], "the reference skipped nothing: the case tests nothing"
    assert got == ref.skipped
    assert err <= TOL


@pytest.mark.timeout(240)
@pytest.mark.parametrize("family", ["wan", "qwen"])
def test_batched_caches_equal_each_alone(folders, family):
    m = _model(folders[family], family)
    steps = 8
    rows = _batch_rows(family)
    states = [_start(m, seed, steps, cache, prompt) for seed, cache, prompt in rows]
    flags: list[list] = [[] for _ in rows]
    for _ in range(steps):
        states = m.denoise_batch(states)
        for i, s in enumerate(states):
            flags[i].append(None if s.cache is None else _flags(s))
    for i, (seed, cache, prompt) in enumerate(rows):
        state = _start(m, seed, steps, cache, prompt)
        alone = []
        for k in range(steps):
            state = m.denoise_step(state, k)
            alone.append(None if state.cache is None else _flags(state))
        err = _rel(states[i].latent, state.latent)
        print(f"{family} row {i}: {cache}: batched {flags[i]}, err {err:.3g}")
        assert flags[i] == alone, i
        assert err <= TOL, (i, err)
        if cache is not None:
            assert _counters(states[i]) == _counters(state)
    assert any(any(f) for row in flags if row[0] is not None for f in row), "nothing was reused"


def test_bad_cache_specs_are_refused():
    import gfdit
    import gfdit.models as gm
    import staged_harness as sh
    from gfdit.models import cache as step_cache
    from gfdit.models import qwen_pipeline, tiny, wan_pipeline

    m = sh.model("tiny-wan")
    cond, latent, grid = m.encode(PROMPT), m.init_latent(1, m.latent_shape()), tuple(m.latent_shape()[2:])

    def refused(model, spec, match):
        with pytest.raises(gfdit.InvalidUsage, match=match) as info:
            model.initial_state(cond, latent, grid=grid, cache=spec)
        assert info.value.param == "cache"

    refused(m, _config("pab", 0.1, 1), "cache kind 'pab'")
    refused(m, object(), "cache must have kind, threshold, warmup, max_skip")

    class OwnModel(wan_pipeline.WanStagedModel):  # a model of one's own: no step cache described
        cache_kinds = ()

    own = OwnModel(
        name="own",
        tokenizer=m.tokenizer,
        text_encoder=m.text_encoder,
        vae=m.vae,
        transformer=m.transformer,
        scheduler_config=m.scheduler_config,
        defaults=m.defaults,
    )
    assert gm.StagedModel.cache_kinds == () and m.cache_kinds == ("fbcache", "teacache")
    refused(own, _config("fbcache", 0.1, 1), "its kinds: none")
    # Qwen-Image with zero_cond_t (per-token modulation), and ControlNet residuals, are refused
    q = sh.model("tiny-qwen-image")
    zero = qwen_pipeline.QwenImageStagedModel(
        name="zero",
        tokenizer=q.tokenizer,
        text_encoder=q.text_encoder,
        vae=q.vae,
        transformer=tiny.tiny_qwen_image(0, zero_cond_t=True),
        scheduler_config=q.scheduler_config,
        defaults=q.defaults,
        prompt_template_drop=q.prompt_template_drop,
    )
    qcond, qlatent = zero.encode(PROMPT), zero.init_latent(1, zero.latent_shape())
    with pytest.raises(gfdit.InvalidUsage, match="zero_cond_t") as info:
        zero.initial_state(
            qcond, qlatent, grid=tuple(zero.latent_shape()[2:]), cache=_config("teacache", 0.1, 1)
        )
    assert info.value.param == "cache"
    state = q.initial_state(
        q.encode(PROMPT),
        q.init_latent(1, q.latent_shape()),
        grid=tuple(q.latent_shape()[2:]),
        cache=_config("fbcache", 0.1, 1),
    )
    loop = step_cache.CachedStep([state], 0, "qwen-image").loop(0, None, None)
    with pytest.raises(gfdit.InvalidUsage, match="ControlNet"):
        loop.check(q.transformer, {"controlnet_block_samples": [torch.zeros(1)]})


def test_remap_cache_ranks():
    import gfdit.models as gm
    from gfdit.models.cache import PassCache, StepCache

    r = torch.ones(1, 4, 8)
    cache = StepCache(
        _config("fbcache", 0.1, 1),
        (
            PassCache(filled=True, tokens=9, ranks=(2, 5), skips=1, ref=r, residual=r),
            PassCache(filled=True, tokens=9, ranks=(), skips=2, ref=r, residual=r),
        ),
        cached_steps=1,
        cached_passes=3,
        passes=8,
    )
    import staged_harness as sh

    state = dataclasses.replace(sh.start(sh.model("tiny-wan"), PROMPT, 1), cache=cache)
    moved = gm.remap_cache_ranks(state, {2: 0, 5: 1, 7: 2})
    assert moved.cache.pass_caches[0].ranks == (0, 1) and moved.cache.pass_caches[0].ref is r
    assert moved.cache.pass_caches[1] == cache.pass_caches[1]
    lost = gm.remap_cache_ranks(state, {2: 0})  # rank 5 is gone: its shard with it
    assert lost.cache.pass_caches[0] == PassCache(tokens=9)
    assert lost.cache.pass_caches[1] == cache.pass_caches[1]
    assert _counters(lost) == (1, 3, 8)
    back = gm.unpack_state(*gm.pack_state(moved))
    assert back.cache.pass_caches[0].ranks == (0, 1) and back.cache.passes == 8


def test_a_step_on_the_other_expert_starts_the_pass_again():
    # Wan 2.2 A14B: the high-noise expert above boundary_ratio * 1000, the low-noise one below; a threshold no
    # change reaches reuses the cache at every step it may, except the first one of the other expert
    import gfdit.models as gm
    import staged_harness as sh

    two = sh.two_experts(sh.model("tiny-wan"))
    steps = 6
    timesteps = two.schedule(steps, (3, 4, 6))[1]
    first_low = next(k for k, t in enumerate(timesteps.tolist()) if t < 875)
    assert 1 < first_low < steps - 1, timesteps
    state, flags = _alone(two, 2, steps, _config("fbcache", 10.0, 1))
    want = [(False, False)] + [(True, True)] * (steps - 1)
    want[first_low] = (False, False)
    assert flags == want
    assert [pc.expert for pc in state.cache.pass_caches] == [1, 1]
    # no world: gather_cache keeps a whole cache and drops one of another world's layout
    other = dataclasses.replace(
        state.cache,
        pass_caches=(
            dataclasses.replace(state.cache.pass_caches[0], ranks=(3, 4)),
            state.cache.pass_caches[1],
        ),
    )
    got = two.gather_cache(dataclasses.replace(state, cache=other), None)
    assert not got.cache.pass_caches[0].filled and got.cache.pass_caches[1] is state.cache.pass_caches[1]
    assert gm.state_digest(two.gather_cache(state, None)) == gm.state_digest(state)


# ------------------------------------------------------------------------ worlds
def case_agreed_ratios(ctx) -> dict:
    """Crafted local sums whose local ratios lie on both sides of 0.1 on the two members."""
    import gfdit
    from gfdit.models.cache import agreed_ratios

    local = {0: [[1.0, 20.0], [6.0, 20.0], [0.0, 0.0]], 1: [[6.0, 20.0], [0.0, 60.0], [3.0, 30.0]]}[ctx.rank]
    sums = torch.tensor(local, dtype=torch.float64)
    return {"rank": ctx.rank, "ratios": agreed_ratios(sums.clone(), gfdit.new_group([0, 1]))}


def case_trajectory(ctx, folder: str, family: str, config, seed: int, steps: int, plan: list) -> dict:
    """Runs ``plan`` on this rank: ("steps", n, ranks, spec) n steps on the group ``ranks``; ("gather", ranks)
    gather_cache on the holders; ("migrate", src, ranks) migrate from src to ranks. Every rank starts with the
    initial state; a rank outside a step's group drops its state. Reports each step's flags and counters on
    the ranks that ran it, every decision's local and agreed ratios, and the final latent. Failures are
    returned, not raised (the world stays usable)."""
    import gfdit
    from gfdit.models import cache as step_cache

    torch.set_num_threads(1)
    out: dict = {"rank": ctx.rank, "error": None, "steps": {}, "ratios": []}
    original = step_cache.agreed_ratios

    def recording(sums, group):
        local = sums.detach().to("cpu", torch.float64, copy=True)
        agreed = original(sums, group)
        out["ratios"].append(((local[:, 0] / local[:, 1]).tolist(), agreed))
        return agreed

    step_cache.agreed_ratios = recording
    try:
        m = _model(folder, family)
        state = _start(m, seed, steps, config)
        k = 0
        for op in plan:
            if op[0] == "steps":
                _, n, ranks, spec = op
                spec = None if spec is None else gfdit.ParallelSpec(**spec)
                for _ in range(n):
                    if ctx.rank in ranks:
                        state = m.denoise_step(state, k, group=gfdit.new_group(ranks), spec=spec)
                        out["steps"][k] = (
                            _flags(state),
                            _counters(state),
                            [pc.ranks for pc in state.cache.pass_caches],
                        )
                    else:
                        state = None
                    k += 1
            elif op[0] == "gather":
                if ctx.rank in op[1]:
                    state = m.gather_cache(state, gfdit.new_group(op[1]))
            elif op[0] == "migrate":
                _, src, ranks = op
                if ctx.rank == src or ctx.rank in ranks:
                    group = gfdit.new_group([src] + [r for r in ranks if r != src])
                    state = m.migrate(state if ctx.rank == src else None, group, src)
        if state is not None and state.done:
            out["latent"] = state.latent
            out["digest_scalars"] = (_counters(state), [pc.ranks for pc in state.cache.pass_caches])
    except Exception as exc:  # noqa: BLE001 - reported to the test
        out["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
    finally:
        step_cache.agreed_ratios = original
    return out


def _check_plan(reports, plan, want_flags, want_latent):
    errors = [r["error"] for r in reports if r["error"]]
    assert not errors, "\n".join(errors)
    k = 0
    for op in plan:
        if op[0] != "steps":
            continue
        for _ in range(op[1]):
            seen = {repr(reports[r]["steps"][k]) for r in op[2]}
            assert len(seen) == 1, f"step {k}: the members {op[2]} disagree: {seen}"
            k += 1
    finals = [r for r in reports if "latent" in r]
    assert finals
    got_flags = [reports[next(r for r in op[2])]["steps"] for op in plan if op[0] == "steps"]
    flags = {}
    for d in got_flags:
        flags.update({kk: v[0] for kk, v in d.items()})
    assert [flags[i] for i in range(len(want_flags))] == want_flags
    for r in finals:
        assert _rel(r["latent"], want_latent) <= TOL, _rel(r["latent"], want_latent)


@pytest.fixture(scope="module")
def world2(world_pool):
    mp_harness.skip_if_too_big(2)
    return world_pool.get(2, timeout=60.0, gloo=False)


@pytest.mark.timeout(120)
def test_the_decision_is_agreed_on_every_member(world2):
    reports = world2.run(case_agreed_ratios, timeout=60)
    assert reports[0]["ratios"] == reports[1]["ratios"]
    # the ratio of the sums of the whole sequence, not either member's, nor the average of their means
    assert reports[0]["ratios"][:2] == [7 / 40, 6 / 80]
    assert reports[0]["ratios"][2] == 0.1


@pytest.mark.timeout(240)
def test_uneven_shards_decide_together(world2, folders):
    # Qwen-Image's 15 tokens on two members: 8 and 7. A first run records each member's local ratio at the first
    # decision (step warmup); the second run puts the threshold between the two members' local ratios there, so
    # that deciding locally would split the members.
    steps, seed, warmup = 8, 7, 2
    ulysses = {"ulysses": 2}
    plan = [("steps", steps, [0, 1], ulysses)]
    first = world2.run(
        case_trajectory,
        folders["qwen"],
        "qwen",
        _config("fbcache", 0.5, warmup),
        seed,
        steps,
        plan,
        timeout=200,
    )
    assert not any(r["error"] for r in first), [r["error"] for r in first]
    local = [first[r]["ratios"][0][0][0] for r in (0, 1)]  # the first decision, row 0 (the conditional pass)
    agreed = first[0]["ratios"][0][1][0]
    assert first[1]["ratios"][0][1][0] == agreed and local[0] != local[1]
    threshold = (agreed + (min(local) if agreed > min(local) else max(local))) / 2
    config = _config("fbcache", threshold, warmup)
    second = world2.run(case_trajectory, folders["qwen"], "qwen", config, seed, steps, plan, timeout=200)
    lo, hi = sorted(local)
    assert lo < threshold < hi
    m = _model(folders["qwen"], "qwen")
    state, flags = _alone(m, seed, steps, config)
    print(f"local ratios {local}, agreed {agreed}, threshold {threshold}, flags {flags}")
    _check_plan(second, plan, flags, state.latent)
    assert flags[warmup][0] == (agreed < threshold)


def _batch_rows(family: str) -> list:
    """(seed, cache, prompt) of a batch: fbcache and teacache at two settings each and one row without a cache;
    thresholds inside each family's range of changes (see CACHE_DIT_CASES), so that rows of one sub-batch
    decide differently at some steps; prompts of several lengths (Qwen-Image's texts: sub-batches on a group)."""
    low, high, tea_low, tea_high = (0.12, 0.2, 0.25, 0.4) if family == "wan" else (0.45, 0.6, 0.1, 0.3)
    return [
        (1, _config("fbcache", low, 2), PROMPT),
        (2, _config("teacache", tea_low, 1), PROMPT),
        (3, _config("fbcache", high, 3), "a lighthouse on a cliff at dusk"),
        (4, None, "a fox"),
        (5, _config("teacache", tea_high, 2), "a fox"),
    ]


def case_batch(ctx, folder: str, family: str, steps: int, spec: dict) -> dict:
    """The batch of ``_batch_rows`` stepped with denoise_batch on [0, 1] with ``spec``: each row's flags per
    step, counters and final latent. Failures are returned, not raised."""
    import gfdit

    torch.set_num_threads(1)
    out: dict = {"rank": ctx.rank, "error": None}
    try:
        m = _model(folder, family)
        states = [_start(m, seed, steps, cache, prompt) for seed, cache, prompt in _batch_rows(family)]
        flags: list[list] = [[] for _ in states]
        for _ in range(steps):
            states = m.denoise_batch(states, group=gfdit.new_group([0, 1]), spec=gfdit.ParallelSpec(**spec))
            for i, st in enumerate(states):
                flags[i].append(None if st.cache is None else _flags(st))
        out["flags"] = flags
        out["counters"] = [None if st.cache is None else _counters(st) for st in states]
        out["latents"] = [st.latent for st in states]
    except Exception as exc:  # noqa: BLE001 - reported to the test
        out["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
    return out


@pytest.mark.timeout(240)
@pytest.mark.parametrize("family", ["wan", "qwen"])
@pytest.mark.parametrize("spec", [{"ulysses": 2}, {"cfg": 2}], ids=["ulysses2", "cfg2"])
def test_batched_caches_on_a_pair_equal_each_alone(world2, folders, family, spec):
    steps = 8
    reports = world2.run(case_batch, folders[family], family, steps, spec, timeout=200)
    errors = [r["error"] for r in reports if r["error"]]
    assert not errors, "\n".join(errors)
    assert reports[0]["flags"] == reports[1]["flags"] and reports[0]["counters"] == reports[1]["counters"]
    m = _model(folders[family], family)
    for i, (seed, cache, prompt) in enumerate(_batch_rows(family)):
        state = _start(m, seed, steps, cache, prompt)
        alone = []
        for k in range(steps):
            state = m.denoise_step(state, k)
            alone.append(None if state.cache is None else _flags(state))
        err = max(_rel(r["latents"][i], state.latent) for r in reports)
        print(f"{family} {spec} row {i}: {reports[0]['flags'][i]}, err {err:.3g}")
        assert reports[0]["flags"][i] == alone, i
        assert err <= TOL, (i, err)


@pytest.fixture(scope="module")
def world4(world_pool):
    mp_harness.skip_if_too_big(4)
    return world_pool.get(4, timeout=60.0, gloo=False)


# 4 ranks (cfg 1, Ulysses 2 x Ring 2) -> gather -> 2 ranks CFG-parallel (a shrink: nothing moves) -> gather ->
# migrate to rank 2 alone; the cache is whole at every regroup, so the decisions are the one-rank run's.
GATHERED = [
    ("steps", 4, [0, 1, 2, 3], {"ulysses": 2, "ring": 2}),
    ("gather", [0, 1, 2, 3]),
    ("steps", 3, [1, 0], {"cfg": 2}),
    ("gather", [0, 1]),
    ("migrate", 0, [2]),
    ("steps", 3, [2], None),
]
# The same groups without gathers: at each regroup the shards are of another layout, so the first step there
# computes in full (a reset; warm-up is not repeated) and the trajectory differs from the one-rank run's.
UNGATHERED = [
    ("steps", 4, [0, 1, 2, 3], {"ulysses": 4}),
    ("steps", 3, [1, 0], {"cfg": 2}),
    ("migrate", 0, [2]),
    ("steps", 3, [2], None),
]


@pytest.mark.timeout(420)
@pytest.mark.parametrize("kind,threshold", [("fbcache", 0.2), ("teacache", 0.3)])
def test_gathered_regroups_keep_the_cache(world4, folders, kind, threshold):
    steps, seed = 10, 9
    config = _config(kind, threshold, 2)
    reports = world4.run(case_trajectory, folders["wan"], "wan", config, seed, steps, GATHERED, timeout=400)
    m = _model(folders["wan"], "wan")
    state, flags = _alone(m, seed, steps, config)
    print(f"{kind}: one rank {flags}")
    assert sum(f[0] for f in flags[4:]) > 0, "nothing reused after the first regroup: the case tests nothing"
    _check_plan(reports, GATHERED, flags, state.latent)
    assert reports[2]["digest_scalars"][0] == _counters(state)


@pytest.mark.timeout(420)
def test_regroups_without_gather_start_the_pass_again(world4, folders):
    steps, seed = 10, 9
    config = _config("fbcache", 0.2, 2)
    reports = world4.run(case_trajectory, folders["wan"], "wan", config, seed, steps, UNGATHERED, timeout=400)
    errors = [r["error"] for r in reports if r["error"]]
    assert not errors, "\n".join(errors)
    # the first step of each new layout computes in full where the member holds no usable shard: at step 4 the
    # CFG-parallel halves ([1] conditional, [0] unconditional) hold quarters of another layout; at step 7 rank 2
    # got from rank 0 (the unconditional half, which held its pass whole) that pass whole, but nothing of the
    # conditional pass, whose only holder was rank 1
    assert {reports[r]["steps"][4][0] for r in (0, 1)} == {(False, False)}
    assert reports[0]["steps"][4][2] == [(1,), (0,)]
    assert reports[2]["steps"][7][0][0] is False
    assert reports[2]["steps"][7][2] == [(2,), (2,)]
    assert reports[2]["steps"][7][1][2] == 16  # every member's counters went on: 8 steps x 2 passes
