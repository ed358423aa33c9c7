#!/usr/bin/env python3
"""Scheduling experiments in simulation (what `make experiments` runs): dynamic policies against static
degrees on a simulated H20 cluster, from light load to overload.

Writes bench/results/experiments.md (method, tables, the headline ratios against their targets),
bench/results/experiments.json (every number) and the figures under bench/results/experiments/.

Sections, each one function that returns a ``Section`` (``SECTIONS`` lists them in report order):

- ``main_section``: Qwen-Image images and Wan 2.2 videos on h20x8, Poisson and bursty arrivals, 8 loads,
  policies static:1/2/4/8 and the built-in dynamic ones; throughput at SLO and dynamic/static ratios.
- ``regroup_section``: the same sweeps with the group-formation cost of NCCL, of GF-DiT's collectives and
  gfdit's own.
- ``layout_section``: long Wan 2.2 videos (720p x 121 frames) on h20x16 under the layout variants of the
  dynamic policies (``POLICY:layout=usp|swift|torus|auto``); with ``--links PROFILE`` the cluster's inter-node
  terms are scaled by the links the profile measured (NOTE [inter-node calibration] in src/runtime/cost.cpp), and
  the section says what that changed.
- ``priority_section``: one long video and a stream of short images with priority 1, with and without
  step-boundary preemption.
- ``caching_section``: image-steady and mixed-steady with every request using cache-dit's published FBCache
  setting on every policy, against the same traces without it; the skip rates are the cost model's curve (Qwen-Image:
  NOTE [published skip rates]; Wan: the curve measured on the deep tiny Wan, a stand-in, as the report says).
- ``real_section``: tiny-wan on this machine's CPUs (``bench/real_runs.py``): a profile measured here, then
  mixed image/video traces at two rates on 2 and 4 ranks and a trace of small images and larger requests on
  2 ranks, replayed on real engines under every policy that fits (about 15 minutes; ``--skip-real`` leaves
  it out).

Sections left out of a run (``--skip-real``, ``--only``) keep what the previous report in the output
directory says of them.

Policies and simulator options are looked up by name in the runtime when the experiments run: one that this
build lacks is skipped with a printed note (also in the report), so new policies join the tables as soon as
they are built in.

    python bench/experiments.py [--quick] [--skip-real] [--only KEY,...] [--links PROFILE] [--out-dir bench/results]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from gfdit._C import Error as GfditError
from gfdit._C import runtime as rt
from gfdit.planning import simulate, workload
from gfdit.planning.trace import Outcome, TraceRequest, summarize

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = 1
SLO_SCALE = 3.0  # deadline = arrival + 3 x the alone latency at the best static degree
SLO_TARGET = 0.9  # throughput at SLO: the highest rate at which >= 90% of requests meet their deadline
LOADS = (0.05, 0.1, 0.2, 0.35, 0.5, 0.7, 0.9, 1.1)  # arrival rate / the cluster's capacity
BISECT_STEPS = 4  # refinements of the throughput at SLO between two grid loads
# fixed groups of D ranks served in fcfs, srtf and edf order (the GF-DiT artifact's srtf_sp lanes); "best static"
# is the best of all of them at each load
STATIC = tuple(f"static:{d}{o}" for d in (1, 2, 4, 8) for o in ("", ":srtf", ":edf"))
DYNAMIC = ("fcfs", "srtf", "edf", "priority")
LAYOUTS = ("usp", "swift", "torus", "auto")
REGROUP_COSTS = (  # (name, seconds or None for the cluster's own)
    ("NCCL new_group (0.778 s)", 0.778),
    ("GF-DiT collectives (60 us)", 60e-6),
    ("gfdit (cluster default, ~1 us)", None),
)
TITLES = {  # of each section, by key (a section left out of a run is found by its title in the last report)
    "main": "Images and videos on h20x8",
    "headline": "Headline: best dynamic vs best static, against the targets",
    "regroup": "(a) Sensitivity to the cost of forming a group",
    "layouts": "(b) Layouts for long videos on h20x16",
    "priority": "(c) Mixed priority: one long video and a stream of images",
    "real": "(d) Real CPU runs: tiny-wan on this machine",
    "batching": "(e) Batching: small images, with and without batches on both sides",
    "stages": "(f) Stages: few-step video whose decode dominates",
    "caching": "(g) Step caching on every request",
}
# caching_section: cache-dit's published FBCache setting (`cache_dit.generate --cache`: F1B0, threshold 0.12, 8
# warm-up steps, at most 3 cached steps in a row), for which Qwen-Image's skip rate is derived (NOTE [published skip
# rates] in src/runtime/cost.cpp); the scenarios whose model has a skip curve, else the note says why not
CACHE_SPEC = "fbcache:0.12,warmup=8,max_skip=3"
CACHE_SCENARIOS = ("image-steady", "mixed-steady")
CACHE_EXTRA_LOADS = (1.5, 2.0, 3.0, 4.0)  # x the uncached capacity
# A stand-in skip curve for the Wan models, which have no published one: `gfdit profile --caches fbcache` on the
# deep tiny Wan (24 blocks in diffusers' default initialisation, whose first block changes 5-11% a step as trained
# models' do: NOTE [deep tiny models] in gfdit.models.tiny), kept beside the report
CACHE_STANDIN_PROFILE = os.path.join(HERE, "results", "experiments", "deep_tiny_wan_caches.json")
# the links bench/bench_layouts_net.py measured on the emulated 2 x 2 cluster, kept beside the report: section (b)'s
# inter-node terms are scaled by them unless --links names another profile ("" leaves the datasheet's)
MEASURED_LINKS_PROFILE = os.path.join(HERE, "results", "experiments", "measured_links.json")
# Real CPU runs (real_section; see bench/real_runs.py): tiny-wan on this machine.
REAL_WORLDS = (2, 4)
REAL_MIXED_REQUESTS = 24
REAL_MIXED_RATES = (3.0, 12.0)  # requests/s; 3/s is the fidelity benchmark's rate
REAL_VIDEO_SHARE = 0.3
REAL_TARGET_WORLD = 2
REAL_TARGET_REQUESTS = 12
REAL_TARGET_LOAD = 0.5  # x the capacity of REAL_TARGET_WORLD ranks for the target trace
REAL_LARGE_SHARE = 0.3
REAL_REPEATS = 3
REAL_TARGETS = {"target_latency_ratio": 1.25, "never_worse_by": 0.05}
REGROUP_SCENARIOS = ("image-steady", "video-bursty", "mixed-steady")  # the regrouping-cost runs
TARGETS = {
    "throughput_at_slo_ratio": 6.0,
    "mean_latency_reduction": 0.95,
    "slo_violation_reduction": 0.90,
    "edf_slo_where_static_fails": 0.88,
    "static_fails_below": 0.10,
    "never_worse_by": 0.02,
}


@dataclasses.dataclass(frozen=True)
class Scenario:
    """A workload on a cluster: what a sweep replays at each load."""

    name: str
    workload: str
    model: str
    arrival: str
    cluster: str = "h20x8"
    requests: int = 4000  # expected requests per trace, whatever the rate
    shape: tuple[int, int, int, int] | None = None  # every request this (h, w, frames, steps), not the menus
    # a profile of measured links (`gfdit profile --network`) that scales the cluster's inter-node terms (NOTE
    # [inter-node calibration] in src/runtime/cost.cpp); None: the datasheet's terms
    profile: str | None = None


SCENARIOS = (
    Scenario("image-steady", "image", "qwen-image", "poisson"),
    Scenario("image-bursty", "image", "qwen-image", "bursty"),
    Scenario("video-steady", "video", "wan2.2", "poisson", requests=2000),
    Scenario("video-bursty", "video", "wan2.2", "bursty", requests=2000),
    # one-frame images and videos of one model, served together (gfdit.planning.workload's "mixed")
    Scenario("mixed-steady", "mixed", "wan2.2", "poisson", requests=2000),
    Scenario("mixed-bursty", "mixed", "wan2.2", "bursty", requests=2000),
)


# stages_section: Wan 2.2 TI2V-5B at 704x1280x121 with 4 steps (as the distilled variants are served; the model's
# default guidance), where the VAE decode is most of a request's time on one rank
STAGES_SCENARIOS = (
    Scenario("stages-steady", "video", "wan2.2-5b", "poisson", requests=600, shape=(704, 1280, 121, 4)),
    Scenario("stages-bursty", "video", "wan2.2-5b", "bursty", requests=600, shape=(704, 1280, 121, 4)),
)
STAGES_POLICIES = (
    "fcfs:decode=1",
    "fcfs",
    "fcfs:stages=split",
    "fcfs:stages=split=2",
    "static:1",
    "static:8",
)


@dataclasses.dataclass
class Section:
    """One part of the report: its markdown (without the title), numbers and figures."""

    key: str
    title: str
    markdown: str
    data: dict[str, Any]
    figures: list[str] = dataclasses.field(default_factory=list)
    carried: bool = False  # not run this time: the previous report's text and numbers


# ------------------------------------------------------------------------------------------------ runs
class Lab:
    """Runs and caches simulations; remembers what this build lacks (notes for the report)."""

    def __init__(self, out_dir: str, quick: bool, links: str | None = None) -> None:
        self.out_dir = out_dir
        self.links = links  # section (b): a profile of measured links that scales h20x16's inter-node terms
        self.fig_dir = os.path.join(out_dir, "experiments")
        self.quick = quick
        self.notes: list[str] = []
        self._pricers: dict[tuple[str, str | None], workload.Pricer] = {}
        self._capacity: dict[tuple[Any, ...], float] = {}
        self._traces: dict[tuple[Any, ...], list[TraceRequest]] = {}
        self._points: dict[tuple[Any, ...], dict[str, Any]] = {}
        self.num_runs = 0
        self.sim_wall_s = 0.0
        self.real_runs = 0

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)
            print(f"note: {text}", flush=True)

    def pricer(self, cluster: str, profile: str | None = None) -> workload.Pricer:
        if (cluster, profile) not in self._pricers:
            self._pricers[(cluster, profile)] = workload.Pricer(cluster, profile=profile)
        return self._pricers[(cluster, profile)]

    def capacity(self, sc: Scenario) -> float:
        """Requests/s the cluster completes with every rank busy at each request's most efficient degree."""
        key = (sc.workload, sc.model, sc.cluster, sc.shape, sc.profile)
        if key not in self._capacity:
            pricer = self.pricer(sc.cluster, sc.profile)
            if sc.shape is not None:
                cap = pricer.cluster.num_ranks / pricer.rank_seconds(sc.model, *sc.shape)
            else:
                cap = workload.capacity_rps(sc.workload, model=sc.model, pricer=pricer)
            self._capacity[key] = cap
        return self._capacity[key]

    def requests_per_trace(self, sc: Scenario) -> int:
        return max(50, sc.requests // 5) if self.quick else sc.requests

    def trace(self, sc: Scenario, load: float) -> list[TraceRequest]:
        key = (sc, round(load, 9))
        if key not in self._traces:
            rate = load * self.capacity(sc)
            duration = self.requests_per_trace(sc) / rate
            if sc.shape is not None:
                self._traces[key] = fixed_shape_trace(self.pricer(sc.cluster, sc.profile), sc, rate, duration)
                return self._traces[key]
            self._traces[key] = workload.generate(
                sc.workload,
                sc.arrival,
                rate,
                duration,
                SLO_SCALE,
                SEED,
                model=sc.model,
                pricer=self.pricer(sc.cluster, sc.profile),
            )
        return self._traces[key]

    def run(
        self,
        sc: Scenario,
        load: float,
        policy: str,
        sim: dict[str, Any] | None = None,
        requests: list[TraceRequest] | None = None,
        tag: str = "",
        keep_outcomes: bool = False,
    ) -> dict[str, Any]:
        """The summary of one replay (gfdit.planning.trace.summarize's keys plus load, rate and wall time), or
        {"error": ...} when the simulator refuses the combination. ``requests`` replaces the scenario's
        trace (``tag`` then names it in the cache); ``keep_outcomes`` keeps the per-request outcomes under
        "_outcomes" (left out of the JSON)."""
        sim = dict(sim or {})
        key = (sc, round(load, 9), policy, tuple(sorted(sim.items())), tag)
        if key in self._points:
            return self._points[key]
        reqs = requests if requests is not None else self.trace(sc, load)
        t0 = time.perf_counter()
        try:
            if sc.profile is not None:
                sim["profile"] = sc.profile
            replay = simulate.simulate_trace(reqs, model=sc.model, cluster=sc.cluster, policy=policy, **sim)
        except GfditError as e:  # refused, or failed inside the runtime: recorded, the sweep goes on
            point = {"load": load, "rate_rps": load * self.capacity(sc), "error": e.message}
            self.note(f"{sc.name}: {policy} failed at load {load:g}: {e.message}")
        else:
            point = replay.summary()
            point.update(
                load=load,
                rate_rps=load * self.capacity(sc),
                completed=sum(o.completed for o in replay.outcomes),
                wall_s=replay.wall_s,
            )
            if keep_outcomes:
                point["_outcomes"] = replay.outcomes
        self.num_runs += 1
        self.sim_wall_s += time.perf_counter() - t0
        self._points[key] = point
        return point


def ok(point: dict[str, Any]) -> bool:
    return "error" not in point and point.get("slo_attainment") is not None


def throughput_at_slo(
    lab: Lab, sc: Scenario, policy: str, loads: Sequence[float], sim: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The highest load (and rate) below the first grid load at which fewer than SLO_TARGET of the requests
    meet their deadline, refined by bisection between the last passing grid load (0 when the lowest fails:
    ``below_grid``) and the first failing one. ``above_grid``: no grid load fails (the result is the top
    load, a lower bound)."""

    def passes(load: float) -> bool:
        p = lab.run(sc, load, policy, sim)
        return ok(p) and p["slo_attainment"] >= SLO_TARGET

    passed = [passes(x) for x in loads]
    cap = lab.capacity(sc)
    if all(passed):
        return {"load": loads[-1], "rate_rps": loads[-1] * cap, "below_grid": False, "above_grid": True}
    first_fail = passed.index(False)
    lo, hi = (loads[first_fail - 1] if first_fail > 0 else 0.0), loads[first_fail]
    for _ in range(BISECT_STEPS if first_fail > 0 else BISECT_STEPS + 2):
        mid = 0.5 * (lo + hi)
        if passes(mid):
            lo = mid
        else:
            hi = mid
    return {"load": lo, "rate_rps": lo * cap, "below_grid": first_fail == 0, "above_grid": False}


def sweep(
    lab: Lab, sc: Scenario, policies: Sequence[str], loads: Sequence[float], sim: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Every policy at every load, and each policy's throughput at SLO."""
    out: dict[str, Any] = {"points": {}, "throughput_at_slo": {}}
    for policy in policies:
        t0 = time.perf_counter()
        out["points"][policy] = [lab.run(sc, x, policy, sim) for x in loads]
        out["throughput_at_slo"][policy] = throughput_at_slo(lab, sc, policy, loads, sim)
        tas = out["throughput_at_slo"][policy]
        print(
            f"  {sc.name:<14} {policy:<22} throughput at SLO {tas['load']:.3f} x capacity "
            f"({time.perf_counter() - t0:.1f} s)",
            flush=True,
        )
    return out


# ------------------------------------------------------------------------------------------------ comparisons
def _best(points: dict[str, list[dict[str, Any]]], names: Sequence[str], i: int, metric: str, lowest: bool):
    """(policy, value) of the best of ``names`` at grid index i on ``metric``; (None, None) if none ran."""
    cands = [(n, points[n][i][metric]) for n in names if n in points and points[n][i].get(metric) is not None]
    if not cands:
        return None, None
    return (min if lowest else max)(cands, key=lambda c: c[1])


def compare(
    sw: dict[str, Any], loads: Sequence[float], static: Sequence[str], dynamic: Sequence[str]
) -> dict:
    """Best dynamic vs best static (each the best of its kind at each rate, on each metric)."""
    pts = sw["points"]
    per_load = []
    for i, load in enumerate(loads):
        s_lat_n, s_lat = _best(pts, static, i, "mean_latency_s", True)
        d_lat_n, d_lat = _best(pts, dynamic, i, "mean_latency_s", True)
        s_slo_n, s_slo = _best(pts, static, i, "slo_attainment", False)
        d_slo_n, d_slo = _best(pts, dynamic, i, "slo_attainment", False)
        s_thr_n, s_thr = _best(pts, static, i, "throughput_rps", False)
        d_thr_n, d_thr = _best(pts, dynamic, i, "throughput_rps", False)
        row = {
            "load": load,
            "static_latency": [s_lat_n, s_lat],
            "dynamic_latency": [d_lat_n, d_lat],
            "static_slo": [s_slo_n, s_slo],
            "dynamic_slo": [d_slo_n, d_slo],
            "static_throughput": [s_thr_n, s_thr],
            "dynamic_throughput": [d_thr_n, d_thr],
            "mean_latency_reduction": (1 - d_lat / s_lat) if s_lat and d_lat is not None else None,
            "slo_violation_reduction": (
                1 - (1 - d_slo) / (1 - s_slo)
                if s_slo is not None and d_slo is not None and s_slo < 1
                else None
            ),
            "throughput_ratio": d_thr / s_thr if s_thr and d_thr is not None else None,
        }
        per_load.append(row)
    tas = sw["throughput_at_slo"]
    s_tas = max(
        ((n, tas[n]["rate_rps"]) for n in static if n in tas), key=lambda c: c[1], default=(None, None)
    )
    d_tas = max(
        ((n, tas[n]["rate_rps"]) for n in dynamic if n in tas), key=lambda c: c[1], default=(None, None)
    )
    ratio = None
    if s_tas[1] is not None and d_tas[1] is not None:
        ratio = d_tas[1] / s_tas[1] if s_tas[1] > 0 else (math.inf if d_tas[1] > 0 else None)

    def largest(key: str, rows: Sequence[dict[str, Any]]) -> list[Any]:
        """[value, load] of the largest ``key`` over ``rows``; [None, None] without any."""
        vals = [(r[key], r["load"]) for r in rows if r[key] is not None]
        return list(max(vals)) if vals else [None, None]

    # loads where the best static misses at least 1 - SLO_TARGET of the deadlines: where it matters
    missing = [r for r in per_load if r["static_slo"][1] is not None and r["static_slo"][1] < SLO_TARGET]
    knee = missing[0] if missing else None

    worse_lat = [
        r["dynamic_latency"][1] / r["static_latency"][1] - 1 for r in per_load if _both(r, "latency")
    ]
    worse_thr = [
        1 - r["dynamic_throughput"][1] / r["static_throughput"][1] for r in per_load if _both(r, "throughput")
    ]
    return {
        "per_load": per_load,
        "best_static_throughput_at_slo": list(s_tas),
        "best_dynamic_throughput_at_slo": list(d_tas),
        "throughput_at_slo_ratio": ratio,
        "max_mean_latency_reduction": largest("mean_latency_reduction", per_load),
        "max_slo_violation_reduction": largest("slo_violation_reduction", missing),
        "static_knee": None
        if knee is None
        else {
            "load": knee["load"],
            "mean_latency_reduction": knee["mean_latency_reduction"],
            "slo_violation_reduction": knee["slo_violation_reduction"],
        },
        "worst_latency_excess": max(worse_lat) if worse_lat else None,
        "worst_throughput_shortfall": max(worse_thr) if worse_thr else None,
    }


def _both(row: dict[str, Any], metric: str) -> bool:
    return bool(row[f"static_{metric}"][1]) and row[f"dynamic_{metric}"][1] is not None


def best_of(names: Sequence[str], tas: dict[str, Any]) -> tuple[str, float]:
    """(policy, rate) of the highest throughput at SLO among ``names``."""
    n = max(names, key=lambda k: tas[k]["rate_rps"])
    return n, tas[n]["rate_rps"]


def on_off(
    tas_off: dict[str, Any], tas_on: dict[str, Any], off_names: Sequence[str] | None = None
) -> dict[str, Any]:
    """Best static and best dynamic throughput at SLO with a feature off and on, and dynamic / static of each
    (``off_names``: the off side's names of STATIC + DYNAMIC, in that order; default the same names)."""
    names = list(STATIC + DYNAMIC)
    off = dict(zip(names, off_names or names))
    s_off, d_off = best_of([off[p] for p in STATIC], tas_off), best_of([off[p] for p in DYNAMIC], tas_off)
    s_on, d_on = best_of(STATIC, tas_on), best_of(DYNAMIC, tas_on)
    return {
        "best_static_off": s_off,
        "best_dynamic_off": d_off,
        "best_static_on": s_on,
        "best_dynamic_on": d_on,
        "dynamic_vs_static_on": d_on[1] / s_on[1] if s_on[1] else None,
        "dynamic_vs_static_off": d_off[1] / s_off[1] if s_off[1] else None,
    }


# ------------------------------------------------------------------------------------------------ formatting
def fmt(x: Any, kind: str = "g") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    if kind == "pct":
        return f"{100 * x:.1f}%"
    if kind == "x":
        return f"{x:.2f}x"
    if kind == "rate":
        return f"{x:.4g}"
    if isinstance(x, float):
        return f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"
    return str(x)


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def pivot(sw: dict[str, Any], policies: Sequence[str], metric: str, kind: str = "g") -> str:
    """Rows: loads; columns: policies; cells: ``metric`` (or the error's first words)."""
    first = sw["points"][policies[0]]
    rows = []
    for i, p0 in enumerate(first):
        row = [f"{p0['load']:g}", fmt(p0["rate_rps"], "rate")]
        for n in policies:
            p = sw["points"][n][i]
            row.append("error" if "error" in p else fmt(p.get(metric), kind))
        rows.append(row)
    return table(["load", "rate (req/s)", *policies], rows)


def _figure(rows: int, cols: int, size: tuple[float, float]) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size)
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False)
    return fig, axes


