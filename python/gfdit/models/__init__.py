"""Sequence-parallel adapters for diffusers DiT transformers (Wan 2.x, Qwen-Image).

``gfdit.models.parallelize(transformer)`` wraps a ``WanTransformer3DModel`` or
``QwenImageTransformer2DModel`` (weights shared); calling the wrapper with the model's own arguments plus
``group=`` and ``spec=`` runs it with the token sequence split across the group and returns the plain
model's output. ``gfdit.models.tiny`` builds tiny seeded models for tests. Importing this package does not
import diffusers.
"""

from gfdit.models.core import ModelAdapter, ParallelTransformer, parallelize
from gfdit.models.sharding import SequenceShards, even_splits

__all__ = ["ModelAdapter", "ParallelTransformer", "SequenceShards", "even_splits", "parallelize"]

# Staged models (encode -> denoise steps -> decode) for the runtime; see gfdit.models.staged.
from gfdit.models.cache import CacheConfig, StepCache, remap_cache_ranks
from gfdit.models.loading import load
from gfdit.models.staged import (
    Conditioning,
    DenoiseState,
    StageDefaults,
    StagedModel,
    migrate,
    pack_state,
    state_digest,
    unpack_state,
)

__all__ += [
    "Conditioning",
    "DenoiseState",
    "StageDefaults",
    "StagedModel",
    "CacheConfig",
    "StepCache",
    "load",
    "migrate",
    "pack_state",
    "remap_cache_ranks",
    "state_digest",
    "unpack_state",
]
