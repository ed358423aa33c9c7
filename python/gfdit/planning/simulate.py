"""``gfdit simulate``: a trace replayed on the simulator, the C++ control plane on a virtual clock
(``gfdit._C.runtime.Simulator``) with the cost model of a cluster (analytic, or fitted from ``gfdit profile``'s
file).

A replay on the real engine (``gfdit run-trace``, gfdit.tools.replay) produces the same records
(``gfdit.planning.trace.Outcome`` per request, ``gfdit.planning.trace.Interval`` per task and rank), summarised
by the same ``summarize`` and drawn by the same plots here, so a simulated and a real replay of a trace
compare line by line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from gfdit import plots
from gfdit._C import InvalidUsage
from gfdit.planning.trace import (
    Interval,
    Outcome,
    TraceRequest,
    format_summary,
    load_trace,
    summarize,
)

# Legend entries of the timeline plot beyond the stage kinds: one per request, at most this many.
MAX_LEGEND_REQUESTS = 12


@dataclasses.dataclass
class Replay:
    """The outcome of replaying a trace, real or simulated."""

    policy: str
    outcomes: list[Outcome]
    busy_rank_s: float  # rank-seconds spent running tasks
    num_ranks: int
    intervals: list[Interval]  # per task and rank (empty unless recorded)
    wall_s: float  # how long the replay took to compute or run
    where: str  # what it ran on, for people ("engine tiny-wan x2", "h20x8: analytic ...")

    def summary(self) -> dict[str, Any]:
        return summarize(self.policy, self.outcomes, self.busy_rank_s, self.num_ranks)


# ------------------------------------------------------------------------------------------------ simulate
def simulate_trace(
    requests: Sequence[TraceRequest],
    *,
    model: str,
    cluster: str,
    policy: str | Any,
    profile: str | None = None,
    max_inflight_steps: int = 2,
    record_intervals: bool = False,
    regroup_s: float | None = None,
    regroup_every_change: bool | None = None,
    cache: str | None = None,
    cache_seed: int = 0,
    skip_curves: Sequence[Any] = (),
) -> Replay:
    """Runs the trace through the simulator: the control plane and ``policy`` (a built-in's name or a
    ``gfdit.Policy`` object, the same one an engine takes) on ``cluster``'s ranks, stage times from the cost
    model (analytic, or ``profile``'s measurements). The ``cpu`` cluster needs a profile and has as many ranks
    as the profile's world size. Unknown clusters or policies raise InvalidUsage naming the valid ones.

    ``regroup_s``: the cost of forming a group (None: the cluster's hardware value, about a microsecond for
    gfdit's group-free collectives). ``regroup_every_change``: charge it each time a request's group changes
    rather than on the first use of a rank set (None: the simulator's default). ``cache``: the step cache of the
    requests that name none (NOTE [step caches]); which of their steps reuse it is drawn from the cost model's
    skip curve with ``cache_seed`` (NOTE [simulated execution]); ``skip_curves`` (``gfdit._C.runtime.SkipCurve``
    objects) stand in for the cost model's own of their kinds."""
    from gfdit._C import cost as cost_c
    from gfdit._C import runtime as rt

    if cluster == "cpu" and profile is None:
        raise InvalidUsage("the cpu cluster is this machine: it needs --profile (written by `gfdit profile`)")
    from gfdit.planning import cost

    prof = cost.load_profile(profile) if profile is not None else None
    num_ranks = prof.world_size if cluster == "cpu" and prof is not None else 0
    cl = cost_c.cluster(cluster, num_ranks)  # unknown names: InvalidUsage listing the valid ones
    check_policy(policy, int(cl.num_ranks))
    cm = cost.cost_model(model, cluster, profile=prof)
    if skip_curves:
        cm = cost_c.with_skip_curves(cm, list(skip_curves))
    sim_requests = [
        rt.SimRequest(
            id=r.id,
            arrival_s=r.arrival_s,
            height=r.height,
            width=r.width,
            num_frames=r.num_frames,
            num_steps=r.num_inference_steps,
            guidance_scale=None,
            deadline_s=r.deadline_s,
            priority=r.priority,
            cache=r.cache if r.cache is not None else cache,
        )
        for r in requests
    ]
    overheads: dict[str, Any] = {}
    if prof is not None:  # what this machine measured: ring round trips, and the cores the ranks share
        overheads = {
            "dispatch_s": prof.dispatch_s,
            "completion_s": prof.completion_s,
            "num_cores": prof.num_cores if cluster == "cpu" else -1,
            "collective_efficiency": prof.collective_efficiency,
        }
    if regroup_s is not None:
        if not regroup_s >= 0:
            raise InvalidUsage(f"regroup_s must be a number >= 0, got {regroup_s}")
        overheads["regroup_s"] = regroup_s
    if regroup_every_change is not None:
        overheads["regroup_every_change"] = regroup_every_change
    sim = rt.Simulator(
        cm,
        cl,
        policy,
        max_inflight_steps=max_inflight_steps,
        record_intervals=record_intervals,
        cache_seed=cache_seed,
        **overheads,
    )
    t0 = time.perf_counter()
    res = sim.run(sim_requests)
    wall = time.perf_counter() - t0
    # the trace's own times: the simulator's arrival is the trace's, and the deadline is read the same way
    outcomes = [
        Outcome(
            id=r.id,
            arrival_s=r.arrival_s,
            finish_s=float(o.finish_s) if o.state == "DONE" else None,
            deadline_s=r.deadline_s,
            state=o.state,
            priority=r.priority,
        )
        for r, o in zip(requests, res.requests)  # the simulator keeps the trace's order
    ]
    outcomes.sort(key=lambda o: (o.arrival_s, o.id))
    intervals = [
        Interval(rank=int(rank), request_id=int(rid), kind=str(kind), start_s=float(s), end_s=float(e))
        for rank, rid, kind, s, e in (res.intervals if record_intervals else [])
    ]
    describe = cm.describe()
    return Replay(
        policy=_policy_name(policy),
        outcomes=outcomes,
        busy_rank_s=float(res.busy_rank_s),
        num_ranks=int(res.num_ranks),
        intervals=intervals,
        wall_s=wall,
        where=f"{cluster} ({int(res.num_ranks)} ranks), {describe}",
    )


def check_policy(policy: str | Any, num_ranks: int) -> None:
    """Refuses an unknown policy with the valid names (from the runtime, the one place that knows them), and
    anything that is neither a name nor a ``gfdit.Policy``."""
    from gfdit._C import runtime as rt

    if isinstance(policy, rt.Policy):
        return
    if not isinstance(policy, str):
        raise InvalidUsage(
            f"a policy is a built-in's name or a gfdit.Policy object, got {type(policy).__name__}"
        )
    try:
        rt.make_policy(policy)  # parses the name the way the simulator and the engine do
    except InvalidUsage as e:
        raise InvalidUsage(e.message, param=e.param) from None  # names the built-in policies
    if policy.startswith("static:") and num_ranks % int(policy.split(":")[1]) != 0:
        raise InvalidUsage(
            f"policy {policy!r} needs a rank count divisible by its degree; the cluster has {num_ranks}"
        )


def _policy_name(policy: str | Any) -> str:
    return policy if isinstance(policy, str) else str(policy.name())


# ------------------------------------------------------------------------------------------------ plots
_KIND_STYLE: dict[str, dict[str, Any]] = {
    # steps: solid in the request's colour; encode/decode: pale and hatched; migrations: near-black marks
    "denoise": {"alpha": 1.0, "hatch": None, "edgecolor": "white", "linewidth": 0.3},
    "encode": {"alpha": 0.45, "hatch": "////", "edgecolor": "0.25", "linewidth": 0.3},
    "decode": {"alpha": 0.45, "hatch": "....", "edgecolor": "0.25", "linewidth": 0.3},
    "migrate": {"alpha": 1.0, "hatch": None, "edgecolor": "black", "linewidth": 0.6, "facecolor": "0.1"},
}


def plot_latency_cdf(outcomes: Sequence[Outcome], path: str, title: str = "") -> None:
    """Writes the CDF of completed requests' latencies to ``path`` (PNG). With deadlines, the latency
    budgets (deadline - arrival) are drawn too (a line when all are equal, else their CDF) and requests
    that completed late are marked."""
    ax = plots.axes(7, 4.5)
    # (latency, outcome) of the completed requests (latency_s is None for the others), by latency
    done = sorted(((lat, o) for o in outcomes if (lat := o.latency_s) is not None), key=lambda d: d[0])
    n = len(done)
    if n:
        plots.cdf(ax, [lat for lat, _ in done], color="C0", label=f"latency ({n} completed)")
        late = [
            (lat, (i + 1) / n)
            for i, (lat, o) in enumerate(done)
            if o.deadline_s is not None and not o.met_deadline
        ]
        if late:
            ax.scatter(
                *zip(*late),
                marker="x",
                s=14,
                linewidths=0.8,
                color="red",
                zorder=3,
                label=f"missed deadline ({len(late)})",
            )
    else:
        plots.empty(ax, "no request completed")
    budgets = sorted(o.deadline_s - o.arrival_s for o in outcomes if o.deadline_s is not None)
    if budgets:
        if budgets[-1] - budgets[0] <= 1e-6 * max(1.0, budgets[-1]):  # one budget (up to rounding)
            ax.axvline(
                budgets[0], color="red", linestyle="--", label=f"deadline ({budgets[0]:.3g} s after arrival)"
            )
        else:
            plots.cdf(ax, budgets, color="red", linestyle="--", label="deadline budgets (CDF)")
    ax.set_xlabel("latency (s)")
    ax.set_ylabel("fraction of completed requests")
    ax.set_ylim(0, 1.02)
    ax.set_xlim(left=0)
    ax.grid(True, alpha=0.3)
    ax.set_title(title or "latency CDF")
    if n or budgets:
        ax.legend(loc="lower right", fontsize="small")
    plots.save(ax, path)


def plot_timeline(intervals: Sequence[Interval], num_ranks: int, path: str, title: str = "") -> None:
    """Writes a per-rank Gantt chart to ``path`` (PNG): one row per rank, one bar per task, coloured by
    request; encode and decode hatched, migrations dark, so that regroupings show. The legend names the
    stage kinds and at most MAX_LEGEND_REQUESTS requests."""
    from matplotlib import colormaps
    from matplotlib.patches import Patch

    ax = plots.axes(12, max(2.5, 0.4 * num_ranks + 1.6))
    palette = colormaps["tab20"]
    order: dict[int, int] = {}
    for iv in sorted(intervals, key=lambda iv: (iv.start_s, iv.request_id)):
        order.setdefault(iv.request_id, len(order))

    def colour(rid: int) -> Any:
        return palette(order[rid] % palette.N)

    # one broken_barh per (rank, kind): hundreds of requests stay a handful of artists
    groups: dict[tuple[int, str], list[Interval]] = {}
    for iv in intervals:
        groups.setdefault((iv.rank, iv.kind), []).append(iv)
    for (rank, kind), ivs in groups.items():
        style = dict(_KIND_STYLE.get(kind, _KIND_STYLE["denoise"]))
        face = style.pop("facecolor", None)
        alpha = style.pop("alpha")
        colours = [face if face is not None else colour(iv.request_id) for iv in ivs]
        bars = ax.broken_barh(
            [(iv.start_s, max(iv.end_s - iv.start_s, 0.0)) for iv in ivs],
            (rank - 0.4, 0.8),
            facecolors=colours,
            **style,
        )
        bars.set_alpha(alpha)
    ax.set_ylim(num_ranks - 0.5, -0.5)
    ax.set_yticks(range(num_ranks) if num_ranks <= 32 else range(0, num_ranks, max(1, num_ranks // 16)))
    ax.set_ylabel("rank")
    ax.set_xlabel("time since the trace's start (s)")
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_title(title or "timeline")
    handles = [Patch(facecolor="0.6", edgecolor="white", label="denoising step")]
    kinds = {iv.kind for iv in intervals}
    for kind, label in (("encode", "encode"), ("decode", "decode"), ("migrate", "migrate")):
        if kind in kinds:
            s = _KIND_STYLE[kind]
            handles.append(
                Patch(
                    facecolor=s.get("facecolor", "0.6"),
                    alpha=s["alpha"],
                    hatch=s["hatch"],
                    edgecolor=s["edgecolor"],
                    label=label,
                )
            )
    shown = list(order)[:MAX_LEGEND_REQUESTS]
    handles += [Patch(facecolor=colour(rid), label=f"request {rid}") for rid in shown]
    if len(order) > len(shown):
        handles.append(Patch(facecolor="none", edgecolor="none", label=f"... {len(order) - len(shown)} more"))
    if not intervals:
        plots.empty(ax, "no tasks recorded")
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)
    plots.save(ax, path)


def write_plots(replay: Replay, directory: str) -> list[str]:
    """latency_cdf.png and timeline.png of a replay in ``directory`` (created); returns their paths."""
    os.makedirs(directory, exist_ok=True)
    summary = replay.summary()
    slo = summary["slo_attainment"]
    slo_text = f", SLO {slo:.0%}" if slo is not None else ""
    cdf = os.path.join(directory, "latency_cdf.png")
    timeline = os.path.join(directory, "timeline.png")
    plot_latency_cdf(replay.outcomes, cdf, f"latency CDF: {replay.policy} on {replay.where}{slo_text}")
    plot_timeline(replay.intervals, replay.num_ranks, timeline, f"{replay.policy} on {replay.where}")
    return [cdf, timeline]


# ------------------------------------------------------------------------------------------------ CLI
def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments ``gfdit simulate`` and ``gfdit run-trace`` share (the trace, the policy, the outputs)."""
    parser.add_argument("--trace", required=True, help="JSONL trace (see gfdit.planning.trace)")
    parser.add_argument("--policy", required=True, help="scheduling policy: fcfs, static:D, ...")
    parser.add_argument("--json", metavar="OUT", help="also write the metrics to this JSON file")
    parser.add_argument("--plot", metavar="DIR", help="write latency_cdf.png and timeline.png into DIR")


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """Arguments of ``gfdit simulate``."""
    add_common_arguments(parser)
    parser.add_argument(
        "--cluster",
        required=True,
        help="simulated cluster: h20x8, a100x8, h100x8, h200x8, h20x16, or cpu (needs --profile)",
    )
    parser.add_argument(
        "--model", required=True, help="model name of the cost model (qwen-image, wan2.2, ...)"
    )
    parser.add_argument(
        "--max-inflight-steps",
        type=int,
        default=2,
        help="steps of one request dispatched ahead of completions (as the engine)",
    )
    parser.add_argument("--profile", help="profile file from `gfdit profile`: stage times from measurements")
    parser.add_argument(
        "--cache",
        default=None,
        help="the step cache of every request whose trace line names none ('fbcache:0.08', ...; README, 'Step "
        "caching'): which steps reuse it is drawn from the cost model's skip curve",
    )


def report(replay: Replay, args: argparse.Namespace, command: str) -> int:
    """Prints a replay's summary, and writes its JSON and plots when asked; returns 0."""
    summary = replay.summary()
    completed = sum(o.completed for o in replay.outcomes)
    print(
        f"gfdit {command}: {args.trace}: {completed} of {len(replay.outcomes)} requests completed; "
        f"{replay.policy} on {replay.where}; {replay.wall_s:.3g} s"
    )
    print(format_summary(summary))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2)
            f.write("\n")
    if args.plot:
        for p in write_plots(replay, args.plot):
            print(f"wrote {p}")
    return 0


def run(args: argparse.Namespace, command: str) -> int:
    """Runs ``gfdit simulate``; 2 for bad input (message on stderr)."""
    try:
        requests = load_trace(args.trace, model=args.model)
        replay = simulate_trace(
            requests,
            model=args.model,
            cluster=args.cluster,
            policy=args.policy,
            profile=args.profile,
            max_inflight_steps=args.max_inflight_steps,
            record_intervals=bool(args.plot),
            cache=args.cache,
        )
    except InvalidUsage as e:
        print(f"gfdit {command}: {e.message}", file=sys.stderr)
        return 2
    return report(replay, args, command)