def _style(policy: str, i: int) -> dict[str, Any]:
    static = policy.startswith("static:")
    return {
        "linestyle": "--" if static else "-",
        "marker": "o" if static else "s",
        "markersize": 3,
        "color": f"C{i}",
    }


def plot_sweep(lab: Lab, sc: Scenario, sw: dict[str, Any], policies: Sequence[str], name: str) -> str:
    """Mean latency (log) and SLO attainment against the arrival rate, one line per policy."""
    fig, axes = _figure(1, 2, (12, 4.5))
    lat_ax, slo_ax = axes[0]
    for i, n in enumerate(policies):
        pts = [p for p in sw["points"][n] if ok(p)]
        xs = [p["rate_rps"] for p in pts]
        lat_ax.plot(xs, [p["mean_latency_s"] for p in pts], label=n, **_style(n, i))
        slo_ax.plot(xs, [p["slo_attainment"] for p in pts], label=n, **_style(n, i))
    lat_ax.set_yscale("log")
    lat_ax.set_ylabel("mean latency (s)")
    slo_ax.set_ylabel("SLO attainment")
    slo_ax.axhline(SLO_TARGET, color="0.4", linewidth=0.8, linestyle=":")
    slo_ax.set_ylim(-0.02, 1.02)
    for ax in (lat_ax, slo_ax):
        ax.set_xlabel("arrival rate (requests/s)")
        ax.grid(True, alpha=0.3)
    slo_ax.legend(fontsize="small", loc="lower left")
    fig.suptitle(f"{sc.name}: {sc.model} on {sc.cluster} (capacity {lab.capacity(sc):.4g} req/s)")
    fig.tight_layout()
    return save(lab, fig, name)


