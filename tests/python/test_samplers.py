"""gfdit.models.samplers: the folder's scheduler, stepped from a portable DenoiseState.

Sampler level: for Wan's UniPC (flow prediction, shift 3 and 5), a third-order UniPC with disabled
correctors, UniPC with Qwen-Image's dynamic shift, DPM-Solver++ (flow and epsilon, orders 2 and 3) and
flow-matching Euler, stepping a state that goes through pack_state / unpack_state before every step equals
stepping the diffusers scheduler itself, bit for bit, and leaves its input state untouched.
Pipeline level: a tiny Wan folder saved with UniPC (as Wan ships), DPM-Solver++ or Euler, and a tiny
Qwen-Image folder with its own Euler or UniPC, loaded with gfdit.models.load: ``generate`` equals
diffusers' WanPipeline / QwenImagePipeline on the same components within 1e-3 on [0, 1] pixels; so does
each loaded with dtype=bfloat16 (Wan with UniPC and Euler, Qwen-Image with Euler), and its states keep the
dtypes diffusers gives latent and history, through pack_state / unpack_state unchanged.
World of 2: a UniPC trajectory on [0], [0, 1], [1], [0] (the history migrates both ways) equals the one
rank run; in bfloat16, a trajectory with CFG-parallel steps and migrations both ways equals the one that
runs every step on rank 0 with the passes in turn, bit for bit. A folder whose scheduler is not supported
is refused with an error naming it.
"""

from __future__ import annotations

import dataclasses
import json
import os

import mp_harness
import pytest
import staged_harness as sh

pytest.importorskip("diffusers")

import torch  # noqa: E402

PROMPT = "a small red fox jumps over a lazy dog"
NEGATIVE = "blurry, static"
PIXEL_TOL = 1e-3

# Wan 2.2 TI2V / Wan 2.1 14B 720p: the same UniPC with flow_shift 5.
UNIPC_SHIFT5 = {**sh.SCHEDULERS["unipc"], "flow_shift": 5.0}
UNIPC_ORDER3 = {
    **sh.SCHEDULERS["unipc"],
    "solver_order": 3,
    "disable_corrector": [0, 2],
}
UNIPC_DYNAMIC = {
    "_class_name": "UniPCMultistepScheduler",
    "prediction_type": "flow_prediction",
    "use_flow_sigmas": True,
    "use_dynamic_shifting": True,
    "time_shift_type": "exponential",
}
DPM_EPS3 = {"_class_name": "DPMSolverMultistepScheduler", "solver_order": 3, "algorithm_type": "dpmsolver++"}
EULER = {"_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000, "shift": 3.0}

# (id, config, steps, set_timesteps kwargs, latent shape)
SAMPLER_CASES = [
    ("unipc-wan", sh.SCHEDULERS["unipc"], 7, {}, (1, 4, 3, 4, 6)),
    ("unipc-shift5", UNIPC_SHIFT5, 5, {}, (1, 4, 3, 4, 6)),
    ("unipc-order3", UNIPC_ORDER3, 8, {}, (1, 4, 3, 4, 6)),
    ("unipc-dynamic", UNIPC_DYNAMIC, 6, {"sigmas": True, "mu": 0.7}, (1, 24, 16)),
    ("dpm-flow", sh.SCHEDULERS["dpm"], 7, {}, (1, 4, 3, 4, 6)),
    ("dpm-eps3", DPM_EPS3, 9, {}, (1, 24, 16)),
    ("euler", EULER, 5, {}, (1, 4, 3, 4, 6)),
]


def _reference_scheduler(config: dict, steps: int, kwargs: dict):
    import diffusers

    sched = getattr(diffusers, config["_class_name"]).from_config(config)
    if kwargs.get("sigmas"):
        import numpy as np

        sched.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=kwargs.get("mu"))
    else:
        sched.set_timesteps(steps)
    sched.set_begin_index(0)
    return sched


@pytest.mark.timeout(60)
def _state(latent: torch.Tensor, sigmas: torch.Tensor, timesteps: torch.Tensor, g: torch.Generator):
    """A denoise state at step 0 of this schedule, without guidance, its text embedding drawn from g."""
    import gfdit.models as gm

    return gm.DenoiseState(
        latent=latent,
        prompt_embeds=torch.randn(1, 3, 8, generator=g),
        negative_prompt_embeds=None,
        sigmas=sigmas,
        timesteps=timesteps,
        step_idx=0,
        guidance_scale=1.0,
        grid=(1, 1, 1),
    )


