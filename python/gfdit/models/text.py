"""Text encoders and tokenizers of the tiny staged models, built in code: nothing is downloaded.

``byte_tokenizer(...)`` is a byte-level tokenizer (every UTF-8 byte is one token, a few special tokens are
whole tokens) wrapped as a transformers fast tokenizer, so it is saved and loaded by ``save_pretrained`` /
``AutoTokenizer.from_pretrained`` like a real one. ``tiny_umt5_encoder`` and ``tiny_qwen25vl_encoder`` are
the real transformers classes (UMT5 for Wan, Qwen2.5-VL for Qwen-Image) a few million times smaller,
with weights drawn from one seeded generator (the same in every process for the same seed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

# Special tokens of the byte tokenizer; their ids are their positions here, the 256 bytes follow.
T5_SPECIALS = ("<pad>", "</s>", "<unk>")
QWEN_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def byte_tokenizer(
    specials: Sequence[str],
    *,
    eos: str | None = None,
    pad: str,
    unk: str | None = None,
    append_eos: bool = False,
) -> Any:
    """A byte-level transformers fast tokenizer with ``len(specials) + 256`` ids.

    specials take ids 0..len(specials)-1 (and match as whole tokens inside text); byte b of the UTF-8 text
    is one token. append_eos: add ``eos`` at the end of every sequence (as T5 tokenizers do).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {s: i for i, s in enumerate(specials)}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(specials))
    if append_eos:
        if eos is None:
            raise ValueError("append_eos needs an eos token")
        tok.post_processor = processors.TemplateProcessing(
            single=f"$A {eos}", special_tokens=[(eos, vocab[eos])]
        )
    kwargs = {"pad_token": pad}
    if eos is not None:
        kwargs["eos_token"] = eos
    if unk is not None:
        kwargs["unk_token"] = unk
    return PreTrainedTokenizerFast(tokenizer_object=tok, **kwargs)


def t5_byte_tokenizer() -> Any:
    """Byte tokenizer shaped like Wan's UMT5 tokenizer: pad 0, eos 1 appended to every sequence."""
    return byte_tokenizer(T5_SPECIALS, eos="</s>", pad="<pad>", unk="<unk>", append_eos=True)


def qwen_byte_tokenizer() -> Any:
    """Byte tokenizer shaped like Qwen2's: <|im_start|>/<|im_end|> are single tokens, pad <|endoftext|>."""
    return byte_tokenizer(QWEN_SPECIALS, eos="<|im_end|>", pad="<|endoftext|>")


def randomize_module(
    model: torch.nn.Module,
    seed: int,
    *,
    norm_mean: float = 1.0,
    norm_std: float = 0.1,
    vector_std: float = 0.05,
) -> torch.nn.Module:
    """Every parameter from one seeded generator, in name order: matrices ~ N(0, 1/fan_in), norm weights ~
    N(norm_mean, norm_std^2), other vectors ~ N(0, vector_std^2). Buffers stay as the constructor made them."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=g)
            if p.dim() > 1:
                p.copy_(noise / max(1, p[0].numel()) ** 0.5)
            elif "norm" in name and name.endswith("weight"):
                p.copy_(norm_mean + norm_std * noise)
            else:
                p.copy_(vector_std * noise)
    return model.eval()


def tiny_umt5_encoder(
    seed: int, *, d_model: int, vocab_size: int = len(T5_SPECIALS) + 256
) -> torch.nn.Module:
    """A float32 UMT5EncoderModel (one layer, three heads) of width d_model with seeded weights."""
    from transformers import UMT5Config, UMT5EncoderModel

    config = UMT5Config(
        vocab_size=vocab_size,
        d_model=d_model,
        d_kv=8,
        d_ff=2 * d_model,
        num_layers=1,
        num_heads=3,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=32,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    return randomize_module(UMT5EncoderModel(config), seed)


def tiny_qwen25vl_encoder(
    seed: int, *, hidden_size: int, vocab_size: int = len(QWEN_SPECIALS) + 256
) -> torch.nn.Module:
    """A float32 Qwen2_5_VLForConditionalGeneration (one text layer, a one-block vision tower) of text
    width hidden_size (a multiple of 12) with seeded weights."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    if hidden_size % 12:
        raise ValueError("tiny Qwen2.5-VL hidden_size must be a multiple of 12 (2 heads, mrope 3 x 2)")
    head_dim = hidden_size // 2
    section = [head_dim // 6, head_dim // 6, head_dim // 2 - 2 * (head_dim // 6)]
    text = {
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 2048,
        "bos_token_id": 0,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section},
    }
    vision = {
        "depth": 1,
        "hidden_size": 16,
        "num_heads": 2,
        "intermediate_size": 32,
        "out_hidden_size": hidden_size,
        "fullatt_block_indexes": [0],
    }
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision)
    return randomize_module(Qwen2_5_VLForConditionalGeneration(config), seed)
