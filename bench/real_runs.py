"""Real runs on this machine's CPUs for the experiments report (``experiments.py``'s ``real_section``).

A profile of tiny-wan measured here (``gfdit profile``, kept beside the report and reused while its options
match), traces built from it (arrivals, sizes, deadlines), and replays on real engines with the profiled
cost model: one engine per (world size, policy), all of a world size alive at once, so that the repeats of
every policy interleave and a slow spell of the machine does not land on one policy only.

Per-request timelines (``Replay.intervals``) give what each policy did: how many ranks each step ran on,
by request class, the steps of a large request that ran on one rank while another rank stayed idle, and
each class's mean latency and wait before its first task.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from gfdit._C import Error as GfditError
from gfdit.planning import cost, simulate, trace, workload
from gfdit.planning.trace import TraceRequest
from gfdit.tools import profile as gprofile
from gfdit.tools import replay as run_trace

MODEL = "tiny-wan"
PROFILE_WORLD = 4
PROFILE_STEPS = 3
PROFILE_REPEATS = 2
# (height, width, frames, steps) of each request class
IMAGE = (32, 32, 1, 4)  # a small image: a step is dominated by its collectives on two ranks
VIDEO = (64, 64, 9, 8)  # the reference mixed trace's video
LARGE_CANDIDATES = ((128, 128, 9), (256, 256, 9))  # sizes that may gain from two ranks
LARGE_STEPS = 40
SUMMARY = trace.SUMMARY_KEYS[2:]  # the figures, without policy and count


@dataclasses.dataclass(frozen=True)
class RealTrace:
    """A trace to replay at some world sizes, with its request classes (name -> shape) for diagnostics."""

    name: str
    requests: tuple[TraceRequest, ...]
    classes: tuple[tuple[str, tuple[int, int, int, int]], ...]
    rate_rps: float
    load: float  # rate over the capacity of the smallest world it runs at (see capacity_rps)
    worlds: tuple[int, ...]

    def class_of(self, r: TraceRequest) -> str:
        shape = (r.height, r.width, r.num_frames, r.num_inference_steps)
        return next(name for name, s in self.classes if s == shape)


# ------------------------------------------------------------------------------------------------ profile
def profile_shapes() -> list[tuple[int, int, int]]:
    return list(dict.fromkeys([IMAGE[:3], VIDEO[:3], *LARGE_CANDIDATES]))


def profile_options() -> dict[str, Any]:
    return {
        "model": MODEL,
        "world_size": PROFILE_WORLD,
        "shapes": [list(s) for s in profile_shapes()],
        "steps": PROFILE_STEPS,
        "repeats": PROFILE_REPEATS,
        "decode": "over each measured group",  # gfdit profile measures the decode at every degree
    }


def get_profile(path: str, log: Callable[[str], None] = print) -> tuple[cost.Profile, bool, float]:
    """(profile, reused, seconds measuring): the profile at ``path`` when it was measured with this
    module's options (its "measured_with"), else a new one measured now (``gfdit profile``'s ``measure``) and
    written there."""
    opts = profile_options()
    if os.path.exists(path):
        try:
            with open(path, encoding="utf-8") as f:
                measured_with = json.load(f).get("measured_with")  # ours, beside the profile's fields
            if measured_with == opts:
                old = cost.load_profile(path)  # still a valid profile
                log(f"real: reusing the profile {path} (same options)")
                return old, True, 0.0
        except (OSError, ValueError, AttributeError, GfditError):
            pass
    log(f"real: profiling {MODEL} at world {PROFILE_WORLD} ({len(opts['shapes'])} shapes)")
    t0 = time.perf_counter()
    prof = gprofile.measure(
        MODEL,
        PROFILE_WORLD,
        profile_shapes(),
        steps=PROFILE_STEPS,
        repeats=PROFILE_REPEATS,
        log=lambda s: log(f"  {s}"),
    )
    took = time.perf_counter() - t0
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    cost.write_profile(path, prof, extra={"measured_with": opts})
    return prof, False, took


def step_table(prof: cost.Profile) -> list[dict[str, Any]]:
    """Per profiled size: a step on one rank, the fastest two-rank layout's, and their ratio (> 1: two ranks
    are faster), with the decode on one and on two ranks and the size's tokens."""
    return _step_rows(prof, profile_shapes())


