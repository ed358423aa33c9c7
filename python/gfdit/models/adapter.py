"""What gfdit needs to know about one family of diffusers transformers (``ModelAdapter``), and the helpers
adapters share to change a call temporarily (NOTE [parallel call] in gfdit.models.core)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from gfdit.models.sharding import SequenceShards

Undo = Callable[[], None]

# A diffusers model or one of its submodules, whose parts gfdit reaches by name (``model.config.patch_size``,
# ``model.blocks[0].attn1.to_q``, ``model.dtype``). Neither torch nor diffusers types those parts: torch types
# an nn.Module's attribute as Tensor | Module, and mypy does not follow diffusers (see pyproject.toml: its
# top-level names type as its placeholder classes). So the adapters and staged models take such modules as
# Any, under this name, rather than casting at every use.
DiffusersModule = Any


class ModelAdapter:
    """What gfdit needs to know about one family of diffusers transformers (see NOTE [parallel call])."""

    name = "model"

    @staticmethod
    def matches(model: Any) -> bool:
        raise NotImplementedError

    def heads(self, model: torch.nn.Module) -> int:
        raise NotImplementedError

    def prepare(self, model: torch.nn.Module, bound: inspect.BoundArguments, shards: SequenceShards) -> None:
        """Checks the call's arguments and cuts the token-indexed ones (in bound.arguments)."""

    def install(self, model: torch.nn.Module, shards: SequenceShards) -> list[Undo]:
        """Installs this call's hooks and processors; returns what undoes them."""
        raise NotImplementedError


def swap_processor(attn: torch.nn.Module, processor: Any) -> Undo:
    """Replaces attn.processor for one call; returns what puts the original back."""
    old = attn.processor
    attn.processor = processor

    def undo() -> None:
        attn.processor = old

    return undo


def hook(handle: Any) -> Undo:
    """A torch hook handle as an Undo."""
    return handle.remove


def call_arg(args: tuple, kwargs: dict, name: str, pos: int) -> tuple[bool, Any]:
    """(given, value) of a forward argument passed by name or at position ``pos``."""
    if name in kwargs:
        return True, kwargs[name]
    if len(args) > pos:
        return True, args[pos]
    return False, None


def set_call_arg(args: tuple, kwargs: dict, name: str, pos: int, value: Any) -> tuple[tuple, dict]:
    """(args, kwargs) with the argument ``name`` (or the one at ``pos``) replaced by ``value``."""
    if name in kwargs:
        kwargs = dict(kwargs)
        kwargs[name] = value
    else:
        args = args[:pos] + (value,) + args[pos + 1 :]
    return args, kwargs
