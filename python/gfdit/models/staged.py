"""Staged models: a request as encode -> denoise step 0 .. N-1 -> decode, movable between any two steps.

``gfdit.models.load(name, path=None)`` returns a ``StagedModel``: "tiny-wan" / "tiny-qwen-image" (seeded
random weights, tokenizer and text encoder built in code, nothing downloaded) or "wan2.2" / "wan2.1" /
"qwen-image" from a local diffusers folder (``path=``, ``from_pretrained(local_files_only=True)``).

A trajectory::

    model = gfdit.models.load("tiny-wan")
    cond = model.encode("a cat", negative_prompt=None)             # text encoder, on one rank
    shape = model.latent_shape(height=32, width=48, num_frames=9)  # VAE-latent [1, C, F, H, W]
    state = model.initial_state(cond, model.init_latent(seed, shape))
    for k in range(state.num_steps):
        state = model.denoise_step(state, k, group=g, spec=s)      # every member of g: same state after
    video = model.decode(state)                                    # float32 [3, F, H, W] in [0, 1]

NOTE [portable denoise state]
A ``DenoiseState`` is everything step k needs and nothing that depends on which process ran the earlier
steps: the latent (in the transformer's layout, in the pipeline's dtype, NOTE [state dtypes]), the text
conditioning (positive and, with guidance, negative embeddings), the whole sigma / timestep schedule
(computed once from num_inference_steps, and the latent size where the schedule shifts with it, as
Qwen-Image's dynamic shift does), the index of the next step, the guidance scale, the VAE-latent grid, and
the sampler's history. The sampler is the folder's scheduler (gfdit.models.samplers): flow-matching Euler is
a pure function of (latent, sigma_k, sigma_{k+1}, velocity) and keeps no history; the multistep solvers
(UniPC, as Wan ships it, and DPM-Solver++) keep their earlier model outputs (shaped like the latent, in the
dtype diffusers keeps them in, stacked oldest first, with their timesteps), the count of lower-order warm-up
steps, and for UniPC the sample its corrector starts from and the order of its last predictor. These are
plain tensors and ints in the state, so no scheduler object carries anything from step to step: each step
loads them into a fresh scheduler object, runs diffusers' own step and reads them back. After
``denoise_step`` every member of the group holds the bit-identical state: the parallel transformer returns
the same gathered output on every member and the guidance and the sampler's update are the same local
arithmetic on it. Hence shrinking a group moves nothing, and growing one is ``migrate(state, group, src)``:
a fixed-size int64 header that says the shapes and dtypes (history included; absent history costs nothing),
then the tensors, from one holder to the group, bit for bit in their own dtypes (bfloat16 included).
A request that caches steps (``initial_state(..., cache=spec)``) also carries its step cache (gfdit.models.cache,
NOTE [step cache algorithms]): its scalars (counters, the passes' decision state, layouts) are identical on
every member too, but its token-indexed tensors are sharded like the hidden states, each member keeping its
own shard (NOTE [sharded step cache]): the one part of a state that differs between members. Before a group
grows, ``gather_cache`` makes it whole on the holders, and ``migrate`` then carries it to the new members.

NOTE [state dtypes]
With a transformer in bfloat16 (``load(..., dtype=torch.bfloat16)``, as real checkpoints run), every op of a
step runs in the dtype the diffusers pipeline runs it in, so the output is the pipeline's for the same dtype:
the transformer's predictions stay in its output dtype and the guidance combines them there (WanPipeline's
``uncond + g (cond - uncond)``, QwenImagePipeline's true CFG and its norm rescaling), nothing is upcast
first; the sampler gets that prediction as diffusers' step does. The latent's dtype is the pipeline's:
before step 0 float32 for Wan (WanPipeline's prepare_latents; the transformer gets ``latent.to(its
dtype)``) and the prompt embeddings' dtype for Qwen-Image (``StagedModel.latent_dtype``); after each step
whatever the scheduler's step returns: FlowMatchEulerDiscreteScheduler computes in float32 and returns the
model output's dtype (``euler_step``), DPM-Solver++ likewise; UniPC returns the sample's dtype, and its
history (converted model outputs, the corrector's sample) keeps the dtypes its step gives them. The VAE is
in the dtype the pipeline's ``from_pretrained(dtype=...)`` gives it, and decode maps its output to [0, 1] in
that dtype (the pipelines' postprocess) before returning float32. With float32 models all of these are
float32.

NOTE [state placement]
While a model holds a state, its tensors that the transformer and the sampler touch every step (latent, text
embeddings, sampler history, UniPC's last sample, the step cache's tensors) live on the model's device
(``StagedModel.device``: the transformer's), so a step on a GPU moves nothing between host and device; the
schedule (sigmas, timesteps, history_timesteps) stays on the CPU, as diffusers keeps its schedulers' sigmas,
so reading the step's timestep never waits for the device. ``StagedModel.place_state`` puts a state there (a
no-op when it is); ``denoise_step``, ``initial_state`` and ``migrate`` do it. ``migrate`` moves each tensor
where it lives on the source: CUDA tensors with the device collectives into CUDA tensors on the receivers'
devices (every member of a migration then needs a world with a device), CPU tensors over the host transport
(the header says which, NOTE [state header]). ``pack_state``/``unpack_state``/``state_digest`` are
device-independent: they copy to the CPU. ``decode`` returns a CPU tensor.

NOTE [CFG-parallel]
With ``spec.cfg == 2`` the two guidance passes of a step run at once on the two halves of the group: the
first half of the members (group order) runs the conditional pass and the second half the unconditional
(negative) one, each half as a sub-group with ``spec.per_pass()`` (ulysses x ring = half the group); each
member of a half gets its pass's whole output (NOTE [parallel call] in gfdit.models.core). Then one
exchange: member i of the first half and member i of the second half all_gather their predictions (a
2-member group, the conditional one first), so every member holds both, bit-identical across the group
(each half's output is the same on all its members). The pairs are disjoint: each member sends and receives
one latent-sized tensor in the transformer's output dtype, the dtype the guidance combines in
(NOTE [state dtypes]), so CFG-parallel gives exactly what the passes in turn give. The guidance formula and
the sampler's update are then the same local arithmetic as with cfg 1, so NOTE [portable denoise state] holds.
With step caches, each half keeps its own pass's cache and the pair also exchanges that pass's cache scalars
(NOTE [sharded step cache], 2). Refused with gfdit.InvalidUsage before any collective, alike on every member
(they all pass the same state, group and spec): cfg 2 without guidance (one pass per step, nothing to split),
a group whose size is not ``spec.degree`` (odd sizes included) or that does not include the caller, and cfg 2
without a gfdit world.

NOTE [batched step]
``denoise_batch(states, group, spec)`` advances several requests by one step each with one transformer
forward per guidance pass over all of them (batch B = len(states)) instead of one per state: the latents
concatenate along dim 0, the timesteps form a [B] tensor (Wan 2.2 TI2V's per-token timesteps: [B, S]), the
text embeddings concatenate, and the output is cut back into one prediction per state. Each state runs its
own next step (``state.step_idx``): the states may be at different steps, with different seeds, prompts,
guidance scales, step counts and sampler histories. The guidance formula (each state's own scale; Qwen-Image's
norm rescaling per state) and the sampler's step (which holds per-state history) then run per state, the same
local arithmetic as ``denoise_step``, which is ``denoise_batch`` of one state. What cannot share one forward
runs as sub-batches, one forward each, in the order in which their first states appear in the list (the same
on every member: they all pass the same list):
- Every model: states with another step cache kind (None, fbcache, teacache: one forward runs one kind of
  cached block loop, NOTE [step cache algorithms] in gfdit.models.cache); each row keeps its own cache and
  decision.
- Wan: states whose step runs the other expert (Wan 2.2 A14B's transformer_2 below boundary_ratio, with its
  own guidance_scale_2 rule), or whose text has another length (max_sequence_length: Wan's cross-attention
  sees the zero padding of its text, so padding further would change the result).
- Qwen-Image: each prompt keeps its own text length. On a group of one member (or without a gfdit world) the
  text is padded to the longest of the pass and masked (``encoder_hidden_states_mask``: the padding is masked
  out of the joint attention and the text's rotary rows start at the same place whatever the padding, so each
  state's prediction is its unpadded one up to float rounding). gfdit.attention takes no mask
  (gfdit.models.qwenimage), so on a larger group each pass runs one sub-batch per text length: the negative
  " " prompts share one, so the unconditional pass still batches.
With ``spec.cfg == 2`` each half runs its pass for the whole batch and the exchange carries the B predictions
(NOTE [CFG-parallel]). Hence each state gets what ``denoise_step`` gives it alone, up to the float rounding of
a batched forward (float32: within 1e-5 on the latent), with identical noise (it is the state's own); a list
of one state gives exactly ``denoise_step``'s; and every member of the group gets bit-identical states (NOTE
[portable denoise state]; a step cache's shards aside). Refused with gfdit.InvalidUsage before any collective,
alike on every member: an empty list, a state that is done, states whose latent grids differ (one forward is
one token sequence), and a mix of states with and without guidance (CFG and non-CFG requests are kept apart by
rule: their steps run two passes and one).
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import json
import os
from collections.abc import Callable, Iterable
from typing import Any, Literal, overload

import torch

from gfdit import comm
from gfdit._C import DType, Error, InvalidUsage
from gfdit.attention.spec import ParallelSpec
from gfdit.comm.dtypes import DTYPE_TO_TORCH, TORCH_TO_DTYPE
from gfdit.models import cache as step_cache
from gfdit.models import patch_decode
from gfdit.models.adapter import DiffusersModule


@dataclasses.dataclass(frozen=True)
class StageDefaults:
    """A model's default request: what serving systems use for the real models, tiny sizes for tiny ones."""

    height: int
    width: int
    num_frames: int  # 1 for image models
    num_inference_steps: int
    guidance_scale: float
    max_sequence_length: int

    @classmethod
    def of(cls, model: str, max_sequence_length: int) -> StageDefaults:
        """The serving defaults the model registry holds for ``model`` (src/runtime/cost.cpp: one place for a
        model's facts), with the pipeline's own text length."""
        from gfdit._C import cost

        a = cost.model_arch(model)
        return cls(
            height=int(a.default_height),
            width=int(a.default_width),
            num_frames=int(a.default_frames),
            num_inference_steps=int(a.default_steps),
            guidance_scale=float(a.default_guidance),
            max_sequence_length=max_sequence_length,
        )


