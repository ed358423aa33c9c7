"""``gfdit profile``: measure every stage of a model on this machine, for the profiled cost model.

One ``gfdit.Engine`` runs at the given world size with a policy that pins each request to the group and
layout being measured (``PinnedPolicy``). Requests go one at a time, so every task runs alone, and each
task's duration is read from the request's timeline (the workers' own start and end times). For every
shape and every layout the model allows on the world, a request of ``--steps`` x ``--repeats`` measured steps
gives the encode, step and decode times (the decode split over the whole group); requests that move between
rank 0 and a group of degree d give the migration times (one holder, d - 1 new members). NOTE [profile requests]
says which requests run and why. For every shape and every batch size b of ``--batches`` (default 2 and 4;
batch 1 is every other measurement), b requests submitted at once run their steps together on rank 0 (one
batched forward per step: NOTE [batches] in src/runtime/control.cpp, guidance as the model's default), which
gives the step time of a batch (``ProfileEntry.batch``): with it a profiled cost model prices batches up to the
largest measured one, and the built-in policies batch on it. With ``--caches`` it also measures each step cache
(NOTE [step caches] in include/gfdit/step_cache.h) on the first shape, on one rank: for each threshold of
``--cache-thresholds`` one request of ``--cache-steps`` steps, whose timeline says which passes reused the cache
(the skip curve the simulator draws from), and the time of a step whose passes all did against a full one.
Control-plane latencies come from ``Engine.ping``.
When the ranks outnumber the cores, two-rank groups running at once give the collective efficiency (how much
of its share of the cores a collective task gets done), which the simulator's core sharing uses.

The profile (a ``gfdit.planning.cost.Profile``: a C++ ``ProfileEntry`` per stage, layout and shape) holds the
median of each stage's samples. ``gfdit.planning.cost`` writes the file (``PROFILE_FORMAT`` there), and
``gfdit simulate --cluster cpu --profile FILE`` and ``gfdit.planning.cost.cost_model(..., profile=FILE)`` read
it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from gfdit._C import InvalidUsage
from gfdit._C import runtime as rt
from gfdit.planning import cost
from gfdit.serving.engine import Engine, Request, worker_devices


@dataclasses.dataclass(frozen=True)
class LayoutSpec:
    """A group of the first ``ulysses * ring * cfg`` ranks with this layout (cfg 2: CFG-parallel)."""

    ulysses: int
    ring: int
    mode: str = "usp"  # a LayoutMode's name
    cfg: int = 1

    @property
    def degree(self) -> int:
        return self.ulysses * self.ring * self.cfg

    def layout(self) -> Any:
        return rt.Layout(ulysses=self.ulysses, ring=self.ring, mode=self.mode, cfg=self.cfg)

    def __str__(self) -> str:
        return layout_name(self.mode, self.ulysses, self.ring, self.cfg)


def layout_name(mode: str, ulysses: int, ring: int, cfg: int = 1) -> str:
    """A layout in a table: "usp 2x1", "torus 2x2", "usp 1x1 cfg2" (CFG-parallel)."""
    return f"{mode} {ulysses}x{ring}" + (" cfg2" if cfg == 2 else "")


class _Key(NamedTuple):
    """What one profile entry is a median of (the fields of a ``cost.ProfileEntry`` that name it)."""

    stage: str
    tokens: int
    degree: int = 1
    ulysses: int = 1
    ring: int = 1
    mode: str = "usp"
    cfg: int = 1
    num_new: int = 0
    batch: int = 1

    @staticmethod
    def of(stage: str, tokens: int, lay: LayoutSpec, num_new: int = 0, batch: int = 1) -> _Key:
        return _Key(stage, tokens, lay.degree, lay.ulysses, lay.ring, lay.mode, lay.cfg, num_new, batch)


@dataclasses.dataclass(frozen=True)
class Phase:
    """Steps of a request that run on one group: ``num_steps`` steps on ``ranks`` with ``layout``."""

    ranks: tuple[int, ...]
    layout: LayoutSpec
    num_steps: int


def layouts_for(world_size: int, heads: int, guidance: bool = False) -> list[LayoutSpec]:
    """Every layout to measure: every degree up to the world size; for each, Ulysses only (where the heads allow
    one per member: uneven splits are fine), Ring only, every Ulysses x Ring mix, and Torus on the mixes. With
    guidance also CFG-parallel: each of those per-pass layouts on both halves of twice its degree, where that
    fits the world."""
    passes = [LayoutSpec(1, 1)]
    for d in range(2, world_size + 1):
        if d <= heads:
            passes.append(LayoutSpec(d, 1))
        passes.append(LayoutSpec(1, d))
        for u in range(2, d):
            if d % u == 0 and u <= heads:
                passes.append(LayoutSpec(u, d // u))
                passes.append(LayoutSpec(u, d // u, "torus"))
    out = list(passes)
    if guidance:
        out += [dataclasses.replace(p, cfg=2) for p in passes if 2 * p.degree <= world_size]
    return out


def parse_batches(text: str) -> tuple[int, ...]:
    """``"2,4"`` as batch sizes, sorted and without repeats; ``""`` as none (batch 1 is always measured)."""
    batches = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            b = int(part)
        except ValueError:
            b = 0
        if b < 2:
            raise InvalidUsage(f"--batches: {part!r} is not an integer >= 2 (batch 1 is always measured)")
        batches.add(b)
    return tuple(sorted(batches))


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """``"HxWxF,HxW,..."`` as (height, width, frames) tuples (F defaults to 1)."""
    shapes = []
    for part in text.split(","):
        part = part.strip().lower()
        if not part:
            continue
        fields = part.split("x")
        try:
            values = [int(v) for v in fields]
        except ValueError:
            values = []
        if len(values) not in (2, 3) or min(values) < 1:
            raise InvalidUsage(f"--shapes: {part!r} is not HxW or HxWxF with positive integers")
        shapes.append((values[0], values[1], values[2] if len(values) == 3 else 1))
    if not shapes:
        raise InvalidUsage("--shapes: no shape given")
    return shapes


class _ModelFacts:
    """Defaults, size rules and token counts of a model, from the cost model's table (the tokens the cost
    model will be asked about)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.arch = cost.model_arch(name)
        self.is_video = bool(self.arch.is_video)
        self.default = (
            int(self.arch.default_height),
            int(self.arch.default_width),
            int(self.arch.default_frames),
        )

    def check(self, h: int, w: int, f: int) -> None:
        from gfdit.planning.trace import check_size

        check_size(self.name, h, w, f, 1)

    def tokens(self, h: int, w: int, f: int) -> int:
        return int(self.arch.tokens(h, w, f))

    def default_shapes(self) -> list[tuple[int, int, int]]:
        """For an image model the sizes it serves: its default size, the largest square its limits allow
        (``max_pixels``, ``max_tokens``) and the square halfway between in log-tokens, as the profiled cost
        model refuses shapes outside the measured tokens (NOTE [profile interpolation] in
        src/runtime/profile_model.cpp). For a video model images and short videos up to 4x the default's tokens
        (multiples of the default size, so always patchable)."""
        h, w, f = self.default
        if self.is_video:
            return list(dict.fromkeys([(h, w, 1), (2 * h, 2 * w, 1), (h, w, f), (2 * h, 2 * w, f)]))
        m = int(self.arch.spatial_multiple())
        side = m * math.isqrt(int(self.arch.max_pixels)) // m
        while side > m and self.tokens(side, side, 1) > int(self.arch.max_tokens):
            side -= m
        t_min, t_max = self.tokens(h, w, 1), self.tokens(side, side, 1)
        if t_max <= t_min:
            return [(h, w, 1)]
        mid = side
        while mid > m and self.tokens(mid - m, mid - m, 1) >= math.sqrt(t_min * t_max):
            mid -= m
        return list(dict.fromkeys([(h, w, 1), (mid, mid, 1), (side, side, 1)]))


