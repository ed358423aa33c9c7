"""Samplers: the folder's diffusers scheduler, stepped from a portable ``DenoiseState``.

``sampler_from_config(scheduler_config)`` returns the ``Sampler`` of a folder's scheduler:

- ``FlowMatchEulerDiscreteScheduler``: flow-matching Euler, a pure function of (latent, sigma_k,
  sigma_{k+1}, velocity) (``gfdit.models.staged.euler_step``); the state carries no history.
- ``UniPCMultistepScheduler`` (Wan's, with ``prediction_type="flow_prediction"`` and ``use_flow_sigmas``)
  and ``DPMSolverMultistepScheduler``: multistep solvers. Each step runs diffusers' own ``step`` on a
  scheduler object made from the config and loaded with the state's history, then reads the history back
  into the next state (see NOTE [portable denoise state] in gfdit.models.staged). Driving diffusers' code,
  not a copy of its arithmetic, keeps every option of the config (solver order and type, lower-order final
  steps, disabled correctors, thresholding, other prediction types) exact.

Any other scheduler class, and options whose steps draw random noise (SDE variants, stochastic sampling),
are refused with gfdit.InvalidUsage naming them: a folder's sampler is never silently replaced.

Two things differ from diffusers on purpose: a one-step schedule under ``shift_terminal`` (NOTE [one-step
terminal stretch]), and a trajectory that ends in a non-finite latent, which is a model error (gfdit.Error)
where diffusers returns it (and a pipeline then decodes it into a black image).
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import torch

from gfdit._C import Error, InvalidUsage
from gfdit.models.staged import DenoiseState, euler_step, flow_match_schedule

EULER = "FlowMatchEulerDiscreteScheduler"
UNIPC = "UniPCMultistepScheduler"
DPM_SOLVER = "DPMSolverMultistepScheduler"
SUPPORTED = (EULER, UNIPC, DPM_SOLVER)


# A sigma this close to 1 is 1 (UniPC lowers a first sigma of 1 by 1e-6, NOTE [one-step terminal stretch]).
_SIGMA_ONE_TOL = 1e-5

# What diffusers raises for a schedule its scheduler cannot make (set_timesteps' own checks).
_SCHEDULE_ERRORS = (ValueError, AssertionError, TypeError)


class Sampler:
    """A scheduler config as a schedule (once per request) and a step (on a ``DenoiseState``)."""

    name: str = ""

    def __init__(self, config: dict) -> None:
        self.config = dict(config)

    @property
    def scheduler_class(self) -> Any:
        """The diffusers scheduler class (for save_pretrained and for reference runs)."""
        import diffusers

        return getattr(diffusers, self.name)

    def schedule(
        self, num_inference_steps: int, *, sigmas: Any = None, mu: float | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(sigmas [N + 1], timesteps [N]) in the scheduler's dtypes, as the pipelines set them: with custom
        ``sigmas`` (Qwen-Image) through ``set_timesteps(sigmas=..., mu=...)``, else
        ``set_timesteps(N, mu=...)``. A fresh scheduler object per call. A schedule that ends at sigma 1 is
        not stretched to ``shift_terminal`` (NOTE [one-step terminal stretch])."""
        if self.config.get("shift_terminal"):
            plain = self._set_timesteps(
                {**self.config, "shift_terminal": None}, num_inference_steps, sigmas=sigmas, mu=mu
            )
            if float(plain[0][-2]) > 1 - _SIGMA_ONE_TOL:
                return plain
        return self._set_timesteps(self.config, num_inference_steps, sigmas=sigmas, mu=mu)

    # NOTE [one-step terminal stretch]
    # With ``shift_terminal`` (Qwen-Image's scheduler: 0.02), diffusers' set_timesteps stretches the shifted
    # sigmas so that sigma 1 stays and the last one becomes shift_terminal: s -> 1 - (1 - s) / c with
    # c = (1 - s_last) / (1 - shift_terminal). A schedule whose last sigma is 1 (one step from pure noise:
    # Qwen-Image's sigmas linspace(1, 1/N, N) at N = 1; every shift keeps 1) makes c zero, and diffusers
    # returns NaN sigmas (QwenImagePipeline at one step gives NaN pixels, with "invalid value encountered in
    # divide"). No stretch can keep sigma 1 and end at shift_terminal with one sigma; the one that keeps the
    # start is the identity, so such a schedule is used unstretched: sigmas [1, 0], one step from noise to
    # the sample. Every other schedule is diffusers' own.
    def _set_timesteps(
        self, config: dict, num_inference_steps: int, *, sigmas: Any, mu: float | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The schedule diffusers' scheduler of ``config`` sets (see ``schedule``)."""
        sched = self.scheduler_class.from_config(config)
        kwargs: dict[str, Any] = {} if mu is None else {"mu": mu}
        params = inspect.signature(sched.set_timesteps).parameters
        try:
            if sigmas is not None:
                if "sigmas" not in params:
                    raise ValueError("its set_timesteps takes no custom sigmas, which this pipeline passes")
                sched.set_timesteps(sigmas=sigmas, device="cpu", **kwargs)
            else:
                sched.set_timesteps(num_inference_steps, device="cpu", **kwargs)
        except _SCHEDULE_ERRORS as exc:
            raise self._refused(exc) from None
        return sched.sigmas.detach().cpu().clone(), sched.timesteps.detach().cpu().clone()

    def _refused(self, exc: Exception) -> InvalidUsage:
        """What a schedule the folder's scheduler refuses becomes (a request error, not a model error)."""
        return InvalidUsage(f"gfdit.models: the folder's {self.name} cannot make this schedule: {exc}")

    def step(self, state: DenoiseState, model_output: torch.Tensor) -> DenoiseState:
        """The state after step ``state.step_idx`` given the model's (guided) output there; the input state is
        not modified. The last step raises gfdit.Error (a model error) when the latent it gives is not
        finite: what would be decoded must be a sample."""
        raise NotImplementedError

    def _checked(self, state: DenoiseState) -> DenoiseState:
        """``state``, after refusing a finished trajectory whose latent holds NaN or infinity. Checked once
        per trajectory (on a GPU it waits for the step), at its end: a non-finite value stays so to the end."""
        if state.done and not bool(torch.isfinite(state.latent).all()):
            raise Error(
                f"gfdit.models: the {self.name} trajectory of {state.num_steps} step(s) ended in a latent "
                "with NaN or infinite values; the model's output is not an image"
            )
        return state


class EulerSampler(Sampler):
    """FlowMatchEulerDiscreteScheduler: x + (sigma_{k+1} - sigma_k) v."""

    name = EULER

    def __init__(self, config: dict) -> None:
        super().__init__(config)
        if self.config.get("stochastic_sampling"):
            raise InvalidUsage(
                f"gfdit.models: {EULER} with stochastic_sampling draws noise at every step; not supported"
            )

    def _set_timesteps(
        self, config: dict, num_inference_steps: int, *, sigmas: Any, mu: float | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            return flow_match_schedule(config, num_inference_steps, sigmas=sigmas, mu=mu)
        except _SCHEDULE_ERRORS as exc:
            raise self._refused(exc) from None

    def step(self, state: DenoiseState, model_output: torch.Tensor) -> DenoiseState:
        k = state.step_idx
        new = euler_step(state.latent, state.sigmas[k], state.sigmas[k + 1], model_output)
        return self._checked(dataclasses.replace(state, latent=new, step_idx=k + 1))


class MultistepSampler(Sampler):
    """UniPCMultistepScheduler and DPMSolverMultistepScheduler: diffusers' step on a scheduler object that
    holds the state's history.

    What diffusers keeps between steps, and where the state keeps it:
      model_outputs [order] (None until filled) -> ``history`` [n, *latent], the n = min(k, order) filled
      ones, oldest first; UniPC's timestep_list -> ``history_timesteps`` [n] (the schedule's timesteps of
      those steps); lower_order_nums -> ``lower_order_nums``; UniPC's last_sample (the sample its corrector
      starts from) -> ``last_sample``; UniPC's this_order (the predictor's order, which the next corrector
      reuses) -> ``this_order``; the step index -> ``step_idx``; sigmas and timesteps -> the schedule.
    Every tensor keeps the dtype diffusers gives it (NOTE [state dtypes] in gfdit.models.staged).
    """

    def __init__(self, config: dict) -> None:
        super().__init__(config)
        self.name = config["_class_name"]
        algo = self.config.get("algorithm_type", "")
        if self.name == DPM_SOLVER and str(algo).startswith("sde-"):
            raise InvalidUsage(
                f"gfdit.models: {DPM_SOLVER} with algorithm_type {algo!r} draws noise at every step; "
                "supported: 'dpmsolver++', 'dpmsolver'"
            )
        if self.config.get("solver_p") is not None:
            raise InvalidUsage(f"gfdit.models: {self.name} with a solver_p scheduler is not supported")
        self.order = int(self.scheduler_class.from_config(self.config).config.solver_order)

    def step(self, state: DenoiseState, model_output: torch.Tensor) -> DenoiseState:
        k = state.step_idx
        sched = self.scheduler_class.from_config(self.config)
        outputs: list = [] if state.history is None else list(state.history.unbind(0))
        times: list = [] if state.history_timesteps is None else list(state.history_timesteps.unbind(0))
        pad = self.order - len(outputs)
        if pad < 0 or len(times) not in (0, len(outputs)):
            raise InvalidUsage(
                f"gfdit.models: the state's sampler history ({len(outputs)} outputs, {len(times)} timesteps) "
                f"does not fit {self.name} of order {self.order}"
            )
        sched.sigmas = state.sigmas
        sched.timesteps = state.timesteps
        sched.num_inference_steps = state.num_steps
        sched.model_outputs = [None] * pad + outputs
        sched.lower_order_nums = int(state.lower_order_nums)
        sched._step_index = k
        sched._begin_index = 0
        if self.name == UNIPC:
            sched.timestep_list = [None] * (self.order - len(times)) + times
            sched.last_sample = state.last_sample
            sched.this_order = int(state.this_order)
        latent = sched.step(model_output, state.timesteps[k], state.latent, return_dict=False)[0]
        kept = [m for m in sched.model_outputs if m is not None]
        return self._checked(
            dataclasses.replace(
                state,
                latent=latent.contiguous(),  # in the dtype diffusers' step returns (NOTE [state dtypes])
                step_idx=k + 1,
                history=torch.stack(kept).contiguous() if kept else None,
                history_timesteps=state.timesteps[k + 1 - len(kept) : k + 1].clone() if kept else None,
                last_sample=None if self.name != UNIPC else sched.last_sample.contiguous(),
                lower_order_nums=int(sched.lower_order_nums),
                this_order=int(getattr(sched, "this_order", 0)),
            )
        )


def sampler_from_config(config: dict) -> Sampler:
    """The sampler of a diffusers scheduler config (a ``scheduler_config.json`` as a dict); other classes
    raise gfdit.InvalidUsage naming the class and the supported ones."""
    name = config.get("_class_name") if isinstance(config, dict) else None
    if name == EULER:
        return EulerSampler(config)
    if name in (UNIPC, DPM_SOLVER):
        return MultistepSampler(config)
    raise InvalidUsage(
        f"gfdit.models: scheduler {name!r} is not supported; supported: {', '.join(SUPPORTED)} "
        "(set the folder's scheduler/scheduler_config.json to one of them)"
    )
