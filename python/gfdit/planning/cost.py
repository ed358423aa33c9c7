"""The cost model from Python: stage estimates, profiles, and the ``gfdit cost`` command.

The model lives in C++ (``gfdit._C.cost``); this module fills in defaults, reads and writes profile files (the
one place that does: their schema is the C++ ``ProfileEntry``, their formats are at PROFILE_FORMAT) and prints.

    >>> import gfdit.planning.cost
    >>> gfdit.planning.cost.estimate("qwen-image", "h20", ulysses=4)["step_s"]  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from gfdit._C import InvalidUsage
from gfdit._C import cost as _C
from gfdit._C import runtime as _rt

Stage = _C.Stage
LayoutMode = _rt.LayoutMode
Profile = _C.Profile
ProfileEntry = _C.ProfileEntry
CostModel = _C.CostModel
ModelArch = _C.ModelArch
Hardware = _C.Hardware
Cluster = _C.Cluster
LinkMeasurement = _C.LinkMeasurement

model_arch = _C.model_arch
model_names = _C.model_names
hardware = _C.hardware
hardware_names = _C.hardware_names
cluster = _C.cluster
cluster_names = _C.cluster_names

stage_name = _C.stage_name
layout_mode_name = _rt.layout_mode_name
best_decode_degree = _C.best_decode_degree
activation_bytes_per_rank = _C.activation_bytes_per_rank
max_batch = _C.max_batch

# Names of the stages and modes, as the C++ names them (cost.h, layout.h), in their order there.
STAGES: dict[str, Any] = {stage_name(s): s for s in Stage.__members__.values()}
MODES: dict[str, Any] = {layout_mode_name(m): m for m in LayoutMode.__members__.values()}

# The profile formats. gfdit-profile/2, which write_profile writes, names each stage as the task kind that runs
# it (STAGES). gfdit-profile/1 is the same but for one name: it called the denoise stage "step". load_profile
# reads both, a /1 file's "step" entries as "denoise"; each format takes only its own stage names. Older still,
# an entry without "cfg" (written before CFG-parallel) is cfg 1, one without "batch" (written before batches)
# batch 1, and one without "samples" has 0. An optional "caches" object holds what `gfdit profile --caches`
# measured of each step cache (NOTE [step caches] in include/gfdit/step_cache.h): {"fbcache": {"step_ratio": a
# cached step over a full one, "skip": [[threshold, probability a pass past its warm-up reuses it], ...],
# "source": how}, "teacache": ...}; a profile without it predicts from the model's published figures, if any.
# An optional "links" list holds what `gfdit profile --network` measured between the nodes of a world (LinkMeasurement's
# fields by name, LINK_FIELDS; intra_collective_s and line_bytes_per_s may be left out); a profile with links may
# have no entries, and then prices every stage of any model with the analytic model on the cluster the links
# calibrate (cost_model, calibrated_cluster; NOTE [inter-node calibration] in src/runtime/cost.cpp).
PROFILE_FORMAT = "gfdit-profile/2"
_CACHE_KINDS = ("fbcache", "teacache")
_STAGES_OF_FORMAT: dict[str, dict[str, Any]] = {
    PROFILE_FORMAT: STAGES,
    "gfdit-profile/1": {("step" if s == Stage.DENOISE else n): s for n, s in STAGES.items()},
}


def _cluster_for(hw: str, degree: int, num_nodes: int) -> Cluster:
    """A cluster of `hw` large enough for a group of `degree` ranks over `num_nodes` nodes (unknown hardware:
    InvalidUsage listing the valid names)."""
    if hw == "cpu":
        return cluster("cpu", max(degree, 1))
    per_node = hardware(hw).ranks_per_node
    return cluster(f"{hw}x8", max(per_node * num_nodes, degree))


def estimate(
    model: str,
    hardware: str = "h20",
    *,
    height: int | None = None,
    width: int | None = None,
    num_frames: int | None = None,
    ulysses: int = 1,
    ring: int = 1,
    mode: str = "usp",
    guidance_scale: float | None = None,
    num_nodes: int = 1,
    cfg: int = 1,
    batch: int = 1,
) -> dict[str, float]:
    """Analytic stage times (seconds) of `batch` requests of `model` on `hardware` with a ulysses x ring layout
    (cfg 2: CFG-parallel, the two guidance passes on two halves of ulysses x ring ranks each).

    Unset sizes and guidance take the model's serving defaults. ``migrate_s`` is the state hand-off to the
    ``degree - 1`` other members of the group (to one member when the degree is 1); ``decode_s`` is a decode on
    one rank.
    """
    arch = model_arch(model)
    if mode not in MODES:
        raise InvalidUsage(f"gfdit.planning.cost: mode must be one of {sorted(MODES)}, got {mode!r}")
    height = arch.default_height if height is None else height
    width = arch.default_width if width is None else width
    num_frames = arch.default_frames if num_frames is None else num_frames
    guidance = arch.default_guidance if guidance_scale is None else guidance_scale
    if cfg not in (1, 2) or isinstance(cfg, bool):
        raise InvalidUsage(f"gfdit.planning.cost: cfg must be 1 or 2, got {cfg!r}")
    degree = ulysses * ring * cfg
    cm = _C.analytic(model, _cluster_for(hardware, max(degree, 2), num_nodes))
    common = {"num_steps": arch.default_steps, "guidance_scale": guidance, "batch": batch}
    group = {"num_nodes": num_nodes}
    layout = {"degree": degree, "ulysses": ulysses, "ring": ring, "mode": MODES[mode], "cfg": cfg}
    num_new = degree - 1 if degree > 1 else 1
    return {
        "encode_s": cm.seconds(Stage.ENCODE, height, width, num_frames, degree=degree, **group, **common),
        "step_s": cm.seconds(Stage.DENOISE, height, width, num_frames, **layout, **group, **common),
        "decode_s": cm.seconds(Stage.DECODE, height, width, num_frames, **common),
        "migrate_s": cm.seconds(
            Stage.MIGRATE,
            height,
            width,
            num_frames,
            degree=max(degree, 2),
            num_new=num_new,
            **group,
            **common,
        ),
    }


# A profile entry's fields in the file besides stage and mode (by name), with their defaults (None: required)
# and what each must be; the entries are gfdit._C.cost.ProfileEntry, whose fields these are.
_ENTRY_FIELDS: dict[str, tuple[Any, str]] = {
    "tokens": (None, "a positive integer"),
    "degree": (1, "a positive integer"),
    "ulysses": (1, "a positive integer"),
    "ring": (1, "a positive integer"),
    "cfg": (1, "1 or 2"),  # profiles from before CFG-parallel: cfg 1
    "guidance": (False, "true or false"),
    "num_new": (0, "an integer >= 0"),
    "batch": (1, "a positive integer"),  # profiles from before batches: batch 1
    "seconds": (None, "a positive number"),
    "samples": (0, "an integer >= 0"),
}


# A link's fields in a profile file, each with what it must be (LinkMeasurement's fields).
LINK_FIELDS: dict[str, str] = {
    "node_a": "an integer >= 0",
    "node_b": "an integer >= 0",
    "ranks_per_node": "a positive integer",
    "stream_bytes_per_s": "a positive number",
    "concurrent_bytes_per_s": "a positive number",
    "round_trip_s": "a positive number",
    "collective_s": "a positive number",
    "intra_collective_s": "a number >= 0",
    "line_bytes_per_s": "a number >= 0",
}
# Fields a link may leave out (0: not measured, or not stated).
_OPTIONAL_LINK_FIELDS = ("intra_collective_s", "line_bytes_per_s")


def _checked(value: Any, kind: str, where: str) -> Any:
    """``value`` when it is ``kind`` (as _ENTRY_FIELDS names kinds), else InvalidUsage naming ``where``."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    finite = number and math.isfinite(value)
    ok = {
        "a positive integer": finite and float(value).is_integer() and value > 0,
        "a positive number": finite and value > 0,
        "a number >= 0": number and not value < 0,
        "an integer >= 0": isinstance(value, int) and not isinstance(value, bool) and value >= 0,
        "1 or 2": not isinstance(value, bool) and value in (1, 2),
        "true or false": isinstance(value, bool),
    }[kind]
    if not ok:
        raise InvalidUsage(f"gfdit.planning.cost: {where} must be {kind}, got {value!r}")
    return int(value) if kind == "a positive integer" else value


