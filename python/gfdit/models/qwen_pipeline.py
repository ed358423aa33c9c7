"""Qwen-Image text-to-image as a StagedModel: Qwen2.5-VL encoder, QwenImageTransformer2DModel,
AutoencoderKLQwenImage.

Follows diffusers' QwenImagePipeline: the prompt goes through the chat template, the encoder's last hidden
states drop the template's prefix tokens; true CFG runs the conditional and negative passes one after the
other (their text lengths differ, so they do not batch without a mask), or with ``spec.cfg == 2`` on the
two halves of the group at once (NOTE [CFG-parallel] in gfdit.models.staged), and rescales the combined
prediction to the conditional one's norm per token; the schedule is the folder's scheduler (flow-matching
Euler as Qwen-Image ships it; UniPC with flow sigmas works too, gfdit.models.samplers) set with sigmas
``linspace(1, 1/N, N)`` and the dynamic shift ``mu`` from the image's token count. The guidance and its
rescaling run in the transformer's output dtype. The state's latent is packed [1, H/16 * W/16, 4C] (2x2
patches), as the transformer takes it, in the prompt embeddings' dtype before step 0 and then in the dtype the
scheduler's step returns (NOTE [state dtypes] in gfdit.models.staged); its grid is the VAE latent
(1, H/8, W/8). With guidance on and no negative prompt, " " is the negative prompt (as the Qwen-Image
model card's example does), so true CFG is on by default. ``denoise_batch`` steps several requests of one size
with one forward per pass (NOTE [batched step] in gfdit.models.staged): their texts (each prompt's own length)
are padded to the longest and masked with ``encoder_hidden_states_mask`` on a group of one member, and run as
one sub-batch per length on a larger one (gfdit.attention takes no mask); img_shapes has one entry per batch
element, and the norm rescaling of true CFG is per state.
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

PROMPT_TEMPLATE = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, "
    "quantity, text, spatial relationships of the objects and background:<|im_end|>\n"
    "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
)
PROMPT_TEMPLATE_DROP = 34  # diffusers' prompt_template_encode_start_idx for the real Qwen2 tokenizer
TOKENIZER_MAX_LENGTH = 1024

# Serving defaults, from the model registry (src/runtime/cost.cpp): Qwen-Image 50 steps at 1024 px, true CFG 4.0.
QWEN_IMAGE_DEFAULTS = StageDefaults.of("qwen-image", max_sequence_length=512)
TINY_DEFAULTS = StageDefaults.of("tiny-qwen-image", max_sequence_length=64)
# Qwen/Qwen-Image's scheduler_config.json (dynamic shifting with mu from the token count).
QWEN_IMAGE_SCHEDULER = {
    "_class_name": "FlowMatchEulerDiscreteScheduler",
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "invert_sigmas": False,
    "max_image_seq_len": 8192,
    "max_shift": 0.9,
    "num_train_timesteps": 1000,
    "shift": 1.0,
    "shift_terminal": 0.02,
    "stochastic_sampling": False,
    "time_shift_type": "exponential",
    "use_beta_sigmas": False,
    "use_dynamic_shifting": True,
    "use_exponential_sigmas": False,
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


def calculate_shift(
    image_seq_len: int,
    base_seq_len: int = 256,
    max_seq_len: int = 4096,
    base_shift: float = 0.5,
    max_shift: float = 1.15,
) -> float:
    """diffusers' QwenImagePipeline calculate_shift: mu linear in the image token count."""
    m = (max_shift - base_shift) / (max_seq_len - base_seq_len)
    return image_seq_len * m + base_shift - m * base_seq_len


