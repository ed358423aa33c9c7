"""``parallelize(transformer)``: run a diffusers DiT transformer sequence-parallel on a gfdit group.

NOTE [parallel call]
A call ``wrapper(*model_args, group=g, spec=s, **model_kwargs)`` runs the model's *own* forward with a few
temporary changes, undone when the call returns or raises:
1. Arguments indexed by token position (e.g. control residuals) are cut before the call (adapter.prepare).
2. Forward hooks cut the rotary tables where the model computes them and the hidden states where they
   enter the first block (NOTE [sequence shards]); everything before the blocks (patch embedding,
   condition embedders, text projection) runs on every member in full, as in the plain model.
3. The self-/joint-attention processors of the blocks are replaced by ones that call gfdit.attention on
   this call's group and spec, with the call's sequence split as seq_splits (so every block after the
   first reuses the first one's validated plan: NOTE [attention plan cache]); cross-attention to
   replicated text stays local (its queries are sharded, its keys are whole, so it is exact as is).
   The Ulysses degree may be anything up to the number of heads (uneven heads are split by gfdit.attention).
4. A forward hook on the output projection gathers the sequence, so the model's unpatchify and its return
   value are exactly what the plain model returns, on every member.
5. With ``block_loop=`` (a step cache's loop, gfdit.models.cache.CachedBlocks), the model's block list is
   replaced by that one module after 1-4, so the hooks and processors are on the real blocks it runs; it
   returns this member's shard as the last block would, so 4 gathers it as before (gfdit.models.cache:
   NOTE [sharded step cache]). It checks the call's arguments with the others, before any collective.
The weights are the model's own (nothing is copied), so the plain model and the wrapper may be used in
turns; one model runs at most one parallel call at a time. Group and spec are per call.
All argument checks that can fail are local and depend only on arguments every member passes alike, so
bad input raises the same gfdit.InvalidUsage on every member before any collective starts.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from gfdit import comm
from gfdit._C import InvalidUsage
from gfdit.attention.spec import ParallelSpec
from gfdit.models.adapter import ModelAdapter, Undo
from gfdit.models.qwenimage import QwenImageAdapter
from gfdit.models.sharding import SequenceShards
from gfdit.models.wan import WanAdapter

SUPPORTED = ("diffusers.WanTransformer3DModel", "diffusers.QwenImageTransformer2DModel")


class ParallelTransformer(torch.nn.Module):
    """A diffusers transformer that runs sequence-parallel over a gfdit group, call by call.

    ``wrapper(*args, group=None, spec=None, **kwargs)`` takes the model's own forward arguments and returns
    what the model returns (the whole output, on every member of the group). group: a gfdit Group (None:
    the world); spec: a gfdit.ParallelSpec with ulysses * ring == len(group) (None: Ulysses over the whole
    group). Every member of the group calls it with the same arguments. ``block_loop``: a step cache's loop
    for this call (NOTE [parallel call], 5). See NOTE [parallel call].
    """

    def __init__(self, transformer: torch.nn.Module, adapter: ModelAdapter) -> None:
        super().__init__()
        self.module = transformer  # shared, not copied: registered as a child for .to(), .eval(), ...
        self._adapter = adapter
        self._signature = inspect.signature(transformer.forward)

    @property
    def config(self) -> Any:
        return self.module.config

    def forward(
        self,
        *args: Any,
        group: comm.Group | None = None,
        spec: ParallelSpec | None = None,
        block_loop: Any = None,
        **kwargs: Any,
    ) -> Any:
        world = comm.get_world()
        g = world._group(group)
        spec = self._check_spec(spec, g)
        try:
            bound = self._signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise InvalidUsage(
                f"gfdit.models: bad arguments for {type(self.module).__name__}.forward: {exc}"
            ) from None
        if block_loop is not None:
            block_loop.check(self.module, bound.arguments)
        shards = SequenceShards(world, g, spec)
        self._adapter.prepare(self.module, bound, shards)
        if self.module.__dict__.get("_gfdit_parallel_call", False):
            raise InvalidUsage("gfdit.models: this model is already running a parallel call (one at a time)")
        undo: list[Undo] = []
        self.module.__dict__["_gfdit_parallel_call"] = True
        try:
            undo = self._adapter.install(self.module, shards)
            if block_loop is not None:  # after the hooks and processors: they stay on the real blocks
                undo.append(block_loop.install(self.module))
            out = self.module(*bound.args, **bound.kwargs)
        finally:
            for u in reversed(undo):
                u()
            self.module.__dict__["_gfdit_parallel_call"] = False
        return out

    def _check_spec(self, spec: ParallelSpec | None, g: comm.Group) -> ParallelSpec:
        n = g.size()
        if spec is None:
            spec = ParallelSpec(ulysses=n, ring=1, mode="usp", placement="ulysses-low")
        if not isinstance(spec, ParallelSpec):
            raise InvalidUsage(f"gfdit.models: spec must be a gfdit.ParallelSpec, got {type(spec).__name__}")
        if spec.cfg != 1:
            raise InvalidUsage(
                f"gfdit.models: spec cfg={spec.cfg}: one transformer call is one pass; CFG-parallel splits a "
                "denoising step's two guidance passes across the group (StagedModel.denoise_step); pass "
                "spec.per_pass() here"
            )
        if spec.degree != n:
            raise InvalidUsage(
                f"gfdit.models: spec ulysses={spec.ulysses} x ring={spec.ring} = "
                f"{spec.degree} members, but the group {g.ranks} has {n}"
            )
        heads = self._adapter.heads(self.module)
        if spec.ulysses > heads:  # uneven heads are fine (gfdit.attention splits them), none is not
            raise InvalidUsage(
                f"gfdit.models: the {self._adapter.name} model has {heads} attention heads, fewer than the "
                f"Ulysses degree {spec.ulysses}; each Ulysses member needs at least one head"
            )
        if spec.mode == "torus" and n > 1:
            from gfdit.attention.torus import check_torus

            check_torus(spec, heads)
        return spec

    def extra_repr(self) -> str:
        return f"adapter={self._adapter.name}"


def parallelize(transformer: Any) -> ParallelTransformer:
    """Wraps a diffusers WanTransformer3DModel or QwenImageTransformer2DModel for sequence-parallel calls.

    The weights are shared with ``transformer`` (nothing is copied). Other models raise gfdit.InvalidUsage.
    """
    if isinstance(transformer, ParallelTransformer):
        return transformer
    for cls in (WanAdapter, QwenImageAdapter):
        if cls.matches(transformer):
            return ParallelTransformer(transformer, cls())
    raise InvalidUsage(
        f"gfdit.models.parallelize: unsupported model {type(transformer).__module__}."
        f"{type(transformer).__name__}; supported: {', '.join(SUPPORTED)}"
    )