def load_profile(path: str | Path) -> Profile:
    """Reads and checks a profile file written by ``gfdit profile`` (either format, see PROFILE_FORMAT);
    errors name the entry and field."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise InvalidUsage(f"gfdit.planning.cost: cannot read profile {path}: {err}") from err
    if not isinstance(data, dict):
        raise InvalidUsage(f"gfdit.planning.cost: profile {path} must be a JSON object")
    stages = _STAGES_OF_FORMAT.get(str(data.get("format")))
    if stages is None:
        raise InvalidUsage(
            f"gfdit.planning.cost: profile {path}: format must be {PROFILE_FORMAT!r} (or an older one: "
            f"{', '.join(repr(f) for f in _STAGES_OF_FORMAT if f != PROFILE_FORMAT)}), got {data.get('format')!r}"
        )
    if data.get("model") not in model_names():
        raise InvalidUsage(
            f"gfdit.planning.cost: profile {path}: unknown model {data.get('model')!r}; valid models: "
            f"{', '.join(model_names())}"
        )
    p = Profile()
    p.model = data["model"]
    p.hardware = str(data.get("hardware", "cpu"))
    p.world_size = _checked(data.get("world_size"), "a positive integer", f"profile {path}: world_size")
    p.num_cores = int(data.get("num_cores", 0) or 0)
    for key, default in (("dispatch_s", 0.0), ("completion_s", 0.0), ("collective_efficiency", 1.0)):
        setattr(p, key, float(_checked(data.get(key, default), "a number >= 0", f"profile {path}: {key}")))
    links = data.get("links", [])
    if not isinstance(links, list):
        raise InvalidUsage(f"gfdit.planning.cost: profile {path}: links must be a list")
    measured = []
    for i, lk in enumerate(links):
        where = f"profile {path}: link {i}"
        if not isinstance(lk, dict):
            raise InvalidUsage(f"gfdit.planning.cost: {where} must be an object")
        m = LinkMeasurement()
        for key, kind in LINK_FIELDS.items():
            value = lk.get(key, 0.0) if key in _OPTIONAL_LINK_FIELDS else lk.get(key)
            setattr(m, key, _checked(value, kind, f"{where}: {key}"))
        measured.append(m)
    p.links = measured
    entries = data.get("entries")
    if not isinstance(entries, list) or not (entries or measured):
        raise InvalidUsage(
            f"gfdit.planning.cost: profile {path}: entries must be a non-empty list (or empty beside links)"
        )
    out = []
    for i, e in enumerate(entries):
        where = f"profile {path}: entry {i}"
        if not isinstance(e, dict):
            raise InvalidUsage(f"gfdit.planning.cost: {where} must be an object")
        if e.get("stage") not in stages:
            raise InvalidUsage(
                f"gfdit.planning.cost: {where}: stage must be one of {list(stages)}, got {e.get('stage')!r}"
            )
        if e.get("mode", "usp") not in MODES:
            raise InvalidUsage(
                f"gfdit.planning.cost: {where}: mode must be one of {list(MODES)}, got {e.get('mode')!r}"
            )
        fields = {k: _checked(e.get(k, d), kind, f"{where}: {k}") for k, (d, kind) in _ENTRY_FIELDS.items()}
        entry = ProfileEntry(stage=stages[e["stage"]], mode=MODES[e.get("mode", "usp")], **fields)
        if entry.cfg == 2 and not entry.guidance:
            raise InvalidUsage(f"gfdit.planning.cost: {where}: cfg 2 (CFG-parallel) needs guidance true")
        if entry.stage == Stage.DENOISE and entry.ulysses * entry.ring * entry.cfg != entry.degree:
            cfg_part = f" x cfg {entry.cfg}" if entry.cfg != 1 else ""
            raise InvalidUsage(
                f"gfdit.planning.cost: {where}: ulysses {entry.ulysses} x ring {entry.ring}{cfg_part} != degree {entry.degree}"
            )
        out.append(entry)
    p.entries = out
    caches = data.get("caches", {})
    if not isinstance(caches, dict) or set(caches) - set(_CACHE_KINDS):
        raise InvalidUsage(
            f"gfdit.planning.cost: profile {path}: caches must be an object with keys among {list(_CACHE_KINDS)}"
        )
    curves = []
    for kind, c in caches.items():
        where = f"profile {path}: caches.{kind}"
        if not isinstance(c, dict):
            raise InvalidUsage(f"gfdit.planning.cost: {where} must be an object")
        ratio = float(_checked(c.get("step_ratio", 0.0), "a number >= 0", f"{where}: step_ratio"))
        setattr(p, f"{kind}_step_ratio", ratio)
        points = c.get("skip", [])
        if not isinstance(points, list) or not all(
            isinstance(x, list) and len(x) == 2 and all(isinstance(v, int | float) for v in x) for x in points
        ):
            raise InvalidUsage(
                f"gfdit.planning.cost: {where}: skip must be a list of [threshold, probability]"
            )
        if points:
            try:
                curves.append(_rt.SkipCurve(kind, [tuple(x) for x in points], str(c.get("source", ""))))
            except InvalidUsage as e:
                raise InvalidUsage(f"gfdit.planning.cost: {where}: {e.message}") from None
    p.skip_curves = curves
    return p


def profile_to_json(profile: Profile) -> dict[str, Any]:
    """``profile`` as the JSON object of a profile file (format PROFILE_FORMAT): every field of the Profile
    and of each ProfileEntry, stage and mode by name."""
    return (
        {
            "format": PROFILE_FORMAT,
            "model": profile.model,
            "hardware": profile.hardware,
            "world_size": profile.world_size,
            "num_cores": profile.num_cores,
            "dispatch_s": profile.dispatch_s,
            "completion_s": profile.completion_s,
            "collective_efficiency": profile.collective_efficiency,
            "entries": [
                {"stage": stage_name(e.stage), "mode": layout_mode_name(e.mode)}
                | {k: getattr(e, k) for k in _ENTRY_FIELDS}
                for e in profile.entries
            ],
        }
        | _caches_json(profile)
        | _links_json(profile)
    )


def _links_json(profile: Profile) -> dict[str, Any]:
    """The "links" key of a profile file (see PROFILE_FORMAT), or nothing when the profile has none."""
    if not profile.links:
        return {}
    return {"links": [{k: getattr(lk, k) for k in LINK_FIELDS} for lk in profile.links]}


def _caches_json(profile: Profile) -> dict[str, Any]:
    """The "caches" key of a profile file (see PROFILE_FORMAT), or nothing when nothing of them was measured."""
    out: dict[str, Any] = {}
    curves = {_rt.cache_kind_name(c.kind): c for c in profile.skip_curves}
    for kind in _CACHE_KINDS:
        ratio = getattr(profile, f"{kind}_step_ratio")
        curve = curves.get(kind)
        if ratio <= 0 and curve is None:
            continue
        out[kind] = {"step_ratio": ratio}
        if curve is not None:
            out[kind] |= {"skip": [list(p) for p in curve.points], "source": curve.source}
    return {"caches": out} if out else {}


def write_profile(path: str | Path, profile: Profile, extra: dict[str, Any] | None = None) -> None:
    """Writes ``profile`` to ``path`` as ``profile_to_json`` has it, with the top-level keys of ``extra``
    besides (notes of the writer's, e.g. how it measured; load_profile ignores them)."""
    data = profile_to_json(profile)
    for key in extra or {}:
        if key in data:
            raise InvalidUsage(f"gfdit.planning.cost: write_profile: extra key {key!r} is a profile field")
    data.update(extra or {})
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
        f.write("\n")


def calibrated_cluster(cluster: str | Cluster, links: Any, transfer: bool | None = None) -> Cluster:
    """``cluster`` (a name or a Cluster; "cpu" gets as many ranks as the links' world) with its inter-node terms
    taken from ``links``: a list of LinkMeasurement, a Profile or a profile file (NOTE [inter-node calibration]
    in src/runtime/cost.cpp). ``transfer`` False: the terms fitted to the links (the cluster measured); True: the
    cluster's own terms scaled by how the links compare with the model's assumptions (another cluster); None:
    fitted when the cluster's hardware is the one the profile was measured on (a bare list: fitted), scaled
    otherwise."""
    if isinstance(links, (str, Path)):
        links = load_profile(links)
    world = 0
    measured_on = None
    if isinstance(links, Profile):
        world = links.world_size
        measured_on = links.hardware
        links = list(links.links)
    if not isinstance(cluster, Cluster):
        cluster = _C.cluster(cluster, world if cluster == "cpu" else 0)
    if transfer is None:
        transfer = measured_on is not None and measured_on != cluster.hw.name
    if transfer:
        return _C.transferred_cluster(cluster, list(links))
    return _C.calibrated_cluster(cluster, list(links))


def cost_model(
    model: str, cluster: str | Cluster = "h20x8", profile: str | Path | Profile | None = None
) -> CostModel:
    """The profiled model when `profile` (a Profile or a file) has stage entries; the analytic one on `cluster`
    otherwise, its inter-node terms calibrated by the profile's links if it has some (``calibrated_cluster``:
    fitted on the hardware measured, scaled on another). A profile of links alone describes the network, not a
    model, so any model may use it."""
    if profile is not None:
        prof = profile if isinstance(profile, Profile) else load_profile(profile)
        if prof.entries and prof.model != model:
            raise InvalidUsage(f"gfdit.planning.cost: the profile is of {prof.model!r}, not {model!r}")
        if prof.entries:
            return _C.profiled(prof)
        if not prof.links:
            raise InvalidUsage("gfdit.planning.cost: the profile has neither entries nor links")
        return _C.analytic(model, calibrated_cluster(cluster, prof))
    cl = cluster if isinstance(cluster, Cluster) else _C.cluster(cluster)
    return _C.analytic(model, cl)


# -- the `gfdit cost` command --------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """Arguments of ``gfdit cost``."""
    parser.add_argument("--model", default="qwen-image", help=f"one of: {', '.join(model_names())}")
    parser.add_argument("--hardware", default="h20", help=f"one of: {', '.join(hardware_names())}")
    parser.add_argument("--height", type=int, default=None, help="pixels (default: the model's)")
    parser.add_argument("--width", type=int, default=None, help="pixels (default: the model's)")
    parser.add_argument("--num-frames", type=int, default=None, help="frames (default: the model's)")
    parser.add_argument("--ulysses", type=int, default=1)
    parser.add_argument("--ring", type=int, default=1)
    parser.add_argument("--mode", choices=sorted(MODES), default="usp")
    parser.add_argument("--num-nodes", type=int, default=1, help="nodes the group spans")
    parser.add_argument(
        "--cfg",
        type=int,
        choices=(1, 2),
        default=1,
        help="2: CFG-parallel (a half of the group per guidance pass)",
    )
    parser.add_argument("--guidance-scale", type=float, default=None, help="(default: the model's)")
    parser.add_argument("--batch", type=int, default=1, help="requests of this shape served together")
    parser.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace, command: str) -> int:
    """Runs ``gfdit cost``: prints the stage estimates; exit code 2 on bad arguments (unknown model or
    hardware names list the valid ones)."""
    try:
        est = estimate(
            args.model,
            args.hardware,
            height=args.height,
            width=args.width,
            num_frames=args.num_frames,
            ulysses=args.ulysses,
            ring=args.ring,
            mode=args.mode,
            guidance_scale=args.guidance_scale,
            num_nodes=args.num_nodes,
            cfg=args.cfg,
            batch=args.batch,
        )
    except InvalidUsage as e:
        print(f"gfdit cost: {e.message}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(est))
    else:
        print("  ".join(f"{k}={v:.6g}" for k, v in est.items()))
    return 0
