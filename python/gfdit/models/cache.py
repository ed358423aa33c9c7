"""Step caches: a request's first-block cache (``fbcache``) or TeaCache (``teacache``), kept in its portable
denoise state, so that caching survives batches, CFG-parallel steps, sequence parallelism and regrouping.

A request asks for one with a cache spec (``kind``, ``threshold``, ``warmup``, ``max_skip``: the runtime's
parsed ``CacheSpec``, or ``CacheConfig`` here) passed to ``StagedModel.initial_state(..., cache=spec)``; the
state then carries a ``StepCache`` (``DenoiseState.cache``) that every step reads and replaces, and that
``pack_state`` / ``migrate`` carry with the rest of the state (NOTE [state header] in gfdit.models.staged).
What a step does with it: NOTE [step cache algorithms]; how it lives on a group: NOTE [sharded step cache].

NOTE [step cache algorithms]
Each guidance pass of a step either runs the transformer's blocks or lets a stored residual stand in for
(some of) them. The two kinds follow their public references:
- ``fbcache``: cache-dit's DBCache with Fn = 1, Bn = 0 (vipshop/cache-dit 1.5.3: caching/cache_blocks/
  pattern_base.py ``CachedBlocks_Pattern_Base.forward``; cache_contexts/cache_manager.py ``can_cache`` and
  ``similarity``; cache_context.py), ParaAttention's first-block cache generalised. Block 0 always runs; its
  residual is r = h_1 - h_0. The pass computes in full at a warm-up step (step_idx < warmup: cache-dit's
  max_warmup_steps), without a reference, or after max_skip cached steps in a row; otherwise it reuses the
  cache when sum|r_ref - r| / sum|r_ref| < threshold, where r_ref is block 0's residual at the pass's LAST
  FULL step (cache-dit sets its Fn buffer on full steps only). Reused: h_N = h_1 + R, R the residual of
  blocks 1..N-1 (h_N - h_1) at that full step. Full: blocks 1..N-1 run, r_ref := r, R := h_N - h_1.
- ``teacache``: TeaCache (ali-vilab/TeaCache: TeaCache4Wan2.1, TeaCache4FLUX; cache-dit has none). Its metric
  is the relative L1 change of block 0's timestep-modulated input m (Wan: norm1(h) (1 + scale_msa) + shift_msa,
  shift and scale from blocks[0].scale_shift_table + timestep_proj, as WanTransformerBlock computes it;
  Qwen-Image: blocks[0]._modulate(img_norm1(h), first half of img_mod(temb)), as QwenImageTransformerBlock)
  against the previous STEP's m, which is kept at every step, cached or not: acc += sum|m - m_prev| /
  sum|m_prev|; acc < threshold: every block is skipped, h_N = h_0 + R; else all blocks run, R := h_N - h_0,
  acc := 0. The rescale is the identity: TeaCache4Wan2.1 fits polynomials for the timestep embedding of the
  real checkpoints (its e / e0), and no published polynomial exists for this input on these models. Warm-up
  steps and the schedule's last step always compute, with acc := 0 (TeaCache's ret_steps and cutoff_steps).
Both kinds: ``max_skip`` bounds the cached steps of a pass in a row since its last full step (-1: no bound).
cache-dit 1.5.3's max_continuous_cached_steps behaves the same for DBCache (its streak restarts at a step whose
previous step computed, cache_context.py ``mark_step_begin``; test_step_cache.py checks max_skip 2 against
it); its extra "-1" for a hit already recorded in the current step is DBPrune's (several blocks per step) and
never applies to one first-block decision per pass. Where gfdit differs from cache-dit: the ratio of the two
sums is taken over the whole sequence of a sequence-parallel pass (NOTE [sharded step cache]; cache-dit
averages each member's two means), in float64; and a threshold >= 1 still compares (cache-dit reuses whenever
a reference exists). The conditional and unconditional passes keep separate caches and decisions
(cache-dit's enable_separate_cfg with cfg_diff_compute_separate=True; TeaCache's even and odd calls). With two
experts (Wan 2.2 A14B) a pass's cache belongs to the expert that filled it: a step on the other expert starts
the pass afresh (a full step). Warm-up counts the trajectory's steps (step_idx), so a pass reset later (a new
expert, a layout it cannot reuse) takes one full step and is not warmed up again. Qwen-Image with
``zero_cond_t`` (per-token modulation) or ControlNet residuals (added after every block) is refused
(gfdit.InvalidUsage naming ``cache``).
In a batch (NOTE [batched step] in gfdit.models.staged) every row keeps its own cache, config and decision;
the rows that compute run the remaining blocks as one sub-batch (their rows of every batch-indexed block
argument), the others add their residual. A sub-batch has one kind (None, fbcache or teacache).
Counters (``StepCache``): ``passes`` (passes run since step 0), ``cached_passes`` (those that reused the
cache) and ``cached_steps`` (steps in which every pass reused it); the worker reports their differences.

NOTE [sharded step cache]
A pass's cache tensors (fbcache: r_ref and R; teacache: m_prev and R) are indexed by token like the hidden
states, and each member of the pass's group keeps ITS SHARD of them, cut as NOTE [sequence shards] cuts the
hidden states (gfdit.models.sharding), so a cached pass needs no communication beyond its decision. A pass's
``ranks`` record its layout: the world ranks, in order, of the (sub-)group whose members hold the shards
(the tokens count is ``tokens``; a layout of one member is its whole cache, held by that member alone); ``()``
means WHOLE on every holder of the state (after ``gather``, a migration, or a call without a gfdit world).
Scalars (acc, the counts) are kept whole. Rules:
1. The decision is one value for the whole (sub-)group: each member sums sum|ref - cur| and sum|ref| over its
   shard (float64), one all_reduce (SUM) over the pass's group gives the sums of the whole sequence (one
   [B, 2] tensor for a batch: one decision per row), and every member divides the same two numbers (the CPU
   transport reduces in member order, so they are bit-identical). cache-dit all-reduces each member's two
   means with AVG, which is the global mean only when the shards are even; here the ratio is the one a single
   rank computes (up to float rounding). No all_reduce when no row can reuse (warm-up, no reference, max_skip):
   decided from the state, alike on every member.
2. CFG-parallel (spec.cfg == 2): each half holds only its own pass's cache, sharded over the half. After the
   exchange of the predictions, the members of each pair also exchange their pass's scalars (one small
   all_gather), so every member's counters and layouts stay identical; the other pass's tensors it does not
   hold.
3. A step whose pass group (its ranks, in order) is the pass's layout uses the shards as they are; if the cache
   is whole, each member slices its shard for the new layout; otherwise (shards of another layout, or of
   another expert) the pass is reset: a full step, no warm-up again. Decided from the state and the group:
   alike on every member.
4. ``gather(cache, group)`` (``StagedModel.gather_cache``): every member of ``group`` (the current holders)
   calls it; afterwards each holds every pass whole (layout ()): one all_gather of each member's (dtype,
   width) of what it holds (so that members without a shard can receive), then per pass a broadcast from a
   one-member layout, else one all_gather over ``group`` of the shards padded to the longest (members outside
   the layout contribute padding). A pass whose layout has a
   rank outside ``group`` (gone) is reset on every member, decided from the state before any collective.
   This is what the runtime runs at a regroup, before migrating the state to new members: a request cached on
   4 ranks continues on 1 or 2 with its cache.
5. ``migrate`` broadcasts the cache the source holds whole (layout () or only the source), which then is whole
   on every member (the source included); a pass sharded over several members keeps its layout, its shards
   stay with them (a receiver gets no shard of it: one shard is no use to another member, rule 3).
6. ``remap_cache_ranks(state, mapping)``: after a world is re-created with renumbered ranks, old rank -> new
   rank; a pass whose layout has a rank missing from the mapping (gone) is reset.
With caching off (no cache in the state) nothing of this runs: no collective, no op, the state unchanged.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Sequence
from typing import Any

import torch

from gfdit import comm
from gfdit._C import DType, InvalidUsage
from gfdit.comm.dtypes import DTYPE_TO_TORCH, TORCH_TO_DTYPE
from gfdit.models.adapter import DiffusersModule
from gfdit.models.sharding import even_splits

KINDS = ("fbcache", "teacache")
_KIND_CODES = {"fbcache": 1, "teacache": 2}
_SPEC_FIELDS = ("kind", "threshold", "warmup", "max_skip")


@dataclasses.dataclass(frozen=True)
class CacheConfig:
    """A step cache's settings (the runtime's CacheSpec has the same four attributes): kind "fbcache" or
    "teacache", the threshold of its metric, warm-up steps that always compute, and the most cached steps of a
    pass in a row (-1: no bound). See NOTE [step cache algorithms]."""

    kind: str
    threshold: float
    warmup: int
    max_skip: int = -1


def config_of(spec: Any, kinds: Sequence[str]) -> CacheConfig | None:
    """``spec`` (its text, "fbcache:0.08,warmup=2", or any object with kind, threshold, warmup and max_skip, such
    as the runtime's CacheSpec) as a CacheConfig (None for kind "none": no cache); gfdit.InvalidUsage naming
    ``cache`` when it lacks them, names a kind not in ``kinds`` (the model's), or has values the runtime's one
    check refuses (``gfdit._C.runtime.CacheSpec``: the same rules as a request's at submit)."""
    from gfdit._C import runtime as rt

    if isinstance(spec, str):
        spec = rt.CacheSpec.parse(spec)
    if getattr(spec, "kind", None) == "none":
        return None
    missing = [f for f in _SPEC_FIELDS if not hasattr(spec, f)]
    if missing:
        raise InvalidUsage(
            f"gfdit.models: cache must have {', '.join(_SPEC_FIELDS)} (a CacheSpec or CacheConfig); a "
            f"{type(spec).__name__} lacks {', '.join(missing)}",
            param="cache",
        )
    if spec.kind not in kinds:
        have = ", ".join(kinds) if kinds else "none"
        raise InvalidUsage(
            f"gfdit.models: cache kind {spec.kind!r} is not one this model has (its kinds: {have})",
            param="cache",
        )
    try:
        values = float(spec.threshold), int(spec.warmup), int(spec.max_skip)
    except (TypeError, ValueError) as exc:
        raise InvalidUsage(f"gfdit.models: cache: {exc}", param="cache") from None
    checked = rt.CacheSpec(str(spec.kind), *values)  # the runtime's one check of the values
    return CacheConfig(checked.kind, checked.threshold, checked.warmup, checked.max_skip)


@dataclasses.dataclass(frozen=True)
class PassCache:
    """One guidance pass's cache (NOTE [step cache algorithms]): ``ref`` (fbcache: block 0's residual at the
    last full step; teacache: the previous step's modulated input) and ``residual`` (R), this member's shard of
    each [1, tokens, D] (None when it holds none); ``filled``: a full step stored them; ``expert``: whose blocks
    (Wan 2.2's transformer 0 or 1); ``ranks``: the layout (NOTE [sharded step cache]); ``skips``: cached steps
    in a row; ``accumulated``: teacache's accumulated relative L1 change."""

    filled: bool = False
    expert: int = 0
    tokens: int = 0
    ranks: tuple[int, ...] = ()
    skips: int = 0
    accumulated: float = 0.0
    ref: torch.Tensor | None = None
    residual: torch.Tensor | None = None

    def reset(self, expert: int, tokens: int, ranks: tuple[int, ...]) -> PassCache:
        """Empty: the next step of the pass computes in full."""
        return PassCache(expert=expert, tokens=tokens, ranks=ranks)


@dataclasses.dataclass(frozen=True)
class StepCache:
    """A request's step cache: its config, one PassCache per guidance pass (0 conditional, 1 unconditional)
    and the counters the runtime reads (NOTE [step cache algorithms])."""

    config: CacheConfig
    pass_caches: tuple[PassCache, ...]
    cached_steps: int = 0  # steps in which every pass reused the cache
    cached_passes: int = 0  # passes that reused the cache
    passes: int = 0  # passes run since step 0, cached or not

    @property
    def kind(self) -> str:
        return self.config.kind

    @classmethod
    def empty(cls, config: CacheConfig, num_passes: int) -> StepCache:
        return cls(config, tuple(PassCache() for _ in range(num_passes)))


def kind_of(state: Any) -> str | None:
    """The cache kind of a DenoiseState (None: no cache): a sub-batch key (NOTE [batched step])."""
    cache = getattr(state, "cache", None)
    return None if cache is None else cache.kind


# ---------------------------------------------------------------------------------------------- decisions
def agreed_ratios(sums: torch.Tensor, group: comm.Group | None) -> list[float]:
    """Per row of ``sums`` [B, 2] float64 (this member's sum|ref - cur| and sum|ref|), the ratio of the sums
    over every member of ``group``: one all_reduce (SUM), then the same division on every member (NOTE
    [sharded step cache], 1). group None or of one member: this member's sums. A zero denominator gives inf or
    NaN, which never reuses."""
    if group is not None and group.size() > 1:
        comm.get_world().all_reduce(sums, "sum", group=group)
    num, den = sums.double().cpu().unbind(1)
    return (num / den).tolist()


def _local_sums(ref: torch.Tensor, cur: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """sum|ref - cur| and sum|ref| over this member's rows, accumulated in float64."""
    return (ref - cur).abs().sum(dtype=torch.float64), ref.abs().sum(dtype=torch.float64)


# ------------------------------------------------------------------------------------- the families' blocks
class _BlockCalls:
    """How the cached loop calls one family's transformer blocks: which block arguments are indexed by batch
    row, how one block is called and returns, and block 0's modulated input (teacache)."""

    blocks_attr = ""
    batch_args: tuple[str, ...] = ()
    carried: tuple[str, ...] = ("hidden_states",)  # what a block changes and the next one takes

    def bind(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        raise NotImplementedError

    def run(self, block: torch.nn.Module, a: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def output(self, a: dict[str, Any]) -> Any:
        raise NotImplementedError

    def modulated(self, block0: DiffusersModule, h: torch.Tensor, a: dict[str, Any]) -> torch.Tensor:
        raise NotImplementedError

    def check(self, model: DiffusersModule, arguments: dict[str, Any]) -> None:
        """Refuses (gfdit.InvalidUsage naming cache) a call the cached loop cannot run."""

    def select(self, a: dict[str, Any], rows: list[int]) -> dict[str, Any]:
        """``a`` with the given rows of its batch-indexed tensors."""
        out = dict(a)
        for name in self.batch_args:
            t = a.get(name)
            if isinstance(t, torch.Tensor):
                out[name] = t[rows]
        return out


class _WanBlockCalls(_BlockCalls):
    # WanTransformer3DModel.forward: block(hidden_states, encoder_hidden_states, timestep_proj, rotary_emb)
    blocks_attr = "blocks"
    batch_args = ("hidden_states", "encoder_hidden_states", "temb")
    _names = ("hidden_states", "encoder_hidden_states", "temb", "rotary_emb")

    def bind(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        a = dict(zip(self._names, args))
        a.update(kwargs)
        return a

    def run(self, block: torch.nn.Module, a: dict[str, Any]) -> dict[str, Any]:
        out = dict(a)
        out["hidden_states"] = block(
            a["hidden_states"], a["encoder_hidden_states"], a["temb"], a["rotary_emb"]
        )
        return out

    def output(self, a: dict[str, Any]) -> Any:
        return a["hidden_states"]

    def modulated(self, block0: DiffusersModule, h: torch.Tensor, a: dict[str, Any]) -> torch.Tensor:
        temb = a["temb"]
        if temb.ndim == 4:  # Wan 2.2 TI2V: per-token [B, S, 6, D]
            shift, scale = (block0.scale_shift_table.unsqueeze(0) + temb.float()).chunk(6, dim=2)[:2]
            shift, scale = shift.squeeze(2), scale.squeeze(2)
        else:  # [B, 6, D]
            shift, scale = (block0.scale_shift_table + temb.float()).chunk(6, dim=1)[:2]
        return (block0.norm1(h.float()) * (1 + scale) + shift).type_as(h)


class _QwenImageBlockCalls(_BlockCalls):
    # QwenImageTransformer2DModel.forward calls each block by keyword and gets (encoder_hidden_states,
    # hidden_states); after the blocks it reads only hidden_states (norm_out, proj_out).
    blocks_attr = "transformer_blocks"
    batch_args = (
        "hidden_states",
        "encoder_hidden_states",
        "encoder_hidden_states_mask",
        "temb",
        "modulate_index",
    )
    carried = ("hidden_states", "encoder_hidden_states")

    def bind(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        if args:
            raise InvalidUsage(
                "gfdit.models: Qwen-Image blocks are called by keyword; got positional arguments"
            )
        return dict(kwargs)

    def run(self, block: torch.nn.Module, a: dict[str, Any]) -> dict[str, Any]:
        out = dict(a)
        out["encoder_hidden_states"], out["hidden_states"] = block(**a)
        return out

    def output(self, a: dict[str, Any]) -> Any:
        return a["encoder_hidden_states"], a["hidden_states"]

    def modulated(self, block0: DiffusersModule, h: torch.Tensor, a: dict[str, Any]) -> torch.Tensor:
        img_mod1 = block0.img_mod(a["temb"]).chunk(2, dim=-1)[0]
        return block0._modulate(block0.img_norm1(h), img_mod1)[0]

    def check(self, model: DiffusersModule, arguments: dict[str, Any]) -> None:
        if getattr(model, "zero_cond_t", False):
            raise InvalidUsage(
                "gfdit.models: step caching is not supported for Qwen-Image with zero_cond_t (per-token "
                "modulation)",
                param="cache",
            )
        if arguments.get("controlnet_block_samples") is not None:
            raise InvalidUsage(
                "gfdit.models: step caching is not supported with ControlNet residuals (the model adds them "
                "after every block)",
                param="cache",
            )


BLOCK_CALLS: dict[str, _BlockCalls] = {"wan": _WanBlockCalls(), "qwen-image": _QwenImageBlockCalls()}


# ----------------------------------------------------------------------------------------- one cached step
@dataclasses.dataclass
class _Outcome:
    cached: bool
    cache: PassCache


@dataclasses.dataclass
class _Row:
    """One row of a cached call: its config, its pass cache prepared for the call's layout, whether it must
    compute (decided from the state alone)."""

    config: CacheConfig
    cache: PassCache
    force: bool


def call_layout(group: comm.Group | None) -> tuple[tuple[int, ...], int, comm.Group | None]:
    """(layout, this member's index in it, the group) of a transformer call on ``group``: layout () and no
    group without a gfdit world (the plain model), else the group's world ranks in order (None: the world)."""
    if group is None and not comm.is_initialized():
        return (), 0, None
    g = comm.get_world()._group(group)
    return tuple(int(r) for r in g.ranks), g.rank(), g


def _slice(t: torch.Tensor | None, tokens: int, n: int, me: int) -> torch.Tensor | None:
    """This member's shard (NOTE [sequence shards]) of a whole [1, tokens, D] tensor, a copy (the whole one
    is not kept alive)."""
    if t is None or n == 1:
        return t
    splits = even_splits(tokens, n)
    return t.narrow(1, sum(splits[:me]), splits[me]).clone()


def _prepare(
    pc: PassCache, expert: int, tokens: int, layout: tuple[int, ...], me: int, what: str
) -> PassCache:
    """The pass cache as the call on ``layout`` uses it (NOTE [sharded step cache], 3)."""
    if not pc.filled or pc.expert != expert or pc.tokens != tokens:
        return pc.reset(expert, tokens, layout)
    if pc.ranks == layout and layout:
        if pc.ref is None or pc.residual is None:
            raise InvalidUsage(
                f"gfdit.models: {what}: the state's cache says this member holds a shard of the pass, but it "
                "holds none (a state given to a member of the cache's layout without gather_cache)"
            )
        return pc
    if pc.ranks == ():
        if pc.ref is None or pc.residual is None:
            raise InvalidUsage(f"gfdit.models: {what}: the state's cache is whole but holds no tensors")
        n = max(len(layout), 1)
        return dataclasses.replace(
            pc,
            ranks=layout,
            ref=_slice(pc.ref, tokens, n, me),
            residual=_slice(pc.residual, tokens, n, me),
        )
    return pc.reset(expert, tokens, layout)  # shards of another layout: of no use here


class CachedStep:
    """The cache work of one step of a sub-batch of states with one cache kind (NOTE [step cache algorithms]):
    a ``CachedBlocks`` loop per transformer call (``loop``), the CFG-parallel exchange (``exchange``) and each
    state's next StepCache (``next_cache``)."""

    def __init__(self, states: Sequence[Any], expert: int, family: str) -> None:
        self.caches: list[StepCache] = [s.cache for s in states]
        self.kind = self.caches[0].kind
        self.expert = expert
        self.calls = BLOCK_CALLS[family]
        self.steps = [(int(s.step_idx), int(s.num_steps)) for s in states]
        self.outcomes: dict[int, list[_Outcome | None]] = {}
        for i, (c, s) in enumerate(zip(self.caches, states)):
            want = 2 if s.do_cfg else 1
            if len(c.pass_caches) != want:
                raise InvalidUsage(
                    f"gfdit.models: state {i}'s cache has {len(c.pass_caches)} pass(es), its step runs {want}"
                )

    @classmethod
    def of(cls, states: Sequence[Any], expert: int, family: str) -> CachedStep | None:
        """The cache work of a sub-batch (one kind: NOTE [batched step]); None when its states have no cache."""
        if kind_of(states[0]) is None:
            return None
        return cls(states, expert, family)

    def _force(self, i: int, pc: PassCache) -> bool:
        """Whether row i must compute, from the state alone (NOTE [step cache algorithms])."""
        cfg = self.caches[i].config
        k, n = self.steps[i]
        if k < cfg.warmup or not pc.filled or (cfg.max_skip >= 0 and pc.skips >= cfg.max_skip):
            return True
        return self.kind == "teacache" and k == n - 1

    def loop(self, pass_idx: int, rows: list[int] | None, group: comm.Group | None) -> CachedBlocks:
        """The block loop of one transformer call of pass ``pass_idx`` over ``rows`` of the sub-batch (None:
        all) on ``group`` (None: the world, or the plain model without one)."""
        rows = list(range(len(self.caches))) if rows is None else list(rows)
        return CachedBlocks(self, pass_idx, rows, group)

    def record(self, pass_idx: int, rows: list[int], outcomes: list[_Outcome]) -> None:
        slot = self.outcomes.setdefault(pass_idx, [None] * len(self.caches))
        for i, o in zip(rows, outcomes):
            slot[i] = o

    def exchange(self, pair: comm.Group, mine: int, other_ranks: Sequence[int]) -> None:
        """CFG-parallel: after the predictions' exchange, member i of each half sends its pass's scalars to
        member i of the other half (one all_gather over the pair, the conditional member first), so every
        member knows both passes' decisions and counters (NOTE [sharded step cache], 2)."""
        rows = [o for o in self.outcomes[mine] if o is not None]
        assert len(rows) == len(self.caches), "a row of the pass left no cache outcome"
        b = len(rows)
        rec = torch.tensor(
            [
                [
                    int(o.cached),
                    int(o.cache.filled),
                    o.cache.expert,
                    o.cache.tokens,
                    o.cache.skips,
                    _f64_bits(o.cache.accumulated),
                ]
                for o in rows
            ],
            dtype=torch.int64,
        )
        both = torch.empty((2 * b, rec.shape[1]), dtype=torch.int64)
        comm.get_world().all_gather_into_tensor(both, rec, group=pair)
        theirs = (both[b:] if mine == 0 else both[:b]).tolist()
        layout = tuple(int(r) for r in other_ranks)
        self.outcomes[1 - mine] = [
            _Outcome(
                bool(c),
                PassCache(
                    filled=bool(f), expert=e, tokens=t, ranks=layout, skips=s, accumulated=_bits_f64(acc)
                ),
            )
            for c, f, e, t, s, acc in theirs
        ]

    def next_cache(self, i: int) -> StepCache:
        """State i's StepCache after the step: its passes' new caches and the counters."""
        c = self.caches[i]
        outs: list[_Outcome] = []
        for p in range(len(c.pass_caches)):
            o = self.outcomes[p][i]
            assert o is not None, "a pass of the step left no cache outcome"
            outs.append(o)
        cached = [o.cached for o in outs]
        return dataclasses.replace(
            c,
            pass_caches=tuple(o.cache for o in outs),
            cached_steps=c.cached_steps + int(all(cached)),
            cached_passes=c.cached_passes + sum(cached),
            passes=c.passes + len(outs),
        )


class CachedBlocks(torch.nn.Module):
    """The model's block loop for one call of a cached pass: installed in place of the block list (one module
    that runs the real blocks with the cache, as cache-dit swaps in its CachedBlocks), it returns what the
    last block would: this member's shard of the hidden states, so the parallel wrapper's gather at proj_out
    works as without caching (NOTE [parallel call] in gfdit.models.core)."""

    # kept in __dict__, not as registered submodules (the step is no module; the blocks stay the model's)
    _step: CachedStep
    _blocks: Any

    def __init__(self, step: CachedStep, pass_idx: int, rows: list[int], group: comm.Group | None) -> None:
        super().__init__()
        self.__dict__["_step"] = step  # plain attributes: not registered as submodules
        self.__dict__["_blocks"] = None
        self.pass_idx = pass_idx
        self.rows = rows
        self.layout, self.me, self.group = call_layout(group)

    # -- installation (NOTE [parallel call], 5) -----------------------------------------------------------
    def check(self, model: DiffusersModule, arguments: dict[str, Any]) -> None:
        self._step.calls.check(model, arguments)

    def install(self, model: DiffusersModule) -> Any:
        """Replaces the model's block list by this loop for one call; returns what puts it back."""
        attr = self._step.calls.blocks_attr
        blocks = getattr(model, attr, None)
        if not isinstance(blocks, torch.nn.ModuleList) or len(blocks) == 0:
            raise InvalidUsage(
                f"gfdit.models: step caching needs the model's {attr} (a non-empty ModuleList)"
            )
        self.__dict__["_blocks"] = blocks
        setattr(model, attr, torch.nn.ModuleList([self]))

        def undo() -> None:
            setattr(model, attr, blocks)
            self.__dict__["_blocks"] = None

        return undo

    # -- the loop -----------------------------------------------------------------------------------------
    def _cut(self, h: torch.Tensor) -> torch.Tensor:
        """This member's shard of the whole hidden states (what the wrapper's hook on blocks[0] cuts)."""
        n = len(self.layout)
        if n <= 1:
            return h
        splits = even_splits(int(h.shape[1]), n)
        return h.narrow(1, sum(splits[: self.me]), splits[self.me])

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        step, calls, blocks = self._step, self._step.calls, self._blocks
        a = calls.bind(args, kwargs)
        h_full = a["hidden_states"]
        tokens = int(h_full.shape[1])
        h0 = self._cut(h_full)
        rows: list[_Row] = []
        for i in self.rows:
            pc = step.caches[i].pass_caches[self.pass_idx]
            pc = _prepare(pc, step.expert, tokens, self.layout, self.me, f"pass {self.pass_idx}")
            rows.append(_Row(step.caches[i].config, pc, step._force(i, pc)))
        if step.kind == "fbcache":
            out, outcomes = self._fbcache(a, h0, rows, blocks)
        else:
            out, outcomes = self._teacache(a, h0, rows, blocks)
        step.record(self.pass_idx, self.rows, outcomes)
        return calls.output(out)

    def _decide(self, metric: torch.Tensor, rows: list[_Row], extra: list[float]) -> list[tuple[bool, float]]:
        """(reuse, ratio) per row: the ratio of sum|ref - metric| to sum|ref| over the whole sequence (NOTE
        [sharded step cache], 1), compared with the row's threshold after adding ``extra`` (teacache's
        accumulated change); rows that must compute take no part and never reuse."""
        if all(r.force for r in rows):
            return [(False, 0.0)] * len(rows)
        sums = torch.zeros((len(rows), 2), dtype=torch.float64, device=metric.device)
        for j, r in enumerate(rows):
            if not r.force:
                sums[j, 0], sums[j, 1] = _local_sums(r.cache.ref, metric[j : j + 1])  # type: ignore[arg-type]
        ratios = agreed_ratios(sums, self.group)
        return [
            (False, 0.0) if r.force else (x + acc < r.config.threshold, x)
            for r, x, acc in zip(rows, ratios, extra)
        ]

    def _run_rows(self, a: dict[str, Any], compute: list[int], b: int, blocks: Any) -> dict[str, Any]:
        """``blocks`` over the rows ``compute`` of ``a`` (all of them: ``a`` as it is)."""
        sub = a if len(compute) == b else self._step.calls.select(a, compute)
        for block in blocks:
            sub = self._step.calls.run(block, sub)
        return sub

    def _assemble(
        self,
        base: dict[str, Any],
        done: dict[str, Any] | None,
        compute: list[int],
        reused: dict[int, torch.Tensor],
    ) -> dict[str, Any]:
        """The loop's output: the computed rows from ``done``; the others ``base`` (their hidden states plus
        their stored residual)."""
        if done is not None and not reused:
            return done
        out = dict(base)
        h = base["hidden_states"]
        new = torch.empty_like(h)
        for i, residual in reused.items():
            new[i : i + 1] = h[i : i + 1] + residual
        out["hidden_states"] = new
        if done is not None:
            idx = torch.tensor(compute, device=h.device)
            for name in self._step.calls.carried:
                dst = new if name == "hidden_states" else base[name].clone()
                out[name] = dst.index_copy_(0, idx, done[name])
        return out

    @staticmethod
    def _keep(t: torch.Tensor, j: int, b: int) -> torch.Tensor:
        """Row j of a batch output as a state's own tensor (a copy in a batch, so a row does not keep the
        batch's tensor alive)."""
        return t if b == 1 else t[j : j + 1].clone()

    def _fbcache(
        self, a: dict[str, Any], h0: torch.Tensor, rows: list[_Row], blocks: Any
    ) -> tuple[dict[str, Any], list[_Outcome]]:
        calls, b = self._step.calls, len(rows)
        a1 = calls.run(blocks[0], a)  # the wrapper's pre-hook on blocks[0] cuts the hidden states
        h1 = a1["hidden_states"]
        r = h1 - h0
        decisions = self._decide(r, rows, [0.0] * b)
        compute = [j for j, (reuse, _) in enumerate(decisions) if not reuse]
        reused = {j: rows[j].cache.residual for j, (reuse, _) in enumerate(decisions) if reuse}
        done = self._run_rows(a1, compute, b, blocks[1:]) if compute else None
        if done is not None:
            base = h1 if len(compute) == b else h1[compute]
            big_r = done["hidden_states"] - base
        outcomes = []
        k = 0
        for j, row in enumerate(rows):
            pc = row.cache
            if j in reused:
                outcomes.append(_Outcome(True, dataclasses.replace(pc, skips=pc.skips + 1)))
                continue
            outcomes.append(
                _Outcome(
                    False,
                    dataclasses.replace(
                        pc,
                        filled=True,
                        skips=0,
                        ref=self._keep(r, j, b),
                        residual=self._keep(big_r, k, len(compute)),
                    ),
                )
            )
            k += 1
        return self._assemble(a1, done, compute, reused), outcomes  # type: ignore[arg-type]

    def _teacache(
        self, a: dict[str, Any], h0: torch.Tensor, rows: list[_Row], blocks: Any
    ) -> tuple[dict[str, Any], list[_Outcome]]:
        calls, b = self._step.calls, len(rows)
        m = calls.modulated(blocks[0], h0, a)
        decisions = self._decide(m, rows, [r.cache.accumulated for r in rows])
        compute = [j for j, (reuse, _) in enumerate(decisions) if not reuse]
        reused = {j: rows[j].cache.residual for j, (reuse, _) in enumerate(decisions) if reuse}
        # every block over the rows that compute, from the whole hidden states (blocks[0]'s hook cuts them)
        done = self._run_rows(a, compute, b, blocks) if compute else None
        if done is not None:
            base = h0 if len(compute) == b else h0[compute]
            big_r = done["hidden_states"] - base
        outcomes = []
        k = 0
        for j, (row, (reuse, ratio)) in enumerate(zip(rows, decisions)):
            pc = dataclasses.replace(row.cache, ref=self._keep(m, j, b))  # the previous step's input: always
            if reuse:
                acc = pc.accumulated + ratio
                outcomes.append(_Outcome(True, dataclasses.replace(pc, skips=pc.skips + 1, accumulated=acc)))
                continue
            outcomes.append(
                _Outcome(
                    False,
                    dataclasses.replace(
                        pc, filled=True, skips=0, accumulated=0.0, residual=self._keep(big_r, k, len(compute))
                    ),
                )
            )
            k += 1
        # the skipped rows' input is this member's shard: h_N = h_0 + R (h0 already cut)
        out = self._assemble(dict(a, hidden_states=h0), done, compute, reused)  # type: ignore[arg-type]
        return out, outcomes


# ------------------------------------------------------------------------------------- regroups and worlds
def gather(cache: StepCache | None, group: comm.Group | None, device: torch.device) -> StepCache | None:
    """Every pass of the cache whole on every member of ``group`` (the current holders, who all call it),
    layout (); passes whose layout has a rank outside the group are reset (NOTE [sharded step cache], 4). The
    collectives depend only on the state's scalars and the group, alike on every member."""
    if cache is None:
        return None
    if group is None and not comm.is_initialized():
        # one process and no ranks: a layout of ranks is another world's, and nobody here holds its shards
        members: list[int] = []
    else:
        world = comm.get_world()
        g = world._group(group)
        if g.rank() < 0:
            raise InvalidUsage(f"gfdit.models: gather_cache: rank {world.rank} is not in the group {g.ranks}")
        members = [int(r) for r in g.ranks]
    new = list(cache.pass_caches)
    moving = []  # the passes whose shards travel
    for p, pc in enumerate(cache.pass_caches):
        if not pc.filled:
            new[p] = dataclasses.replace(pc, ranks=())
        elif any(r not in members for r in pc.ranks):
            new[p] = pc.reset(pc.expert, pc.tokens, ())  # a holder is gone: decided from the state alone
        elif pc.ranks:
            moving.append(p)
    if not moving:
        return dataclasses.replace(cache, pass_caches=tuple(new))
    # Members without a shard learn the tensors' dtype and width from the holders: one all_gather of an int64
    # record per member (ref and residual are both [1, tokens_local, D] in one dtype, sent side by side).
    info = torch.full((len(moving), 2), -1, dtype=torch.int64)
    for j, p in enumerate(moving):
        pc = cache.pass_caches[p]
        if pc.ref is not None and pc.residual is not None:
            if pc.ref.shape != pc.residual.shape or pc.ref.dtype != pc.residual.dtype:
                raise InvalidUsage("gfdit.models: gather_cache: a pass's tensors differ in shape or dtype")
            info[j, 0], info[j, 1] = int(TORCH_TO_DTYPE[pc.ref.dtype]), int(pc.ref.shape[-1])
    every = torch.empty((len(members) * len(moving), 2), dtype=torch.int64)
    world.all_gather_into_tensor(every, info, group=g)
    records = every.view(len(members), len(moving), 2).tolist()
    for j, p in enumerate(moving):
        pc = cache.pass_caches[p]
        held = [records[members.index(r)][j] for r in pc.ranks]
        if any(code < 0 for code, _ in held) or len({tuple(x) for x in held}) != 1:
            raise InvalidUsage(
                f"gfdit.models: gather_cache: the members {list(pc.ranks)} of pass {p}'s layout do not all hold "
                "a shard of it"
            )
        code, width = held[0]
        dtype = DTYPE_TO_TORCH[DType(code)]
        mine = None
        if world.rank in pc.ranks:
            mine = torch.cat([pc.ref, pc.residual], dim=-1).to(device)  # type: ignore[list-item]
        if len(pc.ranks) == 1:  # whole on one member
            whole = (
                mine
                if mine is not None
                else torch.empty((1, pc.tokens, 2 * width), dtype=dtype, device=device)
            )
            world.broadcast(whole, pc.ranks[0], group=g)
        else:
            splits = even_splits(pc.tokens, len(pc.ranks))
            padded = torch.zeros((max(splits), 2 * width), dtype=dtype, device=device)
            if mine is not None:
                padded[: mine.shape[1]] = mine[0]
            out = torch.empty((len(members), *padded.shape), dtype=dtype, device=device)
            world.all_gather_into_tensor(out, padded, group=g)
            whole = torch.cat([out[members.index(r), :s] for r, s in zip(pc.ranks, splits)]).unsqueeze(0)
        ref, residual = whole.split(width, dim=-1)
        new[p] = dataclasses.replace(pc, ranks=(), ref=ref.contiguous(), residual=residual.contiguous())
    return dataclasses.replace(cache, pass_caches=tuple(new))


def remap(cache: StepCache | None, mapping: dict[int, int]) -> StepCache | None:
    """The cache in a world re-created with renumbered ranks: each layout's ranks mapped old -> new; a pass
    whose layout has a rank missing from ``mapping`` (gone) is reset (NOTE [sharded step cache], 6)."""
    if cache is None:
        return None
    new = []
    for pc in cache.pass_caches:
        if all(r in mapping for r in pc.ranks):
            new.append(dataclasses.replace(pc, ranks=tuple(int(mapping[r]) for r in pc.ranks)))
        else:
            new.append(pc.reset(pc.expert, pc.tokens, ()))
    return dataclasses.replace(cache, pass_caches=tuple(new))


def remap_cache_ranks(state: Any, mapping: dict[int, int]) -> Any:
    """A DenoiseState in a world re-created with renumbered ranks (``mapping``: old world rank -> new; a rank
    missing from it is gone): its step cache's layouts renumbered and a pass whose layout lost a rank reset
    (NOTE [sharded step cache], 6). A state without a cache is returned as it is."""
    if not hasattr(state, "cache"):
        raise InvalidUsage(
            f"gfdit.models: remap_cache_ranks needs a DenoiseState, got {type(state).__name__}"
        )
    if state.cache is None:
        return state
    return dataclasses.replace(state, cache=remap(state.cache, {int(k): int(v) for k, v in mapping.items()}))


def for_migration(cache: StepCache | None, src: int) -> StepCache | None:
    """What ``migrate`` from ``src`` delivers (NOTE [sharded step cache], 5): the passes the source holds
    whole (layout () or only the source) whole, layout (); the others with their layout and no tensors."""
    if cache is None:
        return None
    new = []
    for pc in cache.pass_caches:
        if pc.ranks in ((), (src,)):
            new.append(dataclasses.replace(pc, ranks=()))
        else:
            new.append(dataclasses.replace(pc, ref=None, residual=None))
    return dataclasses.replace(cache, pass_caches=tuple(new))


def on_source_after_migration(cache: StepCache | None, src: int) -> StepCache | None:
    """The source's own cache after it migrated: the passes it sent are whole everywhere (layout ()); its shards
    of the others it keeps."""
    if cache is None:
        return None
    return dataclasses.replace(
        cache,
        pass_caches=tuple(
            dataclasses.replace(pc, ranks=()) if pc.ranks in ((), (src,)) else pc for pc in cache.pass_caches
        ),
    )


def place(cache: StepCache | None, device: torch.device) -> StepCache | None:
    """The cache with the tensors it holds on ``device`` (NOTE [state placement]); the same object when they
    are."""
    if cache is None:
        return None
    moved = False
    new = []
    for pc in cache.pass_caches:
        fields: dict[str, Any] = {
            n: t.to(device)
            for n in ("ref", "residual")
            if isinstance(t := getattr(pc, n), torch.Tensor) and t.device != device
        }
        moved = moved or bool(fields)
        new.append(dataclasses.replace(pc, **fields) if fields else pc)
    return dataclasses.replace(cache, pass_caches=tuple(new)) if moved else cache


# ------------------------------------------------------------------------------------------- the header
# The cache's part of a state header (NOTE [state header] in gfdit.models.staged): kind code (0: no cache),
# threshold (float64 bits), warmup, max_skip, cached_steps, cached_passes, passes, number of passes, then per
# pass (MAX_PASSES): filled, expert, tokens, skips, accumulated (float64 bits), layout size, layout ranks
# (MAX_LAYOUT_RANKS). Its tensors travel as the state's: TENSOR_NAMES, a pass's ref then residual.
MAX_PASSES = 2
MAX_LAYOUT_RANKS = 64  # kMaxRanks (include/gfdit/types.h): no group is larger
_PASS_LEN = 6 + MAX_LAYOUT_RANKS
HEADER_LEN = 8 + MAX_PASSES * _PASS_LEN
TENSOR_NAMES = tuple(f"cache_{what}_{p}" for p in range(MAX_PASSES) for what in ("ref", "residual"))


def _f64_bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


def _bits_f64(x: int) -> float:
    return struct.unpack("<d", struct.pack("<q", int(x)))[0]


def header_of(cache: StepCache | None) -> list[int]:
    """The cache's HEADER_LEN header ints (all zero without a cache)."""
    out = [0] * HEADER_LEN
    if cache is None:
        return out
    c = cache.config
    if len(cache.pass_caches) > MAX_PASSES:
        raise InvalidUsage(
            f"gfdit.models: a state cache has {len(cache.pass_caches)} passes (at most {MAX_PASSES})"
        )
    out[:8] = [
        _KIND_CODES[c.kind],
        _f64_bits(c.threshold),
        c.warmup,
        c.max_skip,
        cache.cached_steps,
        cache.cached_passes,
        cache.passes,
        len(cache.pass_caches),
    ]
    for p, pc in enumerate(cache.pass_caches):
        if len(pc.ranks) > MAX_LAYOUT_RANKS:
            raise InvalidUsage(
                f"gfdit.models: a cache layout of {len(pc.ranks)} ranks (at most {MAX_LAYOUT_RANKS})"
            )
        at = 8 + p * _PASS_LEN
        out[at : at + 6] = [
            int(pc.filled),
            pc.expert,
            pc.tokens,
            pc.skips,
            _f64_bits(pc.accumulated),
            len(pc.ranks),
        ]
        out[at + 6 : at + 6 + len(pc.ranks)] = list(pc.ranks)
    return out


def tensors_of(cache: StepCache | None) -> dict[str, torch.Tensor | None]:
    """The cache's tensors by TENSOR_NAMES (None where it holds none)."""
    out: dict[str, torch.Tensor | None] = {n: None for n in TENSOR_NAMES}
    if cache is not None:
        for p, pc in enumerate(cache.pass_caches):
            out[f"cache_ref_{p}"], out[f"cache_residual_{p}"] = pc.ref, pc.residual
    return out


def from_header(h: Sequence[int], tensors: dict[str, torch.Tensor | None]) -> StepCache | None:
    """The StepCache of a header's cache part (``header_of``) and its tensors."""
    code = int(h[0])
    if code == 0:
        return None
    kinds = {v: k for k, v in _KIND_CODES.items()}
    if code not in kinds or not 0 <= int(h[7]) <= MAX_PASSES:
        raise InvalidUsage("gfdit.models: not a gfdit state header (bad cache part)")
    config = CacheConfig(kinds[code], _bits_f64(h[1]), int(h[2]), int(h[3]))
    passes = []
    for p in range(int(h[7])):
        at = 8 + p * _PASS_LEN
        filled, expert, tokens, skips, acc, n = (int(x) for x in h[at : at + 6])
        passes.append(
            PassCache(
                filled=bool(filled),
                expert=expert,
                tokens=tokens,
                ranks=tuple(int(r) for r in h[at + 6 : at + 6 + n]),
                skips=skips,
                accumulated=_bits_f64(acc),
                ref=tensors.get(f"cache_ref_{p}"),
                residual=tensors.get(f"cache_residual_{p}"),
            )
        )
    return StepCache(config, tuple(passes), int(h[4]), int(h[5]), int(h[6]))
