"""Rank-side cases of test_torch_backend_diffusers.py: third-party parallel DiT code, unchanged, on a
torch.distributed default group of either backend ("gfdit" or "gloo").

diffusers' context parallelism (``ContextParallelConfig``: Ulysses and Ring) on the tiny Wan and Qwen-Image
transformers, and yunchang's USP attention. The cases return rank 0's output; the test compares the two
backends with each other and with the plain (one-process) computation.
"""

from __future__ import annotations

import time

import cases_torch_backend
import torch
import torch.distributed as dist


def _default_backend(ctx, backend: str) -> None:
    if backend == "gfdit":
        cases_torch_backend.setup(ctx)
    got = dist.get_backend()
    if got != backend:
        raise AssertionError(f"default backend {got}, expected {backend}")


def _cpu_host_shim() -> None:
    # diffusers picks a device as rank % torch.accelerator.device_count(), which is 0 on a CPU-only torch;
    # one "device" makes it the CPU. Applied the same way on both backends; it touches no collective.
    if torch.accelerator.device_count() == 0:
        torch.accelerator.device_count = lambda: 1


_FLASH_LIB = None


def _cpu_flash_shim() -> None:
    # Ring attention (diffusers', yunchang's) needs an attention op that returns the log-sum-exp; all of those in its
    # registry are CUDA ops. torch has the same computation for CPU under another name
    # (_scaled_dot_product_flash_attention_for_cpu): registering it as the CPU kernel of the CUDA op's name
    # lets diffusers' "_native_flash" backend run here. Same on both backends; no collective involved.
    global _FLASH_LIB
    if _FLASH_LIB is not None:
        return
    lib = torch.library.Library("aten", "IMPL")

    def flash(q, k, v, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, dropout_p, is_causal, scale=scale
        )
        z = torch.empty(0, dtype=torch.int64)
        return out, lse, z, z, q.shape[2], k.shape[2], z, z, torch.empty(0)

    lib.impl("_scaled_dot_product_flash_attention", flash, "CPU")
    _FLASH_LIB = lib


def diffusers_cp(
    ctx, backend: str, kind: str, ulysses: int, ring: int, inputs: dict, repeats: int = 0
) -> dict:
    """One forward of a tiny transformer under diffusers' context parallelism; with repeats, its time."""
    from diffusers import ContextParallelConfig
    from gfdit.models import tiny

    _default_backend(ctx, backend)
    _cpu_host_shim()
    if ring > 1:
        _cpu_flash_shim()
    torch.manual_seed(0)
    build, make = (
        (tiny.tiny_wan, tiny.wan_inputs) if kind == "wan" else (tiny.tiny_qwen_image, tiny.qwen_image_inputs)
    )
    model = build(0).eval()
    model.set_attention_backend("native" if ring == 1 else "_native_flash")
    kwargs = make(model, 1, **inputs)
    with torch.no_grad():
        plain = model(**kwargs)[0]
        model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=ulysses, ring_degree=ring))
        out = model(**kwargs)[0]
        times = []
        for _ in range(repeats):
            dist.barrier()
            t0 = time.perf_counter()
            model(**kwargs)
            times.append(time.perf_counter() - t0)
    return {"out": out if ctx.rank == 0 else None, "plain": plain if ctx.rank == 0 else None, "times": times}


def yunchang_usp(ctx, backend: str, ulysses: int, ring: int, seq: int, heads: int, head_dim: int) -> dict:
    """yunchang's LongContextAttention (USP) with its own process groups (set_seq_parallel_pg)."""
    from yunchang import LongContextAttention, set_seq_parallel_pg
    from yunchang.kernels import AttnType

    _default_backend(ctx, backend)
    _cpu_flash_shim()  # yunchang's ring step calls the same CUDA-named op
    n = ctx.world_size
    set_seq_parallel_pg(ulysses, ring, ctx.rank, n)
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, seq, heads, head_dim, generator=g) for _ in range(3))
    shard = seq // n
    local = [t[:, ctx.rank * shard : (ctx.rank + 1) * shard].contiguous() for t in (q, k, v)]
    attn = LongContextAttention(ring_impl_type="basic_pytorch", attn_type=AttnType.TORCH_MATH)
    with torch.no_grad():
        out = attn(*local, dropout_p=0.0, causal=False)
    gathered = [torch.empty_like(out) for _ in range(n)]
    dist.all_gather(gathered, out.contiguous())
    full = torch.cat(gathered, dim=1)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2).double(), k.transpose(1, 2).double(), v.transpose(1, 2).double()
    ).transpose(1, 2)
    return {"out": full if ctx.rank == 0 else None, "ref": ref if ctx.rank == 0 else None}