def save(lab: Lab, fig: Any, name: str) -> str:
    os.makedirs(lab.fig_dir, exist_ok=True)
    path = os.path.join(lab.fig_dir, name)
    fig.savefig(path, dpi=110)
    return path


def rel(lab: Lab, path: str) -> str:
    return os.path.relpath(path, lab.out_dir)


# ------------------------------------------------------------------------------------------------ sections
def main_section(lab: Lab, ctx: dict[str, Any]) -> Section:
    """Images and videos, steady and bursty, on h20x8: every policy across the load grid."""
    static, dynamic = list(STATIC), list(DYNAMIC)
    policies = static + dynamic
    loads = LOADS[::2] + LOADS[-1:] if lab.quick else LOADS
    md, data, figs = [], {}, []
    for sc in SCENARIOS:
        print(f"main: {sc.name} ({lab.requests_per_trace(sc)} requests per trace)", flush=True)
        sw = sweep(lab, sc, policies, loads)
        cmp = compare(sw, loads, static, dynamic)
        fig = plot_sweep(lab, sc, sw, policies, f"{sc.name}.png")
        figs.append(fig)
        data[sc.name] = {
            "scenario": dataclasses.asdict(sc),
            "capacity_rps": lab.capacity(sc),
            **sw,
            "compare": cmp,
        }
        md.append(f"### {sc.name}: {sc.workload}, {sc.arrival} arrivals, {sc.model} on {sc.cluster}\n")
        md.append(
            f"Capacity {lab.capacity(sc):.4g} requests/s; {lab.requests_per_trace(sc)} requests per trace.\n\n"
            f"![{sc.name}]({rel(lab, fig)})\n"
        )
        for metric, title, kind in (
            ("throughput_rps", "Throughput (completed requests/s)", "rate"),
            ("mean_latency_s", "Mean latency (s)", "g"),
            ("p50_latency_s", "p50 latency (s)", "g"),
            ("p99_latency_s", "p99 latency (s)", "g"),
            ("slo_attainment", "SLO attainment", "pct"),
            ("utilization", "Utilisation", "pct"),
        ):
            md.append(f"{title}:\n\n{pivot(sw, policies, metric, kind)}\n")
        tas = sw["throughput_at_slo"]
        best_static = cmp["best_static_throughput_at_slo"][1]
        rows = []
        for n in policies:
            t = tas[n]
            mark = (
                " (below the grid)"
                if t["below_grid"]
                else (" (at least; above the grid)" if t["above_grid"] else "")
            )
            vs = fmt(t["rate_rps"] / best_static, "x") if best_static else "-"
            rows.append([n, fmt(t["rate_rps"], "rate") + mark, fmt(t["load"]), vs])
        md.append(
            "Throughput at SLO (the highest arrival rate at which >= 90% meet their deadline):\n\n"
            + table(["policy", "req/s", "x capacity", "vs best static"], rows)
            + "\n"
        )
        rows = []
        for r in cmp["per_load"]:
            rows.append(
                [
                    f"{r['load']:g}",
                    f"{r['static_latency'][0]} {fmt(r['static_latency'][1])}",
                    f"{r['dynamic_latency'][0]} {fmt(r['dynamic_latency'][1])}",
                    fmt(r["mean_latency_reduction"], "pct"),
                    f"{r['static_slo'][0]} {fmt(r['static_slo'][1], 'pct')}",
                    f"{r['dynamic_slo'][0]} {fmt(r['dynamic_slo'][1], 'pct')}",
                    fmt(r["slo_violation_reduction"], "pct"),
                    fmt(r["throughput_ratio"], "x"),
                ]
            )
        md.append(
            "Best dynamic vs best static at each load (each the best of its kind on that metric at that load):\n\n"
            + table(
                [
                    "load",
                    "best static: mean latency (s)",
                    "best dynamic: mean latency (s)",
                    "latency reduction",
                    "best static: SLO",
                    "best dynamic: SLO",
                    "SLO-violation reduction",
                    "throughput ratio",
                ],
                rows,
            )
            + "\n"
        )
    ctx["main"] = data
    return Section("main", TITLES["main"], "\n".join(md), data, figs)


def headline_section(lab: Lab, ctx: dict[str, Any]) -> Section:
    """The headline ratios of the main sweeps against the targets (computed, never assumed)."""
    data = ctx["main"]
    rows, out = [], {}
    for name, d in data.items():
        c = d["compare"]
        r = c["throughput_at_slo_ratio"]
        lat, lat_load = c["max_mean_latency_reduction"]
        viol, viol_load = c["max_slo_violation_reduction"]
        knee = c["static_knee"] or {}
        never = [v for v in (c["worst_latency_excess"], c["worst_throughput_shortfall"]) if v is not None]
        out[name] = {
            "throughput_at_slo_ratio": r,
            "best_static_throughput_at_slo": c["best_static_throughput_at_slo"],
            "best_dynamic_throughput_at_slo": c["best_dynamic_throughput_at_slo"],
            "max_mean_latency_reduction": [lat, lat_load],
            "max_slo_violation_reduction": [viol, viol_load],
            "static_knee": c["static_knee"],
            "worst_latency_excess": c["worst_latency_excess"],
            "worst_throughput_shortfall": c["worst_throughput_shortfall"],
        }
        rows.append(
            [
                name,
                _met(fmt(r, "x"), _ge(r, TARGETS["throughput_at_slo_ratio"])),
                _met(f"{fmt(lat, 'pct')} at {fmt(lat_load)}", _ge(lat, TARGETS["mean_latency_reduction"])),
                _met(
                    f"{fmt(viol, 'pct')} at {fmt(viol_load)}", _ge(viol, TARGETS["slo_violation_reduction"])
                ),
                f"{fmt(knee.get('load'))}: {fmt(knee.get('mean_latency_reduction'), 'pct')} / "
                f"{fmt(knee.get('slo_violation_reduction'), 'pct')}",
                _met(
                    f"{fmt(c['worst_latency_excess'], 'pct')} / {fmt(c['worst_throughput_shortfall'], 'pct')}",
                    bool(never) and max(never) <= TARGETS["never_worse_by"],
                ),
            ]
        )
    md = [
        table(
            [
                "scenario",
                "throughput at SLO: best dynamic / best static (target >= 6x)",
                "mean-latency reduction: largest, at load (target >= 95%)",
                "SLO-violation reduction: largest where static misses > 10%, at load (target >= 90%)",
                "at the first load where static misses > 10%: latency / violation reduction",
                "dynamic worse than static at its worst load: latency / throughput (target <= 2%)",
            ],
            rows,
        )
    ]
    # EDF where the best static meets fewer than 10% of deadlines (the target is stated for bursty video)
    edf_rows, edf = [], {}
    for name, d in data.items():
        for i, row in enumerate(d["compare"]["per_load"]):
            s = row["static_slo"][1]
            if s is not None and s < TARGETS["static_fails_below"]:
                e = d["points"]["edf"][i].get("slo_attainment")
                edf.setdefault(name, []).append({"load": row["load"], "best_static_slo": s, "edf_slo": e})
                met = _ge(e, TARGETS["edf_slo_where_static_fails"])
                edf_rows.append([name, f"{row['load']:g}", fmt(s, "pct"), _met(fmt(e, "pct"), met)])
    md.append(
        "\nEDF's SLO attainment where the best static degree meets fewer than 10% of the deadlines "
        "(target >= 88%, stated for bursty video):\n\n"
        + (
            table(["scenario", "load", "best static SLO", "edf SLO"], edf_rows)
            if edf_rows
            else "No load of the grid has the best static degree below 10%."
        )
    )
    out["edf_where_static_fails"] = edf
    md.append(
        "\nEach side is the best policy of its kind at each load on that metric (the static baseline may pick a "
        "different degree at each load, which favours it). Loads are x the scenario's capacity; every load's "
        "value is in the scenario tables below. Past capacity both sides' latencies grow with the trace's "
        "length, so reductions there compare two backlogs."
    )
    return Section("headline", TITLES["headline"], "\n".join(md), out)