class PinnedPolicy:
    """Runs every ready request by ``plan``: phase after phase, each on its ranks with its layout.

    Made a ``gfdit.Policy`` subclass on first use (``make``), so that importing this module needs no engine.
    The plan is set before each submit; the profile runs one request at a time, except with ``batch`` set: then
    it waits until that many requests are ready and runs them as one batch on rank 0 (``_run_batch``).
    """

    @staticmethod
    def make() -> Any:
        class _Pinned(rt.Policy):
            def __init__(self) -> None:
                super().__init__()
                self.plan: list[Phase] = []
                self.spread = 0  # > 0: see _collective_efficiency
                self.batch = 0  # > 0: see _run_batch

            def name(self) -> str:
                return "profile-pinned"

            def schedule(self, view: Any) -> list[Any]:
                free = set(view.free_ranks)
                out = []
                if self.batch:  # all of them, once `batch` are ready, in one batched decision on rank 0
                    ready = list(view.ready)[: self.batch]
                    if len(ready) < self.batch or 0 not in free:
                        return []  # the others are still being submitted, or rank 0 still decodes
                    head, others = ready[0], [r.id for r in ready[1:]]
                    steps = max(1, min(r.num_steps - r.step for r in ready))
                    return [rt.Decision(head.id, [0], rt.Layout(), steps, 1, batch=others)]
                if self.spread:  # every request on a group of its own of `spread` ranks, all its steps
                    d = self.spread
                    for r in view.ready:
                        if len(free) < d:
                            break
                        ranks = sorted(free)[:d]
                        free -= set(ranks)
                        layout = rt.Layout(ulysses=d)
                        out.append(rt.Decision(r.id, ranks, layout, max(1, r.num_steps - r.step)))
                    return out
                for r in view.ready:
                    begin = 0
                    for phase in self.plan:
                        if r.step < begin + phase.num_steps or phase is self.plan[-1]:
                            break
                        begin += phase.num_steps
                    if not set(phase.ranks) <= free:
                        continue
                    steps = max(1, min(begin + phase.num_steps, r.num_steps) - r.step)
                    # the decode splits over the whole group, so that each degree's decode is measured too
                    layout = phase.layout.layout()
                    out.append(rt.Decision(r.id, list(phase.ranks), layout, steps, len(phase.ranks)))
                    free -= set(phase.ranks)
                return out

        return _Pinned()


