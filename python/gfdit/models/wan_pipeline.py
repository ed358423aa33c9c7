"""Wan 2.x text-to-video as a StagedModel: UMT5 encoder, WanTransformer3DModel(s), AutoencoderKLWan.

Follows diffusers' WanPipeline: prompts are cleaned, tokenised to ``max_sequence_length`` and encoded, the
embeddings past each prompt's length are zeroed; guidance runs the conditional and unconditional passes
one after the other, or with ``spec.cfg == 2`` on the two halves of the group at once (NOTE [CFG-parallel]
in gfdit.models.staged), and combines them (``noise_uncond + g (noise_cond - noise_uncond)``) in the
transformer's output dtype; the latent is [1, C, (F-1)/4 + 1, H/8, W/8], float32 before step 0 and then in
the dtype the scheduler's step returns (NOTE [state dtypes] in gfdit.models.staged); decode un-normalises with
the VAE's latents_mean/std.

Scheduler: the folder's own (gfdit.models.samplers): Wan folders ship UniPCMultistepScheduler with flow
prediction (WAN21_SCHEDULER), a multistep solver whose history (earlier model outputs, the corrector's
sample) travels in the state with the latent (NOTE [portable denoise state]), so the output equals
WanPipeline's for the same folder whatever groups ran the steps; FlowMatchEulerDiscreteScheduler and
DPMSolverMultistepScheduler work too, and any other scheduler is refused. Wan 2.2 A14B's two experts
(``transformer`` above, ``transformer_2`` below ``boundary_ratio * 1000``) are supported, with one guidance
scale for both unless ``guidance_scale_2`` gives the low-noise expert its own (as WanPipeline); Wan 2.2
TI2V's ``expand_timesteps`` passes one timestep per token. ``denoise_batch`` steps several requests of one size
with one forward per pass (NOTE [batched step] in gfdit.models.staged): the text embeddings, padded to
max_sequence_length, concatenate; states whose step runs another expert, or whose text has another length, run
as separate sub-batches, each state with its own guidance scale (guidance_scale_2 on the low-noise expert).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch

from gfdit import comm
from gfdit._C import InvalidUsage
from gfdit.attention.spec import ParallelSpec
from gfdit.models import cache as step_cache
from gfdit.models.adapter import DiffusersModule
from gfdit.models.staged import (
    CONFIG_FILE,
    Conditioning,
    DenoiseState,
    StageDefaults,
    StagedModel,
    cat_rows,
    check_folder,
    load_diffusers_model,
    read_json,
    sub_batches,
    transformer_dtype,
    write_gfdit_config,
)

# Serving defaults, from the model registry (src/runtime/cost.cpp): Wan2.2 T2V 40 steps, 1280x720, 81 frames,
# guidance 4.0.
WAN22_DEFAULTS = StageDefaults.of("wan2.2", max_sequence_length=512)
# diffusers WanPipeline's own defaults (Wan 2.1).
WAN21_DEFAULTS = StageDefaults.of("wan2.1", max_sequence_length=512)
TINY_DEFAULTS = StageDefaults.of("tiny-wan", max_sequence_length=16)
TINY_SCHEDULER = {"_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000, "shift": 3.0}
# The scheduler_config.json of Wan-AI/Wan2.1-T2V-1.3B-Diffusers (the 14B 720p folders: flow_shift 5.0).
WAN21_SCHEDULER = {
    "_class_name": "UniPCMultistepScheduler",
    "beta_end": 0.02,
    "beta_schedule": "linear",
    "beta_start": 0.0001,
    "disable_corrector": [],
    "dynamic_thresholding_ratio": 0.995,
    "final_sigmas_type": "zero",
    "flow_shift": 3.0,
    "lower_order_final": True,
    "num_train_timesteps": 1000,
    "predict_x0": True,
    "prediction_type": "flow_prediction",
    "rescale_betas_zero_snr": False,
    "sample_max_value": 1.0,
    "solver_order": 2,
    "solver_p": None,
    "solver_type": "bh2",
    "steps_offset": 0,
    "thresholding": False,
    "timestep_spacing": "linspace",
    "trained_betas": None,
    "use_beta_sigmas": False,
    "use_exponential_sigmas": False,
    "use_flow_sigmas": True,
    "use_karras_sigmas": False,
}
TINY_VAE = {
    "base_dim": 8,
    "z_dim": 4,
    "dim_mult": [1, 1, 1, 1],
    "num_res_blocks": 1,
    "temperal_downsample": [False, True, True],
    "latents_mean": [0.1, -0.2, 0.05, 0.0],
    "latents_std": [1.5, 0.8, 1.2, 1.0],
}


def _prompt_clean(text: str) -> str:
    from diffusers.pipelines.wan.pipeline_wan import prompt_clean

    return prompt_clean(text)


class WanStagedModel(StagedModel):
    """Wan 2.x text-to-video; see the module docstring. Output: float32 video [3, F, H, W] in [0, 1]."""

    is_video = True
    cache_kinds = step_cache.KINDS

    def __init__(
        self,
        *,
        name: str,
        tokenizer: Any,
        text_encoder: torch.nn.Module,
        vae: DiffusersModule,
        transformer: DiffusersModule,
        scheduler_config: dict,
        defaults: StageDefaults,
        transformer_2: DiffusersModule | None = None,
        boundary_ratio: float | None = None,
        expand_timesteps: bool = False,
    ) -> None:
        from gfdit.models.core import parallelize
        from gfdit.models.samplers import sampler_from_config

        self.sampler = sampler_from_config(scheduler_config)  # refuses unsupported schedulers first
        self.name = name
        self.tokenizer = tokenizer
        self.text_encoder = text_encoder.eval()
        self.vae = vae.eval()
        self.transformer = transformer.eval()
        self.transformer_2 = None if transformer_2 is None else transformer_2.eval()
        self.parallel = parallelize(self.transformer)
        self.parallel_2 = None if transformer_2 is None else parallelize(self.transformer_2)
        self.scheduler_config = dict(scheduler_config)
        self.defaults = defaults
        self.boundary_ratio = boundary_ratio
        self.expand_timesteps = bool(expand_timesteps)
        self.patch_size = tuple(int(p) for p in transformer.config.patch_size)  # type: ignore[assignment]
        self.scale_temporal = int(getattr(vae.config, "scale_factor_temporal", 4) or 4)
        self.scale_spatial = int(getattr(vae.config, "scale_factor_spatial", 8) or 8)

    # -- encode ------------------------------------------------------------------------------------------
    def _embed(self, text: str, max_len: int) -> torch.Tensor:
        tok = self.tokenizer(
            [_prompt_clean(text)],
            padding="max_length",
            max_length=max_len,
            truncation=True,
            add_special_tokens=True,
            return_attention_mask=True,
            return_tensors="pt",
        )
        ids, mask = tok.input_ids, tok.attention_mask
        seq_len = int(mask.gt(0).sum())
        dev = next(self.text_encoder.parameters()).device
        with torch.no_grad():
            out = self.text_encoder(ids.to(dev), mask.to(dev)).last_hidden_state
        out = out.to(self.device, self.transformer.dtype)  # NOTE [state placement]
        emb = out.new_zeros(out.shape)
        emb[:, :seq_len] = out[:, :seq_len]
        return emb

    def encode(self, prompt: str, negative_prompt: str | None = None, **opts: Any) -> Conditioning:
        max_len, scale = self._encode_options(prompt, opts)
        cond = self._embed(prompt, max_len)
        neg = self._embed(negative_prompt or "", max_len) if scale > 1.0 else None
        return Conditioning(prompt_embeds=cond, negative_prompt_embeds=neg)

    # -- latent ------------------------------------------------------------------------------------------
    def latent_shape(
        self, *, height: int | None = None, width: int | None = None, num_frames: int | None = None
    ) -> tuple[int, ...]:
        d = self.defaults
        height = d.height if height is None else height
        width = d.width if width is None else width
        num_frames = d.num_frames if num_frames is None else num_frames
        for what, v in (("height", height), ("width", width), ("num_frames", num_frames)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidUsage(f"gfdit.models: {what} must be a positive integer, got {v!r}")
        _, ph, pw = self.patch_size
        mh, mw = self.scale_spatial * ph, self.scale_spatial * pw
        if height % mh or width % mw:
            raise InvalidUsage(
                f"gfdit.models: {self.name} height x width {height}x{width} must be "
                f"multiples of {mh}x{mw} (VAE {self.scale_spatial} x patch)"
            )
        if (num_frames - 1) % self.scale_temporal:
            raise InvalidUsage(
                f"gfdit.models: {self.name} num_frames {num_frames} must be {self.scale_temporal} k + 1"
            )
        frames = (num_frames - 1) // self.scale_temporal + 1
        pt = self.patch_size[0]
        if frames % pt:
            raise InvalidUsage(f"gfdit.models: {frames} latent frames are not a multiple of the patch {pt}")
        z = int(self.transformer.config.in_channels)
        return (1, z, frames, height // self.scale_spatial, width // self.scale_spatial)

    def init_latent(self, seed: int, shape: tuple[int, ...]) -> torch.Tensor:
        shape = tuple(int(s) for s in shape)
        if len(shape) != 5 or shape[0] != 1:
            raise InvalidUsage(f"gfdit.models: Wan latent shape must be [1, C, F, H, W], got {shape}")
        g = torch.Generator().manual_seed(int(seed))
        return torch.randn(shape, generator=g, dtype=torch.float32)

    def schedule(
        self, num_inference_steps: int, grid: tuple[int, int, int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.sampler.schedule(num_inference_steps)

    # -- denoise -----------------------------------------------------------------------------------------
    @property
    def two_experts(self) -> bool:  # type: ignore[override]
        return self.transformer_2 is not None and self.boundary_ratio is not None

    def _expert(self, t: float) -> tuple[DiffusersModule, torch.nn.Module]:
        if self.transformer_2 is None or self.boundary_ratio is None:
            return self.transformer, self.parallel
        boundary = self.boundary_ratio * float(self.scheduler_config.get("num_train_timesteps", 1000))
        if t >= boundary:
            return self.transformer, self.parallel
        return self.transformer_2, self.parallel_2  # type: ignore[return-value]

    def _step_states(
        self, states: list[DenoiseState], group: comm.Group | None, spec: ParallelSpec | None
    ) -> list[DenoiseState]:
        # one sub-batch per expert, text length and cache kind, in the order of first appearance (NOTE
        # [batched step])
        keys = []
        for s in states:
            neg = s.negative_prompt_embeds
            model, _ = self._expert(float(s.timesteps[s.step_idx]))
            keys.append(
                (
                    model is self.transformer,
                    s.prompt_embeds.shape[1],
                    0 if neg is None else neg.shape[1],
                    step_cache.kind_of(s),
                )
            )
        out: list[DenoiseState | None] = [None] * len(states)
        for rows in sub_batches(keys):
            for i, new in zip(rows, self._step_sub_batch([states[i] for i in rows], group, spec)):
                out[i] = new
        return out  # type: ignore[return-value]

    def _step_sub_batch(
        self, states: list[DenoiseState], group: comm.Group | None, spec: ParallelSpec | None
    ) -> list[DenoiseState]:
        """The next states of states that share an expert and a text length: one forward per pass."""
        # the schedule is on the CPU: no wait for the device
        ts = [s.timesteps[s.step_idx] for s in states]
        model, wrapper = self._expert(float(ts[0]))
        dev, dtype = model.device, transformer_dtype(model)
        x = cat_rows([s.latent.to(dev, dtype) for s in states])
        if self.expand_timesteps:
            _, _, f, h, w = states[0].latent.shape
            pt, ph, pw = self.patch_size
            tokens = (f // pt) * (h // ph) * (w // pw)
            # WanPipeline: a float32 mask of ones times t, one timestep per token: [B, S]
            timestep = cat_rows([t.float().expand(1, tokens).to(dev) for t in ts])
        else:
            timestep = cat_rows([t.expand(1).to(dev) for t in ts])  # [B]

        # the step cache's work (NOTE [step cache algorithms]); None without caching: the calls are as ever
        cached = step_cache.CachedStep.of(states, 0 if model is self.transformer else 1, "wan")

        def velocity(
            embeds: list[torch.Tensor], g: comm.Group | None, s: ParallelSpec | None, pass_idx: int
        ) -> torch.Tensor:
            out = self.parallel_call(
                model,
                wrapper,
                g,
                s,
                block_loop=None if cached is None else cached.loop(pass_idx, None, g),
                hidden_states=x,
                timestep=timestep,
                encoder_hidden_states=cat_rows([e.to(dev, dtype) for e in embeds]),
            )
            return out  # in the transformer's dtype: the guidance combines there (NOTE [state dtypes])

        with torch.no_grad():
            # the passes in turn, or CFG-parallel on the two halves of the group (NOTE [CFG-parallel])
            v, v_uncond = self.guided_batch_predictions(states, group, spec, velocity, cached)
            result = []
            for i, state in enumerate(states):
                vi = v[i : i + 1]
                if v_uncond is not None:
                    # WanPipeline: the low-noise expert's steps use guidance_scale_2 when it is given
                    scale = state.guidance_scale
                    if model is self.transformer_2 and state.guidance_scale_2 is not None:
                        scale = state.guidance_scale_2
                    ui = v_uncond[i : i + 1]
                    vi = ui + scale * (vi - ui)
                new = self.sampler.step(state, vi)  # per state: its own sampler history
                if cached is not None:
                    new = dataclasses.replace(new, cache=cached.next_cache(i))
                result.append(new)
        return result

    # -- decode ------------------------------------------------------------------------------------------
    def vae_latent(self, state_or_latent: DenoiseState | torch.Tensor) -> torch.Tensor:
        latent = state_or_latent.latent if isinstance(state_or_latent, DenoiseState) else state_or_latent
        if not isinstance(latent, torch.Tensor) or latent.dim() != 5:
            raise InvalidUsage("gfdit.models: Wan decode needs a DenoiseState or a [1, C, F, H, W] latent")
        return latent

    def decode(
        self, state_or_latent: DenoiseState | torch.Tensor, group: comm.Group | None = None
    ) -> torch.Tensor:
        return self._vae_decode(self.vae_latent(state_or_latent), group)

    # -- saving ------------------------------------------------------------------------------------------
    def save_pretrained(self, path: str | os.PathLike) -> None:
        """Writes a diffusers WanPipeline folder (plus gfdit.json with this model's defaults)."""
        from diffusers import WanPipeline

        pipe = WanPipeline(
            tokenizer=self.tokenizer,
            text_encoder=self.text_encoder,
            vae=self.vae,
            scheduler=self.sampler.scheduler_class.from_config(self.scheduler_config),
            transformer=self.transformer,
            transformer_2=self.transformer_2,
            boundary_ratio=self.boundary_ratio,
            expand_timesteps=self.expand_timesteps,
        )
        pipe.save_pretrained(os.fspath(path))
        write_gfdit_config(path, self.name, self.defaults)


def build_tiny(seed: int = 0, scheduler_config: dict | None = None) -> WanStagedModel:
    """tiny-wan: the tiny Wan transformer of gfdit.models.tiny, a byte tokenizer, a tiny UMT5 and VAE;
    flow-matching Euler unless another scheduler config is given."""
    from diffusers import AutoencoderKLWan

    from gfdit.models import text, tiny

    transformer = tiny.tiny_wan(seed)
    encoder = text.tiny_umt5_encoder(seed + 1, d_model=int(transformer.config.text_dim))
    vae = text.randomize_module(AutoencoderKLWan(**TINY_VAE), seed + 2)
    return WanStagedModel(
        name="tiny-wan",
        tokenizer=text.t5_byte_tokenizer(),
        text_encoder=encoder,
        vae=vae,
        transformer=transformer,
        scheduler_config=TINY_SCHEDULER if scheduler_config is None else scheduler_config,
        defaults=TINY_DEFAULTS,
    )


def _scheduler_config(path: str) -> dict:
    """The folder's scheduler config as it is (WAN21_SCHEDULER, what Wan folders ship, if it has none)."""
    file = os.path.join(path, "scheduler", "scheduler_config.json")
    return read_json(file) if os.path.isfile(file) else dict(WAN21_SCHEDULER)


def load_folder(
    name: str, path: Any, *, dtype: torch.dtype | None = None, device: str | torch.device = "cpu"
) -> WanStagedModel:
    """A Wan model from a local diffusers folder (from_pretrained with local_files_only=True)."""
    from diffusers import AutoencoderKLWan, WanTransformer3DModel
    from transformers import AutoTokenizer, UMT5EncoderModel

    from gfdit.models.samplers import sampler_from_config

    path = check_folder(name, path, ("tokenizer", "text_encoder", "vae", "transformer"))
    scheduler_config = _scheduler_config(path)
    sampler_from_config(scheduler_config)  # an unsupported scheduler is refused before any weights load
    index = read_json(os.path.join(path, "model_index.json"))
    gcfg_file = os.path.join(path, CONFIG_FILE)
    gcfg = read_json(gcfg_file) if os.path.isfile(gcfg_file) else {}
    if "defaults" in gcfg:
        defaults = StageDefaults(**gcfg["defaults"])
    else:
        defaults = WAN21_DEFAULTS if name == "wan2.1" else WAN22_DEFAULTS
    try:
        tokenizer = AutoTokenizer.from_pretrained(os.path.join(path, "tokenizer"), local_files_only=True)
        dtype_arg: dict[str, Any] = {"dtype": dtype} if dtype is not None else {}
        encoder: torch.nn.Module = UMT5EncoderModel.from_pretrained(
            os.path.join(path, "text_encoder"), local_files_only=True, **dtype_arg
        )
        # the VAE as WanPipeline.from_pretrained(dtype=dtype) loads it (float32 without a dtype)
        vae = load_diffusers_model(AutoencoderKLWan, path, "vae", dtype or torch.float32)
        transformer = load_diffusers_model(WanTransformer3DModel, path, "transformer", dtype)
        transformer_2 = None
        if index.get("transformer_2", [None, None])[0] is not None and os.path.isdir(
            os.path.join(path, "transformer_2")
        ):
            transformer_2 = load_diffusers_model(WanTransformer3DModel, path, "transformer_2", dtype)
    except (OSError, ValueError) as exc:
        raise InvalidUsage(f"gfdit.models.load: {name!r}: cannot load {path!r}: {exc}") from None
    model = WanStagedModel(
        name=gcfg.get("name", name),
        tokenizer=tokenizer,
        text_encoder=encoder.to(device),
        vae=vae.to(device),
        transformer=transformer.to(device),
        transformer_2=None if transformer_2 is None else transformer_2.to(device),
        scheduler_config=scheduler_config,
        defaults=defaults,
        boundary_ratio=index.get("boundary_ratio"),
        expand_timesteps=bool(index.get("expand_timesteps", False)),
    )
    return model
