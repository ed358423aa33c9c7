"""Single-device attention blocks that return their log-sum-exp, and the merge of partial results.

Layout here is [B, H, S, D] (what the kernels want). A partial result is (out, lse): out in float32 and
already normalised over the keys it saw, lse = log(sum(exp(scores))) over those keys, float32 [B, H, S].
Two partials over disjoint key sets merge exactly: lse = logaddexp(lse_a, lse_b),
out = out_a * exp(lse_a - lse) + out_b * exp(lse_b - lse).

Kernels: on CPU torch's flash kernel for CPU; on CUDA torch's FlashAttention (16-bit floats) or
memory-efficient attention (any float), both of which return the log-sum-exp; elsewhere (and float64) an
exact softmax in float32.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_FLASH_CUDA = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention", None)
_EFFICIENT_CUDA = getattr(torch.ops.aten, "_scaled_dot_product_efficient_attention", None)
# (dtype, head dim, kernel) combinations a CUDA kernel refused once: not tried again in this process.
_CUDA_REFUSED: set[tuple[torch.dtype, int, str]] = set()


def _cuda_block(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(out float32, lse float32 [B, H, Sq]) from torch's fused CUDA kernels, which return the log-sum-exp:
    FlashAttention for 16-bit floats, memory-efficient attention otherwise (float32 included). None when
    neither takes these inputs; the caller then uses the portable path. No host synchronisation: a kernel
    that refuses its arguments does so when it is called, not when it runs."""
    sq, d = q.shape[2], q.shape[-1]
    kernels: list[tuple[str, Callable[..., Any]]] = []
    if q.dtype in (torch.float16, torch.bfloat16) and _FLASH_CUDA is not None:
        kernels.append(("flash", _FLASH_CUDA))
    if q.dtype in (torch.float32, torch.float16, torch.bfloat16) and _EFFICIENT_CUDA is not None:
        kernels.append(("efficient", _EFFICIENT_CUDA))
    for kernel, op in kernels:
        key = (q.dtype, int(d), kernel)
        if key in _CUDA_REFUSED:
            continue
        try:
            if kernel == "flash":
                res = op(q, k, v, 0.0, False, False, scale=scale)
            else:
                res = op(q, k, v, None, True, 0.0, False, scale=scale)
        except (RuntimeError, NotImplementedError):
            _CUDA_REFUSED.add(key)
            continue
        out, lse = res[0], res[1]
        return out.float(), lse[..., :sq].float()  # memory-efficient pads the lse rows to a multiple of 32
    return None


def block_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-causal attention of q [B, H, Sq, D] over k, v [B, H, Sk, D]; returns (out float32, lse float32).

    Sk must be > 0 (an empty key block has no partial result; callers skip it).
    """
    d = q.shape[-1]
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    if q.shape[2] == 0:
        b, h, _, _ = q.shape
        return (
            q.new_zeros((b, h, 0, v.shape[-1]), dtype=torch.float32),
            q.new_zeros((b, h, 0), dtype=torch.float32),
        )
    if (
        _FLASH_CPU is not None
        and q.device.type == "cpu"
        and q.dtype in (torch.float32, torch.bfloat16, torch.float16)
    ):
        out, lse = _FLASH_CPU(q, k, v, scale=scale)
        return out.float(), lse.float()
    if q.device.type == "cuda":
        fused = _cuda_block(q, k, v, scale)
        if fused is not None:
            return fused
    # Portable path (other devices, float64): exact softmax with its log-sum-exp.
    s = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1))
    return torch.matmul(p, v.float()), lse


class PartialMerger:
    """Accumulates partial attention results of the same queries over disjoint key blocks, in float32."""

    __slots__ = ("out", "lse")

    def __init__(self) -> None:
        self.out: torch.Tensor | None = None
        self.lse: torch.Tensor | None = None

    def add(self, out: torch.Tensor, lse: torch.Tensor) -> None:
        if self.out is None or self.lse is None:  # both or neither
            self.out, self.lse = out, lse
            return
        new_lse = torch.logaddexp(self.lse, lse)
        # Rows where both are -inf (no key at all) stay zero; other rows have a finite new_lse.
        wa = torch.exp(self.lse - new_lse).nan_to_num_(0.0).unsqueeze(-1)
        wb = torch.exp(lse - new_lse).nan_to_num_(0.0).unsqueeze(-1)
        self.out = self.out * wa + out * wb
        self.lse = new_lse

    def add_block(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Adds the partial of q over one key block (skipped when the block is empty)."""
        if k.shape[2] == 0:
            return
        self.add(*block_attention(q, k, v))

    def result(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(out float32 [B, H, Sq, D], lse float32 [B, H, Sq]); zeros / -inf when nothing was added."""
        if self.out is None or self.lse is None:
            b, h, s, d = like.shape
            return (
                like.new_zeros((b, h, s, d), dtype=torch.float32),
                like.new_full((b, h, s), float("-inf"), dtype=torch.float32),
            )
        return self.out, self.lse


def merge_stacked(outs: torch.Tensor, lses: torch.Tensor, dim: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Merges partials stacked along ``dim`` (outs [..., S, D] with lses [..., S]) in one go."""
    lse = torch.logsumexp(lses, dim=dim)
    w = torch.exp(lses - lse.unsqueeze(dim)).nan_to_num_(0.0)
    return (outs * w.unsqueeze(-1)).sum(dim=dim), lse