def batching_section(lab: Lab, ctx: dict[str, Any]) -> Section:
    """Image scenarios with batching off (``:batch=1``) and on (the default) for the static and dynamic policies:
    what batching adds to each side, and whether changing parallelism still adds to batching."""
    loads = LOADS[::2] + LOADS[-1:] if lab.quick else LOADS
    off = [f"{p}:batch=1" for p in STATIC + DYNAMIC]
    md, data = [], {}
    rows = []
    for sc in SCENARIOS[:2]:  # image-steady, image-bursty
        print(f"batching: {sc.name}", flush=True)
        main = ctx.get("main", {}).get(sc.name)
        sw = sweep(lab, sc, off, loads)
        tas = dict(sw["throughput_at_slo"])
        if main is not None:
            tas.update(main["throughput_at_slo"])
        else:  # the main section did not run: the batched side here
            on = sweep(lab, sc, list(STATIC + DYNAMIC), loads)
            tas.update(on["throughput_at_slo"])
        data[sc.name] = {"throughput_at_slo": tas, **on_off(tas, tas, off)}
        s_off, s_on = data[sc.name]["best_static_off"], data[sc.name]["best_static_on"]
        d_off, d_on = data[sc.name]["best_dynamic_off"], data[sc.name]["best_dynamic_on"]
        rows.append(
            [
                sc.name,
                f"{s_off[0]} {fmt(s_off[1], 'rate')}",
                f"{s_on[0]} {fmt(s_on[1], 'rate')}",
                f"{d_off[0]} {fmt(d_off[1], 'rate')}",
                f"{d_on[0]} {fmt(d_on[1], 'rate')}",
                fmt(data[sc.name]["dynamic_vs_static_off"], "x"),
                _met(
                    fmt(data[sc.name]["dynamic_vs_static_on"], "x"),
                    _ge(data[sc.name]["dynamic_vs_static_on"], 3.0),
                ),
            ]
        )
    md.append(
        "Throughput at SLO (req/s; the highest rate at which >= 90% meet their deadline), each side the best of its "
        "policies (static:1/2/4/8 in fcfs, srtf and edf order, and fcfs/srtf/edf/priority), with batching off "
        "(`:batch=1`) and on (the default: requests of one shape that would otherwise wait join a batch while each "
        "request's share of a step stays 5% or more below a step alone, within the memory; the static policies "
        "batch by the same rule on their fixed "
        "groups, as batching serving systems do at a fixed degree). The batched side is the main section's run.\n\n"
        + table(
            [
                "scenario",
                "best static, no batches",
                "best static, batches",
                "best dynamic, no batches",
                "best dynamic, batches",
                "dynamic / static, no batches",
                "dynamic / static, batches (target >= 3x)",
            ],
            rows,
        )
    )
    return Section("batching", TITLES["batching"], "\n".join(md), data)


def caching_section(lab: Lab, ctx: dict[str, Any]) -> Section:
    """Every request with the step cache CACHE_SPEC, on every policy: which steps reuse the cache is drawn from the
    analytic model's skip curve (NOTE [simulated execution] in src/runtime/simulator.cpp), the policies plan with
    the expected mix of full and cached steps (NOTE [step caches]). Loads and deadlines are the uncached sweep's,
    so rates compare directly with the main section's."""
    from gfdit.planning import cost

    base_loads = LOADS[::2] + LOADS[-1:] if lab.quick else LOADS
    loads = base_loads + CACHE_EXTRA_LOADS  # a cache raises the capacity past the uncached grid's top
    md, data, rows = [], {}, []
    kind = CACHE_SPEC.split(":")[0]
    threshold = float(CACHE_SPEC.split(":")[1].split(",")[0])
    for sc in (x for x in SCENARIOS if x.name in CACHE_SCENARIOS):
        model = cost.cost_model(sc.model, sc.cluster)
        curve = model.skip_curve(kind)
        sim: dict[str, Any] = {"cache": CACHE_SPEC, "cache_seed": SEED}
        if curve.at(threshold) <= 0 and os.path.isfile(CACHE_STANDIN_PROFILE):
            stand_in = [
                c for c in cost.load_profile(CACHE_STANDIN_PROFILE).skip_curves if c.kind == curve.kind
            ]
            if stand_in:
                curve = stand_in[0]
                sim["skip_curves"] = (curve,)
        p = curve.at(threshold)
        if p <= 0:
            lab.note(
                f"caching: {sc.model} has no skip curve for {kind}: {sc.name} would be the uncached sweep"
            )
            continue
        print(
            f"caching: {sc.name} ({sc.model}: a pass reuses the cache with probability {p:.2f})", flush=True
        )
        sw = sweep(lab, sc, list(STATIC + DYNAMIC), loads, sim)
        tas = sw["throughput_at_slo"]
        main = ctx.get("main", {}).get(sc.name)
        off = (
            main["throughput_at_slo"]
            if main is not None
            else sweep(lab, sc, list(STATIC + DYNAMIC), base_loads)["throughput_at_slo"]
        )
        data[sc.name] = {
            "cache": CACHE_SPEC,
            "skip_probability": p,
            "skip_curve_source": curve.source,
            "throughput_at_slo": tas,
            "points": sw["points"],
            **on_off(off, tas),
        }
        s_off, s_on = data[sc.name]["best_static_off"], data[sc.name]["best_static_on"]
        d_off, d_on = data[sc.name]["best_dynamic_off"], data[sc.name]["best_dynamic_on"]
        rows.append(
            [
                sc.name,
                sc.model,
                f"{p:.2f}",
                f"{s_off[0]} {fmt(s_off[1], 'rate')}",
                f"{s_on[0]} {fmt(s_on[1], 'rate')}",
                f"{d_off[0]} {fmt(d_off[1], 'rate')}",
                f"{d_on[0]} {fmt(d_on[1], 'rate')}",
                fmt(data[sc.name]["dynamic_vs_static_off"], "x"),
                fmt(data[sc.name]["dynamic_vs_static_on"], "x"),
            ]
        )
    md.append(
        f"Every request with the step cache `{CACHE_SPEC}` (cache-dit's `cache_dit.generate --cache` setting) on "
        "every policy, against the same traces without it (the main section). In the simulator each pass of a step "
        "past the warm-up reuses the cache with the probability of the model's skip curve at the threshold, at "
        "most 3 in a row, and then costs the first block and the decision instead of every block; migrations "
        "carry the cache and a regroup first gathers its shards (NOTE [cache gathers]). The policies plan with "
        "the expected mix (RequestCost). Throughput at SLO (req/s; the highest rate at which >= 90% meet their "
        "deadline, the deadlines of the uncached requests), each side the best of its policies; the cached sweeps "
        f"go on past the uncached grid, to {max(CACHE_EXTRA_LOADS):g} x the uncached capacity.\n\n"
        + (
            table(
                [
                    "scenario",
                    "model",
                    "p(reuse)",
                    "best static, no cache",
                    "best static, cache",
                    "best dynamic, no cache",
                    "best dynamic, cache",
                    "dynamic / static, no cache",
                    "dynamic / static, cache",
                ],
                rows,
            )
            if rows
            else "No scenario's model has a skip curve for this cache."
        )
    )
    for name, d in data.items():
        md.append(
            f"\n- {name}: p(reuse) {d['skip_probability']:.2f} per pass past the warm-up, {d['skip_curve_source']}"
        )
    skipped = [n for n in CACHE_SCENARIOS if n not in data]
    if skipped:
        md.append(
            "\nNot run: "
            + ", ".join(skipped)
            + " (the model has no skip curve, published or measured, for this cache; NOTE [published skip rates])."
        )
    return Section("caching", TITLES["caching"], "\n".join(md), data)


def stages_section(lab: Lab, ctx: dict[str, Any]) -> Section:
    """A decode-heavy workload: one-rank decodes, decodes the cost model splits, and encodes and decodes kept on
    auxiliary ranks (disaggregated stages)."""
    loads = LOADS[::2] + LOADS[-1:] if lab.quick else LOADS
    md, data = [], {}
    pricer = lab.pricer("h20x8")
    for sc in STAGES_SCENARIOS:
        print(f"stages: {sc.name}", flush=True)
        h, w, f, steps = sc.shape  # type: ignore[misc]
        enc, dec = pricer._parts(sc.model, h, w, f, steps, 1)
        sw = sweep(lab, sc, list(STAGES_POLICIES), loads)
        tas = sw["throughput_at_slo"]
        data[sc.name] = {"scenario": dataclasses.asdict(sc), **sw}
        md.append(
            f"### {sc.name}: {sc.model} {h}x{w}x{f}, {steps} steps, {sc.arrival} arrivals on {sc.cluster}\n\n"
            f"Alone on one rank: encode and steps {fmt(enc)} s, decode {fmt(dec)} s "
            f"({fmt(dec / (enc + dec), 'pct')} of the request). Capacity {lab.capacity(sc):.4g} requests/s.\n"
        )
        for metric, title, kind in (
            ("mean_latency_s", "Mean latency (s)", "g"),
            ("slo_attainment", "SLO attainment", "pct"),
            ("utilization", "Utilisation", "pct"),
        ):
            md.append(f"{title}:\n\n{pivot(sw, list(STAGES_POLICIES), metric, kind)}\n")
        base = tas["fcfs:decode=1"]["rate_rps"]
        rows = [
            [
                n,
                fmt(tas[n]["rate_rps"], "rate"),
                fmt(tas[n]["load"]),
                fmt(tas[n]["rate_rps"] / base, "x") if base else "-",
            ]
            for n in STAGES_POLICIES
        ]
        md.append(
            "Throughput at SLO:\n\n"
            + table(["policy", "req/s", "x capacity", "vs one-rank decodes"], rows)
            + "\n"
        )
    md.append(
        "`fcfs:decode=1` decodes every request on one rank (as the pipelines do); `fcfs` splits each decode over "
        "as many of the request's free holders as the cost model finds fastest (NOTE [parallel decode]); "
        "`fcfs:stages=split[=K]` keeps every encode and decode on the last K ranks and the steps on the others "
        "(NOTE [stages]), as GF-DiT's disaggregate policy does; `static:D` decodes on its fixed group."
    )
    return Section("stages", TITLES["stages"], "\n".join(md), data)


def _ge(x: float | None, target: float) -> bool:
    return x is not None and x >= target


def _met(text: str, met: bool) -> str:
    return f"{text} ({'met' if met else 'missed'})"