def _request(
    shape: tuple[int, int, int], steps: int, seed: int, prompt: str, cache: str | None = None
) -> Request:
    h, w, f = shape
    return Request(
        prompt=prompt, height=h, width=w, num_frames=f, num_inference_steps=steps, seed=seed, cache=cache
    )


# The warm-up of the step caches' measuring requests: short, so that most of their steps can reuse the cache,
# and not 0, so that the first steps (whose change is the largest) are computed as any request's are.
CACHE_WARMUP = 2


def _measure_caches(
    eng: Any,
    policy: Any,
    kinds: Sequence[str],
    thresholds: Sequence[float],
    shape: tuple[int, int, int],
    steps: int,
    timeout_s: float,
    model: str,
) -> tuple[list[Any], dict[str, float]]:
    """Each step cache of ``kinds`` at each threshold on rank 0: one request of ``steps`` steps (warm-up
    CACHE_WARMUP, no limit in a row) per threshold. Returns the skip curves (threshold, the share of the passes
    past the warm-up that reused the cache) and, per kind, the median step whose passes all reused it over the
    median full step (0 where a kind never had both)."""
    guidance = float(eng.model_info.defaults.guidance_scale) > 1.0
    passes = 2 if guidance else 1
    curves, ratios = [], {}
    one = LayoutSpec(1, 1)
    for kind in kinds:
        points, full, cached = [], [], []
        for i, thr in enumerate(thresholds):
            text = f"{kind}:{thr},warmup={CACHE_WARMUP},max_skip=-1"
            spec = rt.CacheSpec.parse(text)
            eligible = sum(not spec.always_full(k, steps) for k in range(steps))
            policy.plan = [Phase((0,), one, steps)]
            prompt = "profile {}x{}x{} ".format(*shape) + kind
            res = eng.submit(_request(shape, steps, 7000 + i, prompt, text)).result(timeout=timeout_s)
            for s in res.timeline:
                if s.kind != "denoise" or s.step_begin == 0:  # the first forward is not counted
                    continue
                dt = (s.end_ns - s.start_ns) / 1e9
                if s.cached_steps == s.num_steps:
                    cached.append(dt)
                elif s.cached_passes == 0:
                    full.append(dt)
            points.append((float(thr), res.cached_passes / max(1, eligible * passes)))
        source = (
            f"measured by gfdit profile on {model}, {shape[0]}x{shape[1]}x{shape[2]}, {steps} steps, one rank, "
            f"warm-up {CACHE_WARMUP}"
        )
        curves.append(rt.SkipCurve(kind, points, source))
        ratios[kind] = statistics.median(cached) / statistics.median(full) if cached and full else 0.0
    return curves, ratios


