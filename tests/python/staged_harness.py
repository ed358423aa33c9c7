"""Case functions of the staged-model tests; they run inside the rank processes of mp_harness worlds.

A trajectory plan is one (group, spec) per denoising step. Every rank follows the same plan, so every rank
knows who holds the request's state before each step (the members of the previous step's group; before
step 0 the first member of step 0's group, which encodes). Before a step whose group has members without
the state, the first holder in the group (or, if none, the first holder) migrates it to them with
gfdit.models.migrate on [source, *new members]; non-members of a step sit it out and drop their copy.
The last step's first member decodes. Failures are returned, not raised, so the world stays in step.
"""

from __future__ import annotations

import traceback

import torch

_MODELS: dict = {}


def model(name: str):
    """The tiny staged model ``name``, built once per process (seed 0). "tiny-wan@unipc": tiny-wan with
    Wan's UniPC scheduler (likewise "@dpm" for DPM-Solver++, and for tiny-qwen-image). A "+bf16" suffix
    ("tiny-wan@unipc+bf16"): that model saved and loaded back with gfdit.models.load(..., dtype=bfloat16),
    as a real checkpoint runs."""
    import gfdit.models as gm

    if name not in _MODELS:
        stem, bf16, _ = name.partition("+bf16")
        base, _, sampler = stem.partition("@")
        if sampler:
            from gfdit.models import qwen_pipeline, wan_pipeline

            mod = wan_pipeline if base == "tiny-wan" else qwen_pipeline
            m = mod.build_tiny(scheduler_config=SCHEDULERS[sampler])
        else:
            m = gm.load(base)
        if bf16:
            import tempfile

            with tempfile.TemporaryDirectory() as folder:
                m.save_pretrained(folder)
                m = gm.load("wan2.1" if base == "tiny-wan" else "qwen-image", folder, dtype=torch.bfloat16)
        _MODELS[name] = m
    return _MODELS[name]


def two_experts(base, scheduler_config: dict | None = None):
    """A Wan 2.2 A14B-like staged model on ``base``'s parts (a tiny staged Wan): its transformer above
    boundary_ratio 0.875 x 1000, a second tiny transformer (seed 11) below; ``scheduler_config``: base's when
    None."""
    from gfdit.models import tiny, wan_pipeline

    return wan_pipeline.WanStagedModel(
        name="wan2.2",
        tokenizer=base.tokenizer,
        text_encoder=base.text_encoder,
        vae=base.vae,
        transformer=base.transformer,
        transformer_2=tiny.tiny_wan(11),
        scheduler_config=base.scheduler_config if scheduler_config is None else scheduler_config,
        defaults=base.defaults,
        boundary_ratio=0.875,
    )


def _schedulers() -> dict:
    from gfdit.models.wan_pipeline import WAN21_SCHEDULER

    dpm = {
        "_class_name": "DPMSolverMultistepScheduler",
        "algorithm_type": "dpmsolver++",
        "prediction_type": "flow_prediction",
        "use_flow_sigmas": True,
        "flow_shift": 3.0,
        "solver_order": 2,
    }
    return {"unipc": WAN21_SCHEDULER, "dpm": dpm}


SCHEDULERS = _schedulers()


def start(m, prompt: str, seed: int, steps: int | None = None):
    """The state before step 0 of the default request of model m (same on every process)."""
    shape = m.latent_shape()
    cond = m.encode(prompt)
    return m.initial_state(cond, m.init_latent(seed, shape), num_inference_steps=steps, grid=tuple(shape[2:]))


def reference(name: str, prompt: str, seed: int) -> dict:
    """The whole trajectory in one process with the plain transformer (gfdit not initialised)."""
    m = model(name)
    state = start(m, prompt, seed)
    for k in range(state.num_steps):
        state = m.denoise_step(state, k)
    return {"latent": state.latent, "output": m.decode(state)}


def _spec(spec: dict | None):
    import gfdit

    return None if spec is None else gfdit.ParallelSpec(**spec)