def regroup_section(lab: Lab, ctx: dict[str, Any]) -> Section:
    """The main sweeps with the group-formation cost of NCCL, of GF-DiT's collectives, and gfdit's own."""
    static, dynamic = list(STATIC), list(DYNAMIC)
    policies = static + dynamic
    loads = LOADS[::2] + LOADS[-1:] if lab.quick else LOADS
    every = True  # charge the group-formation cost at every change of a group
    rows, data = [], {}
    scenarios = [sc for sc in SCENARIOS if sc.name in REGROUP_SCENARIOS]
    fig, axes = _figure(1, len(scenarios), (4.2 * len(scenarios), 4.2))
    for j, sc in enumerate(scenarios):
        ax = axes[0][j]
        data[sc.name] = {}
        for k, (label, cost) in enumerate(REGROUP_COSTS):
            sim: dict[str, Any] = {}
            if cost is not None:
                sim["regroup_s"] = cost
            if every:
                sim["regroup_every_change"] = True
            print(f"regroup: {sc.name}, {label}", flush=True)
            sw = sweep(lab, sc, policies, loads, sim)
            cmp = compare(sw, loads, static, dynamic)
            mid = loads.index(0.5) if 0.5 in loads else len(loads) // 2
            per = cmp["per_load"][mid]
            data[sc.name][label] = {
                "regroup_s": cost,
                "regroup_every_change": every,
                "throughput_at_slo": sw["throughput_at_slo"],
                "compare": cmp,
                "mean_latency_s": {n: [p.get("mean_latency_s") for p in sw["points"][n]] for n in policies},
            }
            tas = sw["throughput_at_slo"]
            rows.append(
                [
                    sc.name,
                    label,
                    f"{cmp['best_static_throughput_at_slo'][0]} {fmt(cmp['best_static_throughput_at_slo'][1], 'rate')}",
                    f"{cmp['best_dynamic_throughput_at_slo'][0]} "
                    f"{fmt(cmp['best_dynamic_throughput_at_slo'][1], 'rate')}",
                    fmt(cmp["throughput_at_slo_ratio"], "x"),
                    *[fmt(tas[n]["rate_rps"], "rate") for n in dynamic],
                    f"{per['dynamic_latency'][0]} {fmt(per['dynamic_latency'][1])}",
                    fmt(per["mean_latency_reduction"], "pct"),
                ]
            )
            xs = [x * lab.capacity(sc) for x in loads]
            best = [r["dynamic_latency"][1] for r in cmp["per_load"]]
            ax.plot(xs, best, marker="s", markersize=3, color=f"C{k}", label=f"best dynamic, {label}")
            if k == len(REGROUP_COSTS) - 1:
                ax.plot(
                    xs,
                    [r["static_latency"][1] for r in cmp["per_load"]],
                    "--",
                    color="0.3",
                    label="best static",
                )
        ax.set_yscale("log")
        ax.set_title(sc.name, fontsize="medium")
        ax.set_xlabel("arrival rate (requests/s)")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("mean latency (s)")
    axes[0][0].legend(fontsize="x-small")
    fig.tight_layout()
    path = save(lab, fig, "regroup.png")
    charge = (
        "each time a request's group changes (`regroup_every_change`)"
        if every
        else "on the first use of each rank set only (this build's simulator has no `regroup_every_change`: "
        "communicator caches are assumed, so the cost hardly shows)"
    )
    mid_load = loads[loads.index(0.5) if 0.5 in loads else len(loads) // 2]
    md = f"Group formation is charged {charge}.\n\n![regroup]({rel(lab, path)})\n\n" + table(
        [
            "scenario",
            "group formation",
            "best static: throughput at SLO (req/s)",
            "best dynamic: throughput at SLO (req/s)",
            "ratio",
            *[f"{n}: throughput at SLO" for n in dynamic],
            f"best dynamic mean latency at load {mid_load:g} (s)",
            "reduction vs best static",
        ],
        rows,
    )
    return Section("regroup", TITLES["regroup"], md, data, [path])


def fixed_shape_trace(
    pricer: workload.Pricer, sc: Scenario, rate: float, duration: float
) -> list[TraceRequest]:
    """Requests of the scenario's one shape (h, w, frames, steps) at its arrivals, deadlines as
    gfdit.planning.workload sets them."""
    assert sc.shape is not None
    h, w, f, steps = sc.shape
    budget = pricer.alone_latency(sc.model, h, w, f, steps)
    rng = np.random.Generator(np.random.PCG64(SEED))
    times = workload.arrival_times(sc.arrival, rate, duration, rng)
    return [
        TraceRequest(i, t, sc.model, h, w, f, steps, deadline_s=t + SLO_SCALE * budget)
        for i, t in enumerate(times)
    ]


def layout_steps(sc: Scenario) -> list[dict[str, Any]]:
    """Predicted seconds of one step per layout family, for long videos on one and two nodes."""
    from gfdit.planning import cost

    cm = cost.cost_model(sc.model, sc.cluster, profile=sc.profile)
    families = {f: getattr(rt.LayoutFamily, f.upper()) for f in LAYOUTS}
    rows = []
    for frames in (121, 81):
        for degree, nodes in ((16, 2), (8, 2), (8, 1)):
            row: dict[str, Any] = {"frames": frames, "degree": degree, "nodes": nodes}
            for name, fam in families.items():
                layout, step_s = rt.best_layout(cm, 720, 1280, frames, 40, 4.0, degree, nodes, fam)
                mode = rt.layout_mode_name(layout.mode)
                inside = {
                    rt.Placement.AUTO: "",
                    rt.Placement.ULYSSES_LOW: ", ulysses inside",
                    rt.Placement.RING_LOW: ", ring inside",
                }[layout.placement]
                cfg = " cfg2" if layout.cfg == 2 else ""  # CFG-parallel: a guidance pass per half
                row[name] = {
                    "step_s": step_s,
                    "layout": f"{layout.ulysses}x{layout.ring}{cfg} {mode}{inside}",
                }
            rows.append(row)
    return rows


def inter_node_calibration(sc: Scenario, steps: list[dict[str, Any]]) -> dict[str, Any]:
    """What the measured links (``sc.profile``) change in section (b): h20x16's inter-node terms before and after
    (NOTE [inter-node calibration] in src/runtime/cost.cpp), and each layout family's predicted step with the
    datasheet's terms beside the scaled ones (``steps``)."""
    from gfdit.planning import cost

    prof = cost.load_profile(sc.profile)
    before = cost.cluster(sc.cluster)
    after = cost.calibrated_cluster(before, prof, transfer=True)
    datasheet = layout_steps(dataclasses.replace(sc, profile=None))
    h, w, f, n = sc.shape or (720, 1280, 121, 40)
    pricers = (workload.Pricer(sc.cluster), workload.Pricer(sc.cluster, profile=sc.profile))
    alone = [pr.alone_latency(sc.model, h, w, f, n) for pr in pricers]
    decode = [
        pr.cost_model(sc.model).seconds(
            cost.Stage.DECODE, h, w, f, num_steps=n, guidance_scale=4.0, degree=16, num_nodes=2
        )
        for pr in pricers
    ]
    links = [
        {k: getattr(lk, k) for k in cost.LINK_FIELDS} for lk in prof.links
    ]  # what was measured, for the JSON
    rows = []
    changes = []
    for old, new in zip(datasheet, steps):
        cells = [str(new["frames"]), str(new["degree"]), str(new["nodes"])]
        for f in LAYOUTS:
            change = new[f]["step_s"] / old[f]["step_s"] - 1
            changes.append(change)
            same = "" if new[f]["layout"] == old[f]["layout"] else f", was {old[f]['layout']}"
            delta_ms = (new[f]["step_s"] - old[f]["step_s"]) * 1e3
            cells.append(f"{old[f]['step_s']:.3f} -> {new[f]['step_s']:.3f} ({delta_ms:+.2f} ms{same})")
        rows.append(cells)
    lk = prof.links[0]
    md = (
        f"**Inter-node terms scaled by measured links** (`--links {os.path.basename(sc.profile)}`: "
        f"`gfdit profile --network` on an emulated cluster of {prof.world_size // max(1, lk.ranks_per_node)} nodes "
        f"x {lk.ranks_per_node} ranks, `bench/bench_layouts_net.py`). The transport moved "
        f"{lk.concurrent_bytes_per_s / 1e6:.1f} MB/s of a {lk.line_bytes_per_s / 1e6:.0f} MB/s link with every "
        f"rank of a node crossing at once ({lk.concurrent_bytes_per_s / lk.line_bytes_per_s:.2f} of the line rate; "
        f"the datasheet model assumes 1.00), and a 4-byte all-to-all across nodes took {lk.collective_s * 1e6:.1f} us "
        f"against {lk.intra_collective_s * 1e6:.1f} us inside one ({lk.collective_s / lk.intra_collective_s:.2f}x; "
        f"the model assumes {before.hw.inter_node_latency_s / before.hw.collective_latency_s:.2f}x). Scaled by "
        f"those ratios, h20x16's inter_node_bw goes from {before.hw.inter_node_bw / 1e9:.1f} to "
        f"{after.hw.inter_node_bw / 1e9:.1f} GB/s per rank and inter_node_latency_s from "
        f"{before.hw.inter_node_latency_s * 1e6:.0f} to {after.hw.inter_node_latency_s * 1e6:.0f} us; everything "
        "inside a node stays the datasheet's. The efficiency of the transport carries over from a TCP link of one "
        "machine's namespaces to the H20s' 400 Gb/s NICs only as a what-if: it is what gfdit's network edges "
        "achieve over sockets, not what RDMA would. Every number below uses the scaled terms.\n\n"
        "Predicted step (s) per layout family, datasheet -> scaled terms (change; the layout the family picks, "
        "where it changed):\n\n"
        + table(["frames", "ranks", "nodes"] + list(LAYOUTS), rows)
        + f"\n\nLargest change of a family's best step: {max(abs(c) for c in changes):.4%}: these layouts are "
        "compute-bound (seconds of attention per step against milliseconds of all-to-all across the NICs, the "
        "CFG-parallel ones exchanging one latent between the halves). What moves more is what is latency-bound or "
        f"crosses with every peer: the decode on 16 ranks over both nodes (its halo exchanges) goes from "
        f"{decode[0]:.3f} to {decode[1]:.3f} s, and a request's latency alone at the best static degree (Ulysses "
        f"over contiguous ranks, which sets the deadlines) from {alone[0]:.1f} to {alone[1]:.1f} s "
        f"({alone[1] / alone[0] - 1:+.2%}); the tables below differ from the datasheet run only through such "
        "changes.\n"
    )
    return {
        "markdown": md,
        "links": links,
        "inter_node_bw": [before.hw.inter_node_bw, after.hw.inter_node_bw],
        "inter_node_latency_s": [before.hw.inter_node_latency_s, after.hw.inter_node_latency_s],
        "datasheet_step_s": datasheet,
        "largest_step_change": max(abs(c) for c in changes),
        "alone_latency_s": alone,
        "decode_16_ranks_2_nodes_s": decode,
    }


def layout_section(lab: Lab, ctx: dict[str, Any]) -> Section:
    """Long Wan 2.2 videos (720p x 121 frames, 40 steps) on two nodes: the layout variants."""
    shape = (720, 1280, 121, 40)
    sc = Scenario(
        "long-video-h20x16",
        "video",
        "wan2.2",
        "poisson",
        cluster="h20x16",
        requests=200,
        shape=shape,
        profile=lab.links,
    )
    pricer = lab.pricer(sc.cluster, sc.profile)
    capacity = lab.capacity(sc)
    loads = (0.25, 0.5, 0.75, 1.0) if not lab.quick else (0.25, 0.75)
    variants = [f"{base}:layout={layout}" for base in DYNAMIC for layout in LAYOUTS]
    policies = list(["static:4", "static:8"]) + list(DYNAMIC) + list(variants)
    print(f"layouts: {sc.name} ({lab.requests_per_trace(sc)} requests per trace)", flush=True)
    sw = sweep(lab, sc, policies, loads)
    fig = plot_sweep(lab, sc, sw, policies, "layouts.png")
    missing = [v for v in variants if v not in policies]
    steps = layout_steps(sc)
    calibration = inter_node_calibration(sc, steps) if sc.profile else None
    md = [calibration["markdown"]] if calibration else []
    md += [
        "One step of a Wan 2.2 720x1280 video, as the analytic cost model predicts it for each layout family "
        "(`gfdit._C.runtime.best_layout`; ulysses x ring, USP or Torus, which axis stays inside a node):\n\n"
        + table(
            ["frames", "ranks", "nodes"] + [f"{f}: s (layout)" for f in LAYOUTS] + ["usp / best"],
            [
                [str(r["frames"]), str(r["degree"]), str(r["nodes"])]
                + [f"{r[f]['step_s']:.2f} ({r[f]['layout']})" for f in LAYOUTS]
                + [f"{r['usp']['step_s'] / min(r[f]['step_s'] for f in LAYOUTS):.3f}x"]
                for r in steps
            ],
        )
        + "\n",
        f"Every request is 720x1280, 121 frames, 40 steps (alone at the best static degree "
        f"{pricer.alone_latency(sc.model, *shape):.0f} s); Poisson arrivals; capacity {capacity:.4g} requests/s "
        f"on 16 H20s in two nodes of 8.\n",
        f"![layouts]({rel(lab, fig)})\n",
        "Mean latency (s):\n\n" + pivot(sw, policies, "mean_latency_s"),
        "\nSLO attainment:\n\n" + pivot(sw, policies, "slo_attainment", "pct"),
        "\nThroughput (req/s):\n\n" + pivot(sw, policies, "throughput_rps", "rate"),
        "\nThroughput at SLO (req/s): "
        + ", ".join(f"{n} {fmt(sw['throughput_at_slo'][n]['rate_rps'], 'rate')}" for n in policies)
        + ".",
    ]
    if missing:
        md.append(
            f"\nNot run (not in this build yet): {', '.join(missing)}. They join this table by name once built in."
        )
    data = {"capacity_rps": capacity, "shape": shape, "step_s": steps, **sw, "missing": missing}
    if calibration:
        data["calibration"] = {k: v for k, v in calibration.items() if k != "markdown"}
    return Section("layouts", TITLES["layouts"], "\n".join(md), data, [fig])


def priority_section(lab: Lab, ctx: dict[str, Any]) -> Section:
    """One long video, then a stream of short images with priority 1: preemption at step boundaries
    (``priority``) against policies that never preempt."""
    sc = Scenario("video-plus-images", "mixed", "wan2.2", "poisson")
    pricer = lab.pricer(sc.cluster)
    video = (720, 1280, 121, 40)
    video_alone = pricer.alone_latency(sc.model, *video)
    stills = workload.fit_menu(sc.model, workload.STILL_SIZES, [(1, 1.0)], ((20, 0.5), (30, 0.5)), pricer)
    image_rank_s = sum(
        s.weight * pricer.rank_seconds(s.model, s.height, s.width, 1, s.num_steps) for s in stills
    )
    image_capacity = pricer.cluster.num_ranks / image_rank_s
    loads = (0.1, 0.25, 0.5) if not lab.quick else (0.25,)
    duration = 1.5 * video_alone
    policies = list(["priority", "edf", "srtf", "fcfs", *STATIC])
    if "priority" not in policies:
        lab.note("priority section: the `priority` policy is not built in, so no run preempts")
    rows, data = [], {}
    print("priority: one long video and a stream of images", flush=True)
    for load in loads:
        rng = np.random.Generator(np.random.PCG64(SEED))
        rate = load * image_capacity
        times = workload.arrival_times("poisson", rate, duration, rng)
        picks = rng.choice(len(stills), size=len(times), p=[s.weight for s in stills])
        reqs = [TraceRequest(0, 0.0, sc.model, *video, deadline_s=SLO_SCALE * video_alone, priority=0)]
        for i, (t, k) in enumerate(zip(times, picks), start=1):
            s = stills[int(k)]
            budget = pricer.alone_latency(sc.model, s.height, s.width, 1, s.num_steps)
            reqs.append(
                TraceRequest(
                    i, t, sc.model, s.height, s.width, 1, s.num_steps, t + SLO_SCALE * budget, priority=1
                )
            )
        data[load] = {}
        for policy in policies:
            p = lab.run(sc, load, policy, requests=reqs, tag="priority", keep_outcomes=True)
            if not ok(p):
                continue
            outs: list[Outcome] = p["_outcomes"]
            img = summarize(policy, [o for o in outs if o.priority == 1], 0.0, 8)
            vid = next(o for o in outs if o.id == 0)
            d = {
                "images": len(outs) - 1,
                "image_mean_latency_s": img["mean_latency_s"],
                "image_p99_latency_s": img["p99_latency_s"],
                "image_slo_attainment": img["slo_attainment"],
                "video_latency_s": vid.latency_s,
                "video_met_deadline": vid.met_deadline,
            }
            data[load][policy] = d
            rows.append(
                [
                    f"{load:g}",
                    policy,
                    d["images"],
                    fmt(d["image_mean_latency_s"]),
                    fmt(d["image_p99_latency_s"]),
                    fmt(d["image_slo_attainment"], "pct"),
                    fmt(d["video_latency_s"]),
                    "yes" if d["video_met_deadline"] else "no",
                ]
            )
        print(f"  image load {load:g}: {len(policies)} policies", flush=True)
    fig, axes = _figure(1, 2, (11, 4.2))
    for i, policy in enumerate(policies):
        xs = [x for x in loads if policy in data[x]]
        axes[0][0].plot(
            xs, [data[x][policy]["image_p99_latency_s"] for x in xs], label=policy, **_style(policy, i)
        )
        axes[0][1].plot(
            xs, [data[x][policy]["video_latency_s"] for x in xs], label=policy, **_style(policy, i)
        )
    axes[0][0].set_ylabel("image p99 latency (s)")
    axes[0][1].set_ylabel("video latency (s)")
    for ax in axes[0]:
        ax.set_yscale("log")
        ax.set_xlabel("image load (x the cluster's capacity for the images)")
        ax.grid(True, alpha=0.3)
    axes[0][1].legend(fontsize="small")
    fig.tight_layout()
    path = save(lab, fig, "priority.png")
    md = (
        f"At t = 0 one 720x1280 video of 121 frames (40 steps, priority 0; alone {video_alone:.0f} s at the best "
        f"static degree) arrives; then one-frame images (480p to 720p, 20 or 30 steps, priority 1) arrive as a "
        f"Poisson stream for {duration:.0f} s at a share of the cluster's capacity for images "
        f"({image_capacity:.4g} images/s). `priority` preempts at step boundaries; fcfs and static never "
        f"preempt. Deadlines are 3 x each request's alone latency.\n\n"
        f"![priority]({rel(lab, path)})\n\n"
        + table(
            [
                "image load",
                "policy",
                "images",
                "image mean latency (s)",
                "image p99 latency (s)",
                "image SLO",
                "video latency (s)",
                "video met its deadline",
            ],
            rows,
        )
    )
    return Section("priority", TITLES["priority"], md, data, [path])


def real_section(lab: Lab, ctx: dict[str, Any]) -> Section:
    """tiny-wan on this machine's CPUs: a profile measured here, then mixed traces and the target trace
    replayed on real engines (the profiled cost model in the control plane) under every policy that fits
    the world; each cell the median of REAL_REPEATS runs."""
    import real_runs as R

    t0 = time.perf_counter()
    load_before = os.getloadavg()
    repeats = 1 if lab.quick else REAL_REPEATS
    prof_path = os.path.join(lab.fig_dir, "real_profile.json")
    prof, reused, took = R.get_profile(prof_path)
    steps = R.step_table(prof)
    large, large_row = R.pick_large(prof)
    one = R.pricer_for(prof_path, 1)  # the large request alone on one rank; then with its steps halved
    alone1 = one.latency(R.MODEL, *large, 1)
    alone2 = R.pricer_for(prof_path, 2).latency(R.MODEL, *large, 2)  # its steps and decode on two ranks
    ceiling = (alone1, alone2)
    pricer = R.pricer_for(prof_path, min(REAL_WORLDS))
    mixed = [("image", R.IMAGE, 1 - REAL_VIDEO_SHARE), ("video", R.VIDEO, REAL_VIDEO_SHARE)]
    target = [("image", R.IMAGE, 1 - REAL_LARGE_SHARE), ("large", large, REAL_LARGE_SHARE)]

    def cap(classes: Sequence[tuple[str, tuple[int, int, int, int], float]]) -> float:
        return R.capacity_rps(pricer, [(shape, share) for _, shape, share in classes])

    n_mixed = 12 if lab.quick else REAL_MIXED_REQUESTS
    n_target = 6 if lab.quick else REAL_TARGET_REQUESTS
    traces = [
        R.make_trace(
            f"mixed {rate:g}/s", mixed, n_mixed, rate, pricer, rate / cap(mixed), REAL_WORLDS, SEED, SLO_SCALE
        )
        for rate in REAL_MIXED_RATES
    ]
    traces.append(
        R.make_trace(
            "target",
            target,
            n_target,
            REAL_TARGET_LOAD * cap(target),
            pricer,
            REAL_TARGET_LOAD,
            (REAL_TARGET_WORLD,),
            SEED,
            SLO_SCALE,
        )
    )
    dynamic = list(DYNAMIC)
    cells: dict[str, dict[str, Any]] = {}  # "trace @ world N" -> policy -> median summary (or error)
    kinds: dict[str, list[str]] = {}
    sizes: dict[str, int] = {}
    for world in REAL_WORLDS:
        # fixed groups in arrival and shortest-remaining-time order (best static: the best of them)
        static = [f"static:{d}{o}" for d in (1, 2, 4) for o in ("", ":srtf") if world % d == 0]
        policies = static + dynamic
        res = R.run_world(traces, world, policies, prof_path, repeats)
        for name, per_policy in res.items():
            key = f"{name} @ world {world}"
            sizes[key] = next(len(t.requests) for t in traces if t.name == name)
            kinds[key] = static
            cells[key] = {}
            for p, cell in per_policy.items():
                if cell.get("error") or not cell["runs"]:
                    cells[key][p] = {"error": cell.get("error", "no run completed"), "runs": cell["runs"]}
                else:
                    cells[key][p] = {**R.median_summary(cell["runs"]), "runs": cell["runs"]}
            lab.real_runs += sum(len(c["runs"]) for c in per_policy.values())
    # the profile's two-rank step against one measured at the smallest world (its collectives may wait
    # differently when the ranks do not outnumber the cores)
    check_shape = R.VIDEO[:3]
    small_world = R.two_rank_step_at(min(REAL_WORLDS), check_shape)
    in_profile = next(r for r in steps if tuple(r["shape"]) == check_shape)
    load_after = os.getloadavg()

    # best static vs best dynamic on mean latency, per trace and world
    cmp_rows, compare_data, figs = [], {}, []
    if os.path.isdir(lab.fig_dir):  # the timelines of an earlier run's best policies
        for name in os.listdir(lab.fig_dir):
            if name.startswith("real-target-") and name.endswith(".png"):
                os.remove(os.path.join(lab.fig_dir, name))
    for key, per in cells.items():
        static = kinds[key]

        def best(names: Sequence[str], per: dict[str, Any] = per) -> tuple[str | None, float | None]:
            c = [(n, per[n]["mean_latency_s"]) for n in names if per.get(n, {}).get("mean_latency_s")]
            return min(c, key=lambda x: x[1]) if c else (None, None)

        s_name, s_lat = best(static)
        d_name, d_lat = best(dynamic)
        ratio = s_lat / d_lat if s_lat and d_lat else None
        excess = d_lat / s_lat - 1 if s_lat and d_lat else None
        compare_data[key] = {
            "best_static": [s_name, s_lat],
            "best_dynamic": [d_name, d_lat],
            "static_over_dynamic_mean_latency": ratio,
            "dynamic_excess": excess,
        }
        never = excess is not None and excess <= REAL_TARGETS["never_worse_by"]
        s_spread = per.get(s_name, {}).get("mean_latency_spread_s") if s_name else None
        d_spread = per.get(d_name, {}).get("mean_latency_spread_s") if d_name else None
        overlap = bool(s_spread and d_spread and s_spread[0] <= d_spread[1] and d_spread[0] <= s_spread[1])
        compare_data[key]["repeat_ranges_overlap"] = overlap
        is_target = key.startswith("target")
        cmp_rows.append(
            [
                key,
                f"{s_name} {fmt_ms(s_lat)}",
                f"{d_name} {fmt_ms(d_lat)}",
                _met(fmt(ratio, "x"), _ge(ratio, REAL_TARGETS["target_latency_ratio"]))
                if is_target
                else fmt(ratio, "x"),
                _met(fmt(excess, "pct"), never),
                "yes" if overlap else "no",
            ]
        )
        if is_target and s_name and d_name:
            for n in (s_name, d_name):
                replay = per[n].get("_replay")
                if replay is not None:
                    path = os.path.join(lab.fig_dir, f"real-target-{n.replace(':', '')}.png")
                    os.makedirs(lab.fig_dir, exist_ok=True)
                    simulate.plot_timeline(
                        replay.intervals,
                        replay.num_ranks,
                        path,
                        f"target trace, {n} on the real engine ({replay.where})",
                    )
                    figs.append(path)

    md = [
        f"gfdit's engine on this machine ({os.cpu_count()} cores, shared with other work: load average "
        f"{load_before[0]:.1f} before the runs, {load_after[0]:.1f} after), tiny-wan (random weights), one worker "
        f"process per rank, the control plane given the profiled cost model (`gfdit.tools.replay.replay_trace(..., "
        f"profile=...)`), so the dynamic policies plan with measured stage times. Each cell is the median of "
        f"{repeats} replays on one engine per policy (all engines of a world size alive at once, the policies "
        f"taking turns in each repeat); the spread is the min..max of the mean latency over the repeats.\n",
        f"**Profile** (`gfdit profile`, world {R.PROFILE_WORLD}, {R.PROFILE_STEPS} steps x {R.PROFILE_REPEATS} "
        f"repeats per size and layout): "
        + ("reused from an earlier run with the same options" if reused else f"measured in {took:.0f} s")
        + f" (`{rel(lab, prof_path)}`). A step on one rank against the fastest two-rank layout:\n",
        table(
            [
                "size (HxWxF)",
                "tokens",
                "step, 1 rank (ms)",
                "step, 2 ranks (ms)",
                "2-rank layout",
                "gain",
                "decode, 1 rank (ms)",
                "decode, 2 ranks (ms)",
            ],
            [
                [
                    "x".join(map(str, r["shape"])),
                    r["tokens"],
                    fmt_ms(r["step1_s"]),
                    fmt_ms(r["step2_s"]),
                    r["step2_layout"] or "-",
                    fmt(r["gain"], "x"),
                    fmt_ms(r["decode_s"]),
                    fmt_ms(r["decode2_s"]),
                ]
                for r in steps
            ],
        ),
        "",
        f"**Traces** (seed {SEED}; Poisson arrivals from t = 0; deadlines {SLO_SCALE:g} x each request's alone "
        f"latency at its best static degree on {min(REAL_WORLDS)} ranks, from the profile):\n",
        table(
            [
                "trace",
                "requests",
                "classes (HxWxF, steps, share)",
                "rate (req/s)",
                "load (x capacity on 2 ranks)",
                "worlds",
            ],
            [
                [
                    t.name,
                    len(t.requests),
                    "; ".join(
                        f"{c} {s[0]}x{s[1]}x{s[2]} {s[3]} steps {share:.0%}"
                        for c, s, share in (mixed if t.name.startswith("mixed") else target)
                    ),
                    fmt(t.rate_rps, "rate"),
                    fmt(t.load),
                    ", ".join(map(str, t.worlds)),
                ]
                for t in traces
            ],
        ),
        "",
        f"The target trace mixes the small images with the profiled size whose step gains most from two ranks "
        f"({'x'.join(map(str, large[:3]))}: {fmt(large_row['gain'], 'x')} by the profile), at {large[3]} steps. "
        + (
            "No profiled size runs a step faster on two ranks than on one, so a policy that follows the profile "
            "keeps every request on one rank and can differ from static:1 only in order and placement. "
            if (max((r["gain"] or 0) for r in steps) < 1)
            else ""
        )
        + f"The decode splits over the ranks that hold the final state, as many as the profile says is fastest "
        f"(NOTE [parallel decode]), for every policy, static ones included: alone, the large request takes "
        f"{fmt_ms(ceiling[0])} ms on one rank and {fmt_ms(ceiling[1])} ms on two, steps and decode "
        f"({fmt(ceiling[0] / ceiling[1], 'x')}), which bounds what spreading can win on this trace.\n",
    ]
    for key, per in cells.items():
        rows = []
        for p, c in per.items():
            if "error" in c:
                rows.append([p, "error: " + str(c["error"])[:80], "", "", "", "", "", "", ""])
                continue
            spread = c["mean_latency_spread_s"]
            rows.append(
                [
                    p,
                    fmt(c["throughput_rps"], "rate"),
                    fmt_ms(c["mean_latency_s"]),
                    fmt_ms(c["p50_latency_s"]),
                    fmt_ms(c["p99_latency_s"]),
                    fmt(c["slo_attainment"], "pct"),
                    fmt(c["utilization"], "pct"),
                    f"{fmt_ms(spread[0])}..{fmt_ms(spread[1])}" if spread else "-",
                    f"{c['completed']}/{sizes[key]}",
                ]
            )
        md.append(f"### {key}\n")
        md.append(
            table(
                [
                    "policy",
                    "throughput (req/s)",
                    "mean latency (ms)",
                    "p50 (ms)",
                    "p99 (ms)",
                    "SLO",
                    "utilisation",
                    "mean latency over repeats (ms)",
                    "completed (worst repeat)",
                ],
                rows,
            )
            + "\n"
        )
    md.append(
        f"The profile was measured at world {R.PROFILE_WORLD}; measured again at world {min(REAL_WORLDS)} after "
        f"the runs, a {'x'.join(map(str, check_shape))} step takes {fmt_ms(small_world['step1_s'])} ms on one "
        f"rank and {fmt_ms(small_world['step2_s'])} ms on two ({small_world['step2_layout']}), against "
        f"{fmt_ms(in_profile['step1_s'])} and {fmt_ms(in_profile['step2_s'])} ms in the profile.\n"
    )
    md.append("### Best dynamic against best static (mean latency)\n")
    md.append(
        table(
            [
                "trace @ world",
                "best static (ms)",
                "best dynamic (ms)",
                f"static / dynamic (target trace: >= {REAL_TARGETS['target_latency_ratio']:g}x)",
                f"dynamic worse by (target <= {REAL_TARGETS['never_worse_by']:.0%})",
                "their repeats' mean latencies overlap",
            ],
            cmp_rows,
        )
        + "\n\nOn this machine the mean latency of one policy moves by several percent between repeats and "
        "between engine instances even where the timelines show the same placements (the spreads above); where "
        "the two repeat ranges overlap, a difference between the best static and the best dynamic policy is "
        "within that noise.\n"
    )
    diag_rows = []
    for key, per in cells.items():
        for p in [*kinds[key], *dynamic]:
            d = per.get(p, {}).get("diagnostics")
            if not d:
                continue
            parts, waits = [], []
            for cname, v in d.items():
                if cname == "migrations":
                    continue
                parts.append(
                    f"{cname}: {v['spread_share']:.0%} of {v['steps']} steps on > 1 rank"
                    + (
                        f", {v['one_rank_while_another_idle']} on 1 rank beside an idle one"
                        if cname != "image"
                        else ""
                    )
                )
                waits.append(f"{cname} {fmt_ms(v['mean_latency_s'])} / {fmt_ms(v['mean_wait_s'])}")
            diag_rows.append([key, p, "; ".join(parts), d["migrations"], "; ".join(waits)])
    md.append(
        "What each policy did (the median repeat's timeline), by request class: steps on more than one rank, "
        "steps of a larger request on one rank while another rank was idle the whole step, mean latency and mean "
        "wait from arrival to the request's first task:\n"
    )
    md.append(
        table(
            [
                "trace @ world",
                "policy",
                "steps",
                "migrations",
                "mean latency / wait before the first task (ms)",
            ],
            diag_rows,
        )
        + "\n"
    )
    for f in figs:
        md.append(f"![{os.path.basename(f)}]({rel(lab, f)})\n")
    md.append(f"_{lab.real_runs} real replays, {time.perf_counter() - t0:.0f} s._")
    data = {
        "profile": {"path": rel(lab, prof_path), "reused": reused, "seconds": took, "steps": steps},
        "large": {"shape": list(large), **large_row, "alone_s": ceiling[0], "alone2_s": ceiling[1]},
        "traces": {
            t.name: {
                "requests": [r.to_json() for r in t.requests],
                "rate_rps": t.rate_rps,
                "load": t.load,
                "worlds": list(t.worlds),
            }
            for t in traces
        },
        "repeats": repeats,
        "load_average": [load_before[0], load_after[0]],
        "two_rank_step_check": {"world": min(REAL_WORLDS), "measured": small_world, "in_profile": in_profile},
        "cells": cells,
        "compare": compare_data,
        "targets": REAL_TARGETS,
        "seconds": time.perf_counter() - t0,
    }
    return Section("real", TITLES["real"], "\n".join(md), data, figs)


def fmt_ms(x: float | None) -> str:
    return "-" if x is None else f"{1e3 * x:.0f}"


# The report, in order. A section is a function (lab, ctx) -> Section; ctx carries what one section hands a
# later one (the headline reads the main sweeps).
SECTIONS: list[Callable[[Lab, dict[str, Any]], Section]] = [
    main_section,
    headline_section,
    regroup_section,
    layout_section,
    priority_section,
    real_section,
    batching_section,
    stages_section,
    caching_section,
]
# SECTIONS' keys, in order
SECTION_KEYS = ("main", "headline", "regroup", "layouts", "priority", "real", "batching", "stages", "caching")
REPORT_ORDER = ("headline", "main", "batching", "stages", "caching", "regroup", "layouts", "priority", "real")


# ------------------------------------------------------------------------------------------------ report
def method(lab: Lab) -> str:
    built = ", ".join(rt.policy_names())
    return f"""The simulator is gfdit's control plane with its built-in policies on a virtual clock
(`gfdit._C.runtime.Simulator`, through `gfdit.planning.simulate.simulate_trace`), each stage taking the time of the
analytic cost model of an H20 cluster (`h20x8`: one node of 8; `h20x16`: two). Policies built into this
build: {built}.

- **Workloads** (`gfdit.planning.workload`, seed {SEED}): Qwen-Image images (512-1536 px, 1024 px most common, 20-50
  steps) and Wan 2.2 videos (480p and 720p, 33-121 frames, 20-50 steps, 40 most common), and both served
  together by Wan 2.2 (mixed: 30% videos, the rest one-frame images); the size distributions are stated in
  `python/gfdit/workload.py`. Arrivals are Poisson (steady) or Gamma with a
  coefficient of variation of 2 (bursty). A trace holds about {lab.requests_per_trace(SCENARIOS[0])} requests
  (images) or {lab.requests_per_trace(SCENARIOS[2])} (videos) whatever the rate, and every rate draws the
  same sequence of sizes.
- **Load** is the arrival rate over the cluster's capacity: ranks / the mean of each request's least
  rank-seconds over the static degrees (degree x (encode + steps x step) + decode), i.e. the rate at which
  every rank is busy with each request at its most efficient degree. Loads: {", ".join(f"{x:g}" for x in LOADS)}.
- **Deadlines**: arrival + {SLO_SCALE:g} x the request's latency alone at its best static degree.
- **Metrics** (`gfdit.planning.trace.summarize`): throughput = completed / (last finish - first arrival); latency =
  finish - arrival (mean, p50, p99); SLO attainment = share of requests done by their deadline;
  utilisation = busy rank-seconds / (ranks x span). Every trace runs to its end (no request is dropped),
  so past capacity the queue, and the latency, grows with the trace's length.
- **Throughput at SLO**: the highest arrival rate at which >= {SLO_TARGET:.0%} of the requests meet their
  deadline: the last grid load before the first that fails, refined by {BISECT_STEPS} bisection steps
  toward it.
- **Best static / best dynamic**: at each load, the best of static:1/2/4/8, each in fcfs, srtf and edf order
  (`static:D:srtf`, `static:D:edf`), and the best of the dynamic policies ({", ".join(DYNAMIC)}, those built in)
  on each metric separately. Both sides batch requests of one shape by the same rule (section (e)); the text
  encoder runs once per request on one rank, its state copied to the group.
"""


def jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items() if not str(k).startswith("_")}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    return x