class QwenImageStagedModel(StagedModel):
    """Qwen-Image text-to-image; see the module docstring. Output: float32 image [3, H, W] in [0, 1]."""

    is_video = False
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
        prompt_template_drop: int = PROMPT_TEMPLATE_DROP,
    ) -> None:
        from gfdit.models.core import parallelize
        from gfdit.models.samplers import sampler_from_config

        self.sampler = sampler_from_config(scheduler_config)  # refuses unsupported schedulers first
        if getattr(transformer.config, "guidance_embeds", False):
            raise InvalidUsage("gfdit.models: guidance-distilled Qwen-Image transformers are not supported")
        self.name = name
        self.tokenizer = tokenizer
        self.text_encoder = text_encoder.eval()
        self.vae = vae.eval()
        self.transformer = transformer.eval()
        self.parallel = parallelize(self.transformer)
        self.scheduler_config = dict(scheduler_config)
        self.defaults = defaults
        self.prompt_template_drop = int(prompt_template_drop)
        self.vae_scale = 2 ** len(vae.temperal_downsample)
        self.patch_size = (1, 2, 2)

    # -- encode ------------------------------------------------------------------------------------------
    def _embed(self, text: str, max_len: int) -> torch.Tensor:
        drop = self.prompt_template_drop
        tok = self.tokenizer(
            [PROMPT_TEMPLATE.format(text)],
            max_length=TOKENIZER_MAX_LENGTH + drop,
            padding=True,
            truncation=True,
            return_tensors="pt",
        )
        dev = next(self.text_encoder.parameters()).device
        with torch.no_grad():
            out = self.text_encoder(
                input_ids=tok.input_ids.to(dev),
                attention_mask=tok.attention_mask.to(dev),
                output_hidden_states=True,
            )
        valid = tok.attention_mask[0].bool().to(dev)  # one prompt: all of its tokens are valid
        hidden = out.hidden_states[-1][0][valid]
        hidden = hidden[drop:][:max_len]
        if hidden.shape[0] == 0:
            raise InvalidUsage("gfdit.models: the prompt encodes to no tokens")
        return hidden.unsqueeze(0).to(self.device, self.transformer.dtype)  # NOTE [state placement]

    def encode(self, prompt: str, negative_prompt: str | None = None, **opts: Any) -> Conditioning:
        max_len, scale = self._encode_options(prompt, opts)
        if max_len > TOKENIZER_MAX_LENGTH:
            raise InvalidUsage(f"gfdit.models: max_sequence_length {max_len} > {TOKENIZER_MAX_LENGTH}")
        cond = self._embed(prompt, max_len)
        neg = None
        if scale > 1.0:
            neg = self._embed(negative_prompt if negative_prompt is not None else " ", max_len)
        return Conditioning(prompt_embeds=cond, negative_prompt_embeds=neg)

    # -- latent ------------------------------------------------------------------------------------------
    def latent_shape(
        self, *, height: int | None = None, width: int | None = None, num_frames: int | None = None
    ) -> tuple[int, ...]:
        d = self.defaults
        height = d.height if height is None else height
        width = d.width if width is None else width
        if num_frames not in (None, 1):
            raise InvalidUsage(
                f"gfdit.models: {self.name} makes images; num_frames must be 1, got {num_frames!r}"
            )
        for what, v in (("height", height), ("width", width)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidUsage(f"gfdit.models: {what} must be a positive integer, got {v!r}")
        m = self.vae_scale * 2
        if height % m or width % m:
            raise InvalidUsage(
                f"gfdit.models: {self.name} height x width {height}x{width} must be multiples of {m}"
            )
        z = int(self.transformer.config.in_channels) // 4
        return (1, z, 1, height // self.vae_scale, width // self.vae_scale)

    @staticmethod
    def pack(latent: torch.Tensor) -> torch.Tensor:
        """[1, C, 1, H, W] -> [1, H/2 * W/2, 4C] (diffusers' _pack_latents)."""
        b, c, _, h, w = latent.shape
        x = latent.reshape(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
        return x.reshape(b, (h // 2) * (w // 2), c * 4)

    @staticmethod
    def unpack(packed: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
        """[1, H/2 * W/2, 4C] -> [1, C, 1, H, W] (diffusers' _unpack_latents)."""
        _, h, w = grid
        b, _, ch = packed.shape
        x = packed.view(b, h // 2, w // 2, ch // 4, 2, 2).permute(0, 3, 1, 4, 2, 5)
        return x.reshape(b, ch // 4, 1, h, w)

    def init_latent(self, seed: int, shape: tuple[int, ...]) -> torch.Tensor:
        shape = tuple(int(s) for s in shape)
        if len(shape) != 5 or shape[0] != 1 or shape[2] != 1 or shape[3] % 2 or shape[4] % 2:
            raise InvalidUsage(
                f"gfdit.models: Qwen-Image latent shape must be [1, C, 1, H, W] with even H, W, got {shape}"
            )
        g = torch.Generator().manual_seed(int(seed))
        # diffusers draws [1, 1, C, H, W]: the same numbers in the same order as [1, C, 1, H, W].
        return self.pack(torch.randn(shape, generator=g, dtype=torch.float32)).contiguous()

    def latent_dtype(self, conditioning: Conditioning) -> torch.dtype:
        """QwenImagePipeline draws its latents in the prompt embeddings' dtype."""
        return conditioning.prompt_embeds.dtype

    def initial_state(
        self,
        conditioning: Conditioning,
        latent: torch.Tensor,
        *,
        num_inference_steps: int | None = None,
        guidance_scale: float | None = None,
        grid: tuple[int, int, int] | None = None,
        guidance_scale_2: float | None = None,
        cache: Any = None,
    ) -> DenoiseState:
        if grid is None and latent.dim() == 3:
            raise InvalidUsage(
                "gfdit.models: a packed Qwen-Image latent needs grid=(1, H, W) of the VAE latent"
            )
        if latent.dim() == 5:
            grid = self._grid_of(latent)
            latent = self.pack(latent)
        return super().initial_state(
            conditioning,
            latent,
            num_inference_steps=num_inference_steps,
            guidance_scale=guidance_scale,
            grid=grid,
            guidance_scale_2=guidance_scale_2,  # refused: one transformer
            cache=cache,
        )

    def _check_cache(self, config: step_cache.CacheConfig) -> None:
        if getattr(self.transformer.config, "zero_cond_t", False):
            raise InvalidUsage(
                f"gfdit.models: {self.name} has zero_cond_t (per-token modulation); step caching "
                f"({config.kind}) is not supported for it",
                param="cache",
            )

    def schedule(
        self, num_inference_steps: int, grid: tuple[int, int, int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        import numpy as np

        cfg = self.scheduler_config
        n = num_inference_steps
        mu = calculate_shift(
            self.sequence_length(grid),
            cfg.get("base_image_seq_len", 256),
            cfg.get("max_image_seq_len", 4096),
            cfg.get("base_shift", 0.5),
            cfg.get("max_shift", 1.15),
        )
        return self.sampler.schedule(n, sigmas=np.linspace(1.0, 1 / n, n), mu=mu)

    # -- denoise -----------------------------------------------------------------------------------------
    def _step_states(
        self, states: list[DenoiseState], group: comm.Group | None, spec: ParallelSpec | None
    ) -> list[DenoiseState]:
        kinds = [step_cache.kind_of(s) for s in states]
        if len(set(kinds)) > 1:  # one sub-batch per step cache kind (NOTE [batched step])
            out: list[DenoiseState | None] = [None] * len(states)
            for rows in sub_batches(kinds):
                for i, new in zip(rows, self._step_states([states[i] for i in rows], group, spec)):
                    out[i] = new
            return out  # type: ignore[return-value]
        model = self.transformer
        dev, dtype = model.device, transformer_dtype(model)
        x = cat_rows([s.latent.to(dev, dtype) for s in states])
        # QwenImagePipeline: t in the latent's dtype; the schedule is on the CPU: no wait for the device
        timestep = cat_rows(
            [s.timesteps[s.step_idx].expand(1).to(dev, s.latent.dtype) / 1000 for s in states]
        )
        _, h, w = states[0].grid  # one grid for the batch (check_batch)
        img_shapes = [[(1, h // 2, w // 2)]] * len(states)  # one per batch element
        # the step cache's work (NOTE [step cache algorithms]); None without caching: the calls are as ever
        cached = step_cache.CachedStep.of(states, 0, "qwen-image")

        def forward(
            pass_idx: int,
            rows: list[int] | None,
            text: torch.Tensor,
            mask: torch.Tensor | None,
            g: comm.Group | None,
            s: ParallelSpec | None,
        ) -> torch.Tensor:
            """One transformer call of pass ``pass_idx`` on the batch's rows (None: all); with a text mask the
            plain model's."""
            loop = None if cached is None else cached.loop(pass_idx, rows, g)
            kwargs: dict[str, Any] = dict(
                hidden_states=x if rows is None else x[rows],
                timestep=timestep if rows is None else timestep[rows],
                guidance=None,
                encoder_hidden_states_mask=mask,
                encoder_hidden_states=text,
                img_shapes=img_shapes if rows is None else img_shapes[: len(rows)],
            )
            if mask is not None:  # one member: the model's own masked attention (NOTE [batched step])
                return self.plain_call(model, loop, **kwargs)
            return self.parallel_call(model, self.parallel, g, s, block_loop=loop, **kwargs)

        def velocity(
            embeds: list[torch.Tensor], g: comm.Group | None, s: ParallelSpec | None, pass_idx: int
        ) -> torch.Tensor:
            # in the transformer's dtype: true CFG combines there (NOTE [state dtypes])
            embeds = [e.to(dev, dtype) for e in embeds]
            lengths = [int(e.shape[1]) for e in embeds]
            if len(set(lengths)) == 1:
                return forward(pass_idx, None, cat_rows(embeds), None, g, s)
            if self.one_member(g, s):
                # padded at the end: the real tokens keep their rotary rows (the text's start after the
                # image's), and the mask drops the padding from the joint attention's keys
                longest = max(lengths)
                text = embeds[0].new_zeros((len(embeds), longest, embeds[0].shape[2]))
                mask = torch.zeros((len(embeds), longest), dtype=torch.bool, device=dev)
                for i, e in enumerate(embeds):
                    text[i, : lengths[i]] = e[0]
                    mask[i, : lengths[i]] = True
                return forward(pass_idx, None, text, mask, g, s)
            # gfdit.attention takes no mask: one sub-batch per text length
            out: torch.Tensor | None = None
            for rows in sub_batches(lengths):
                part = forward(pass_idx, rows, cat_rows([embeds[i] for i in rows]), None, g, s)
                if out is None:
                    out = part.new_empty((len(embeds), *part.shape[1:]))
                out[rows] = part
            assert out is not None
            return out

        with torch.no_grad():
            # the passes in turn, or CFG-parallel on the two halves of the group (NOTE [CFG-parallel])
            v, v_neg = self.guided_batch_predictions(states, group, spec, velocity, cached)
            result = []
            for i, state in enumerate(states):
                vi = v[i : i + 1]
                if v_neg is not None:  # true CFG, rescaled to the conditional prediction's norm per token
                    ni = v_neg[i : i + 1]
                    comb = ni + state.guidance_scale * (vi - ni)
                    vi = comb * (
                        torch.norm(vi, dim=-1, keepdim=True) / torch.norm(comb, dim=-1, keepdim=True)
                    )
                new = self.sampler.step(state, vi)  # per state: its own sampler history
                if cached is not None:
                    new = dataclasses.replace(new, cache=cached.next_cache(i))
                result.append(new)
        return result

    # -- decode ------------------------------------------------------------------------------------------
    def vae_latent(self, state_or_latent: DenoiseState | torch.Tensor) -> torch.Tensor:
        if isinstance(state_or_latent, DenoiseState):
            return self.unpack(state_or_latent.latent, state_or_latent.grid)
        if not isinstance(state_or_latent, torch.Tensor) or state_or_latent.dim() != 5:
            raise InvalidUsage(
                "gfdit.models: Qwen-Image decode needs a DenoiseState or a [1, C, 1, H, W] latent"
            )
        return state_or_latent

    def decode(
        self, state_or_latent: DenoiseState | torch.Tensor, group: comm.Group | None = None
    ) -> torch.Tensor:
        return self._vae_decode(self.vae_latent(state_or_latent), group)[:, 0]  # the one frame: [3, H, W]

    # -- saving ------------------------------------------------------------------------------------------
    def save_pretrained(self, path: str | os.PathLike) -> None:
        """Writes a diffusers QwenImagePipeline folder (plus gfdit.json: defaults, template drop)."""
        from diffusers import QwenImagePipeline

        pipe = QwenImagePipeline(
            scheduler=self.sampler.scheduler_class.from_config(self.scheduler_config),
            vae=self.vae,
            text_encoder=self.text_encoder,
            tokenizer=self.tokenizer,
            transformer=self.transformer,
        )
        pipe.save_pretrained(os.fspath(path))
        write_gfdit_config(path, self.name, self.defaults, prompt_template_drop=self.prompt_template_drop)


def build_tiny(seed: int = 0, scheduler_config: dict | None = None) -> QwenImageStagedModel:
    """tiny-qwen-image: gfdit.models.tiny's transformer, a byte tokenizer, a tiny Qwen2.5-VL and VAE;
    Qwen-Image's own scheduler unless another scheduler config is given."""
    from diffusers import AutoencoderKLQwenImage

    from gfdit.models import text, tiny

    transformer = tiny.tiny_qwen_image(seed)
    tokenizer = text.qwen_byte_tokenizer()
    encoder = text.tiny_qwen25vl_encoder(seed + 1, hidden_size=int(transformer.config.joint_attention_dim))
    vae = text.randomize_module(AutoencoderKLQwenImage(**TINY_VAE), seed + 2)
    drop = len(tokenizer(PROMPT_TEMPLATE.split("{}")[0]).input_ids)  # the template's prefix, in byte tokens
    return QwenImageStagedModel(
        name="tiny-qwen-image",
        tokenizer=tokenizer,
        text_encoder=encoder,
        vae=vae,
        transformer=transformer,
        scheduler_config=QWEN_IMAGE_SCHEDULER if scheduler_config is None else scheduler_config,
        defaults=TINY_DEFAULTS,
        prompt_template_drop=drop,
    )


def load_folder(
    name: str, path: Any, *, dtype: torch.dtype | None = None, device: str | torch.device = "cpu"
) -> QwenImageStagedModel:
    """A Qwen-Image model from a local diffusers folder (from_pretrained with local_files_only=True)."""
    from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel
    from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

    from gfdit.models.samplers import sampler_from_config

    path = check_folder(name, path, ("tokenizer", "text_encoder", "vae", "transformer"))
    gcfg_file = os.path.join(path, CONFIG_FILE)
    gcfg = read_json(gcfg_file) if os.path.isfile(gcfg_file) else {}
    defaults = StageDefaults(**gcfg["defaults"]) if "defaults" in gcfg else QWEN_IMAGE_DEFAULTS
    sched_file = os.path.join(path, "scheduler", "scheduler_config.json")
    sched = read_json(sched_file) if os.path.isfile(sched_file) else QWEN_IMAGE_SCHEDULER
    sampler_from_config(sched)  # an unsupported scheduler is refused before any weights load
    try:
        tokenizer = AutoTokenizer.from_pretrained(os.path.join(path, "tokenizer"), local_files_only=True)
        dtype_arg: dict[str, Any] = {"dtype": dtype} if dtype else {}
        encoder: torch.nn.Module = Qwen2_5_VLForConditionalGeneration.from_pretrained(
            os.path.join(path, "text_encoder"), local_files_only=True, **dtype_arg
        )
        # the VAE as QwenImagePipeline.from_pretrained(dtype=dtype) loads it (float32 without a dtype)
        vae = load_diffusers_model(AutoencoderKLQwenImage, path, "vae", dtype or torch.float32)
        transformer = load_diffusers_model(QwenImageTransformer2DModel, path, "transformer", dtype)
    except (OSError, ValueError) as exc:
        raise InvalidUsage(f"gfdit.models.load: {name!r}: cannot load {path!r}: {exc}") from None
    drop = int(gcfg.get("prompt_template_drop", PROMPT_TEMPLATE_DROP))
    return QwenImageStagedModel(
        name=gcfg.get("name", name),
        tokenizer=tokenizer,
        text_encoder=encoder.to(device),
        vae=vae.to(device),
        transformer=transformer.to(device),
        scheduler_config=sched,
        defaults=defaults,
        prompt_template_drop=drop,
    )