def case_trajectory(ctx, name: str, prompt: str, seed: int, plan: list) -> dict:
    """Runs the plan on this rank; returns the digests of the states it held after each step it ran, and
    (on the decoding rank) the final latent and the decoded output."""
    import gfdit
    import gfdit.models as gm

    torch.set_num_threads(1)
    me = ctx.rank
    report: dict = {"rank": me, "digests": {}, "migrations": 0, "error": None}
    try:
        m = model(name)
        first = plan[0][0]
        holders = [first[0]]
        state = start(m, prompt, seed) if me == first[0] else None
        for k, (ranks, spec) in enumerate(plan):
            new = [r for r in ranks if r not in holders]
            if new:
                src = next((r for r in ranks if r in holders), holders[0])
                if me == src or me in new:
                    state = gm.migrate(state if me == src else None, gfdit.new_group([src] + new), src)
                    report["migrations"] += 1
            if me in ranks:
                state = m.denoise_step(state, k, group=gfdit.new_group(ranks), spec=_spec(spec))
                report["digests"][k] = gm.state_digest(state)
            else:
                state = None  # a rank outside the step's group no longer holds the current state
            holders = list(ranks)
        if me == plan[-1][0][0]:
            assert state is not None and state.done
            report["latent"] = state.latent
            report["output"] = m.decode(state)
    except Exception as exc:  # noqa: BLE001 - reported to the test
        report["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
    return report


def case_migrate_without_state(ctx, name: str) -> dict:
    """Rank 1 is the source but holds nothing: every member must raise gfdit.InvalidUsage, then a good
    migration on the same ranks must still work."""
    import gfdit
    import gfdit.models as gm

    group = gfdit.new_group([1, 0, 2, 3])
    out: dict = {"rank": ctx.rank}
    try:
        gm.migrate(None, group, 1)
        out["types"] = []
    except Exception as exc:  # noqa: BLE001
        out["types"] = [c.__name__ for c in type(exc).__mro__]
        out["message"] = str(exc)
    m = model(name)
    state = start(m, "after a failed migration", 5) if ctx.rank == 1 else None
    got = gm.migrate(state, group, 1)
    out["digest"] = gm.state_digest(got)
    return out


def case_cfg_refused(ctx, name: str) -> dict:
    """CFG-parallel steps that must be refused on every member alike, before any collective: no guidance, a
    group whose size is not the spec's degree (odd), a spec whose degree does not match the group; then a good
    CFG-parallel step on the same ranks still works (nobody was left in a collective)."""
    import gfdit
    import gfdit.models as gm

    torch.set_num_threads(1)
    m = model(name)
    out: dict = {"rank": ctx.rank, "errors": []}
    shape = m.latent_shape()
    plain = m.initial_state(
        m.encode("no guidance", guidance_scale=1.0),
        m.init_latent(3, shape),
        grid=tuple(shape[2:]),
        guidance_scale=1.0,
    )
    guided = start(m, "guided", 3)
    cases = [
        (plain, [0, 1, 2, 3], gfdit.ParallelSpec(ulysses=2, cfg=2)),  # one pass per step
        (guided, [0, 1, 2], gfdit.ParallelSpec(cfg=2)),  # odd group; the spec needs 2
        (guided, [0, 1, 2, 3], gfdit.ParallelSpec(cfg=2)),  # the spec needs 2 members, the group has 4
    ]
    for state, ranks, spec in cases:
        if ctx.rank not in ranks:
            out["errors"].append(None)
            continue
        try:
            m.denoise_step(state, 0, group=gfdit.new_group(ranks), spec=spec)
            out["errors"].append("accepted")
        except gfdit.InvalidUsage as exc:
            out["errors"].append(str(exc))
    state = m.denoise_step(
        guided, 0, group=gfdit.new_group([0, 1, 2, 3]), spec=gfdit.ParallelSpec(ulysses=2, cfg=2)
    )
    out["digest"] = gm.state_digest(state)
    return out