@dataclasses.dataclass
class Conditioning:
    """Output of ``encode``: text embeddings [1, L, D] (negative: None when guidance is off)."""

    prompt_embeds: torch.Tensor
    negative_prompt_embeds: torch.Tensor | None = None


@dataclasses.dataclass
class DenoiseState:
    """One request between two denoising steps; see NOTE [portable denoise state].

    latent: the transformer's layout (Wan [1, C, F, H, W]; Qwen-Image packed [1, H/2 * W/2, 4C]), in the
    pipeline's dtype (NOTE [state dtypes]; float32 for float32 models).
    sigmas: float32 [N + 1], sigmas[N] = 0; timesteps: [N], the scheduler's t in its dtype (float32 for
    flow-matching Euler, int64 for the multistep solvers).
    step_idx: the next step to run (N when denoising is done). grid: the VAE latent (frames, height, width).
    The sampler's history (None / 0 for Euler and before the first step): history, [n, *latent] (dtype: as
    diffusers keeps it),
    the multistep solver's earlier model outputs, oldest first; history_timesteps [n], their timesteps;
    last_sample, UniPC's corrector input; lower_order_nums and this_order, the solver's warm-up count and
    UniPC's last predictor order.
    cache: the request's step cache (gfdit.models.cache.StepCache: NOTE [step cache algorithms]), None
    without one.
    """

    latent: torch.Tensor
    prompt_embeds: torch.Tensor
    negative_prompt_embeds: torch.Tensor | None
    sigmas: torch.Tensor
    timesteps: torch.Tensor
    step_idx: int
    guidance_scale: float
    grid: tuple[int, int, int]
    history: torch.Tensor | None = None
    history_timesteps: torch.Tensor | None = None
    last_sample: torch.Tensor | None = None
    lower_order_nums: int = 0
    this_order: int = 0
    guidance_scale_2: float | None = None
    cache: step_cache.StepCache | None = None

    @property
    def num_steps(self) -> int:
        return int(self.timesteps.numel())

    @property
    def done(self) -> bool:
        return self.step_idx >= self.num_steps

    @property
    def do_cfg(self) -> bool:
        return self.guidance_scale > 1.0


# ---------------------------------------------------------------------------------------------- flow matching
def euler_step(
    latent: torch.Tensor, sigma: torch.Tensor, sigma_next: torch.Tensor, velocity: torch.Tensor
) -> torch.Tensor:
    """Flow-matching Euler, as diffusers' FlowMatchEulerDiscreteScheduler.step: float32 x + (s' - s) v with
    (s' - s) v in the velocity's dtype, the result in the velocity's dtype (NOTE [state dtypes])."""
    # diffusers' Euler sigmas live on the pipeline's device: (s' - s) is a float32 0-dim tensor there, so here
    # (a fill: no copy that waits for the device), as a CPU scalar and a device tensor need not enter a CUDA
    # bfloat16 product alike
    dt = torch.full((), float(sigma_next - sigma), dtype=torch.float32, device=velocity.device)
    return (latent.to(torch.float32) + dt * velocity).to(velocity.dtype)


