"""Case functions of the patch-parallel decode tests (NOTE [patch-parallel decode]); they run inside the
rank processes of mp_harness worlds. Each builds the same VAE from a config with seeded random weights on
every rank, so the one-rank reference and the group decode read the same weights."""

from __future__ import annotations

import torch

# Small VAEs of each family the issue names, built from configs (random weights, no download).
VAES = {
    # Wan 2.1 / 2.2 A14B: 16 latent channels, spatial x8, temporal x4
    "wan": (
        "AutoencoderKLWan",
        {
            "base_dim": 8,
            "z_dim": 4,
            "dim_mult": [1, 1, 1, 1],
            "num_res_blocks": 1,
            "temperal_downsample": [False, True, True],
        },
    ),
    # Wan 2.2 TI2V-5B: 48 latent channels, residual up blocks (DupUp3D), patch size 2, spatial x16
    "wan22-48": (
        "AutoencoderKLWan",
        {
            "base_dim": 8,
            "decoder_base_dim": 8,
            "z_dim": 48,
            "dim_mult": [1, 1, 1, 1],
            "num_res_blocks": 1,
            "temperal_downsample": [False, True, True],
            "is_residual": True,
            "in_channels": 12,
            "out_channels": 12,
            "patch_size": 2,
            "scale_factor_spatial": 16,
            "scale_factor_temporal": 4,
            "latents_mean": [0.0] * 48,
            "latents_std": [1.0] * 48,
        },
    ),
    # Qwen-Image: the Wan-style VAE with one frame
    "qwen-image": (
        "AutoencoderKLQwenImage",
        {
            "base_dim": 8,
            "z_dim": 4,
            "dim_mult": [1, 1, 1, 1],
            "num_res_blocks": 1,
            "temperal_downsample": [False, True, True],
            "latents_mean": [0.0] * 4,
            "latents_std": [1.0] * 4,
        },
    ),
}

_BUILT: dict = {}


def vae(family: str, dtype: torch.dtype = torch.float32):
    import diffusers
    from gfdit.models import text

    key = (family, dtype)
    if key not in _BUILT:
        cls, cfg = VAES[family]
        m = text.randomize_module(getattr(diffusers, cls)(**cfg), 7)
        _BUILT[key] = m.to(dtype).eval()
    return _BUILT[key]


def latent(
    family: str, frames: int, rows: int, cols: int, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    g = torch.Generator().manual_seed(11)
    z_dim = VAES[family][1]["z_dim"]
    return torch.randn(1, z_dim, frames, rows, cols, generator=g).to(dtype)


def case_decode(ctx, family: str, frames: int, rows: int, cols: int, ranks: list, dtype: str = "float32"):
    """The group decode of `ranks` (members only) and, on the first member, the one-rank decode."""
    import gfdit
    from gfdit.models import patch_decode

    torch.set_num_threads(1)
    dt = getattr(torch, dtype)
    m = vae(family, dt)
    z = latent(family, frames, rows, cols, dt)
    group = gfdit.new_group(ranks)
    if ctx.rank not in ranks:
        return None
    with torch.no_grad():
        out = patch_decode.decode(m, z, group)
        ref = m.decode(z, return_dict=False)[0] if ctx.rank == ranks[0] else None
    return {"out": out.float(), "ref": None if ref is None else ref.float()}


def case_refused(ctx, family: str, rows: int, ranks: list):
    """A group larger than the latent's rows: every member must raise InvalidUsage before communicating."""
    import gfdit
    from gfdit.models import patch_decode

    group = gfdit.new_group(ranks)
    if ctx.rank not in ranks:
        return None
    try:
        with torch.no_grad():
            patch_decode.decode(vae(family), latent(family, 1, rows, 4), group)
    except gfdit.InvalidUsage as exc:
        return str(exc)
    return "no error"


def case_model_decode(ctx, name: str, rows: int, cols: int, frames: int, ranks: list):
    """A staged model's decode (its VAE, with the latent's un-normalisation) on `ranks` and, on the first
    member, on one rank."""
    import gfdit
    import staged_harness as sh

    torch.set_num_threads(1)
    m = sh.model(name)
    c = int(m.vae.config.z_dim)
    z = torch.randn(1, c, frames, rows, cols, generator=torch.Generator().manual_seed(5))
    group = gfdit.new_group(ranks)
    if ctx.rank not in ranks:
        return None
    out = m.decode(z, group)
    ref = m.decode(z) if ctx.rank == ranks[0] else None
    return {"out": out, "ref": ref}