def _run(
    engine: Any, policy: Any, plan: list[Phase], shape: tuple[int, int, int], seed: int, timeout_s: float
) -> list[Any]:
    """One request with ``plan``; its timeline."""
    policy.plan = plan
    steps = sum(p.num_steps for p in plan)
    prompt = "profile {}x{}x{}".format(*shape)
    return engine.submit(_request(shape, steps, seed, prompt)).result(timeout=timeout_s).timeline


def _run_batch(
    engine: Any, policy: Any, batch: int, shape: tuple[int, int, int], steps: int, seed: int, timeout_s: float
) -> tuple[list[Any], list[list[Any]]]:
    """``batch`` requests of ``shape`` submitted at once, run as one batch of ``steps`` steps on rank 0; the
    denoise stages the batch ran in step order (each once: every member's timeline holds the same batched
    stage), and every member's timeline."""
    policy.batch = batch
    try:
        prompt = "profile batch {}x{}x{}".format(*shape)
        handles = [engine.submit(_request(shape, steps, seed + k, prompt)) for k in range(batch)]
        timelines = [h.result(timeout=timeout_s).timeline for h in handles]
    finally:
        policy.batch = 0
    seen: dict[tuple, Any] = {}
    for tl in timelines:
        for s in tl:
            if s.kind == "denoise" and s.batch == batch:
                seen.setdefault((s.start_ns, s.end_ns, tuple(s.ranks), s.step_begin), s)
    return sorted(seen.values(), key=lambda s: s.step_begin), timelines


