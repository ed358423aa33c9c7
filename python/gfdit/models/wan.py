"""Wan 2.x (diffusers ``WanTransformer3DModel``) on gfdit sequence parallelism.

The video latent [B, C, F, H, W] becomes S = F/p_t * H/p_h * W/p_w tokens. Per NOTE [parallel call]
(gfdit.models.core): the rotary tables (``rope`` output, [1, S, 1, D] cos and sin) and the hidden states entering
``blocks[0]`` are cut along the token axis; with Wan 2.2 TI2V's per-token timesteps ([B, S]) the condition
embedder's per-token outputs are cut too. Each block's self-attention (``attn1``) runs gfdit.attention;
its cross-attention (``attn2``, to the replicated text and image context) is local. ``proj_out``'s output
is gathered, so unpatchify sees the whole sequence.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

import torch

from gfdit._C import InvalidUsage
from gfdit.attention.core import attention
from gfdit.models.adapter import (
    DiffusersModule,
    ModelAdapter,
    Undo,
    call_arg,
    hook,
    set_call_arg,
    swap_processor,
)
from gfdit.models.sharding import SequenceShards


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Wan's rotary embedding on interleaved (even, odd) channel pairs of x [B, S, H, D]; cos, sin
    [1, S, 1, D] repeat each frequency twice. Computed in the tables' dtype, returned in x's."""
    even, odd = x.unflatten(-1, (-1, 2)).unbind(-1)
    c = cos[..., 0::2]
    s = sin[..., 1::2]
    return torch.stack((even * c - odd * s, even * s + odd * c), dim=-1).flatten(-2).type_as(x)


class WanSelfAttentionProcessor:
    """Wan's self-attention (``attn1``) over the sequence split across this call's group."""

    def __init__(self, shards: SequenceShards) -> None:
        self.shards = shards

    def __call__(
        self,
        attn: DiffusersModule,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        if encoder_hidden_states is not None or attention_mask is not None:
            raise InvalidUsage(
                "gfdit.models: Wan self-attention got a context or a mask; only the plain "
                "self-attention of WanTransformerBlock.attn1 is supported"
            )
        if getattr(attn, "fused_projections", False):
            query, key, value = attn.to_qkv(hidden_states).chunk(3, dim=-1)
        else:
            query, key, value = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
        # RMSNorm across all heads: per token, so it is the same on a shard as on the whole sequence.
        query = attn.norm_q(query).unflatten(2, (attn.heads, -1))
        key = attn.norm_k(key).unflatten(2, (attn.heads, -1))
        value = value.unflatten(2, (attn.heads, -1))
        if rotary_emb is not None:
            query = _rotate(query, *rotary_emb)
            key = _rotate(key, *rotary_emb)
        sh = self.shards
        out = attention(query, key, value, group=sh.group, spec=sh.spec, seq_splits=sh.splits)
        out = out.flatten(2, 3).type_as(query)
        out = attn.to_out[0](out)
        return attn.to_out[1](out)


class WanAdapter(ModelAdapter):
    name = "Wan"

    @staticmethod
    def matches(model: Any) -> bool:
        mod = sys.modules.get("diffusers.models.transformers.transformer_wan")
        return mod is not None and type(model) is mod.WanTransformer3DModel

    def heads(self, model: DiffusersModule) -> int:
        return int(model.config.num_attention_heads)

    def prepare(self, model: DiffusersModule, bound: inspect.BoundArguments, shards: SequenceShards) -> None:
        hs = bound.arguments.get("hidden_states")
        if not isinstance(hs, torch.Tensor) or hs.dim() != 5:
            raise InvalidUsage("gfdit.models: Wan hidden_states must be a [B, C, F, H, W] tensor")
        p_t, p_h, p_w = model.config.patch_size
        _, _, f, h, w = hs.shape
        if f % p_t or h % p_h or w % p_w:
            raise InvalidUsage(
                f"gfdit.models: Wan latent [F, H, W] = {[f, h, w]} is not a multiple of the "
                f"patch size {[p_t, p_h, p_w]}"
            )
        shards._fix((f // p_t) * (h // p_h) * (w // p_w), "the patched latent")
        ts = bound.arguments.get("timestep")
        if isinstance(ts, torch.Tensor) and ts.dim() == 2 and ts.shape[1] != shards.total:
            raise InvalidUsage(
                f"gfdit.models: Wan per-token timestep has {ts.shape[1]} tokens, the latent {shards.total}"
            )

    def install(self, model: DiffusersModule, shards: SequenceShards) -> list[Undo]:
        from diffusers.models.transformers.transformer_wan import WanAttnProcessor

        if len(model.blocks) == 0:
            raise InvalidUsage("gfdit.models: this Wan model has no transformer blocks")
        for i, block in enumerate(model.blocks):
            proc = block.attn1.processor
            if type(proc) is not WanAttnProcessor or getattr(proc, "_parallel_config", None) is not None:
                raise InvalidUsage(
                    f"gfdit.models: Wan blocks[{i}].attn1 uses {type(proc).__name__} (or "
                    "diffusers' own context parallelism); gfdit replaces only the stock "
                    "WanAttnProcessor"
                )
            if block.attn1.add_k_proj is not None:
                raise InvalidUsage(f"gfdit.models: Wan blocks[{i}].attn1 has added K/V projections")

        def cut_rope(_module, _inputs, output):
            cos, sin = output
            return shards.take(cos, 1, "the rotary table"), shards.take(sin, 1, "the rotary table")

        def cut_per_token_conditions(_module, _inputs, output):
            temb, timestep_proj, *rest = output
            if temb.dim() != 3:  # one timestep per sample: nothing is per token
                return output
            return (
                shards.take(temb, 1, "the per-token timestep embedding"),
                shards.take(timestep_proj, 1, "the per-token timestep projection"),
                *rest,
            )

        def cut_hidden_states(_module, args, kwargs):
            found, hs = call_arg(args, kwargs, "hidden_states", 0)
            if not found:
                return None
            return set_call_arg(args, kwargs, "hidden_states", 0, shards.take(hs, 1, "the hidden states"))

        def gather_output(_module, _inputs, output):
            return shards.gather(output, 1)

        undo = [
            hook(model.rope.register_forward_hook(cut_rope)),
            hook(model.condition_embedder.register_forward_hook(cut_per_token_conditions)),
            hook(model.blocks[0].register_forward_pre_hook(cut_hidden_states, with_kwargs=True)),
            hook(model.proj_out.register_forward_hook(gather_output)),
        ]
        processor = WanSelfAttentionProcessor(shards)
        undo += [swap_processor(block.attn1, processor) for block in model.blocks]
        return undo