@pytest.mark.parametrize("case", SAMPLER_CASES, ids=[c[0] for c in SAMPLER_CASES])
def test_portable_state_steps_like_diffusers(case):
    import gfdit.models as gm
    import numpy as np
    from gfdit.models.samplers import sampler_from_config

    _, config, steps, kwargs, shape = case
    ref = _reference_scheduler(config, steps, kwargs)
    sampler = sampler_from_config(config)
    sigmas = np.linspace(1.0, 1 / steps, steps) if kwargs.get("sigmas") else None
    got_sigmas, got_timesteps = sampler.schedule(steps, sigmas=sigmas, mu=kwargs.get("mu"))
    assert torch.equal(got_sigmas, ref.sigmas) and torch.equal(got_timesteps, ref.timesteps)

    g = torch.Generator().manual_seed(5)
    x_ref = torch.randn(shape, generator=g)
    state = _state(x_ref.clone(), got_sigmas, got_timesteps, g)
    for k, t in enumerate(ref.timesteps):
        # a "model" whose output depends on its input, as a denoiser's does
        out = 0.3 * x_ref.flip(-1) + torch.randn(shape, generator=g)
        x_ref = ref.step(out.clone(), t, x_ref, return_dict=False)[0]
        state = gm.unpack_state(*gm.pack_state(state))  # the state as a migration delivers it
        prev, before = state, gm.state_digest(state)
        state = sampler.step(state, out.clone())
        assert gm.state_digest(prev) == before, f"step {k} modified its input state"
        assert gm.state_digest(gm.unpack_state(*gm.pack_state(state))) == gm.state_digest(state)
        assert state.step_idx == k + 1
        assert torch.equal(state.latent, x_ref.float()), f"step {k}: {(state.latent - x_ref).abs().max()}"
        if config is not EULER and k + 1 < steps:
            assert state.history is not None and state.history.shape[1:] == shape
    assert state.done
    if config is EULER:
        assert state.history is None and state.last_sample is None


# ------------------------------------------------------------------------ folders and pipelines
def _wan_folder(tmp_path, config: dict) -> str:
    from gfdit.models import wan_pipeline

    wan_pipeline.build_tiny(scheduler_config=config).save_pretrained(tmp_path)
    with open(os.path.join(tmp_path, "scheduler", "scheduler_config.json"), encoding="utf-8") as f:
        assert json.load(f)["_class_name"] == config["_class_name"]
    return str(tmp_path)


def _folder_scheduler(path: str):
    import diffusers

    with open(os.path.join(path, "scheduler", "scheduler_config.json"), encoding="utf-8") as f:
        name = json.load(f)["_class_name"]
    return getattr(diffusers, name).from_pretrained(path, subfolder="scheduler", local_files_only=True)