def _collective_efficiency(
    eng: Any, policy: Any, facts: Any, shapes: list, samples: dict, steps: int, timeout_s: float
) -> float:
    """How much of its fair share of the cores a collective task gets done when the ranks outnumber the
    cores: a request of the largest shape on every group of two ranks at once, each step compared with the
    same step alone times ranks / cores (its members wait in collectives for peers the OS is not running).
    1 when the ranks do not outnumber the cores, or two groups of two do not fit."""
    world = eng.world_size
    cores = os.cpu_count() or 1
    heads = int(eng.model_info.heads)
    if world <= cores or world % 2 or world < 4 or heads % 2:
        return 1.0
    shape = max(shapes, key=lambda s: facts.tokens(*s))
    alone = samples.get(_Key.of("denoise", facts.tokens(*shape), LayoutSpec(2, 1)))
    if not alone:
        return 1.0
    policy.spread = 2
    try:
        requests = [
            _request(shape, max(8, 2 * steps), 1000 + k, "profile collectives") for k in range(world // 2)
        ]
        handles = [eng.submit(r) for r in requests]
        timelines = [hd.result(timeout=timeout_s).timeline for hd in handles]
    finally:
        policy.spread = 0
    # the steps that ran while every rank was busy: all but the first and last of each request
    together = [
        (s.end_ns - s.start_ns) / 1e9
        for tl in timelines
        for s in [x for x in tl if x.kind == "denoise"][1:-1]
    ]
    if not together:
        return 1.0
    eff = statistics.median(alone) * (world / cores) / statistics.median(together)
    return float(min(1.2, max(0.2, eff)))


# NOTE [profile requests]
# What the fit needs and no more. Each layout is one request of 1 + steps x repeats steps whose first step (the
# layout's first forward) is not counted: its steps give the step time, and the encode and decode it needs anyway
# give theirs. A decode costs more than all the steps of a tiny model's request together, so requests are few,
# and the decode of a degree is taken from every request that ends on a group of that degree (each layout of the
# degree, its migration requests and, at degree 1, every member of a batch). Before a shape is measured, one
# warm-up request per degree (WARMUP_STEPS steps, not counted) runs the first encode, forward and decode of that
# shape and group size. A migration is measured by ``repeats`` requests per degree, each a step on rank 0 and one
# on the group (a request that goes back to rank 0 and then to the group again migrates only once: the members
# keep what they hold). A batch size is one batch of 1 + steps x repeats steps, its first step not counted. No
# request has one step: a one-step schedule is degenerate for a sampler that stretches its sigmas to a terminal
# value (Qwen-Image's flow-matching Euler divides by zero there), so it measures nothing that is served.
WARMUP_STEPS = 2


def measure(
    model: str,
    world_size: int,
    shapes: list[tuple[int, int, int]] | None = None,
    steps: int = 2,
    repeats: int = 2,
    pings: int = 50,
    timeout_s: float = 120.0,
    log: Any = None,
    batches: Sequence[int] = (2, 4),
    *,
    model_path: str | None = None,
    device: Any = None,
    progress: Callable[[int, int], None] | None = None,
    caches: Sequence[str] = (),
    cache_thresholds: Sequence[float] = (0.04, 0.08, 0.12, 0.2),
    cache_steps: int = 30,
) -> Any:
    """Measures every stage of ``model`` on this machine at ``world_size`` ranks, and the step of each batch size
    in ``batches`` (at degree 1); returns the profile (a ``gfdit.planning.cost.Profile``: ``cost.write_profile``
    writes the file ``gfdit profile`` writes). ``model_path`` and ``device`` are the engine's
    (``gfdit.Engine``); ``progress(done, total)`` is called after each measured request or batch (NOTE
    [profile requests]). ``caches``: the step caches to measure ("fbcache", "teacache") at ``cache_thresholds``
    with requests of ``cache_steps`` steps (the module's docstring)."""
    for kind in caches:
        if kind not in ("fbcache", "teacache"):
            raise InvalidUsage(f"--caches: {kind!r} is not a step cache (fbcache, teacache)")
    if caches and (cache_steps <= CACHE_WARMUP + 1 or not all(t > 0 for t in cache_thresholds)):
        raise InvalidUsage(
            f"--cache-steps must be more than {CACHE_WARMUP + 1} and --cache-thresholds positive numbers"
        )
    if world_size < 1:
        raise InvalidUsage(f"--world-size must be positive, got {world_size}")
    if steps < 1 or repeats < 1:
        raise InvalidUsage("--steps and --repeats must be positive")
    if any(b < 2 for b in batches):
        raise InvalidUsage(
            f"--batches must be integers >= 2 (batch 1 is always measured), got {list(batches)}"
        )
    batches = sorted(set(batches))
    facts = _ModelFacts(model)
    shapes = shapes or facts.default_shapes()
    for h, w, f in shapes:
        try:
            facts.check(h, w, f)
        except InvalidUsage as e:
            raise InvalidUsage(f"--shapes: {h}x{w}x{f}: {e}") from None
    policy = PinnedPolicy.make()
    samples: dict[_Key, list[float]] = {}
    measured = 1 + steps * repeats  # NOTE [profile requests]: the first step is not counted
    one = LayoutSpec(1, 1)
    t0 = time.perf_counter()

    def add(key: _Key, s: Any) -> None:
        samples.setdefault(key, []).append((s.end_ns - s.start_ns) / 1e9)

    def add_decodes(timeline: list[Any], tokens: int) -> None:
        # a decode's key is its degree alone (NOTE [parallel decode] in src/runtime/control.cpp)
        for s in timeline:
            if s.kind == "decode":
                add(_Key("decode", tokens, len(s.ranks)), s)

    with Engine(
        model=model,
        model_path=model_path,
        world_size=world_size,
        policy=policy,
        cost_model=False,
        device=device,
    ) as eng:
        heads = int(eng.model_info.heads)
        guidance = float(eng.model_info.defaults.guidance_scale) > 1.0
        layouts = layouts_for(world_size, heads, guidance)
        warmups = list({lay.degree: lay for lay in reversed(layouts)}.values())  # one layout per degree
        migrations = [
            lay for lay in layouts if lay.degree > 1 and lay.ring == 1 and lay.mode == "usp" and lay.cfg == 1
        ]
        total = len(shapes) * (len(warmups) + len(layouts) + repeats * len(migrations) + len(batches)) + 1
        total += 1 if caches else 0
        done = 0

        def tick() -> None:
            nonlocal done
            done += 1
            if progress:
                progress(done, total)

        if log:
            log(
                f"engine up in {time.perf_counter() - t0:.1f} s; {len(shapes)} shapes x {len(layouts)} layouts "
                f"({', '.join(map(str, layouts))}), {repeats} repeats of {steps} steps"
                + (f"; batches {', '.join(map(str, batches))} on one rank" if batches else "")
            )
        seed = 0
        for shape in shapes:
            tokens = facts.tokens(*shape)
            for lay in warmups:
                seed += 1
                _run(
                    eng, policy, [Phase(tuple(range(lay.degree)), lay, WARMUP_STEPS)], shape, seed, timeout_s
                )
                tick()
            for lay in layouts:
                seed += 1
                timeline = _run(
                    eng, policy, [Phase(tuple(range(lay.degree)), lay, measured)], shape, seed, timeout_s
                )
                for s in timeline:
                    if s.kind == "encode":
                        add(_Key.of("encode", tokens, lay), s)
                    elif s.kind == "denoise" and s.step_begin > 0:
                        add(_Key.of("denoise", tokens, lay), s)
                add_decodes(timeline, tokens)
                tick()
            for lay in migrations:  # one layout per degree: the state it moves does not depend on the layout
                for _ in range(repeats):
                    seed += 1
                    plan = [Phase((0,), one, 1), Phase(tuple(range(lay.degree)), lay, 1)]
                    timeline = _run(eng, policy, plan, shape, seed, timeout_s)
                    for s in timeline:
                        if s.kind == "migrate":
                            add(_Key.of("migrate", tokens, lay, num_new=len(s.ranks) - 1), s)
                    add_decodes(timeline, tokens)
                    tick()
            for b in batches:
                seed += b
                key = _Key.of("denoise", tokens, one, batch=b)
                stepped, timelines = _run_batch(eng, policy, b, shape, measured, seed, timeout_s)
                for s in stepped[1:]:
                    add(key, s)
                for timeline in timelines:
                    add_decodes(timeline, tokens)
                if key not in samples:  # the control plane ran them apart: a bug, not a measurement
                    raise RuntimeError(f"gfdit profile: {b} requests of {shape} never stepped as one batch")
                tick()
            if log:
                log(
                    f"  {shape[0]}x{shape[1]}x{shape[2]} ({tokens} tokens) done at {time.perf_counter() - t0:.1f} s"
                )
        curves: list[Any] = []
        ratios: dict[str, float] = {}
        if caches:
            curves, ratios = _measure_caches(
                eng, policy, caches, cache_thresholds, shapes[0], cache_steps, timeout_s, model
            )
            tick()
            if log:
                for c in curves:
                    kind = rt.cache_kind_name(c.kind)
                    pts = ", ".join(f"{t:g}: {p:.2f}" for t, p in c.points)
                    log(f"  {kind}: skip {pts}; cached step {ratios[kind]:.3f} of a full one")
        collective = _collective_efficiency(eng, policy, facts, shapes, samples, steps, timeout_s)
        if log:
            log(f"  collective efficiency {collective:.3f} at {time.perf_counter() - t0:.1f} s")
        ping = eng.ping(0, pings)
        tick()
        devices = worker_devices(device, world_size)
    prof = cost.Profile()
    prof.model = model
    prof.hardware = "cpu" if devices[0] is None else "cuda"
    prof.world_size = world_size
    prof.num_cores = os.cpu_count() or 1
    prof.dispatch_s = statistics.median([(start - disp) / 1e9 for disp, start, _, _ in ping])
    prof.completion_s = statistics.median([(seen - post) / 1e9 for _, _, post, seen in ping])
    prof.collective_efficiency = collective
    prof.entries = [
        cost.ProfileEntry(
            **{**k._asdict(), "stage": cost.STAGES[k.stage]},
            guidance=guidance,
            seconds=statistics.median(v),
            samples=len(v),
        )
        for k, v in sorted(samples.items(), key=lambda kv: (int(cost.STAGES[kv[0].stage]), *kv[0][1:]))
    ]
    prof.skip_curves = curves
    prof.fbcache_step_ratio = ratios.get("fbcache", 0.0)
    prof.teacache_step_ratio = ratios.get("teacache", 0.0)
    return prof


def format_table(profile: Any) -> str:
    """The entries of a profile (a ``gfdit.planning.cost.Profile``) as a table a person can read."""
    head = (
        f"{'stage':<8} {'tokens':>7} {'degree':>6} {'layout':<17} {'new':>3} {'batch':>5} {'ms':>9} {'n':>3}"
    )
    title = (
        f"{profile.model} on {profile.hardware}: world {profile.world_size}, {profile.num_cores} cores; "
        f"dispatch {profile.dispatch_s * 1e6:.1f} us, completion {profile.completion_s * 1e6:.1f} us"
    )
    lines = [title, head, "-" * len(head)]
    for e in profile.entries:
        layout = layout_name(cost.layout_mode_name(e.mode), e.ulysses, e.ring, e.cfg)
        lines.append(
            f"{cost.stage_name(e.stage):<8} {e.tokens:>7} {e.degree:>6} {layout:<17} {e.num_new:>3} {e.batch:>5} "
            f"{e.seconds * 1e3:>9.3f} {e.samples:>3}"
        )
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """Arguments of ``gfdit profile``."""
    parser.add_argument("--model", help="model to measure (tiny-wan, tiny-qwen-image)")
    parser.add_argument("--world-size", type=int, help="ranks (worker processes)")
    parser.add_argument("--out", help="profile file to write (JSON)")
    parser.add_argument("--path", help="local diffusers folder of the model (as gfdit serve --path)")
    parser.add_argument(
        "--collectives",
        action="store_true",
        help="instead: time the CUDA copy paths (sm, tma, ce) of the collectives on this GPU, 4 KiB to 256 MiB, and "
        "print the copy table for GFDIT_CUDA_COPY_TABLE (with --out, also as JSON)",
    )
    parser.add_argument("--device", type=int, default=0, help="--collectives: the CUDA device (default 0)")
    parser.add_argument(
        "--network",
        action="store_true",
        help="instead: run as one rank of a world that spans nodes (torchrun's RANK, WORLD_SIZE, MASTER_ADDR, "
        "MASTER_PORT) and measure the links between the nodes and each layout of --model across them "
        "(gfdit.tools.profile_network); rank 0 writes --out, a profile whose links calibrate the cost model",
    )
    parser.add_argument("--links-only", action="store_true", help="--network: the links alone, no layouts")
    parser.add_argument(
        "--min-seconds",
        type=float,
        default=0.0,
        help="--network: per shape, run more rounds of the layouts than --repeats (up to 10 x) while they fit in "
        "this many seconds (default 0: --repeats rounds)",
    )
    parser.add_argument(
        "--line-gbit",
        type=float,
        default=0.0,
        help="--network: the nominal rate of each node's link per direction, Gbit/s (a NIC's datasheet rate; "
        "kept in the profile so that it can also scale another cluster's inter-node terms; default: unknown)",
    )
    parser.add_argument(
        "--shapes",
        help="HxWxF,... to measure (default: an image model's default size up to the largest its limits allow, "
        "3 sizes; a video model's images and short videos up to ~4x the default's tokens)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=2,
        help="measured denoising steps per repeat (default 2): each shape and layout measures steps x repeats",
    )
    parser.add_argument(
        "--repeats", type=int, default=2, help="repeats of --steps, and migrations per degree (default 2)"
    )
    parser.add_argument(
        "--batches",
        default="2,4",
        help="batch sizes whose step to measure on one rank, B,B,... (default 2,4; empty: none, and the profile "
        "prices no batch)",
    )
    parser.add_argument(
        "--caches",
        default="",
        help="step caches to measure, fbcache,teacache (default: none): their skip curves and cached step times",
    )
    parser.add_argument(
        "--cache-thresholds",
        default="0.04,0.08,0.12,0.2",
        help="the thresholds each of --caches is measured at (default 0.04,0.08,0.12,0.2)",
    )
    parser.add_argument(
        "--cache-steps", type=int, default=30, help="steps of each --caches request (default 30)"
    )


def profile_collectives(device: int = 0) -> dict:
    """The CUDA copy paths timed on ``device`` (gfdit._C.measure_copy_table): per size the microseconds of each
    path and the fastest, and the table that picks it (GFDIT_CUDA_COPY_TABLE's format)."""
    from gfdit import _C

    if not hasattr(_C, "measure_copy_table"):
        raise InvalidUsage("gfdit profile --collectives: this build has no CUDA transport")
    try:
        return dict(_C.measure_copy_table(int(device)))
    except _C.Error as e:
        raise InvalidUsage(
            f"gfdit profile --collectives: no CUDA device to measure on ({e.message})"
        ) from None


def run(args: argparse.Namespace, command: str) -> int:
    """Runs ``gfdit profile``; 2 for bad input (message on stderr)."""
    if args.collectives:
        try:
            table = profile_collectives(args.device)
        except InvalidUsage as e:
            print(f"gfdit {command}: {e.message}", file=sys.stderr)
            return 2
        print(json.dumps(table, indent=1, default=str))
        print(f"export GFDIT_CUDA_COPY_TABLE={table.get('table', '')}")
        if args.out:
            with open(args.out, "w", encoding="utf-8") as f:
                json.dump(table, f, indent=1, default=str)
                f.write("\n")
        return 0
    if args.network:
        return _run_network(args, command)
    missing = [n for n in ("model", "world_size", "out") if getattr(args, n) is None]
    if missing:
        print(
            f"gfdit {command}: --{', --'.join(m.replace('_', '-') for m in missing)} required (or --collectives)",
            file=sys.stderr,
        )
        return 2
    try:
        shapes = parse_shapes(args.shapes) if args.shapes else None
        batches = parse_batches(args.batches)
        caches = [c.strip() for c in args.caches.split(",") if c.strip()]
        try:
            thresholds = [float(t) for t in args.cache_thresholds.split(",") if t.strip()]
        except ValueError:
            raise InvalidUsage(
                f"--cache-thresholds: {args.cache_thresholds!r} is not a list of numbers"
            ) from None
        profile = measure(
            args.model,
            args.world_size,
            shapes,
            steps=args.steps,
            repeats=args.repeats,
            log=lambda s: print(s, flush=True),
            batches=batches,
            model_path=args.path,
            caches=caches,
            cache_thresholds=thresholds,
            cache_steps=args.cache_steps,
        )
    except InvalidUsage as e:
        print(f"gfdit {command}: {e.message}", file=sys.stderr)
        return 2
    cost.write_profile(args.out, profile)
    print(format_table(profile))
    print(f"wrote {args.out} ({len(profile.entries)} entries)")
    return 0


def _run_network(args: argparse.Namespace, command: str) -> int:
    """``gfdit profile --network`` on one rank (gfdit.tools.profile_network); 2 for bad input."""
    from gfdit.tools import profile_network

    missing = [n for n in ("model", "out") if getattr(args, n) is None]
    if missing:
        print(f"gfdit {command} --network: --{', --'.join(missing)} required", file=sys.stderr)
        return 2
    if not args.line_gbit >= 0:
        print(f"gfdit {command} --network: --line-gbit must be >= 0, got {args.line_gbit}", file=sys.stderr)
        return 2
    try:
        shapes = parse_shapes(args.shapes) if args.shapes else None
        got = profile_network.measure(
            args.model,
            shapes,
            repeats=args.repeats,
            log=lambda s: print(s, flush=True),
            links_only=args.links_only,
            line_bytes_per_s=args.line_gbit * 1e9 / 8,
            min_seconds=args.min_seconds,
        )
    except InvalidUsage as e:
        print(f"gfdit {command}: {e.message}", file=sys.stderr)
        return 2
    if got is None:  # not rank 0
        return 0
    prof, records = got
    cost.write_profile(args.out, prof, {"layouts": records} if records else None)
    print(profile_network.format_tables(prof, records))
    print(f"wrote {args.out} ({len(prof.links)} links, {len(records)} layout measurements)")
    return 0