def write_report(lab: Lab, sections: dict[str, Section], wall_s: float) -> tuple[str, str]:
    parts = [
        "# Scheduling experiments\n",
        "Regenerate with `make experiments` (`python bench/experiments.py`); every number below is computed "
        "by that run.\n",
        "## Method\n",
        method(lab),
    ]
    notes = list(lab.notes)
    if notes:
        parts.append("Notes of this run:\n\n" + "\n".join(f"- {n}" for n in notes) + "\n")
    for key in [*REPORT_ORDER, *(k for k in sections if k not in REPORT_ORDER)]:
        if key in sections:
            s = sections[key]
            parts.append(f"## {s.title}\n\n{s.markdown}\n")
    carried = [k for k in sections if sections[k].carried]
    if carried:
        parts.append(f"_Carried over from the previous report, not run this time: {', '.join(carried)}._\n")
    parts.append(f"_{lab.num_runs} simulations, {lab.real_runs} real replays in this run, {wall_s:.0f} s._\n")
    md_path = os.path.join(lab.out_dir, "experiments.md")
    json_path = os.path.join(lab.out_dir, "experiments.json")
    with open(md_path, "w", encoding="utf-8") as f:
        f.write("\n".join(parts))
    payload = {
        "config": {
            "seed": SEED,
            "slo_scale": SLO_SCALE,
            "slo_target": SLO_TARGET,
            "loads": LOADS,
            "bisect_steps": BISECT_STEPS,
            "targets": TARGETS,
            "quick": lab.quick,
            "policies_built_in": list(rt.policy_names()),
        },
        "notes": lab.notes,
        "sections": {k: s.data for k, s in sections.items()},
        "section_titles": {k: s.title for k, s in sections.items()},
        "carried_over": carried,
    }
    with open(json_path, "w", encoding="utf-8") as f:
        json.dump(jsonable(payload), f, indent=1)
        f.write("\n")
    return md_path, json_path