def flow_match_schedule(
    scheduler_config: dict, num_inference_steps: int, *, sigmas: Any = None, mu: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sigmas [N + 1], timesteps [N]) of a FlowMatchEulerDiscreteScheduler with this config, float32.

    A fresh scheduler object per call: the schedule is a pure function of the config, N and mu.
    """
    from diffusers import FlowMatchEulerDiscreteScheduler

    sched = FlowMatchEulerDiscreteScheduler.from_config(scheduler_config)
    kwargs: dict[str, Any] = {}
    if sigmas is not None:
        kwargs["sigmas"] = sigmas
    if mu is not None:
        kwargs["mu"] = mu
    sched.set_timesteps(num_inference_steps, device="cpu", **kwargs)
    return sched.sigmas.detach().float().clone(), sched.timesteps.detach().float().clone()


# ---------------------------------------------------------------------------------------------- the interface
def _grid_tuple(cells: Iterable[Any]) -> tuple[int, int, int]:
    """A latent grid (frames, height, width) as Python ints; the callers pass its three sizes."""
    # mypy types tuple(a generator) as tuple[int, ...]: it does not count the items
    return tuple(int(x) for x in cells)  # type: ignore[return-value]


class StagedModel(abc.ABC):
    """A diffusion model cut into stages a runtime may place on different groups of ranks.

    Stages: ``encode`` (text encoder), ``init_latent`` + ``initial_state``, ``denoise_step`` (one step on a
    group, sequence-parallel) and ``decode`` (VAE). Every stage is deterministic: the same prompt, seed and
    options give the same output whatever groups ran the steps (up to float rounding of the layouts).
    Weights are replicated: every worker loads the whole model. A request has batch size 1 and its own
    state; ``denoise_batch`` steps several requests with one forward per guidance pass (NOTE [batched step]).
    """

    name: str = "model"
    defaults: StageDefaults
    is_video: bool = False
    transformer: DiffusersModule  # the denoising transformer: where it runs is ``device``

    # -- stages ------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def encode(self, prompt: str, negative_prompt: str | None = None, **opts: Any) -> Conditioning:
        """Text conditioning of one request (deterministic). The negative prompt is encoded when guidance
        is on (opts ``guidance_scale``, default ``defaults.guidance_scale``, > 1). Opts:
        max_sequence_length, guidance_scale."""

    @abc.abstractmethod
    def latent_shape(
        self, *, height: int | None = None, width: int | None = None, num_frames: int | None = None
    ) -> tuple[int, ...]:
        """The VAE-latent shape [1, C, F, H, W] of a request of this size (None: the model's default);
        sizes the model cannot patch raise gfdit.InvalidUsage."""

    @abc.abstractmethod
    def init_latent(self, seed: int, shape: tuple[int, ...]) -> torch.Tensor:
        """The initial noise for ``seed`` (a CPU torch.Generator; float32), in the transformer's layout.
        ``initial_state`` casts it to ``latent_dtype``: on the CPU, noise drawn in bfloat16 is this cast."""

    @abc.abstractmethod
    def schedule(
        self, num_inference_steps: int, grid: tuple[int, int, int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(sigmas [N + 1], timesteps [N]), float32, for a latent of this (frames, height, width) grid."""

    def denoise_step(
        self,
        state: DenoiseState,
        step_idx: int,
        group: comm.Group | None = None,
        spec: ParallelSpec | None = None,
    ) -> DenoiseState:
        """Runs step ``step_idx`` (must be ``state.step_idx``) on ``group`` with ``spec``; returns the next
        state (the input is not modified). Every member of the group calls it with the same state and gets
        the same result. group None: the gfdit world if initialised, else a plain local call. spec.cfg 2:
        the guidance passes on the two halves of the group at once (NOTE [CFG-parallel])."""
        self.check_step(state, step_idx)
        # see NOTE [state placement]: a no-op for a state held here
        return self._step_states([self.place_state(state)], group, spec)[0]

    def denoise_batch(
        self,
        states: list[DenoiseState],
        group: comm.Group | None = None,
        spec: ParallelSpec | None = None,
    ) -> list[DenoiseState]:
        """Runs the next step of every state (each its own ``state.step_idx``) with one transformer forward
        per guidance pass over all of them, or over the sub-batches that cannot share one (NOTE [batched
        step]); returns the next states in the list's order (the inputs are not modified). Each equals
        ``denoise_step(state, state.step_idx, group, spec)`` up to the rounding of a batched forward (a list
        of one: exactly). Every member of the group calls it with the same list and gets the same result;
        group and spec as ``denoise_step``'s. Refused with gfdit.InvalidUsage, alike on every member and
        before any collective: an empty list, a finished state, different latent grids, and a mix of states
        with and without guidance."""
        self.check_batch(states)
        if len(states) == 1:
            return [self.denoise_step(states[0], states[0].step_idx, group, spec)]
        return self._step_states([self.place_state(s) for s in states], group, spec)

    @abc.abstractmethod
    def _step_states(
        self, states: list[DenoiseState], group: comm.Group | None, spec: ParallelSpec | None
    ) -> list[DenoiseState]:
        """The next state of each of ``states`` (checked and placed, NOTE [state placement]) after one step
        on ``group``: the model's forwards (one per guidance pass and sub-batch), guidance and sampler
        (NOTE [batched step]). ``denoise_step`` is this on a list of one."""

    @abc.abstractmethod
    def vae_latent(self, state_or_latent: DenoiseState | torch.Tensor) -> torch.Tensor:
        """The latent of a state in the VAE's layout [1, C, F, H, W] (a tensor already so is returned)."""

    @abc.abstractmethod
    def decode(
        self, state_or_latent: DenoiseState | torch.Tensor, group: comm.Group | None = None
    ) -> torch.Tensor:
        """VAE decode of a finished state (or a VAE-layout latent [1, C, F, H, W]): float32 in [0, 1],
        [3, H, W] for images, [3, F, H, W] for video. With a group, every member calls it with the same
        state and the decode splits over them (NOTE [patch-parallel decode] in gfdit.models.patch_decode);
        each gets the whole output."""

    # -- devices (NOTE [state placement]) -----------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        """Where the transformer runs, and where held states keep their per-step tensors."""
        return next(self.transformer.parameters()).device

    def _modules(self) -> list[torch.nn.Module]:
        names = ("transformer", "transformer_2", "text_encoder", "vae")
        return [m for m in (getattr(self, n, None) for n in names) if isinstance(m, torch.nn.Module)]

    def to(self, device: Any) -> StagedModel:
        """Moves every component (transformers, text encoder, VAE) to ``device``; returns the model."""
        if isinstance(device, int):
            device = torch.device("cuda", device)
        for m in self._modules():
            m.to(device)
        return self

    def place_state(self, state: DenoiseState) -> DenoiseState:
        """The state with its per-step tensors on this model's device (the same object when they are)."""
        dev = self.device
        moved: dict[str, Any] = {
            name: t.to(dev)
            for name in DEVICE_TENSORS
            if isinstance(t := getattr(state, name), torch.Tensor) and t.device != dev
        }
        cache = step_cache.place(state.cache, dev)
        if cache is not state.cache:
            moved["cache"] = cache
        return dataclasses.replace(state, **moved) if moved else state

    def latent_dtype(self, conditioning: Conditioning) -> torch.dtype:
        """The latent's dtype before step 0, as the pipeline's prepare_latents (NOTE [state dtypes]): float32
        (WanPipeline's); Qwen-Image overrides it."""
        return torch.float32

    # -- shared helpers ----------------------------------------------------------------------------------
    def _encode_options(self, prompt: Any, opts: dict) -> tuple[int, float]:
        """Checks encode's arguments; returns (max_sequence_length, guidance_scale) with defaults filled in."""
        if not isinstance(prompt, str):
            raise InvalidUsage(f"gfdit.models: prompt must be a str, got {type(prompt).__name__}")
        unknown = set(opts) - {"max_sequence_length", "guidance_scale"}
        if unknown:
            raise InvalidUsage(f"gfdit.models: unknown encode option(s) {sorted(unknown)}")
        max_len = opts.get("max_sequence_length") or self.defaults.max_sequence_length
        scale = opts.get("guidance_scale")
        return max_len, self.defaults.guidance_scale if scale is None else float(scale)

    def _vae_decode(self, latent: torch.Tensor, group: comm.Group | None = None) -> torch.Tensor:
        """Un-normalises a VAE-layout latent [1, C, F, H, W] with the VAE's latents_mean/std and decodes it:
        float32 [3, F, H, W] in [0, 1] (the Wan and Qwen-Image VAEs share this convention). As the pipelines:
        in the VAE's dtype, mapped to [0, 1] in it too (their postprocess), then float32."""
        vae = self.vae  # type: ignore[attr-defined]
        cfg = vae.config
        dev = next(vae.parameters()).device
        latent = latent.to(dev, vae.dtype)
        mean = torch.tensor(cfg.latents_mean).view(1, cfg.z_dim, 1, 1, 1).to(dev, latent.dtype)
        std = 1.0 / torch.tensor(cfg.latents_std).view(1, cfg.z_dim, 1, 1, 1).to(dev, latent.dtype)
        with torch.no_grad():
            video = patch_decode.decode(vae, latent / std + mean, group)
        if not bool(torch.isfinite(video).all()):  # a model error, never a black image
            raise Error("gfdit.models: the VAE decoded NaN or infinite pixels; the output is not an image")
        return (video[0] * 0.5 + 0.5).clamp(0, 1).float().cpu()

    def initial_state(
        self,
        conditioning: Conditioning,
        latent: torch.Tensor,
        *,
        num_inference_steps: int | None = None,
        guidance_scale: float | None = None,
        grid: tuple[int, int, int] | None = None,
        guidance_scale_2: float | None = None,
        cache: Any = None,
    ) -> DenoiseState:
        """The state before step 0. latent: from ``init_latent`` (its grid is derived from the shape unless
        given). Guidance > 1 needs a negative embedding in the conditioning. guidance_scale_2: the scale of
        the steps a second expert runs (Wan 2.2's low-noise transformer_2, as WanPipeline's
        ``guidance_scale_2``; None: guidance_scale); only for models with two experts. cache: a step cache
        spec (kind, threshold, warmup, max_skip: the runtime's CacheSpec or gfdit.models.cache.CacheConfig; see
        NOTE [step cache algorithms]) of a kind in ``cache_kinds``, else gfdit.InvalidUsage naming ``cache``;
        None or kind "none": no caching."""
        steps = self.defaults.num_inference_steps if num_inference_steps is None else num_inference_steps
        scale = self.defaults.guidance_scale if guidance_scale is None else float(guidance_scale)
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise InvalidUsage(f"gfdit.models: num_inference_steps must be a positive integer, got {steps!r}")
        if scale > 1.0 and conditioning.negative_prompt_embeds is None:
            raise InvalidUsage(
                f"gfdit.models: guidance_scale {scale} > 1 needs negative_prompt_embeds; "
                "encode with the same guidance_scale"
            )
        if guidance_scale_2 is not None and not self.two_experts:
            raise InvalidUsage(
                f"gfdit.models: guidance_scale_2 is for models with two experts (Wan 2.2's transformer_2 and "
                f"boundary_ratio); {self.name} has one"
            )
        config = None if cache is None else step_cache.config_of(cache, self.cache_kinds)
        if config is not None:
            self._check_cache(config)
        grid = self._grid_of(latent) if grid is None else _grid_tuple(grid)
        sigmas, timesteps = self.schedule(steps, grid)
        neg = conditioning.negative_prompt_embeds if scale > 1.0 else None
        dev = self.device
        return DenoiseState(
            latent=latent.to(dev, self.latent_dtype(conditioning)).contiguous(),
            prompt_embeds=conditioning.prompt_embeds.to(dev),
            negative_prompt_embeds=None if neg is None else neg.to(dev),
            sigmas=sigmas,
            timesteps=timesteps,
            step_idx=0,
            guidance_scale=scale,
            grid=grid,
            guidance_scale_2=None if guidance_scale_2 is None else float(guidance_scale_2),
            cache=None if config is None else step_cache.StepCache.empty(config, 2 if scale > 1.0 else 1),
        )

    #: Whether some steps run a second expert (Wan 2.2 A14B); see initial_state's guidance_scale_2.
    two_experts: bool = False

    #: The step cache kinds this model runs (NOTE [step cache algorithms] in gfdit.models.cache); a model of
    #: one's own has none until its block loop is described there.
    cache_kinds: tuple[str, ...] = ()

    def _check_cache(self, config: step_cache.CacheConfig) -> None:
        """Refuses (gfdit.InvalidUsage naming cache) a step cache this model's configuration cannot run."""

    def gather_cache(self, state: DenoiseState, group: comm.Group | None) -> DenoiseState:
        """The state with its step cache whole (NOTE [sharded step cache], 4): every member of ``group`` (the
        state's current holders) calls it and gets every pass's cache whole; a pass whose layout has a rank
        outside the group is reset on every member alike. The runtime runs it at a regroup, before migrating
        the state to new members. A state without a cache is returned as it is (no collective)."""
        if not isinstance(state, DenoiseState):
            raise InvalidUsage(f"gfdit.models: gather_cache needs a DenoiseState, got {type(state).__name__}")
        if state.cache is None:
            return state
        state = self.place_state(state)
        return dataclasses.replace(state, cache=step_cache.gather(state.cache, group, self.device))

    def _grid_of(self, latent: torch.Tensor) -> tuple[int, int, int]:
        if latent.dim() != 5:
            raise InvalidUsage(
                f"gfdit.models: cannot derive the latent grid from shape {tuple(latent.shape)}; pass grid="
            )
        return _grid_tuple(latent.shape[2:])

    def sequence_length(self, grid: tuple[int, int, int]) -> int:
        """Image/video tokens the transformer sees for a latent grid (for cost models)."""
        f, h, w = grid
        pt, ph, pw = self.patch_size
        return (f // pt) * (h // ph) * (w // pw)

    patch_size: tuple[int, int, int] = (1, 2, 2)

    def generate(
        self,
        prompt: str,
        *,
        seed: int = 0,
        negative_prompt: str | None = None,
        height: int | None = None,
        width: int | None = None,
        num_frames: int | None = None,
        num_inference_steps: int | None = None,
        guidance_scale: float | None = None,
        guidance_scale_2: float | None = None,
        group: comm.Group | None = None,
        spec: ParallelSpec | None = None,
    ) -> torch.Tensor:
        """The whole trajectory on one group (a convenience and a reference)."""
        cond = self.encode(prompt, negative_prompt, guidance_scale=guidance_scale)
        shape = self.latent_shape(height=height, width=width, num_frames=num_frames)
        state = self.initial_state(
            cond,
            self.init_latent(seed, shape),
            grid=_grid_tuple(shape[2:]),
            num_inference_steps=num_inference_steps,
            guidance_scale=guidance_scale,
            guidance_scale_2=guidance_scale_2,
        )
        for k in range(state.num_steps):
            state = self.denoise_step(state, k, group=group, spec=spec)
        return self.decode(state)

    def migrate(self, state: DenoiseState | None, group: comm.Group | None, src: int) -> DenoiseState:
        """See ``gfdit.models.staged.migrate``; the result is placed on this model's device."""
        dev = self.device
        return self.place_state(migrate(state, group, src, device=dev if dev.type == "cuda" else None))

    @staticmethod
    def check_step(state: DenoiseState, step_idx: int) -> None:
        if not isinstance(state, DenoiseState):
            raise InvalidUsage(f"gfdit.models: denoise_step needs a DenoiseState, got {type(state).__name__}")
        if step_idx != state.step_idx:
            raise InvalidUsage(
                f"gfdit.models: step {step_idx} asked, but the state is before step "
                f"{state.step_idx} of {state.num_steps}"
            )
        if state.done:
            raise InvalidUsage(f"gfdit.models: the state has finished all {state.num_steps} steps")

    @staticmethod
    def check_batch(states: Any) -> None:
        """Refuses (gfdit.InvalidUsage) a list of states that ``denoise_batch`` cannot step together (NOTE
        [batched step]); the checks read only the states, so every member refuses alike."""
        if not isinstance(states, list | tuple):
            raise InvalidUsage(
                f"gfdit.models: denoise_batch needs a list of DenoiseState, got {type(states).__name__}"
            )
        if not states:
            raise InvalidUsage("gfdit.models: denoise_batch needs at least one state, got an empty list")
        for i, state in enumerate(states):
            if not isinstance(state, DenoiseState):
                raise InvalidUsage(
                    f"gfdit.models: denoise_batch: item {i} is a {type(state).__name__}, not a DenoiseState"
                )
            if state.done:
                raise InvalidUsage(
                    f"gfdit.models: denoise_batch: state {i} has finished all {state.num_steps} steps"
                )
        first = states[0]
        for i, state in enumerate(states[1:], 1):
            if state.grid != first.grid or state.latent.shape != first.latent.shape:
                raise InvalidUsage(
                    f"gfdit.models: denoise_batch: state {i} has latent grid {state.grid} "
                    f"{tuple(state.latent.shape)}, state 0 {first.grid} {tuple(first.latent.shape)}; one "
                    "forward needs one size"
                )
            if state.do_cfg != first.do_cfg:
                raise InvalidUsage(
                    f"gfdit.models: denoise_batch: state {i} has guidance_scale {state.guidance_scale}, state 0 "
                    f"{first.guidance_scale}: CFG and non-CFG requests are kept apart by rule"
                )
        if first.do_cfg:
            for i, state in enumerate(states):
                if state.negative_prompt_embeds is None:
                    raise InvalidUsage(
                        f"gfdit.models: denoise_batch: state {i} has guidance but no negative_prompt_embeds"
                    )

    @staticmethod
    def guided_batch_predictions(
        states: list[DenoiseState],
        group: comm.Group | None,
        spec: ParallelSpec | None,
        velocity: Callable[[list[torch.Tensor], comm.Group | None, ParallelSpec | None, int], torch.Tensor],
        caches: step_cache.CachedStep | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(conditional, unconditional) predictions of one step of a batch (NOTE [batched step]) on every member
        of ``group`` (unconditional None without guidance), [B, ...], row i state i's. ``velocity(embeds, group,
        spec, pass_idx)`` runs one transformer pass (0 conditional, 1 unconditional) over the pass's text
        embeddings of every state (a list, in the states' order) and returns its whole batched output (in the
        transformer's output dtype, on the model's device; NOTE [state dtypes]). spec.cfg 1: the passes in turn
        on the whole group; 2: one per half of the group at once, then one exchange (NOTE [CFG-parallel]), and
        with ``caches`` (the step's cache work) one exchange of the passes' cache scalars. The states were
        checked by ``check_batch`` (all with guidance or all without)."""
        first = states[0]
        negatives = [s.negative_prompt_embeds for s in states] if first.do_cfg else None
        return StagedModel._guided_passes(
            [s.prompt_embeds for s in states],
            negatives,
            first.guidance_scale,
            group,
            spec,
            velocity,
            caches,
        )

    @staticmethod
    def _guided_passes(
        cond_embeds: Any,
        neg_embeds: Any,
        guidance_scale: float,
        group: comm.Group | None,
        spec: ParallelSpec | None,
        velocity: Callable[[Any, comm.Group | None, ParallelSpec | None, int], torch.Tensor],
        caches: step_cache.CachedStep | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The passes of ``guided_batch_predictions``, with the embeddings ``velocity`` takes."""
        do_cfg = guidance_scale > 1.0
        if spec is None or spec.cfg == 1:
            cond = velocity(cond_embeds, group, spec, 0)
            if not do_cfg:
                return cond, None
            return cond, velocity(neg_embeds, group, spec, 1)
        if not do_cfg:
            raise InvalidUsage(
                f"gfdit.models: spec cfg=2 (CFG-parallel) needs guidance, but the state has guidance_scale "
                f"{guidance_scale} (one pass per step: nothing to run in parallel)"
            )
        if neg_embeds is None:  # refused on both halves, before the exchange
            raise InvalidUsage(
                "gfdit.models: spec cfg=2 (CFG-parallel): the state has guidance but no negative prompt "
                "embeddings for the unconditional half"
            )
        if not comm.is_initialized():
            raise InvalidUsage("gfdit.models: spec cfg=2 (CFG-parallel) needs gfdit.init and a group")
        world = comm.get_world()
        g = world._group(group)
        ranks = list(g.ranks)
        if len(ranks) != spec.degree:
            raise InvalidUsage(
                f"gfdit.models: spec cfg=2 x ulysses={spec.ulysses} x ring={spec.ring} = {spec.degree} "
                f"members, but the group {ranks} has {len(ranks)}"
            )
        me = g.rank()
        if me < 0:
            raise InvalidUsage(f"gfdit.models: rank {world.rank} is not a member of the group {ranks}")
        half = len(ranks) // 2
        conditional = me < half
        sub = world.new_group(ranks[:half] if conditional else ranks[half:])
        embeds = cond_embeds if conditional else neg_embeds
        # exchanged in the dtype the guidance combines in: the same predictions as the passes in turn
        mine = velocity(embeds, sub, spec.per_pass(), 0 if conditional else 1).contiguous()
        pair = world.new_group([ranks[me % half], ranks[half + me % half]])
        both = torch.empty((2 * mine.shape[0], *mine.shape[1:]), dtype=mine.dtype, device=mine.device)
        world.all_gather_into_tensor(both, mine, group=pair)
        if caches is not None:  # the other pass's decisions and cache scalars (NOTE [sharded step cache], 2)
            caches.exchange(pair, 0 if conditional else 1, ranks[half:] if conditional else ranks[:half])
        return both[: mine.shape[0]], both[mine.shape[0] :]

    @staticmethod
    def parallel_call(
        model: torch.nn.Module,
        wrapper: torch.nn.Module,
        group: comm.Group | None,
        spec: ParallelSpec | None,
        block_loop: step_cache.CachedBlocks | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """The transformer's output: the plain model when group is None and gfdit is not initialised,
        else the parallel wrapper on the group (the world for None). block_loop: a step cache's loop for
        the call (NOTE [parallel call], 5, in gfdit.models.core)."""
        if group is None and not comm.is_initialized():
            if spec is not None and spec.degree != 1:
                raise InvalidUsage("gfdit.models: a parallel spec needs gfdit.init and a group")
            return StagedModel.plain_call(model, block_loop, **kwargs)
        if block_loop is None:
            return wrapper(**kwargs, return_dict=False, group=group, spec=spec)[0]
        return wrapper(**kwargs, return_dict=False, group=group, spec=spec, block_loop=block_loop)[0]

    @staticmethod
    def plain_call(
        model: torch.nn.Module, block_loop: step_cache.CachedBlocks | None, **kwargs: Any
    ) -> torch.Tensor:
        """The plain model's output for ``kwargs``, with a step cache's loop in place of its blocks for the call
        when one is given (put back when the call returns or raises)."""
        if block_loop is None:
            return model(**kwargs, return_dict=False)[0]
        block_loop.check(model, kwargs)
        undo = block_loop.install(model)
        try:
            return model(**kwargs, return_dict=False)[0]
        finally:
            undo()

    @staticmethod
    def one_member(group: comm.Group | None, spec: ParallelSpec | None) -> bool:
        """Whether a transformer call on ``group`` runs on this process alone (no gfdit world and no group,
        or a group of one), where the plain model may run a call the parallel wrapper refuses (NOTE
        [batched step]: Qwen-Image's masked text). A spec of more than one member is refused as
        ``parallel_call`` and the wrapper refuse it."""
        if group is None and not comm.is_initialized():
            n = 1
        else:
            n = comm.get_world()._group(group).size()
        if n == 1 and spec is not None and spec.degree != 1:
            raise InvalidUsage(
                f"gfdit.models: spec ulysses={spec.ulysses} x ring={spec.ring} x cfg={spec.cfg} = "
                f"{spec.degree} members, but the call runs on one"
            )
        return n == 1


def transformer_dtype(model: torch.nn.Module) -> torch.dtype:
    """``model.dtype`` as diffusers computes it (what the pipelines cast the transformer's inputs to), remembered
    per model while its first parameter keeps its dtype (a cast of the model changes it, and is seen): the
    property scans every submodule for casting hooks, about 2 ms a step for a 24-block tiny model, which the
    pipelines pay once per call and a step of a staged model would pay every step."""
    first = next(model.parameters()).dtype
    memo = model.__dict__.get("_gfdit_dtype")
    if memo is None or memo[0] != first:
        dtype: torch.dtype = model.dtype  # type: ignore[assignment]  # a diffusers ModelMixin's property
        memo = (first, dtype)
        model.__dict__["_gfdit_dtype"] = memo
    return memo[1]


def sub_batches(keys: list[Any]) -> list[list[int]]:
    """The indices of ``keys`` grouped by equal key, each group in order, the groups in the order of their
    first index (NOTE [batched step]: the same sub-batches in the same order on every member)."""
    groups: dict[Any, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def cat_rows(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The tensors concatenated along dim 0 (a batch); one tensor is returned as it is, so a batch of one
    runs exactly the ops of ``denoise_step`` (NOTE [batched step])."""
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors)


# ----------------------------------------------------------------------------------- packing and migration
# NOTE [state header]
# int64[HEADER_LEN]: MAGIC, VERSION, status (0 ok; 1 the source had no state), step_idx, guidance_scale
# (float64 bits), grid f, h, w, lower_order_nums, this_order, has guidance_scale_2, its float64 bits, in
# migrate's header (not pack_state's) at _DEVICE_MASK_AT a bit per tensor of ALL_TENSORS that the source holds
# on CUDA (NOTE [state placement]), zeros up to _TENSORS_AT, then per tensor of ALL_TENSORS (STATE_TENSORS, then
# the step cache's: each pass's ref and residual, gfdit.models.cache.TENSOR_NAMES): dtype code (-1: None),
# ndim, 6 dims; then at _CACHE_AT the step cache's scalars (gfdit.models.cache.header_of: its kind, 0 for no
# cache, its config, the counters, and per pass its decision state and layout). The payload is the tensors'
# bytes, contiguous, in ALL_TENSORS order; a None tensor (no negative prompt, no sampler history, no cache, or a
# shard that migrate does not carry: NOTE [sharded step cache], 5) has no bytes. VERSION 3 added the step
# cache; a header of another version is refused.
STATE_TENSORS = (
    "latent",
    "prompt_embeds",
    "negative_prompt_embeds",
    "sigmas",
    "timesteps",
    "history",
    "history_timesteps",
    "last_sample",
)
# The tensors a held state keeps on the model's device (NOTE [state placement]); the others are the schedule.
# The step cache's tensors live there too (gfdit.models.cache.place).
DEVICE_TENSORS = ("latent", "prompt_embeds", "negative_prompt_embeds", "history", "last_sample")
ALL_TENSORS = STATE_TENSORS + step_cache.TENSOR_NAMES
_MAX_DIMS = 6
_DEVICE_MASK_AT = 12
_TENSORS_AT = 16
_CACHE_AT = _TENSORS_AT + len(ALL_TENSORS) * (2 + _MAX_DIMS)
HEADER_LEN = _CACHE_AT + step_cache.HEADER_LEN
MAGIC = 0x6766646974  # "gfdit"
VERSION = 3
# the element types a state's tensors may have, as the header codes them (gfdit._C.DType values)
_STATE_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.uint8)


def _f64_bits(x: float) -> int:
    return int(torch.tensor([x], dtype=torch.float64).view(torch.int64).item())


def _bits_f64(x: int) -> float:
    return float(torch.tensor([x], dtype=torch.int64).view(torch.float64).item())


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def _tensors_of(state: DenoiseState) -> dict[str, torch.Tensor | None]:
    """The state's tensors by the names of ALL_TENSORS."""
    out: dict[str, torch.Tensor | None] = {name: getattr(state, name) for name in STATE_TENSORS}
    out.update(step_cache.tensors_of(state.cache))
    return out


@overload
def pack_state(
    state: DenoiseState, with_payload: Literal[True] = True
) -> tuple[torch.Tensor, torch.Tensor]: ...
@overload
def pack_state(state: DenoiseState, with_payload: bool) -> tuple[torch.Tensor, torch.Tensor | None]: ...
def pack_state(state: DenoiseState, with_payload: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(header int64[HEADER_LEN], payload uint8[...]) of a state; see NOTE [state header]. Without the
    payload (None) when with_payload is False."""
    if not isinstance(state, DenoiseState):
        raise InvalidUsage(f"gfdit.models: pack_state needs a DenoiseState, got {type(state).__name__}")
    header = torch.zeros(HEADER_LEN, dtype=torch.int64)
    head = [MAGIC, VERSION, 0, state.step_idx, _f64_bits(state.guidance_scale), *state.grid]
    head += [int(state.lower_order_nums), int(state.this_order)]
    g2 = state.guidance_scale_2
    head += [0, 0] if g2 is None else [1, _f64_bits(g2)]
    head += [0] * (_TENSORS_AT - len(head))
    parts = []
    tensors = _tensors_of(state)
    for name in ALL_TENSORS:
        t = tensors[name]
        if t is None:
            head += [-1, 0] + [0] * _MAX_DIMS
            continue
        if t.dtype not in _STATE_DTYPES or t.dim() > _MAX_DIMS:
            raise InvalidUsage(
                f"gfdit.models: state tensor {name} ({t.dtype}, {t.dim()} dims) cannot migrate"
            )
        head += [int(TORCH_TO_DTYPE[t.dtype]), t.dim()] + list(t.shape) + [0] * (_MAX_DIMS - t.dim())
        if with_payload:
            parts.append(_bytes(t))
    head += step_cache.header_of(state.cache)
    header[: len(head)] = torch.tensor(head, dtype=torch.int64)
    if not with_payload:
        return header, None
    payload = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.uint8)
    return header, payload


def _layout(header: torch.Tensor) -> list[tuple[torch.dtype, tuple[int, ...]] | None]:
    h = header.tolist()
    if h[0] != MAGIC or h[1] != VERSION:
        raise InvalidUsage("gfdit.models: not a gfdit state header (magic or version mismatch)")
    out = []
    pos = _TENSORS_AT
    for _ in ALL_TENSORS:
        code, ndim = h[pos], h[pos + 1]
        out.append(None if code < 0 else (DTYPE_TO_TORCH[DType(code)], tuple(h[pos + 2 : pos + 2 + ndim])))
        pos += 2 + _MAX_DIMS
    return out


def _state_of(header: torch.Tensor, tensors: dict[str, torch.Tensor | None]) -> DenoiseState:
    """The DenoiseState of a header and its tensors (by the names of ALL_TENSORS)."""
    cache = step_cache.from_header(header[_CACHE_AT:].tolist(), tensors)
    plain = {name: tensors[name] for name in STATE_TENSORS}
    return DenoiseState(**_scalars(header), **plain, cache=cache)  # type: ignore[arg-type]


def _scalars(header: torch.Tensor) -> dict[str, Any]:
    """The DenoiseState fields of a header that are not tensors (the step cache aside)."""
    h = header.tolist()
    return {
        "step_idx": int(h[3]),
        "guidance_scale": _bits_f64(h[4]),
        "grid": (int(h[5]), int(h[6]), int(h[7])),
        "lower_order_nums": int(h[8]),
        "this_order": int(h[9]),
        "guidance_scale_2": _bits_f64(h[11]) if h[10] else None,
    }


def payload_bytes(header: torch.Tensor) -> int:
    """Bytes of the payload that goes with a header."""
    total = 0
    for item in _layout(header):
        if item is not None:
            dtype, shape = item
            total += torch.Size(shape).numel() * torch.empty(0, dtype=dtype).element_size()
    return total


def unpack_state(header: torch.Tensor, payload: torch.Tensor) -> DenoiseState:
    """The state that ``pack_state`` packed (tensors are copies, on the CPU)."""
    layout = _layout(header)
    if payload.numel() != payload_bytes(header):
        raise InvalidUsage(
            f"gfdit.models: state payload has {payload.numel()} bytes, the header says "
            f"{payload_bytes(header)}"
        )
    tensors: dict[str, torch.Tensor | None] = {}
    offset = 0
    for name, item in zip(ALL_TENSORS, layout):
        if item is None:
            tensors[name] = None
            continue
        dtype, shape = item
        n = torch.Size(shape).numel() * torch.empty(0, dtype=dtype).element_size()
        tensors[name] = payload[offset : offset + n].clone().view(dtype).reshape(shape)
        offset += n
    return _state_of(header, tensors)


def state_digest(state: DenoiseState) -> str:
    """sha256 of the packed state: equal digests on two ranks mean bit-identical states (a step cache's
    shards included: members of a sequence-parallel group hold different ones, NOTE [sharded step cache])."""
    header, payload = pack_state(state)
    return hashlib.sha256(header.numpy().tobytes() + payload.numpy().tobytes()).hexdigest()


def _receive_buffer(
    world: comm.World, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | None = None
) -> torch.Tensor:
    """Where a migrated state tensor lands: the symmetric heap when it has room. Heap pages stay mapped and
    touched after a state is freed, so the next migration into them takes no page faults (a fresh
    allocation of 16 MiB costs several milliseconds of faults here), and migrating the state onward from
    this rank is zero-copy. On a device: an ordinary CUDA tensor (the caching allocator keeps its pages;
    the device heap is left to the attention workspaces, whose symmetric offsets it would shift)."""
    if device is not None:
        return torch.empty(shape, dtype=dtype, device=device)
    try:
        return world.empty(shape, dtype)
    except InvalidUsage:  # heap full: ordinary memory
        return torch.empty(shape, dtype=dtype)


def migrate(
    state: DenoiseState | None, group: comm.Group | None, src: int, device: Any = None
) -> DenoiseState:
    """Gives every member of ``group`` the state that global rank ``src`` holds; returns it on every member.

    Every member calls it; only ``src`` needs a state (the others pass None or anything). A gfdit broadcast
    of the fixed-size header (shapes, dtypes, step, guidance, grid, the sampler's counters; NOTE [state
    header]), then one broadcast per state tensor (the sampler's history included) straight into freshly allocated tensors: no packing copy on the source and no unpacking
    copy on the receivers, and the staged broadcast pipelines the source's and the receivers' copies. Call
    it on [holder, *new members]: members that already hold the state need not take part. A step cache goes
    with the state as NOTE [sharded step cache] (5) says: what the source holds whole (after ``gather_cache``)
    becomes whole on every member. On ``src`` the given state is returned as is (its cache's layouts updated
    so); elsewhere fresh tensors, on the CPU for the tensors the source holds on
    the CPU, and on ``device`` (None: the world's device) for those it holds on CUDA, moved with the device
    collectives (NOTE [state placement]). If ``src`` has no state, every member raises gfdit.InvalidUsage
    (after the header, so nobody waits for the tensors); a receiver without a device for a source's CUDA
    tensors raises gfdit.InvalidUsage too.
    """
    world = comm.get_world()
    g = world._group(group)
    if int(src) not in g.ranks:
        raise InvalidUsage(f"gfdit.models: migrate source {src} is not in group {g.ranks}")
    me = world.rank
    sent = None  # on the source: the state as the receivers get it
    if me == src:
        if isinstance(state, DenoiseState):
            sent = state
            if state.cache is not None:
                sent = dataclasses.replace(state, cache=step_cache.for_migration(state.cache, src))
            header, _ = pack_state(sent, with_payload=False)
            mask = 0
            for i, t in enumerate(_tensors_of(sent).values()):
                if isinstance(t, torch.Tensor) and t.device.type == "cuda":
                    mask |= 1 << i
            header[_DEVICE_MASK_AT] = mask
        else:
            header = torch.zeros(HEADER_LEN, dtype=torch.int64)
            header[:3] = torch.tensor([MAGIC, VERSION, 1])
    else:
        header = torch.zeros(HEADER_LEN, dtype=torch.int64)
    world.broadcast(header, src, group=g)
    if int(header[2]) != 0:
        raise InvalidUsage(f"gfdit.models: migrate source rank {src} holds no DenoiseState")
    mask = int(header[_DEVICE_MASK_AT])
    recv_device = None
    if mask and me != src:
        recv_device = world.device if device is None else torch.device(device)
        if recv_device is None or recv_device.type != "cuda":
            raise InvalidUsage(
                f"gfdit.models: migrate: source rank {src} holds the state on CUDA, but rank {me} has no "
                "device to receive it on (gfdit.init device=... on every member)"
            )
    tensors: dict[str, torch.Tensor | None] = {}
    held = _tensors_of(sent) if sent is not None else {}
    for i, (name, item) in enumerate(zip(ALL_TENSORS, _layout(header))):
        if item is None:
            tensors[name] = None
            continue
        dtype, shape = item
        if me == src:
            t = held[name].detach().contiguous()  # type: ignore[union-attr]  # where it lives: CPU or the device
        else:
            t = _receive_buffer(world, shape, dtype, recv_device if mask >> i & 1 else None)
        if t.numel():
            world.broadcast(t, src, group=g)
        tensors[name] = t
    if me == src:
        assert isinstance(state, DenoiseState)
        if state.cache is None:
            return state
        return dataclasses.replace(state, cache=step_cache.on_source_after_migration(state.cache, src))
    return _state_of(header, tensors)


# ---------------------------------------------------------------------------------------------- loading
CONFIG_FILE = "gfdit.json"  # written by save_pretrained of a staged model: its name and defaults


def write_gfdit_config(path: Any, name: str, defaults: StageDefaults, **extra: Any) -> None:
    """Writes CONFIG_FILE (the model's name and defaults) next to a saved diffusers pipeline."""
    with open(os.path.join(os.fspath(path), CONFIG_FILE), "w", encoding="utf-8") as f:
        json.dump({"name": name, "defaults": dataclasses.asdict(defaults), **extra}, f, indent=1)


def read_json(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def check_folder(name: str, path: Any, components: tuple[str, ...]) -> str:
    """The folder as a str, or gfdit.InvalidUsage saying what is missing."""
    if path is None:
        raise InvalidUsage(
            f"gfdit.models.load: {name!r} needs path= (a local diffusers folder); nothing is downloaded"
        )
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise InvalidUsage(f"gfdit.models.load: {name!r}: path {path!r} is not a folder")
    if not os.path.isfile(os.path.join(path, "model_index.json")):
        raise InvalidUsage(
            f"gfdit.models.load: {name!r}: {path!r} has no model_index.json; expected a "
            "diffusers pipeline folder (save_pretrained, or a downloaded *-Diffusers "
            "repository)"
        )
    missing = [c for c in components if not os.path.isdir(os.path.join(path, c))]
    if missing:
        raise InvalidUsage(
            f"gfdit.models.load: {name!r}: {path!r} lacks the component folder(s) {', '.join(missing)}"
        )
    return path


def load_diffusers_model(cls: Any, path: str, subfolder: str, dtype: torch.dtype | None = None) -> Any:
    """``cls.from_pretrained(path, subfolder=..., local_files_only=True)``; without ``accelerate`` (which
    diffusers needs for models with fp32-pinned modules, such as Wan's transformer) the same from the config
    and the safetensors files, with the pinned modules kept in float32."""
    import importlib.util

    kwargs: dict[str, Any] = {"subfolder": subfolder, "local_files_only": True}
    if dtype is not None:
        kwargs["torch_dtype"] = dtype
    if importlib.util.find_spec("accelerate") is not None or not getattr(cls, "_keep_in_fp32_modules", None):
        return cls.from_pretrained(path, **kwargs)
    from safetensors.torch import load_file

    folder = os.path.join(path, subfolder)
    config = cls.load_config(folder, local_files_only=True)
    index = os.path.join(folder, "diffusion_pytorch_model.safetensors.index.json")
    if os.path.isfile(index):
        files = sorted(set(read_json(index)["weight_map"].values()))
    else:
        files = ["diffusion_pytorch_model.safetensors"]
    state: dict[str, torch.Tensor] = {}
    for f in files:
        full = os.path.join(folder, f)
        if not os.path.isfile(full):
            raise OSError(f"{full} is missing (only safetensors weights load without accelerate)")
        state.update(load_file(full))
    model = cls.from_config(config)
    model.load_state_dict(state, strict=True)
    if dtype is not None:
        model.to(dtype)
        keep = cls._keep_in_fp32_modules
        for name, module in model.named_modules():
            if any(k in name for k in keep):
                module.float()
    return model.eval()