def _step_rows(prof: cost.Profile, shapes: Sequence[tuple[int, int, int]]) -> list[dict[str, Any]]:
    facts = gprofile._ModelFacts(MODEL)
    entries = list(prof.entries)
    rows = []
    for h, w, f in shapes:
        tokens = facts.tokens(h, w, f)
        steps = [e for e in entries if e.stage == cost.Stage.DENOISE and e.tokens == tokens]
        one = next((e.seconds for e in steps if e.degree == 1), None)
        two = [e for e in steps if e.degree == 2]
        best2 = min(two, key=lambda e: e.seconds) if two else None
        decodes = {
            e.degree: e.seconds for e in entries if e.stage == cost.Stage.DECODE and e.tokens == tokens
        }
        rows.append(
            {
                "shape": [h, w, f],
                "tokens": tokens,
                "step1_s": one,
                "step2_s": best2.seconds if best2 else None,
                "step2_layout": (
                    f"{cost.layout_mode_name(best2.mode)} {best2.ulysses}x{best2.ring}"
                    + (" cfg2" if best2.cfg == 2 else "")
                    if best2
                    else None
                ),
                "gain": one / best2.seconds if one and best2 else None,
                "decode_s": decodes.get(1),
                "decode2_s": decodes.get(2),
            }
        )
    return rows


def pick_large(prof: cost.Profile) -> tuple[tuple[int, int, int, int], dict[str, Any]]:
    """The large class of the target trace: the candidate size whose step gains most from two ranks (by
    the profile), at LARGE_STEPS steps."""
    rows = {tuple(r["shape"]): r for r in step_table(prof)}
    best = max(LARGE_CANDIDATES, key=lambda s: rows[s]["gain"] or 0.0)
    return (*best, LARGE_STEPS), rows[best]


# ------------------------------------------------------------------------------------------------ traces
def pricer_for(prof_path: str, world: int) -> workload.Pricer:
    """Alone latencies on ``world`` ranks of this machine, from the profile (degrees up to ``world``)."""
    prof = cost.load_profile(prof_path)
    prof.world_size = min(int(prof.world_size), world)
    return workload.Pricer("cpu", prof)


def capacity_rps(
    pricer: workload.Pricer, classes: Sequence[tuple[tuple[int, int, int, int], float]]
) -> float:
    """Requests/s the pricer's ranks complete, each request at its most rank-efficient static degree."""
    rank_s = sum(share * pricer.rank_seconds(MODEL, *shape) for shape, share in classes)
    return float(pricer.cluster.num_ranks) / rank_s


def make_trace(
    name: str,
    classes: Sequence[tuple[str, tuple[int, int, int, int], float]],
    n: int,
    rate: float,
    pricer: workload.Pricer,
    load: float,
    worlds: tuple[int, ...],
    seed: int,
    slo_scale: float,
) -> RealTrace:
    """``n`` requests with Poisson arrivals at ``rate``, each of a class drawn by its share; deadlines
    ``slo_scale`` x the request's alone latency at its best static degree (as gfdit.planning.workload sets them)."""
    rng = np.random.Generator(np.random.PCG64(seed))
    gaps = rng.exponential(1.0 / rate, n)
    times = np.cumsum(gaps) - gaps[0]  # the first request at t = 0
    shares = np.array([c[2] for c in classes])
    picks = rng.choice(len(classes), size=n, p=shares / shares.sum())
    reqs = []
    for i, (t, k) in enumerate(zip(times, picks)):
        _, shape, _ = classes[int(k)]
        budget = pricer.alone_latency(MODEL, *shape)
        reqs.append(
            TraceRequest(i, round(float(t), 4), MODEL, *shape, deadline_s=float(t) + slo_scale * budget)
        )
    return RealTrace(
        name=name,
        requests=tuple(reqs),
        classes=tuple((c[0], c[1]) for c in classes),
        rate_rps=rate,
        load=load,
        worlds=worlds,
    )


# ------------------------------------------------------------------------------------------------ runs
def diagnose(trace: RealTrace, replay: simulate.Replay) -> dict[str, Any]:
    """What the policy did, from the timeline: per request class, the share of steps on more than one rank,
    the mean ranks per step, the steps that ran on one rank while another rank stayed idle the whole step,
    the mean latency and the mean wait from arrival to the first task; migrations."""
    cls = {r.id: trace.class_of(r) for r in trace.requests}
    tasks: dict[tuple[int, str, float, float], list[int]] = {}
    for iv in replay.intervals:
        tasks.setdefault((iv.request_id, iv.kind, iv.start_s, iv.end_s), []).append(iv.rank)
    busy: dict[int, list[tuple[float, float]]] = {}
    first: dict[int, float] = {}
    for iv in replay.intervals:
        busy.setdefault(iv.rank, []).append((iv.start_s, iv.end_s))
        first[iv.request_id] = min(first.get(iv.request_id, iv.start_s), iv.start_s)
    out: dict[str, Any] = {}
    for name, _ in trace.classes:
        steps = [(k, ranks) for k, ranks in tasks.items() if k[1] == "denoise" and cls.get(k[0]) == name]
        if not steps:
            continue
        alone = 0
        for (rid, _, s, e), ranks in steps:
            if len(ranks) > 1:
                continue
            for rank, spans in busy.items():
                if rank not in ranks and not any(a < e and b > s for a, b in spans):
                    alone += 1  # another rank idle for this whole step
                    break
        done = [o for o in replay.outcomes if o.completed and cls.get(o.id) == name]
        waits = [first[o.id] - o.arrival_s for o in done if o.id in first]
        out[name] = {
            "steps": len(steps),
            "spread_share": sum(len(r) > 1 for _, r in steps) / len(steps),
            "mean_ranks": sum(len(r) for _, r in steps) / len(steps),
            "one_rank_while_another_idle": alone,
            "mean_latency_s": statistics.mean(o.latency_s for o in done) if done else None,
            "mean_wait_s": statistics.mean(waits) if waits else None,  # arrival to its first task
        }
    out["migrations"] = sum(1 for k in tasks if k[1] == "migrate")
    return out


