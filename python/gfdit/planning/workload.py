"""``gfdit trace``: synthetic request traces (workloads) for the simulator and the engine.

    gfdit trace --workload image --arrival poisson --rate 0.5 --duration 600 --slo-scale 3 --seed 0 \\
        --model qwen-image --cluster h20x8 --out image.jsonl

A trace is drawn from four independent random streams of one seed (arrival times, image-or-video, sizes,
priorities), so the same seed at another rate gives the same sequence of request sizes: load sweeps compare
like with like.

Sizes (``height x width``, frames, steps), drawn independently per request, skewed toward the common ones:

- **images** on an image model (Qwen-Image): 1024x1024 35%, 768x768 12%, 512x512 8%, 1280x1280 8%,
  1536x1536 4%, 4:3 and 3:4 (1024x768, 768x1024) 7% each, 16:9 and 9:16 (864x1536, 1536x864) 6% each, 3:2 and
  2:3 (832x1248, 1248x832) 3.5% each. Steps: 50 (the model's default) 45%, 30 20%, 20 15%, 25 10%, 40 10%.
- **images** on a video model (one-frame requests, as Wan serves text-to-image): 480x832 30%, 720x1280 25%,
  768x768 15%, 832x480 10%, 1280x720 10%, 512x512 10%. Steps as for images.
- **videos**: 480x832 (480p) 45%, 720x1280 (720p) 30%, 1280x720 15%, 832x480 10%; frames 81 (the default)
  45%, 49 20%, 33 20%, 121 15%; steps 40 (Wan's default) 50%, 30 20%, 20 15%, 50 15%.

Every menu is fitted to the model: sizes are rounded to the model's spatial stride and, where the model
cannot take the whole menu (the tiny test models), scaled down together until every entry passes the
runtime's request check; frame counts above the model's limit are scaled to 4k+1 counts within it. With a
profile (``--cluster cpu``), sizes the profile cannot price are dropped.

Workloads: ``image`` (image requests), ``video`` (video requests), ``mixed`` (each request a video with
probability ``video_share``, default 0.3, else an image). The simulator and the engine serve one model per
run, so a ``mixed`` trace is one model by default: a video model (``wan2.2``) serving one-frame images and
videos. ``--video-model`` different from ``--model`` gives a two-model trace instead (images of ``--model``,
videos of ``--video-model``), which ``gfdit.planning.trace.load_trace`` reads but a single-model replay refuses.

Arrivals at mean rate ``rate`` (requests/s) over ``duration_s`` seconds:

- ``poisson``: exponential inter-arrival times (coefficient of variation 1).
- ``bursty``: Gamma inter-arrival times with coefficient of variation ``cv`` (default 2): shape 1/cv^2.
- ``onoff``: Poisson bursts at ``burst_factor`` (default 4) times the rate alternating with silence; on and
  off periods are exponential with means cycle/burst_factor and cycle x (1 - 1/burst_factor), where the mean
  cycle is ``burst_cycle_s`` (default: 25 mean inter-arrival times), so the mean rate stays ``rate``.

Deadlines: ``deadline_s = arrival_s + slo_scale x`` the request's latency alone on the cluster at the best
static degree for its shape, where the latency at degree d is encode + steps x step(d) + decode from the
cost model the simulator uses (``gfdit.planning.cost.cost_model``: analytic on the cluster, or the profile's), the
layout Ulysses x d with the guidance passes in turn, and d ranges over the divisors of the cluster's rank
count (the group sizes ``static:d`` tiles it with) up to the model's largest Ulysses degree (its head count,
at most 64). One-off group formation is left out.

``--priority-share p``: each request independently gets priority 1 with probability p (else 0).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from gfdit._C import InvalidUsage
from gfdit.planning.trace import TraceRequest, write_trace

WORKLOADS = ("image", "video", "mixed")
ARRIVALS = ("poisson", "bursty", "onoff")
DEFAULT_IMAGE_MODEL = "qwen-image"
DEFAULT_VIDEO_MODEL = "wan2.2"

# (height, width, weight); weights of a menu sum to 1
IMAGE_SIZES: tuple[tuple[int, int, float], ...] = (
    (1024, 1024, 0.35),
    (768, 768, 0.12),
    (512, 512, 0.08),
    (1280, 1280, 0.08),
    (1536, 1536, 0.04),
    (1024, 768, 0.07),
    (768, 1024, 0.07),
    (864, 1536, 0.06),
    (1536, 864, 0.06),
    (832, 1248, 0.035),
    (1248, 832, 0.035),
)
STILL_SIZES: tuple[tuple[int, int, float], ...] = (  # one-frame requests of a video model
    (480, 832, 0.30),
    (720, 1280, 0.25),
    (768, 768, 0.15),
    (832, 480, 0.10),
    (1280, 720, 0.10),
    (512, 512, 0.10),
)
VIDEO_SIZES: tuple[tuple[int, int, float], ...] = (
    (480, 832, 0.45),
    (720, 1280, 0.30),
    (1280, 720, 0.15),
    (832, 480, 0.10),
)
# (value, weight)
VIDEO_FRAMES: tuple[tuple[int, float], ...] = ((81, 0.45), (49, 0.20), (33, 0.20), (121, 0.15))
IMAGE_STEPS: tuple[tuple[int, float], ...] = ((50, 0.45), (30, 0.20), (20, 0.15), (25, 0.10), (40, 0.10))
VIDEO_STEPS: tuple[tuple[int, float], ...] = ((40, 0.50), (30, 0.20), (20, 0.15), (50, 0.15))


@dataclasses.dataclass(frozen=True)
class Shape:
    """One entry of a fitted size menu: a request shape of one model and its probability."""

    model: str
    height: int
    width: int
    num_frames: int
    num_steps: int
    weight: float


# ------------------------------------------------------------------------------------------------ cost
class Pricer:
    """Alone latencies of request shapes on one cluster, from the cost models the simulator uses.

    ``cluster``: a cluster name (``cpu`` needs ``profile``, whose world size gives its rank count).
    ``profile``: a path or a ``gfdit.planning.cost.Profile``; its model must be every priced model."""

    def __init__(self, cluster: str = "h20x8", profile: Any = None) -> None:
        from gfdit.planning import cost

        self._prof = None
        if profile is not None:
            self._prof = profile if isinstance(profile, cost.Profile) else cost.load_profile(profile)
        elif cluster == "cpu":
            raise InvalidUsage(
                "the cpu cluster is this machine: it needs a profile (written by `gfdit profile`)"
            )
        num_ranks = int(self._prof.world_size) if cluster == "cpu" and self._prof is not None else 0
        self.cluster = cost.cluster(cluster, num_ranks)  # unknown names: InvalidUsage listing the valid ones
        self.cluster_name = cluster
        self._models: dict[str, Any] = {}
        self._cache: dict[tuple[str, int, int, int, int], tuple[float, int] | None] = {}

    def cost_model(self, model: str) -> Any:
        """The cost model of ``model`` on this cluster (the profile's when there is one)."""
        from gfdit.planning import cost

        if model not in self._models:
            self._models[model] = cost.cost_model(model, self.cluster, profile=self._prof)
        return self._models[model]

    def degrees(self, model: str) -> list[int]:
        """Degrees that divide the cluster's rank count, up to the model's largest Ulysses degree."""
        from gfdit._C import runtime
        from gfdit.planning import cost

        ranks = int(self.cluster.num_ranks)
        limit = min(ranks, runtime.max_ulysses_degree(int(cost.model_arch(model).heads)))
        return [d for d in range(1, limit + 1) if ranks % d == 0]

    def _parts(
        self, model: str, height: int, width: int, num_frames: int, num_steps: int, degree: int
    ) -> tuple[float, float]:
        """(encode + steps x step on the group, decode) of a request alone on a ``static:degree`` group (Ulysses
        x degree, on contiguous ranks); the decode on as many of the group as the fastest predicted one, at most
        the latent's rows, as the control plane splits it (NOTE [parallel decode] in src/runtime/control.cpp).
        InvalidUsage when the cost model cannot price it."""
        from gfdit.planning import cost

        cm = self.cost_model(model)
        guidance = float(cost.model_arch(model).default_guidance)
        per_node = max(1, int(self.cluster.ranks_per_node))
        common = {"num_steps": num_steps, "guidance_scale": guidance}
        group = {"degree": degree, "ulysses": degree, "num_nodes": -(-degree // per_node)}
        encode = cm.seconds(cost.Stage.ENCODE, height, width, num_frames, **common, **group)
        step = cm.seconds(cost.Stage.DENOISE, height, width, num_frames, **common, **group)
        d = cost.best_decode_degree(cm, height, width, num_frames, max_degree=degree, ranks_per_node=per_node)
        nodes = -(-d // per_node)
        decode = cm.seconds(cost.Stage.DECODE, height, width, num_frames, degree=d, num_nodes=nodes, **common)
        return encode + num_steps * step, decode

    def latency(
        self, model: str, height: int, width: int, num_frames: int, num_steps: int, degree: int
    ) -> float:
        """encode + steps x step + decode of one request alone on a ``static:degree`` group (Ulysses x degree,
        on contiguous ranks). Raises InvalidUsage when the cost model cannot price it (a profile's gaps)."""
        return sum(self._parts(model, height, width, num_frames, num_steps, degree))

    def best(
        self, model: str, height: int, width: int, num_frames: int, num_steps: int
    ) -> tuple[float, int] | None:
        """(latency, degree) at the best static degree for the shape; None when no degree can be priced."""
        key = (model, height, width, num_frames, num_steps)
        if key not in self._cache:
            found: tuple[float, int] | None = None
            for d in self.degrees(model):
                try:
                    t = self.latency(model, height, width, num_frames, num_steps, d)
                except InvalidUsage:  # a profile without this degree or size
                    continue
                if found is None or t < found[0]:
                    found = (t, d)
            self._cache[key] = found
        return self._cache[key]

    def alone_latency(self, model: str, height: int, width: int, num_frames: int, num_steps: int) -> float:
        """The latency at the best static degree; InvalidUsage when the cost model cannot price the shape."""
        found = self.best(model, height, width, num_frames, num_steps)
        if found is None:
            raise InvalidUsage(
                f"the cost model of {model} on {self.cluster_name} cannot price "
                f"{height}x{width}x{num_frames} ({num_steps} steps) at any degree"
            )
        return found[0]

    def rank_seconds(self, model: str, height: int, width: int, num_frames: int, num_steps: int) -> float:
        """The least rank-seconds the request occupies on any static degree: degree x (encode + steps x
        step) + decode (which runs on one rank)."""
        best = math.inf
        for d in self.degrees(model):
            try:
                group_s, decode_s = self._parts(model, height, width, num_frames, num_steps, d)
            except InvalidUsage:
                continue
            best = min(best, d * group_s + decode_s)
        if not math.isfinite(best):
            raise InvalidUsage(f"the cost model of {model} on {self.cluster_name} cannot price this shape")
        return best


# ------------------------------------------------------------------------------------------------ sizes
def _valid(model: str, h: int, w: int, f: int, steps: int) -> bool:
    from gfdit._C import runtime

    try:
        runtime.check_request(model, h, w, f, steps)
    except InvalidUsage:
        return False
    return True


def _fit_frames(frames: Sequence[tuple[int, float]], arch: Any) -> list[tuple[int, float]]:
    """Frame counts within the model's limit: unchanged when all fit, else scaled onto 4k+1 counts in it."""
    t = max(1, int(arch.vae_stride_t))
    limit = int(arch.max_frames)
    if all(f <= limit for f, _ in frames):
        return list(frames)
    top = max(f for f, _ in frames)
    scale = (limit - 1) / (top - 1)
    merged: dict[int, float] = {}
    for f, p in frames:
        g = 1 + t * max(1, min((limit - 1) // t, round((f - 1) * scale / t)))
        merged[g] = merged.get(g, 0.0) + p
    return sorted(merged.items(), key=lambda x: -x[1])


def fit_menu(
    model: str,
    sizes: Sequence[tuple[int, int, float]],
    frames: Sequence[tuple[int, float]],
    steps: Sequence[tuple[int, float]],
    pricer: Pricer | None = None,
) -> list[Shape]:
    """The cross product of a size, frame and step menu, fitted to ``model`` (see the module's docstring):
    sizes on the model's stride, scaled down together until every shape passes the request check; with a
    pricer, shapes it cannot price are dropped. InvalidUsage when nothing is left."""
    from gfdit.planning import cost

    arch = cost.model_arch(model)
    m = int(arch.spatial_multiple())
    frames = _fit_frames(frames, arch) if arch.is_video else [(1, 1.0)]
    if any(f > 1 for f, _ in frames) and not arch.is_video:
        raise InvalidUsage(f"{model} is an image model: it cannot serve videos")
    scale = 1.0
    for _ in range(400):
        shapes: dict[tuple[int, int, int, int], float] = {}
        for h, w, p in sizes:
            hh = max(m, round(h * scale / m) * m)
            ww = max(m, round(w * scale / m) * m)
            for f, pf in frames:
                for s, ps in steps:
                    key = (hh, ww, f, s)
                    shapes[key] = shapes.get(key, 0.0) + p * pf * ps
        if all(_valid(model, *key) for key in shapes):
            break
        scale *= 0.98
    else:
        raise InvalidUsage(f"no size of the menu fits {model} (even scaled down)")
    out = [Shape(model, h, w, f, s, p) for (h, w, f, s), p in shapes.items()]
    if pricer is not None:
        out = [x for x in out if pricer.best(model, x.height, x.width, x.num_frames, x.num_steps) is not None]
        if not out:
            raise InvalidUsage(
                f"the cost model of {model} on {pricer.cluster_name} can price none of the workload's sizes "
                "(profile the sizes it needs with `gfdit profile`)"
            )
    total = sum(x.weight for x in out)
    return [dataclasses.replace(x, weight=x.weight / total) for x in out]


def _resolve_models(workload: str, model: str | None, video_model: str | None) -> tuple[str, str | None]:
    """(model of the image requests, model of the video requests or None) of a workload."""
    from gfdit.planning import cost

    if workload not in WORKLOADS:
        raise InvalidUsage(f"unknown workload {workload!r}; valid: {', '.join(WORKLOADS)}")
    if model is None:
        model = DEFAULT_IMAGE_MODEL if workload == "image" else DEFAULT_VIDEO_MODEL
    for name in (model, video_model):
        if name is not None and name not in list(cost.model_names()):
            raise InvalidUsage(f"unknown model {name!r} (known: {', '.join(cost.model_names())})")
    if workload == "image":
        return model, None
    video = video_model or model
    if not cost.model_arch(video).is_video:
        hint = " (pass a video --model, or --video-model)" if workload == "mixed" else ""
        raise InvalidUsage(f"the {workload} workload needs a video model; {video} is an image model{hint}")
    return model, video


def workload_menus(
    workload: str,
    model: str | None = None,
    video_model: str | None = None,
    video_share: float = 0.3,
    pricer: Pricer | None = None,
) -> list[tuple[float, list[Shape]]]:
    """The workload's menus as (share of requests, fitted menu): images and/or videos."""
    from gfdit.planning import cost

    image_model, vid_model = _resolve_models(workload, model, video_model)
    if not 0.0 <= video_share <= 1.0:
        raise InvalidUsage(f"video_share must be in [0, 1], got {video_share}")
    menus: list[tuple[float, list[Shape]]] = []
    share = {"image": 0.0, "video": 1.0, "mixed": video_share}[workload]
    if share < 1.0:
        stills = cost.model_arch(image_model).is_video
        sizes = STILL_SIZES if stills else IMAGE_SIZES
        menus.append((1.0 - share, fit_menu(image_model, sizes, [(1, 1.0)], IMAGE_STEPS, pricer)))
    if share > 0.0:
        assert vid_model is not None
        menus.append((share, fit_menu(vid_model, VIDEO_SIZES, VIDEO_FRAMES, VIDEO_STEPS, pricer)))
    return menus


# ------------------------------------------------------------------------------------------------ arrivals
def arrival_times(
    arrival: str,
    rate: float,
    duration_s: float,
    rng: np.random.Generator,
    *,
    cv: float = 2.0,
    burst_factor: float = 4.0,
    burst_cycle_s: float | None = None,
) -> list[float]:
    """Arrival times in [0, duration_s) of a process with mean rate ``rate`` (see the module's docstring)."""
    if arrival not in ARRIVALS:
        raise InvalidUsage(f"unknown arrival process {arrival!r}; valid: {', '.join(ARRIVALS)}")
    if not (rate > 0 and math.isfinite(rate)):
        raise InvalidUsage(f"rate must be a positive number, got {rate}")
    if not (duration_s > 0 and math.isfinite(duration_s)):
        raise InvalidUsage(f"duration must be a positive number, got {duration_s}")
    if not cv > 0:
        raise InvalidUsage(f"cv must be positive, got {cv}")
    if not burst_factor > 1:
        raise InvalidUsage(f"burst_factor must be above 1, got {burst_factor}")
    expected = rate * duration_s
    batch = int(expected + 10 * math.sqrt(expected) + 16)
    if arrival in ("poisson", "bursty"):
        shape = 1.0 if arrival == "poisson" else 1.0 / (cv * cv)
        out: list[float] = []
        t = 0.0
        while True:  # batches of gaps until past the end (usually one)
            gaps = (
                rng.exponential(1.0 / rate, batch)
                if shape == 1.0
                else rng.gamma(shape, 1.0 / (rate * shape), batch)
            )
            times = t + np.cumsum(gaps)
            keep = times[times < duration_s]
            out.extend(float(x) for x in keep)
            if len(keep) < len(times):
                return out
            t = float(times[-1])
    cycle = burst_cycle_s if burst_cycle_s is not None else 25.0 / rate
    if not cycle > 0:
        raise InvalidUsage(f"burst_cycle_s must be positive, got {burst_cycle_s}")
    on_mean, off_mean = cycle / burst_factor, cycle * (1.0 - 1.0 / burst_factor)
    burst_rate = rate * burst_factor
    out = []
    t = 0.0
    on = bool(rng.random() < 1.0 / burst_factor)  # the stationary share of time in bursts
    while t < duration_s:
        if on:
            end = min(duration_s, t + float(rng.exponential(on_mean)))
            while True:  # memoryless: the gap that overshoots the burst's end is dropped
                t += float(rng.exponential(1.0 / burst_rate))
                if t >= end:
                    break
                out.append(t)
            t = end
        else:
            t += float(rng.exponential(off_mean))
        on = not on
    return out


# ------------------------------------------------------------------------------------------------ traces
def generate(
    workload: str,
    arrival: str,
    rate: float,
    duration_s: float,
    slo_scale: float,
    seed: int,
    *,
    model: str | None = None,
    video_model: str | None = None,
    cluster: str = "h20x8",
    profile: Any = None,
    video_share: float = 0.3,
    priority_share: float = 0.0,
    cv: float = 2.0,
    burst_factor: float = 4.0,
    burst_cycle_s: float | None = None,
    pricer: Pricer | None = None,
) -> list[TraceRequest]:
    """A trace of ``workload`` requests arriving at mean rate ``rate`` over ``duration_s`` seconds, with
    deadlines ``slo_scale`` times each request's alone latency on ``cluster`` after its arrival. Same
    arguments, same trace. ``model``: the image requests' model (default: qwen-image for ``image``, wan2.2
    otherwise); ``video_model``: the video requests' (default ``model``). ``pricer`` (optional) reuses the
    cost models of an earlier call on the same cluster; it overrides ``cluster`` and ``profile``. Bad
    arguments raise InvalidUsage."""
    if not (slo_scale > 0 and math.isfinite(slo_scale)):
        raise InvalidUsage(f"slo_scale must be a positive number, got {slo_scale}")
    if not 0.0 <= priority_share <= 1.0:
        raise InvalidUsage(f"priority_share must be in [0, 1], got {priority_share}")
    pricer = pricer or Pricer(cluster, profile)
    menus = workload_menus(workload, model, video_model, video_share, pricer)
    arrival_rng, kind_rng, size_rng, prio_rng = (
        np.random.Generator(np.random.PCG64(s)) for s in np.random.SeedSequence(seed).spawn(4)
    )
    times = arrival_times(
        arrival, rate, duration_s, arrival_rng, cv=cv, burst_factor=burst_factor, burst_cycle_s=burst_cycle_s
    )
    n = len(times)
    shares = np.array([share for share, _ in menus])
    kinds = (
        kind_rng.choice(len(menus), size=n, p=shares / shares.sum()) if len(menus) > 1 else np.zeros(n, int)
    )
    picks = [size_rng.choice(len(menu), size=n, p=np.array([s.weight for s in menu])) for _, menu in menus]
    priorities = prio_rng.random(n) < priority_share
    requests = []
    for i, t in enumerate(times):
        k = int(kinds[i])
        s = menus[k][1][int(picks[k][i])]
        budget = pricer.alone_latency(s.model, s.height, s.width, s.num_frames, s.num_steps)
        requests.append(
            TraceRequest(
                id=i,
                arrival_s=t,
                model=s.model,
                height=s.height,
                width=s.width,
                num_frames=s.num_frames,
                num_inference_steps=s.num_steps,
                deadline_s=t + slo_scale * budget,
                priority=int(priorities[i]),
            )
        )
    return requests


def capacity_rps(
    workload: str,
    *,
    model: str | None = None,
    video_model: str | None = None,
    cluster: str = "h20x8",
    profile: Any = None,
    video_share: float = 0.3,
    pricer: Pricer | None = None,
) -> float:
    """Requests per second the cluster completes when every rank is busy and each request runs at its most
    rank-efficient static degree: ranks / E[least rank-seconds of a request] (see ``Pricer.rank_seconds``),
    the expectation over the workload's size menus. A load of 1.0 is this rate."""
    pricer = pricer or Pricer(cluster, profile)
    expected = 0.0
    for share, menu in workload_menus(workload, model, video_model, video_share, pricer):
        expected += share * sum(
            s.weight * pricer.rank_seconds(s.model, s.height, s.width, s.num_frames, s.num_steps)
            for s in menu
        )
    return float(pricer.cluster.num_ranks) / expected


# ------------------------------------------------------------------------------------------------ CLI
def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """Arguments of ``gfdit trace``."""
    parser.add_argument(
        "--workload", choices=WORKLOADS, required=True, help="image, video, or mixed requests"
    )
    parser.add_argument(
        "--arrival", choices=ARRIVALS, default="poisson", help="arrival process (default poisson)"
    )
    rate = parser.add_mutually_exclusive_group(required=True)
    rate.add_argument("--rate", type=float, help="mean arrival rate, requests/s")
    rate.add_argument(
        "--load", type=float, help="mean arrival rate as a share of the cluster's capacity (see capacity_rps)"
    )
    parser.add_argument("--duration", type=float, required=True, help="seconds of arrivals")
    parser.add_argument(
        "--slo-scale",
        type=float,
        required=True,
        help="deadline = arrival + K x the alone latency at the best degree",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--model",
        help=f"model of the image requests (default {DEFAULT_IMAGE_MODEL}; {DEFAULT_VIDEO_MODEL} for video/mixed)",
    )
    parser.add_argument("--video-model", help="model of the video requests (default: --model)")
    parser.add_argument("--video-share", type=float, default=0.3, help="mixed: share of videos (default 0.3)")
    parser.add_argument("--cluster", default="h20x8", help="cluster whose cost model sets the deadlines")
    parser.add_argument("--profile", help="profile file from `gfdit profile` (needed for --cluster cpu)")
    parser.add_argument("--priority-share", type=float, default=0.0, help="share of requests with priority 1")
    parser.add_argument("--cv", type=float, default=2.0, help="bursty: coefficient of variation of the gaps")
    parser.add_argument("--burst-factor", type=float, default=4.0, help="onoff: burst rate / mean rate")
    parser.add_argument("--burst-cycle", type=float, help="onoff: mean seconds of a burst plus a silence")
    parser.add_argument("--out", required=True, help="JSONL trace to write")


def run(args: argparse.Namespace, command: str) -> int:
    """Runs ``gfdit trace``: writes the trace and prints what it holds; 2 for bad input."""
    try:
        pricer = Pricer(args.cluster, args.profile)
        models = {"model": args.model, "video_model": args.video_model, "video_share": args.video_share}
        capacity = capacity_rps(args.workload, pricer=pricer, **models)
        rate = args.rate if args.rate is not None else args.load * capacity
        requests = generate(
            args.workload,
            args.arrival,
            rate,
            args.duration,
            args.slo_scale,
            args.seed,
            priority_share=args.priority_share,
            cv=args.cv,
            burst_factor=args.burst_factor,
            burst_cycle_s=args.burst_cycle,
            pricer=pricer,
            **models,
        )
        if not requests:
            raise InvalidUsage(f"no request arrives in {args.duration} s at {rate:.4g} requests/s")
        write_trace(args.out, requests)
    except InvalidUsage as e:
        print(f"gfdit {command}: {e.message}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"gfdit {command}: cannot write {args.out}: {e.strerror}", file=sys.stderr)
        return 2
    videos = sum(r.num_frames > 1 for r in requests)
    budgets = [r.deadline_s - r.arrival_s for r in requests if r.deadline_s is not None]  # generate sets all
    print(
        f"gfdit {command}: wrote {len(requests)} requests to {args.out}: {args.workload} ({videos} videos), "
        f"{args.arrival} arrivals at {rate:.4g}/s ({rate / capacity:.2f} x the capacity of {capacity:.4g}/s on "
        f"{args.cluster}), models {', '.join(sorted({r.model for r in requests}))}, deadline budgets "
        f"{min(budgets):.3g}..{max(budgets):.3g} s"
    )
    return 0
