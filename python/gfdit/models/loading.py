"""``gfdit.models.load``: a staged model by name, built tiny in code or loaded from a local diffusers folder."""

from __future__ import annotations

import os
from typing import Any

import torch

from gfdit._C import InvalidUsage
from gfdit._C import cost as _registry
from gfdit.models import qwen_pipeline, wan_pipeline
from gfdit.models.staged import StagedModel

# the pipelines that build staged models, by the registry's name of them (ModelArch::pipeline)
_PIPELINES = {"wan": wan_pipeline, "qwen-image": qwen_pipeline}


def load(
    name: str,
    path: str | os.PathLike | None = None,
    *,
    seed: int = 0,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
) -> StagedModel:
    """A staged model by name.

    "tiny-wan", "tiny-qwen-image": tiny float32 models with weights drawn from ``seed`` (tokenizer and text
    encoder built in code); with ``path`` they load from a folder that ``save_pretrained`` wrote.
    "wan2.2", "wan2.1" (Wan text-to-video; a second expert ``transformer_2`` is used when the folder has
    one) and "qwen-image": from the local diffusers folder ``path``. dtype: of the transformer, text encoder
    and VAE, as the pipeline's ``from_pretrained(dtype=...)`` (torch_dtype) makes them (default: transformer
    and text encoder as stored, the VAE float32); latents then take the dtypes the pipeline gives them
    (NOTE [state dtypes]): float32 throughout for float32 models.
    device: where every component goes (e.g. "cuda:0"); held states keep their per-step tensors there
    (NOTE [state placement]).
    Unknown names, a missing path or an incomplete folder raise gfdit.InvalidUsage.
    """
    known = _registry.loadable_model_names()  # the model registry (src/runtime/cost.cpp) says which
    if not isinstance(name, str) or name not in known:
        raise InvalidUsage(
            f"gfdit.models.load: unknown model {name!r}; known: {', '.join(known)}", param="name"
        )
    mod = _PIPELINES[_registry.model_arch(name).pipeline]
    if name.startswith("tiny-") and path is None:
        model = mod.build_tiny(seed=seed)
        return model if torch.device(device).type == "cpu" else model.to(device)
    return mod.load_folder(name, path, dtype=dtype, device=device)


def save_deep(name: str, path: str | os.PathLike, *, layers: int = 24, seed: int = 0) -> str:
    """Writes a diffusers folder of ``name`` ("tiny-wan" or "tiny-qwen-image") whose transformer is
    ``gfdit.models.tiny.deep_transformer(name, layers=layers, seed=seed)`` (NOTE [deep tiny models]); the
    tokenizer, text encoder, VAE, scheduler and defaults are the tiny model's (``load(name, seed=seed)``).
    Returns the folder, which ``gfdit.models.load(name, path)`` and ``gfdit.Engine(model=name,
    model_path=path)`` load. Here rather than in gfdit.models.tiny: it builds whole staged models, and the
    pipelines import tiny."""
    from gfdit.models import tiny

    transformer = tiny.deep_transformer(name, layers=layers, seed=seed)
    path = os.fspath(path)
    # the tiny model's folder, then its transformer folder rewritten with the deep one (same subfolder and
    # file names, so nothing of the two-block transformer is left)
    model: Any = load(name, seed=seed)  # a Wan or Qwen-Image staged model: both save a diffusers folder
    model.save_pretrained(path)
    transformer.save_pretrained(os.path.join(path, "transformer"))
    return path
