"""Tiny Wan and Qwen-Image transformers with seeded random weights, and matching inputs, for tests.

Same code paths as the real models (diffusers' own classes), a few thousand times smaller: two blocks,
four heads of 16 channels. ``tiny_wan(seed)`` / ``tiny_qwen_image(seed)`` give the same weights in every
process for the same seed; nothing is downloaded. ``deep_transformer(name)`` is a deep one in diffusers' default
initialisation, where step caching has something to find (NOTE [deep tiny models]);
``gfdit.models.loading.save_deep(name, path)`` writes a tiny staged model's folder with it (there, above the
pipelines that import this module).
"""

from __future__ import annotations

from typing import Any

import torch

from gfdit.models.adapter import DiffusersModule

WAN_CONFIG: dict[str, Any] = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=4,
    attention_head_dim=16,
    in_channels=4,
    out_channels=4,
    text_dim=24,
    freq_dim=32,
    ffn_dim=96,
    num_layers=2,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    eps=1e-6,
    rope_max_seq_len=64,
)

QWEN_IMAGE_CONFIG: dict[str, Any] = dict(
    patch_size=2,
    in_channels=16,  # 4 latent channels x 2 x 2 patch
    out_channels=4,
    num_layers=2,
    attention_head_dim=16,
    num_attention_heads=4,
    joint_attention_dim=24,
    axes_dims_rope=(4, 6, 6),  # sums to the head dim
)


def _randomize(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Seeded weights scaled so that attention matters: norm weights ~ 2 + N(0, 0.2^2) make the
    RMS-normalised queries and keys large enough for peaked (position-dependent) attention, so a wrong
    shard, rotary row or key block changes the output far beyond the test tolerance."""
    from gfdit.models.text import randomize_module

    return randomize_module(model, seed, norm_mean=2.0, norm_std=0.2, vector_std=0.1)


def tiny_wan(seed: int = 0, **overrides: Any) -> DiffusersModule:
    """A float32 WanTransformer3DModel with WAN_CONFIG (updated by overrides) and seeded weights."""
    from diffusers import WanTransformer3DModel

    return _randomize(WanTransformer3DModel(**{**WAN_CONFIG, **overrides}), seed)


def tiny_qwen_image(seed: int = 0, **overrides: Any) -> DiffusersModule:
    """A float32 QwenImageTransformer2DModel with QWEN_IMAGE_CONFIG (updated by overrides), seeded."""
    from diffusers import QwenImageTransformer2DModel

    return _randomize(QwenImageTransformer2DModel(**{**QWEN_IMAGE_CONFIG, **overrides}), seed)


# NOTE [deep tiny models]
# Step caches (FBCache, TeaCache) skip a step's remaining transformer blocks when the first block's residual
# (or the timestep-modulated input) changed little since the last full step, relative to its size. Trained
# Wan and Qwen-Image models change it by a few percent to about twenty percent per step over 30-50 steps,
# which is what the published thresholds (0.05-0.2) are tuned to. The tiny models' own weights
# (``_randomize``: norm weights near 2, for peaked attention) make it change by 30-140% per step, so no
# sensible threshold skips anything; diffusers' default initialisation (nn.Linear's uniform(+-1/sqrt(fan_in)),
# norm weights 1, the modulation tables' randn / sqrt(dim)) gives a 24-block tiny Wan at 128x128x9 with
# guidance 5-11% per step over 30 steps: the trained models' regime, at about 200 ms a step on one core.
# The default initialisation draws from torch's global generator; ``deep_transformer`` seeds a forked copy of it,
# so the same seed gives the same weights in every process and the caller's generator is left as it was.
DEEP_MODELS = ("tiny-wan", "tiny-qwen-image")


def deep_transformer(name: str, *, layers: int = 24, seed: int = 0) -> DiffusersModule:
    """The transformer of ``gfdit.models.loading.save_deep``: the tiny model's config with ``layers`` blocks,
    diffusers' default initialisation drawn from ``seed`` (NOTE [deep tiny models]), float32, in eval mode."""
    from diffusers import QwenImageTransformer2DModel, WanTransformer3DModel

    if name not in DEEP_MODELS:
        raise ValueError(f"deep tiny models are {DEEP_MODELS}, not {name!r}")
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise ValueError(f"layers must be a positive integer, got {layers!r}")
    cls, config = (
        (WanTransformer3DModel, WAN_CONFIG)
        if name == "tiny-wan"
        else (QwenImageTransformer2DModel, QWEN_IMAGE_CONFIG)
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return cls(**{**config, "num_layers": layers}).eval()


def wan_inputs(
    model: DiffusersModule,
    seed: int,
    *,
    batch: int = 1,
    frames: int = 3,
    height: int = 6,
    width: int = 10,
    text: int = 7,
    per_token_timestep: bool = False,
    image_tokens: int = 0,
) -> dict[str, Any]:
    """Forward kwargs for a tiny Wan: latent [B, C, F, H, W] (F*H/2*W/2 tokens), text [B, text, text_dim].

    image_tokens: Wan 2.1 I2V's image context [B, image_tokens, image_dim] (the model needs image_dim and
    added_kv_proj_dim; its attention takes the last 512 context tokens as text, so use text=512).
    """
    cfg = model.config
    g = torch.Generator().manual_seed(seed)
    latent = torch.randn(batch, cfg.in_channels, frames, height, width, generator=g)
    if per_token_timestep:  # Wan 2.2 TI2V: one timestep per token
        p_t, p_h, p_w = cfg.patch_size
        tokens = (frames // p_t) * (height // p_h) * (width // p_w)
        timestep = torch.randint(0, 1000, (batch, tokens), generator=g)
    else:
        timestep = torch.randint(0, 1000, (batch,), generator=g)
    context = torch.randn(batch, text, cfg.text_dim, generator=g)
    kwargs = {
        "hidden_states": latent,
        "timestep": timestep,
        "encoder_hidden_states": context,
        "return_dict": False,
    }
    if image_tokens:
        kwargs["encoder_hidden_states_image"] = torch.randn(batch, image_tokens, cfg.image_dim, generator=g)
    return kwargs


def qwen_image_inputs(
    model: DiffusersModule,
    seed: int,
    *,
    batch: int = 1,
    height: int = 6,
    width: int = 7,
    text: int = 5,
    extra_shapes: tuple = (),
    mask: bool = False,
) -> dict[str, Any]:
    """Forward kwargs for a tiny Qwen-Image: packed latent [B, H*W (+ extra images), in_channels], text."""
    cfg = model.config
    g = torch.Generator().manual_seed(seed)
    shapes = [(1, height, width)] + [tuple(s) for s in extra_shapes]
    tokens = sum(f * h * w for f, h, w in shapes)
    kwargs: dict[str, Any] = {
        "hidden_states": torch.randn(batch, tokens, cfg.in_channels, generator=g),
        "encoder_hidden_states": torch.randn(batch, text, cfg.joint_attention_dim, generator=g),
        "timestep": torch.rand(batch, generator=g),
        "img_shapes": [shapes] * batch,
        "return_dict": False,
    }
    if mask:
        kwargs["encoder_hidden_states_mask"] = torch.ones(batch, text, dtype=torch.long)
    return kwargs