def previous_sections(out_dir: str) -> dict[str, Section]:
    """The sections of the report already in ``out_dir`` (its markdown by title, its numbers by key), for
    the sections a run leaves out."""
    try:
        with open(os.path.join(out_dir, "experiments.md"), encoding="utf-8") as f:
            md = f.read()
        with open(os.path.join(out_dir, "experiments.json"), encoding="utf-8") as f:
            payload = json.load(f)
    except (OSError, ValueError):
        return {}
    bodies: dict[str, str] = {}
    title, lines = None, []
    for line in md.split("\n"):
        if line.startswith(("## ", "_Carried over")) or re.match(r"_\d+ simulations", line):
            if title is not None:
                bodies[title] = "\n".join(lines).strip("\n")
            title, lines = (line[3:].strip(), []) if line.startswith("## ") else (None, [])
        elif title is not None:
            lines.append(line)
    if title is not None:
        bodies[title] = "\n".join(lines).strip("\n")
    titles = {**TITLES, **(payload.get("section_titles") or {})}
    out = {}
    for key, data in (payload.get("sections") or {}).items():
        t = titles.get(key, "")
        if t in bodies:
            out[key] = Section(key, t, bodies[t], data, carried=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", default=os.path.join(HERE, "results"), help="where the report goes")
    ap.add_argument("--quick", action="store_true", help="smaller traces and fewer loads (a smoke test)")
    ap.add_argument(
        "--skip-real",
        action="store_true",
        help="leave out the real CPU runs (they keep the previous report's)",
    )
    ap.add_argument(
        "--links",
        metavar="PROFILE",
        default=MEASURED_LINKS_PROFILE,
        help="section (b): scale h20x16's inter-node terms by the links a `gfdit profile --network` profile measured "
        "(NOTE [inter-node calibration]; bench/bench_layouts_net.py writes one); default: "
        "results/experiments/measured_links.json; '' for the datasheet's terms",
    )
    ap.add_argument(
        "--only",
        metavar="KEY,...",
        help=f"run only these sections ({', '.join(SECTION_KEYS)}); the others keep the previous report's",
    )
    args = ap.parse_args()
    only = set(SECTION_KEYS)
    if args.only:
        only = {k.strip() for k in args.only.split(",") if k.strip()}
        unknown = only - set(SECTION_KEYS)
        if unknown:
            ap.error(
                f"--only: unknown section(s) {', '.join(sorted(unknown))}; known: {', '.join(SECTION_KEYS)}"
            )
        if "headline" in only:
            only.add("main")  # the headline reads the main sweeps
    if args.skip_real:
        only.discard("real")
    os.makedirs(args.out_dir, exist_ok=True)
    previous = previous_sections(args.out_dir)
    lab = Lab(args.out_dir, args.quick, links=args.links or None)
    t0 = time.perf_counter()
    ctx: dict[str, Any] = {}
    sections: dict[str, Section] = {}
    for key, fn in zip(SECTION_KEYS, SECTIONS):
        if key in only:
            s = fn(lab, ctx)
            sections[s.key] = s
        elif key in previous:
            sections[key] = previous[key]
    md_path, json_path = write_report(lab, sections, time.perf_counter() - t0)
    for key in ("headline", "real"):
        if key in only and key in sections:
            print(sections[key].markdown)
    print(
        f"{lab.num_runs} simulations in {lab.sim_wall_s:.0f} s, {lab.real_runs} real replays; "
        f"total {time.perf_counter() - t0:.0f} s"
    )
    print(f"wrote {md_path}, {json_path} and {lab.fig_dir}/*.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
