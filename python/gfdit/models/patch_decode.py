"""Patch-parallel VAE decode: a group of ranks decodes one latent, each member a band of its rows.

NOTE [patch-parallel decode]
The Wan 2.x VAEs (16 and 48 latent channels) and Qwen-Image's VAE decode with layers that are local in
height except for two kinds:
- a convolution with height padding p (the 3x3x3 causal convolutions, the 3x3 convolutions after each
  nearest-neighbour upsampling) reads p rows beyond each side of an output row;
- the mid-block's attention, one head over all pixels of a frame, reads every row.
Everything else is local to a row: the RMS norms normalise over channels per pixel (no statistics to
reduce), the upsamplings repeat rows (x2, or x2 in time), DupUp3D and the final unpatchify move channels
into a pixel's own neighbourhood, and the time convolutions (3x1x1) and the causal caches are per pixel.
So member i of the group takes rows [a_i, b_i) of the latent (NOTE [sequence shards]' split), runs the
VAE's own decode on them with those two kinds of layer replaced while it runs:
- a height-padded convolution exchanges p rows with each neighbour (one all_to_all_single on the group:
  its top rows to the member above, its bottom rows to the one below) and writes them into its padding,
  which stays zero above the first band and below the last, as the whole convolution's does;
- the attention block gathers the whole frame for its keys and values and computes only its own rows'
  queries (1/d of the attention).
Every band grows by the same factor through the upsamplings, so each member knows every band's size. The
causal caches hold each member's own rows, and the halos of cached frames come from the neighbours' caches
through the same exchange, because the exchange runs after a convolution has joined cache and input. The
bands are gathered at the end; the result equals the one-rank decode up to the float rounding of a
differently sized convolution. Peak activation memory falls with the band (about 1/d), except the gathered
attention frame's keys and values at the lowest resolution and the gathered output. diffusers' tiled decode
is not this: it blends overlapping tiles and gives a different picture.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F

from gfdit import comm
from gfdit._C import InvalidUsage
from gfdit.models.sharding import even_splits


class RowBands:
    """The group's split of a latent's rows, and the exchanges between the bands."""

    def __init__(self, group: comm.Group, latent_rows: int) -> None:
        n = group.size()
        if latent_rows < n:
            raise InvalidUsage(
                f"gfdit.models: a decode group of {n} ranks needs a latent of at least {n} rows "
                f"(this one has {latent_rows}): each member decodes a band of one row or more"
            )
        self.group = group
        self.n = n
        self.me = group.rank()
        self.rows = even_splits(latent_rows, n)
        self.start = sum(self.rows[: self.me])

    def scale(self, local_rows: int) -> int:
        """How much the bands have grown since the latent (the same for every member)."""
        s, r = divmod(local_rows, self.rows[self.me])
        if r:
            raise InvalidUsage(f"gfdit.models: a band of {local_rows} rows is not a multiple of the latent's")
        return s

    def halos(self, x: torch.Tensor, dim: int, p: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The last p rows along ``dim`` of the band above and the first p of the band below, in x's layout
        (None beyond the first and the last band), in one exchange with both neighbours."""
        if p > x.shape[dim]:
            raise InvalidUsage(f"gfdit.models: a halo of {p} rows is wider than a band of {x.shape[dim]}")
        top, bottom = x.narrow(dim, 0, p), x.narrow(dim, x.shape[dim] - p, p)
        piece = top.numel()
        up = self.me - 1 if self.me > 0 else None
        down = self.me + 1 if self.me < self.n - 1 else None
        sizes = [0] * self.n
        parts = []
        if up is not None:
            sizes[up] = piece
            parts.append(top.reshape(-1))
        if down is not None:
            sizes[down] = piece
            parts.append(bottom.reshape(-1))
        inp = torch.cat(parts)
        out = torch.empty_like(inp)
        self.group.all_to_all_single(out, inp, sizes, sizes)
        above = out[:piece].view(top.shape) if up is not None else None
        below = out[out.numel() - piece :].view(top.shape) if down is not None else None
        return above, below

    def gather(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """The whole tensor from every member's band along ``dim`` (bands in group order), in x's layout."""
        s = self.scale(int(x.shape[dim]))
        sizes = [r * s for r in self.rows]
        longest = max(sizes)
        padded = x.contiguous()
        if sizes[self.me] < longest:
            shape = list(x.shape)
            shape[dim] = longest
            padded = x.new_zeros(shape)
            padded.narrow(dim, 0, sizes[self.me]).copy_(x)
        out = padded.new_empty((self.n, *padded.shape))
        self.group.all_gather_into_tensor(out, padded)
        return torch.cat([out[i].narrow(dim, 0, k) for i, k in enumerate(sizes)], dim=dim)

    def band(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """This member's band of a whole tensor along ``dim``."""
        s = int(x.shape[dim]) // sum(self.rows)
        return x.narrow(dim, self.start * s, self.rows[self.me] * s)


def _fill_halos(
    bands: RowBands, x: torch.Tensor, padded: torch.Tensor, p: int, front: int, left: int
) -> None:
    """Writes the neighbours' rows into the height padding of ``padded`` (x zero-padded: ``front`` leading
    frames for a 5-D x, ``left`` columns); the padding beyond the first and last band stays zero, as the
    whole tensor's would."""
    dim = x.dim() - 2
    above, below = bands.halos(x, dim, p)
    w = x.shape[-1]
    inner = padded.narrow(-1, left, w)
    if x.dim() == 5:
        inner = inner.narrow(2, front, x.shape[2])
    if above is not None:
        inner.narrow(dim, 0, p).copy_(above)
    if below is not None:
        inner.narrow(dim, inner.shape[dim] - p, p).copy_(below)


def _causal_conv_forward(bands: RowBands) -> Callable:
    """forward(x, cache_x) of a causal 3-D convolution (Wan's and Qwen-Image's) whose height padding holds
    the neighbouring bands' rows instead of zeros."""

    def forward(self: Any, x: torch.Tensor, cache_x: torch.Tensor | None = None) -> torch.Tensor:
        padding = list(self._padding)  # F.pad order: (w, w, h, h, t_front, t_back)
        if cache_x is not None and padding[4] > 0:
            x = torch.cat([cache_x.to(x.device), x], dim=2)
            padding[4] -= cache_x.shape[2]
        padded = F.pad(x, padding)
        _fill_halos(bands, x, padded, padding[2], padding[4], padding[0])
        return torch.nn.Conv3d.forward(self, padded)

    return forward


def _conv2d_forward(bands: RowBands) -> Callable:
    def forward(self: Any, x: torch.Tensor) -> torch.Tensor:
        ph, pw = self.padding
        padded = F.pad(x, (pw, pw, ph, ph))
        _fill_halos(bands, x, padded, ph, 0, pw)
        return F.conv2d(padded, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)

    return forward


def _attention_forward(bands: RowBands) -> Callable:
    """forward(x) of the mid-block attention (diffusers' WanAttentionBlock and QwenImageAttentionBlock, one
    head over a frame's pixels) on a band: keys and values from the whole gathered frame, queries from the
    band's own rows only, so each member computes 1/d of the attention."""

    def forward(self: Any, x: torch.Tensor) -> torch.Tensor:
        b, c, t, rows, w = x.shape
        whole = bands.gather(x, 3)
        h = whole.shape[3]
        first = bands.start * (h // sum(bands.rows))  # this band's first row in the frame
        f = self.norm(whole.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w))
        qkv = self.to_qkv(f).reshape(b * t, 1, c * 3, h * w).permute(0, 1, 3, 2).contiguous()
        q, k, v = qkv.chunk(3, dim=-1)
        out = F.scaled_dot_product_attention(q[:, :, first * w : (first + rows) * w], k, v)
        out = self.proj(out.squeeze(1).permute(0, 2, 1).reshape(b * t, c, rows, w))
        return out.view(b, t, c, rows, w).permute(0, 2, 1, 3, 4) + x

    return forward


def _height_padding(m: Any) -> int:
    """The zero rows a convolution adds above and below; refuses any other kind of padding."""
    if isinstance(m, torch.nn.Conv3d):
        if not hasattr(m, "_padding"):  # Wan's and Qwen-Image's causal convolution pads in forward
            raise InvalidUsage(f"gfdit.models: patch-parallel decode cannot split the convolution {m}")
        return int(getattr(m, "_padding")[2])  # diffusers sets it; torch does not declare it
    if m.padding_mode != "zeros" or isinstance(m.padding, str):
        raise InvalidUsage(f"gfdit.models: patch-parallel decode cannot split the convolution {m}")
    return int(m.padding[0])


@contextmanager
def banded(decoder: Any, bands: RowBands) -> Iterator[None]:
    """Replaces, while it runs, the decoder's layers that read beyond a row (NOTE [patch-parallel decode])."""
    patched: list[Any] = []
    try:
        for m in decoder.modules():
            if isinstance(m, torch.nn.Conv3d | torch.nn.Conv2d):
                h = 3 if isinstance(m, torch.nn.Conv3d) else 2  # the height dim of its input
                k, p = m.kernel_size[h - 2], _height_padding(m)
                if k > 1 and (m.stride[h - 2] != 1 or m.dilation[h - 2] != 1 or 2 * p != k - 1):
                    raise InvalidUsage(f"gfdit.models: patch-parallel decode cannot split {m}")
                if p > 0:
                    forward = _causal_conv_forward if h == 3 else _conv2d_forward
                    setattr(m, "forward", types.MethodType(forward(bands), m))  # deleted again below
                    patched.append(m)
            elif type(m).__name__.endswith("AttentionBlock") and hasattr(m, "to_qkv"):
                setattr(m, "forward", types.MethodType(_attention_forward(bands), m))
                patched.append(m)
        yield
    finally:
        for m in patched:
            del m.forward


def decode(vae: Any, z: torch.Tensor, group: comm.Group | None) -> torch.Tensor:
    """``vae.decode(z)`` (a [B, C, F, H, W] latent, already un-normalised) on ``group``: every member calls it
    with the same z and gets the whole decoded sample. A group of one is the VAE's own decode."""
    if group is None or group.size() == 1:
        return vae.decode(z, return_dict=False)[0]
    if getattr(vae, "use_tiling", False):
        raise InvalidUsage("gfdit.models: patch-parallel decode does not combine with the VAE's tiling")
    bands = RowBands(group, int(z.shape[3]))
    with banded(vae.decoder, bands):
        out = vae.decode(bands.band(z, 3).contiguous(), return_dict=False)[0]
    return bands.gather(out.contiguous(), 3)