WAN_FOLDERS = [("unipc", sh.SCHEDULERS["unipc"]), ("dpm", sh.SCHEDULERS["dpm"]), ("euler", EULER)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("config", [c for _, c in WAN_FOLDERS], ids=[n for n, _ in WAN_FOLDERS])
def test_wan_generate_equals_wan_pipeline(tmp_path, config):
    import gfdit.models as gm
    from diffusers import WanPipeline

    path = _wan_folder(tmp_path, config)
    m = gm.load("wan2.1", path=path)
    assert m.sampler.name == config["_class_name"]
    # The pipeline from the folder's components (WanPipeline.from_pretrained needs accelerate for Wan's
    # float32-pinned modules; these are the modules gfdit loaded from the same folder) and its scheduler.
    pipe = WanPipeline(
        tokenizer=m.tokenizer,
        text_encoder=m.text_encoder,
        vae=m.vae,
        transformer=m.transformer,
        scheduler=_folder_scheduler(path),
    )
    pipe.set_progress_bar_config(disable=True)
    size = {"height": 32, "width": 48, "num_frames": 9}
    opts = {"num_inference_steps": 6, "guidance_scale": 4.0, **size}
    want = pipe(
        PROMPT,
        negative_prompt=NEGATIVE,
        generator=torch.Generator().manual_seed(3),
        output_type="pt",
        max_sequence_length=m.defaults.max_sequence_length,  # gfdit.json's; a real folder's is 512 too
        **opts,
    ).frames[0]
    got = m.generate(PROMPT, seed=3, negative_prompt=NEGATIVE, **opts)
    err = (got.permute(1, 0, 2, 3) - want.float()).abs().max().item()
    print(f"wan {config['_class_name']}: max |pixel difference| {err:.3g}")
    assert err <= PIXEL_TOL


@pytest.mark.timeout(120)
def test_wan22_two_experts_equal_wan_pipeline(tmp_path):
    # Wan 2.2 A14B: a high-noise expert (transformer) above boundary_ratio * 1000 and a low-noise expert
    # (transformer_2) below, with the UniPC Wan ships; the boundary falls between steps of this schedule.
    import gfdit.models as gm
    from diffusers import WanPipeline
    from gfdit.models import wan_pipeline

    base = wan_pipeline.build_tiny(scheduler_config=sh.SCHEDULERS["unipc"])
    two = sh.two_experts(base)
    two.save_pretrained(tmp_path)
    m = gm.load("wan2.2", path=tmp_path)
    assert m.transformer_2 is not None and m.boundary_ratio == 0.875
    pipe = WanPipeline(
        tokenizer=m.tokenizer,
        text_encoder=m.text_encoder,
        vae=m.vae,
        transformer=m.transformer,
        transformer_2=m.transformer_2,
        boundary_ratio=0.875,
        scheduler=_folder_scheduler(str(tmp_path)),
    )
    pipe.set_progress_bar_config(disable=True)
    opts = {"num_inference_steps": 6, "guidance_scale": 4.0, "height": 32, "width": 48, "num_frames": 9}
    timesteps = m.schedule(6, (3, 4, 6))[1]
    assert (timesteps >= 875).any() and (timesteps < 875).any(), timesteps  # both experts run
    want = pipe(
        PROMPT,
        negative_prompt=NEGATIVE,
        generator=torch.Generator().manual_seed(3),
        output_type="pt",
        max_sequence_length=m.defaults.max_sequence_length,
        **opts,
    ).frames[0]
    got = m.generate(PROMPT, seed=3, negative_prompt=NEGATIVE, **opts)
    err = (got.permute(1, 0, 2, 3) - want.float()).abs().max().item()
    # Wan 2.2's own scales: 4.0 for the high-noise expert, 3.0 for the low-noise one (guidance_scale_2).
    want2 = pipe(
        PROMPT,
        negative_prompt=NEGATIVE,
        generator=torch.Generator().manual_seed(3),
        output_type="pt",
        max_sequence_length=m.defaults.max_sequence_length,
        guidance_scale_2=3.0,
        **opts,
    ).frames[0]
    got2 = m.generate(PROMPT, seed=3, negative_prompt=NEGATIVE, guidance_scale_2=3.0, **opts)
    err2 = (got2.permute(1, 0, 2, 3) - want2.float()).abs().max().item()
    assert (want2 - want).abs().max().item() > 100 * PIXEL_TOL  # the second scale matters here
    # It travels with the state (a migration delivers it), and a model with one expert refuses it.
    cond = m.encode(PROMPT, NEGATIVE, guidance_scale=4.0)
    st = m.initial_state(cond, m.init_latent(3, m.latent_shape()), guidance_scale=4.0, guidance_scale_2=3.0)
    assert gm.unpack_state(*gm.pack_state(st)).guidance_scale_2 == 3.0
    assert (
        gm.unpack_state(*gm.pack_state(dataclasses.replace(st, guidance_scale_2=None))).guidance_scale_2
        is None
    )
    import gfdit

    with pytest.raises(gfdit.InvalidUsage, match="two experts"):
        base.initial_state(
            cond, base.init_latent(3, base.latent_shape()), guidance_scale=4.0, guidance_scale_2=3.0
        )
    # The same with the experts swapped differs: the test sees which expert ran where.
    m.transformer, m.transformer_2 = m.transformer_2, m.transformer
    m.parallel, m.parallel_2 = m.parallel_2, m.parallel
    swapped = m.generate(PROMPT, seed=3, negative_prompt=NEGATIVE, **opts)
    print(f"wan2.2 two experts: max |pixel difference| {err:.3g}, with guidance_scale_2 {err2:.3g}")
    assert err <= PIXEL_TOL and err2 <= PIXEL_TOL
    assert (swapped.permute(1, 0, 2, 3) - want.float()).abs().max().item() > 100 * PIXEL_TOL


QWEN_FOLDERS = [("euler", None), ("unipc", UNIPC_DYNAMIC)]


def _qwen_pixel_error(m, pipe, steps: int = 5) -> float:
    """Max |pixel difference| between m.generate and the pipeline for one prompt, negative prompt, size, steps,
    true-CFG scale and seed (gfdit returns float32 pixels whatever the model's dtype); the output must be
    finite and not flat."""
    pipe.prompt_template_encode_start_idx = m.prompt_template_drop  # the byte tokenizer's template prefix
    pipe.set_progress_bar_config(disable=True)
    opts = {"num_inference_steps": steps, "height": 48, "width": 80}
    want = pipe(
        PROMPT,
        negative_prompt=NEGATIVE,
        true_cfg_scale=4.0,
        generator=torch.Generator().manual_seed(4),
        output_type="pt",
        max_sequence_length=m.defaults.max_sequence_length,
        **opts,
    ).images[0]
    got = m.generate(PROMPT, seed=4, negative_prompt=NEGATIVE, guidance_scale=4.0, **opts)
    assert got.dtype == torch.float32 and torch.isfinite(got).all()
    assert got.std().item() > 0.01  # an image, not a flat one
    return (got - want.float()).abs().max().item()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("config", [c for _, c in QWEN_FOLDERS], ids=[n for n, _ in QWEN_FOLDERS])
def test_qwen_image_generate_equals_qwen_image_pipeline(tmp_path, config):
    import gfdit.models as gm
    from diffusers import QwenImagePipeline
    from gfdit.models import qwen_pipeline

    if config is not None:
        config = {**qwen_pipeline.QWEN_IMAGE_SCHEDULER, **config}
    qwen_pipeline.build_tiny(scheduler_config=config).save_pretrained(tmp_path)
    m = gm.load("qwen-image", path=tmp_path)
    pipe = QwenImagePipeline(
        scheduler=_folder_scheduler(str(tmp_path)),
        vae=m.vae,
        text_encoder=m.text_encoder,
        tokenizer=m.tokenizer,
        transformer=m.transformer,
    )
    err = _qwen_pixel_error(m, pipe)
    print(f"qwen-image {m.sampler.name}: max |pixel difference| {err:.3g}")
    assert err <= PIXEL_TOL


# ------------------------------------------------------------------------ bfloat16, as real checkpoints run
# gfdit.models.load(..., dtype=torch.bfloat16) against the pipeline loaded with dtype=torch.bfloat16
# (diffusers 0.42's name for torch_dtype): every op in the dtype diffusers runs it in, so the output is the
# pipeline's.
BF16_WAN_FOLDERS = [("unipc", sh.SCHEDULERS["unipc"]), ("euler", EULER)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("config", [c for _, c in BF16_WAN_FOLDERS], ids=[n for n, _ in BF16_WAN_FOLDERS])
def test_wan_bf16_generate_equals_wan_pipeline(tmp_path, config):
    import gfdit.models as gm
    from diffusers import WanPipeline

    path = _wan_folder(tmp_path, config)
    m = gm.load("wan2.1", path=path, dtype=torch.bfloat16)
    # The pipeline loads its tokenizer, text encoder, VAE and scheduler itself; Wan's transformer (with its
    # float32-pinned modules) loads in bfloat16 only with accelerate, so it is the one gfdit loaded.
    pipe = WanPipeline.from_pretrained(
        path, transformer=m.transformer, dtype=torch.bfloat16, local_files_only=True
    )
    pipe.set_progress_bar_config(disable=True)
    assert m.transformer.dtype == torch.bfloat16 and pipe.text_encoder.dtype == m.text_encoder.dtype
    assert (
        pipe.vae.dtype == m.vae.dtype
    )  # whatever the pipeline's dtype makes of the VAE, gfdit's is the same
    opts = {"num_inference_steps": 6, "guidance_scale": 4.0, "height": 32, "width": 48, "num_frames": 9}
    want = pipe(
        PROMPT,
        negative_prompt=NEGATIVE,
        generator=torch.Generator().manual_seed(3),
        output_type="pt",
        max_sequence_length=m.defaults.max_sequence_length,
        **opts,
    ).frames[0]
    got = m.generate(PROMPT, seed=3, negative_prompt=NEGATIVE, **opts)
    err = (got.permute(1, 0, 2, 3) - want.float()).abs().max().item()
    print(f"wan bf16 {config['_class_name']}: max |pixel difference| {err:.3g}")
    assert got.dtype == torch.float32 and err <= PIXEL_TOL


@pytest.mark.timeout(120)
def test_qwen_image_bf16_generate_equals_qwen_image_pipeline(tmp_path):
    import gfdit.models as gm
    from diffusers import QwenImagePipeline
    from gfdit.models import qwen_pipeline

    qwen_pipeline.build_tiny().save_pretrained(tmp_path)
    m = gm.load("qwen-image", path=tmp_path, dtype=torch.bfloat16)
    pipe = QwenImagePipeline.from_pretrained(tmp_path, dtype=torch.bfloat16, local_files_only=True)
    assert m.transformer.dtype == pipe.transformer.dtype == torch.bfloat16
    assert pipe.text_encoder.dtype == m.text_encoder.dtype and pipe.vae.dtype == m.vae.dtype
    err = _qwen_pixel_error(m, pipe)
    print(f"qwen-image bf16 {m.sampler.name}: max |pixel difference| {err:.3g}")
    assert err <= PIXEL_TOL


@pytest.mark.timeout(60)
def test_bf16_state_dtypes_follow_diffusers_and_pack_unchanged():
    # Qwen-Image with UniPC: latent, history and the corrector's sample in bfloat16 (the prompt embeddings'
    # dtype, which UniPC keeps); Wan with UniPC: float32 latent and history (WanPipeline's float32 latents),
    # with Euler: bfloat16 after the first step (the model output's dtype). Packing keeps them bit for bit.
    import gfdit.models as gm

    cases = [
        ("tiny-qwen-image@unipc+bf16", torch.bfloat16, torch.bfloat16),
        ("tiny-wan@unipc+bf16", torch.float32, torch.float32),
        ("tiny-wan+bf16", torch.bfloat16, None),
    ]
    for name, latent_dtype, history_dtype in cases:
        m = sh.model(name)
        state = sh.start(m, PROMPT, 2)
        assert state.prompt_embeds.dtype == torch.bfloat16
        for k in range(2):
            state = m.denoise_step(state, k)
        assert state.latent.dtype == latent_dtype, (name, state.latent.dtype)
        if history_dtype is None:
            assert state.history is None and state.last_sample is None
        else:
            assert state.history.dtype == state.last_sample.dtype == history_dtype, name
        back = gm.unpack_state(*gm.pack_state(state))
        for field in ("latent", "history", "last_sample", "prompt_embeds", "negative_prompt_embeds"):
            a, b = getattr(state, field), getattr(back, field)
            assert (a is None and b is None) or (a.dtype == b.dtype and torch.equal(a, b)), (name, field)


@pytest.mark.timeout(60)
def test_unsupported_schedulers_refused(tmp_path):
    import gfdit
    import gfdit.models as gm
    from gfdit.models.samplers import sampler_from_config

    path = _wan_folder(tmp_path, EULER)
    with open(os.path.join(path, "scheduler", "scheduler_config.json"), "w", encoding="utf-8") as f:
        json.dump({"_class_name": "DDIMScheduler", "num_train_timesteps": 1000}, f)
    with pytest.raises(gfdit.InvalidUsage, match="DDIMScheduler.*not supported.*UniPCMultistepScheduler"):
        gm.load("wan2.1", path=path)
    with pytest.raises(gfdit.InvalidUsage, match="'sde-dpmsolver\\+\\+' draws noise"):
        sampler_from_config({**sh.SCHEDULERS["dpm"], "algorithm_type": "sde-dpmsolver++"})
    with pytest.raises(gfdit.InvalidUsage, match="stochastic_sampling"):
        sampler_from_config({**EULER, "stochastic_sampling": True})
    # Qwen-Image sets custom sigmas, which DPM-Solver++ cannot take (QwenImagePipeline refuses it too).
    from gfdit.models import qwen_pipeline

    m = qwen_pipeline.build_tiny(scheduler_config=sh.SCHEDULERS["dpm"])
    with pytest.raises(gfdit.InvalidUsage, match="DPMSolverMultistepScheduler cannot make this schedule"):
        m.generate(PROMPT)


# ------------------------------------------------------------------------ one step, and outputs that are not finite
# Qwen-Image's scheduler stretches its sigmas to shift_terminal; at one step diffusers divides by zero there and
# gives NaN (NOTE [one-step terminal stretch] in gfdit.models.samplers). The reference of the one-step schedule is
# diffusers' scheduler with the stretch off, which at one step is the stretch that keeps sigma 1.
QWEN_UNIPC = {
    "_class_name": "UniPCMultistepScheduler",
    "use_flow_sigmas": True,
    "prediction_type": "flow_prediction",
}


def _qwen_schedulers():
    from gfdit.models import qwen_pipeline

    return [
        ("euler", qwen_pipeline.QWEN_IMAGE_SCHEDULER),
        ("unipc", {**qwen_pipeline.QWEN_IMAGE_SCHEDULER, **QWEN_UNIPC}),
    ]


@pytest.mark.timeout(60)
def test_one_step_schedule_under_shift_terminal_starts_from_noise():
    import warnings

    import numpy as np
    from gfdit.models.samplers import sampler_from_config

    for name, config in _qwen_schedulers():
        assert config["shift_terminal"] == 0.02
        sampler = sampler_from_config(config)
        for steps in (1, 2, 5):
            sigmas = np.linspace(1.0, 1 / steps, steps)
            with warnings.catch_warnings():
                warnings.simplefilter("error", RuntimeWarning)  # no division by zero on our side
                got_sigmas, got_timesteps = sampler.schedule(steps, sigmas=sigmas, mu=0.7)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # diffusers' own at one step
                stretched = _reference_scheduler(config, steps, {"sigmas": True, "mu": 0.7})
            assert torch.isfinite(got_sigmas).all() and torch.isfinite(got_timesteps.float()).all()
            if steps == 1:
                assert torch.isnan(stretched.sigmas[0]), (
                    "diffusers now makes this schedule: drop the workaround"
                )
                plain = _reference_scheduler(
                    {**config, "shift_terminal": None}, 1, {"sigmas": True, "mu": 0.7}
                )
                assert torch.equal(got_sigmas, plain.sigmas) and torch.equal(got_timesteps, plain.timesteps)
                assert got_sigmas[0] > 0.999 and got_sigmas[1] == 0, (name, got_sigmas)
            else:  # diffusers' schedule, stretched to end at shift_terminal
                assert torch.equal(got_sigmas, stretched.sigmas), (name, steps)
                assert torch.equal(got_timesteps, stretched.timesteps), (name, steps)
                assert abs(float(got_sigmas[-2]) - 0.02) < 1e-4


@pytest.mark.timeout(120)
@pytest.mark.parametrize("which", ["euler", "unipc"])
def test_qwen_image_one_step_is_finite_and_equals_the_pipeline_without_the_stretch(tmp_path, which):
    import gfdit.models as gm
    from diffusers import QwenImagePipeline
    from gfdit.models import qwen_pipeline

    config = dict(_qwen_schedulers())[which]
    qwen_pipeline.build_tiny(scheduler_config=config).save_pretrained(tmp_path)
    m = gm.load("qwen-image", path=tmp_path)
    scheduler = m.sampler.scheduler_class.from_config({**config, "shift_terminal": None})
    pipe = QwenImagePipeline(
        scheduler=scheduler,
        vae=m.vae,
        text_encoder=m.text_encoder,
        tokenizer=m.tokenizer,
        transformer=m.transformer,
    )
    err = _qwen_pixel_error(m, pipe, steps=1)
    print(f"qwen-image {which} one step: max |pixel difference| {err:.3g}")
    assert err <= PIXEL_TOL


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "case", [c for c in SAMPLER_CASES if c[0] in ("euler", "unipc-wan")], ids=lambda c: c[0]
)
def test_a_trajectory_ending_in_nan_is_a_model_error(case):
    # The worker reports the exception's class (NOTE [worker loop]): gfdit.Error is a model error, which fails
    # the request with its cause instead of decoding NaN into a black image.
    import gfdit
    import gfdit._C.runtime as rt
    from gfdit.models.samplers import sampler_from_config

    _, config, steps, _, shape = case
    sampler = sampler_from_config(config)
    sigmas, timesteps = sampler.schedule(steps)
    g = torch.Generator().manual_seed(5)
    state = _state(torch.randn(shape, generator=g), sigmas, timesteps, g)
    outputs = [torch.randn(shape, generator=g) for _ in range(steps)]
    clean = state
    for out in outputs:
        clean = sampler.step(clean, out)
    assert clean.done and torch.isfinite(clean.latent).all()
    outputs[1][0, 0, 0] = float("nan")  # one bad value mid-trajectory: checked once, at the end
    for out in outputs[:-1]:
        state = sampler.step(state, out)
    assert not torch.isfinite(state.latent).all()
    with pytest.raises(gfdit.Error, match="NaN or infinite") as info:
        sampler.step(state, outputs[-1])
    assert not isinstance(info.value, gfdit.InvalidUsage)
    assert rt.task_error_of(info.value) == rt.TaskError.MODEL_ERROR


# ------------------------------------------------------------------------ world of 2
@pytest.fixture(scope="module")
def world(world_pool):
    mp_harness.skip_if_too_big(2)
    return world_pool.get(2, timeout=60.0, gloo=False)


# Four steps: rank 0, both (Ulysses 2; rank 1 receives the history), rank 1, rank 0 (receives it back).
PLAN = [([0], None), ([0, 1], {"ulysses": 2, "ring": 1}), ([1], None), ([0], None)]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", ["tiny-wan@unipc", "tiny-wan@dpm", "tiny-qwen-image@unipc"])
def test_multistep_trajectory_with_migrations_matches_one_rank(world, name):
    reports = world.run(sh.case_trajectory, name, PROMPT, 13, PLAN, timeout=150)
    errors = [r["error"] for r in reports if r["error"]]
    assert not errors, "\n".join(errors)
    for k, (ranks, _) in enumerate(PLAN):
        assert len({reports[r]["digests"].get(k) for r in ranks}) == 1, f"step {k}: members differ"
    assert sum(r["migrations"] for r in reports) >= 4  # two migrations, each on both ranks
    ref = sh.reference(name, PROMPT, 13)
    final = reports[0]
    rel = ((final["latent"] - ref["latent"]).abs().max() / ref["latent"].abs().max()).item()
    pix = (final["output"] - ref["output"]).abs().max().item()
    print(f"{name}: latent rel {rel:.3g}, pixels {pix:.3g}")
    assert rel <= 1e-4 and pix <= PIXEL_TOL


# bfloat16 steps with CFG-parallel (one rank per guidance pass) and migrations both ways (rank 1 receives the
# state, then rank 0 receives it back): the guidance pairs exchange predictions in the dtype they combine in,
# and the state migrates in its own dtypes, so the trajectory is bit for bit the one that runs every step on
# rank 0 with the passes in turn (the same transformer calls), and on one rank per pass gfdit.attention runs
# the computation of diffusers' own processors, so it equals the plain model of a process without gfdit too.
BF16_PLAN = [([0], None), ([0, 1], {"cfg": 2}), ([1], None), ([1, 0], {"cfg": 2})]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", ["tiny-wan+bf16", "tiny-wan@unipc+bf16", "tiny-qwen-image@unipc+bf16"])
def test_bf16_trajectory_with_cfg_parallel_and_migrations_is_exact(world, name):
    reports = world.run(sh.case_trajectory, name, PROMPT, 17, BF16_PLAN, timeout=200)
    sequential = world.run(sh.case_trajectory, name, PROMPT, 17, [([0], None)] * len(BF16_PLAN), timeout=200)
    errors = [r["error"] for r in reports + sequential if r["error"]]
    assert not errors, "\n".join(errors)
    for k, (ranks, _) in enumerate(BF16_PLAN):
        assert len({reports[r]["digests"].get(k) for r in ranks}) == 1, f"step {k}: members differ"
    assert sum(r["migrations"] for r in reports) >= 4  # two migrations, each on both ranks
    final, ref = reports[BF16_PLAN[-1][0][0]], sequential[0]
    assert reports[1]["digests"][3] == ref["digests"][3]  # the whole state, history included
    assert final["latent"].dtype == ref["latent"].dtype
    assert torch.equal(final["latent"], ref["latent"]), (final["latent"] - ref["latent"]).abs().max()
    assert torch.equal(final["output"], ref["output"])
    plain = sh.reference(name, PROMPT, 17)  # gfdit not initialised: the plain transformer
    err = (final["output"] - plain["output"]).abs().max().item()
    print(f"{name}: max |pixel difference| to the plain one-process run {err:.3g}")
    # Each guidance pass ran on one rank, where gfdit.attention is the plain model's own attention call.
    assert err <= PIXEL_TOL