def run_world(
    traces: Sequence[RealTrace],
    world: int,
    policies: Sequence[str],
    prof_path: str,
    repeats: int,
    log: Callable[[str], None] = print,
    timeout_s: float = 300.0,
) -> dict[str, Any]:
    """Every trace that runs at ``world`` under every policy, ``repeats`` times, on one engine per policy
    (all alive at once; the policies take turns within each repeat). Returns
    {trace name: {policy: {"runs": [summary + diagnostics per repeat], "error": ...}}}."""
    import gfdit

    out: dict[str, Any] = {t.name: {p: {"runs": []} for p in policies} for t in traces if world in t.worlds}
    todo = [t for t in traces if world in t.worlds]
    if not todo:
        return out
    cm, _ = run_trace.engine_cost_model(MODEL, world, prof_path)
    engines: dict[str, Any] = {}
    try:
        for p in policies:
            t0 = time.perf_counter()
            try:
                engines[p] = gfdit.Engine(model=MODEL, world_size=world, policy=p, cost_model=cm)
            except (GfditError, RuntimeError) as e:
                for t in todo:
                    out[t.name][p]["error"] = (
                        f"engine did not start: {e.message if isinstance(e, GfditError) else e}"
                    )
                log(f"real: world {world}: {p}: engine did not start: {e}")
                continue
            log(f"real: world {world}: {p} engine up in {time.perf_counter() - t0:.1f} s")
        for rep in range(repeats):
            for t in todo:
                order = list(engines)
                order = order[rep % len(order) :] + order[: rep % len(order)] if order else order
                for p in order:
                    cell = out[t.name][p]
                    if "error" in cell:
                        continue
                    try:
                        replay = run_trace.replay_on_engine(engines[p], list(t.requests), timeout_s=timeout_s)
                    except (GfditError, RuntimeError, TimeoutError) as e:
                        cell["error"] = e.message if isinstance(e, GfditError) else str(e)
                        log(f"real: {t.name} world {world} {p}: failed: {cell['error']}")
                        continue
                    s = replay.summary()
                    s["completed"] = sum(o.completed for o in replay.outcomes)
                    s["wall_s"] = replay.wall_s
                    s["diagnostics"] = diagnose(t, replay)
                    s["_replay"] = replay
                    cell["runs"].append(s)
                    lat = s["mean_latency_s"]
                    log(
                        f"real: {t.name} world {world} {p:<9} repeat {rep + 1}: mean "
                        f"{1e3 * lat:.0f} ms, {s['completed']}/{len(t.requests)} done, {replay.wall_s:.1f} s"
                        if lat is not None
                        else f"real: {t.name} world {world} {p} repeat {rep + 1}: nothing completed"
                    )
    finally:
        for eng in engines.values():
            eng.shutdown()
    return out


def median_summary(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Each metric's median over the repeats; the mean latency's spread (min, max); the repeat whose mean
    latency is the median (its diagnostics and timeline stand for the cell)."""
    done = [r for r in runs if r.get("mean_latency_s") is not None]
    out: dict[str, Any] = {"repeats": len(runs)}
    for k in SUMMARY:
        vals = [r[k] for r in runs if r.get(k) is not None]
        out[k] = statistics.median(vals) if vals else None
    out["completed"] = min((r["completed"] for r in runs), default=0)
    lats = sorted(r["mean_latency_s"] for r in done)
    out["mean_latency_spread_s"] = [lats[0], lats[-1]] if lats else None
    if done:
        mid = sorted(done, key=lambda r: r["mean_latency_s"])[(len(done) - 1) // 2]
        out["diagnostics"] = mid["diagnostics"]
        out["_replay"] = mid["_replay"]
    return out


def two_rank_step_at(
    world: int, shape: tuple[int, int, int], log: Callable[[str], None] = print
) -> dict[str, Any]:
    """A short profile of one size at ``world`` ranks (degrees 1 and 2 where the world allows): the step
    times a world of this size sees, to hold the profile of PROFILE_WORLD ranks against."""
    prof = gprofile.measure(MODEL, world, [shape], steps=PROFILE_STEPS, repeats=PROFILE_REPEATS)
    rows = {tuple(r["shape"]): r for r in _step_rows(prof, [shape])}
    log(f"real: {'x'.join(map(str, shape))} at world {world}: {rows[shape]}")
    return rows[shape]
