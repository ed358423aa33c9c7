"""Qwen-Image (diffusers ``QwenImageTransformer2DModel``, an MMDiT) on gfdit sequence parallelism.

Each block attends jointly over [text tokens, image tokens]. Per NOTE [parallel call] (gfdit.models.core): the image
tokens are cut along the sequence (the image rotary table from ``pos_embed``, the hidden states entering
``transformer_blocks[0]``, Qwen-Image-Edit's ``modulate_index`` and ControlNet residuals), while the text
stream stays whole on every member and enters gfdit.attention as the joint tokens (placed in front, as
the model concatenates them). gfdit.attention returns the same joint output on every member, so the text
stream evolves identically everywhere. ``proj_out``'s output (image tokens only) is gathered.

A text mask (``encoder_hidden_states_mask``) is accepted when it keeps every token (then it changes
nothing); masks that drop text tokens are refused, since gfdit.attention takes no attention mask.
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


class QwenJointAttentionProcessor:
    """Qwen-Image's joint text/image attention with the image tokens split across this call's group."""

    def __init__(self, shards: SequenceShards) -> None:
        self.shards = shards

    def __call__(
        self,
        attn: DiffusersModule,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_hidden_states_mask: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        from diffusers.models.transformers.transformer_qwenimage import apply_rotary_emb_qwen

        if encoder_hidden_states is None:
            raise InvalidUsage("gfdit.models: Qwen-Image joint attention needs the text stream")
        if attention_mask is not None or encoder_hidden_states_mask is not None:
            raise InvalidUsage("gfdit.models: Qwen-Image attention masks are not supported in parallel calls")
        head_dim = attn.inner_dim // attn.heads

        def heads(x: torch.Tensor) -> torch.Tensor:
            return x.unflatten(-1, (-1, head_dim))

        img_q, img_k, img_v = (heads(p(hidden_states)) for p in (attn.to_q, attn.to_k, attn.to_v))
        txt_q, txt_k, txt_v = (
            heads(p(encoder_hidden_states)) for p in (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj)
        )
        # Per-head RMSNorms act on each token alone: the same on a shard as on the whole sequence.
        if attn.norm_q is not None:
            img_q = attn.norm_q(img_q)
        if attn.norm_k is not None:
            img_k = attn.norm_k(img_k)
        if attn.norm_added_q is not None:
            txt_q = attn.norm_added_q(txt_q)
        if attn.norm_added_k is not None:
            txt_k = attn.norm_added_k(txt_k)
        if image_rotary_emb is not None:
            img_freqs, txt_freqs = image_rotary_emb  # img_freqs: this member's rows (cut by pos_embed's hook)
            img_q = apply_rotary_emb_qwen(img_q, img_freqs, use_real=False)
            img_k = apply_rotary_emb_qwen(img_k, img_freqs, use_real=False)
            txt_q = apply_rotary_emb_qwen(txt_q, txt_freqs, use_real=False)
            txt_k = apply_rotary_emb_qwen(txt_k, txt_freqs, use_real=False)
        img_out, txt_out = attention(
            img_q,
            img_k,
            img_v,
            group=self.shards.group,
            spec=self.shards.spec,
            joint_q=txt_q,
            joint_k=txt_k,
            joint_v=txt_v,
            joint="front",
            seq_splits=self.shards.splits,
        )
        img_out = img_out.flatten(2, 3).to(img_q.dtype)
        txt_out = txt_out.flatten(2, 3).to(img_q.dtype)
        img_out = attn.to_out[0](img_out.contiguous())
        if len(attn.to_out) > 1:
            img_out = attn.to_out[1](img_out)
        txt_out = attn.to_add_out(txt_out.contiguous())
        return img_out, txt_out


# Positions of the arguments of QwenImageTransformerBlock.forward that the hooks may need.
_BLOCK_HIDDEN_STATES = 0
_BLOCK_MODULATE_INDEX = 6


class QwenImageAdapter(ModelAdapter):
    name = "Qwen-Image"

    @staticmethod
    def matches(model: Any) -> bool:
        mod = sys.modules.get("diffusers.models.transformers.transformer_qwenimage")
        return mod is not None and type(model) is mod.QwenImageTransformer2DModel

    def heads(self, model: DiffusersModule) -> int:
        return int(model.config.num_attention_heads)

    def prepare(self, model: DiffusersModule, bound: inspect.BoundArguments, shards: SequenceShards) -> None:
        args = bound.arguments
        hs = args.get("hidden_states")
        if not isinstance(hs, torch.Tensor) or hs.dim() != 3:
            raise InvalidUsage(
                "gfdit.models: Qwen-Image hidden_states must be a [B, S, C] tensor of packed latent patches"
            )
        if args.get("encoder_hidden_states") is None:
            raise InvalidUsage("gfdit.models: Qwen-Image needs encoder_hidden_states (the text stream)")
        shards._fix(int(hs.shape[1]), "hidden_states")
        mask = args.get("encoder_hidden_states_mask")
        if mask is not None:
            if not isinstance(mask, torch.Tensor) or not bool(mask.bool().all()):
                raise InvalidUsage(
                    "gfdit.models: Qwen-Image parallel calls support only a text mask that "
                    "keeps every token (or none); drop the padding tokens instead"
                )
            args["encoder_hidden_states_mask"] = None  # all ones: the same result without a mask
        control = args.get("controlnet_block_samples")
        if control is not None:
            args["controlnet_block_samples"] = [shards.take(c, 1, "a ControlNet residual") for c in control]

    def install(self, model: DiffusersModule, shards: SequenceShards) -> list[Undo]:
        from diffusers.models.transformers.transformer_qwenimage import QwenDoubleStreamAttnProcessor2_0

        blocks = model.transformer_blocks
        if len(blocks) == 0:
            raise InvalidUsage("gfdit.models: this Qwen-Image model has no transformer blocks")
        for i, block in enumerate(blocks):
            proc = block.attn.processor
            if (
                type(proc) is not QwenDoubleStreamAttnProcessor2_0
                or getattr(proc, "_parallel_config", None) is not None
            ):
                raise InvalidUsage(
                    f"gfdit.models: Qwen-Image transformer_blocks[{i}].attn uses "
                    f"{type(proc).__name__} (or diffusers' own context parallelism); gfdit "
                    "replaces only the stock QwenDoubleStreamAttnProcessor2_0"
                )

        def cut_rope(_module, _inputs, output):
            img_freqs, txt_freqs = output
            return shards.take(img_freqs, 0, "the image rotary table"), txt_freqs

        def cut_hidden_states(_module, args, kwargs):
            found, hs = call_arg(args, kwargs, "hidden_states", _BLOCK_HIDDEN_STATES)
            if not found:
                return None
            return set_call_arg(
                args, kwargs, "hidden_states", _BLOCK_HIDDEN_STATES, shards.take(hs, 1, "the hidden states")
            )

        memo: dict[str, Any] = {"src": None, "cut": None}

        def cut_modulate_index(_module, args, kwargs):
            found, idx = call_arg(args, kwargs, "modulate_index", _BLOCK_MODULATE_INDEX)
            if not found or idx is None:
                return None
            if memo["src"] is not idx:  # the model passes one tensor to every block: cut it once
                memo["src"], memo["cut"] = idx, shards.take(idx, 1, "modulate_index")
            return set_call_arg(args, kwargs, "modulate_index", _BLOCK_MODULATE_INDEX, memo["cut"])

        def gather_output(_module, _inputs, output):
            return shards.gather(output, 1)

        undo = [
            hook(model.pos_embed.register_forward_hook(cut_rope)),
            hook(blocks[0].register_forward_pre_hook(cut_hidden_states, with_kwargs=True)),
            hook(model.proj_out.register_forward_hook(gather_output)),
        ]
        undo += [hook(b.register_forward_pre_hook(cut_modulate_index, with_kwargs=True)) for b in blocks]
        processor = QwenJointAttentionProcessor(shards)
        undo += [swap_processor(b.attn, processor) for b in blocks]
        return undo
