"""Request traces (JSONL, one request per line) and the metrics of a trace replay.

A line is ``{"id", "arrival_s", "model", "height", "width", "num_frames", "num_inference_steps",
"deadline_s"}`` plus an optional ``"priority"`` (int, default 0) and ``"cache"`` (the request's step cache as
``gfdit.Request`` takes it, "fbcache:0.08"; absent or null: none). ``num_frames`` is 1 for images;
``arrival_s`` and ``deadline_s`` are seconds after the trace's start (``deadline_s`` may be null).

``load_trace`` refuses a malformed trace with ``gfdit.InvalidUsage`` naming the line and the reason;
known model names come from the cost model's table (``gfdit._C.cost``) and sizes are checked by the
runtime's own request check (``gfdit._C.runtime.check_request``), so a trace is held to the rules the
engine applies at submit.

``summarize`` turns the outcomes of a replay (real engine or simulator) into the metrics both
``gfdit run-trace`` and ``gfdit simulate`` print.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

from gfdit._C import InvalidUsage
from gfdit.stats import mean, percentile

# field -> (accepted Python types, required)
_FIELDS: dict[str, tuple[tuple[type, ...], bool]] = {
    "id": ((int,), True),
    "arrival_s": ((int, float), True),
    "model": ((str,), True),
    "height": ((int,), True),
    "width": ((int,), True),
    "num_frames": ((int,), True),
    "num_inference_steps": ((int,), True),
    "deadline_s": ((int, float, type(None)), True),
    "priority": ((int,), False),
    "cache": ((str, type(None)), False),
}


@dataclasses.dataclass
class TraceRequest:
    """One request of a trace. Times are seconds after the trace's start."""

    id: int
    arrival_s: float
    model: str
    height: int
    width: int
    num_frames: int
    num_inference_steps: int
    deadline_s: float | None = None
    priority: int = 0
    cache: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The request as a trace line (a dict in the field order of the format; no cache: no "cache")."""
        return {name: getattr(self, name) for name in _FIELDS if name != "cache" or self.cache is not None}


def _type_name(types: tuple[type, ...]) -> str:
    names = {int: "an integer", float: "a number", str: "a string", type(None): "null"}
    if float in types:
        types = tuple(t for t in types if t is not int)
    return " or ".join(names[t] for t in types)


def _model_arch(name: str) -> Any:
    """The cost model's architecture record of a model; InvalidUsage (listing the known ones) if unknown."""
    from gfdit._C import cost

    if name not in list(cost.model_names()):
        raise InvalidUsage(f"unknown model {name!r} (known: {', '.join(cost.model_names())})")
    return cost.model_arch(name)


def check_size(
    model: str, height: int, width: int, num_frames: int, num_steps: int, cache: str | None = None
) -> None:
    """Refuses (InvalidUsage naming the field) a request size (or step cache) that ``model`` cannot serve: the
    engine's own check at submit (``gfdit._C.runtime.check_request``), so a trace is held to the same rules."""
    from gfdit._C import runtime

    try:
        runtime.check_request(model, height, width, num_frames, num_steps, cache=cache)
    except InvalidUsage as e:
        raise InvalidUsage(e.message, param=e.param) from None


def _parse_line(text: str, model: str | None) -> TraceRequest:
    """One trace line as a request; InvalidUsage with the reason (without the line number)."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidUsage(f"not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(obj, dict):
        raise InvalidUsage(f"a request is a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - set(_FIELDS))
    if unknown:
        raise InvalidUsage(f"unknown field(s) {', '.join(unknown)} (a request has: {', '.join(_FIELDS)})")
    missing = [f for f, (_, required) in _FIELDS.items() if required and f not in obj]
    if missing:
        raise InvalidUsage(f"missing field(s) {', '.join(missing)}")
    for name, (types, _) in _FIELDS.items():
        if name not in obj:
            continue
        v = obj[name]
        if isinstance(v, bool) or not isinstance(v, types):
            raise InvalidUsage(f"{name} must be {_type_name(types)}, got {json.dumps(v)}")
        if isinstance(v, float) and not math.isfinite(v):
            raise InvalidUsage(f"{name} must be finite, got {v}")
    req = TraceRequest(**{k: obj[k] for k in _FIELDS if k in obj})
    req.arrival_s = float(req.arrival_s)
    req.deadline_s = None if req.deadline_s is None else float(req.deadline_s)
    if req.id < 0:
        raise InvalidUsage(f"id must be non-negative, got {req.id}")
    if req.arrival_s < 0:
        raise InvalidUsage(f"arrival_s must be non-negative, got {req.arrival_s}")
    if req.deadline_s is not None:
        if req.deadline_s < 0:
            raise InvalidUsage(f"deadline_s must be non-negative, got {req.deadline_s}")
        if req.deadline_s <= req.arrival_s:
            raise InvalidUsage(f"deadline_s {req.deadline_s} is not after arrival_s {req.arrival_s}")
    if req.num_inference_steps < 1:
        raise InvalidUsage(f"num_inference_steps must be positive, got {req.num_inference_steps}")
    if model is not None and req.model != model:
        raise InvalidUsage(f"model {req.model!r} differs from the model being served, {model!r}")
    _model_arch(req.model)  # unknown models are refused by name, before their sizes are looked at
    check_size(req.model, req.height, req.width, req.num_frames, req.num_inference_steps, req.cache)
    return req


def load_trace(path: str, model: str | None = None) -> list[TraceRequest]:
    """Reads and checks a trace. ``model``: every line must name this model (None: any known model).

    Blank lines are skipped. A malformed trace raises gfdit.InvalidUsage "PATH:LINE: reason" at its first
    bad line: bad JSON, missing, unknown or mistyped fields, negative times, arrivals that go back in time,
    duplicate ids, a deadline not after its arrival, an unknown model or one other than ``model``, a size
    the model cannot serve. A trace without requests is refused too.
    """
    if model is not None:
        _model_arch(model)
    requests: list[TraceRequest] = []
    seen: dict[int, int] = {}
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except OSError as e:
        raise InvalidUsage(f"cannot read trace {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise InvalidUsage(f"trace {path} is not UTF-8 text ({e.reason})") from None
    for lineno, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            req = _parse_line(text, model)
            if req.id in seen:
                raise InvalidUsage(f"duplicate id {req.id} (first on line {seen[req.id]})")
            if requests and req.arrival_s < requests[-1].arrival_s:
                raise InvalidUsage(
                    f"arrival_s {req.arrival_s} is before the previous line's "
                    f"{requests[-1].arrival_s} (arrivals must not decrease)"
                )
        except InvalidUsage as e:
            raise InvalidUsage(f"{path}:{lineno}: {e}") from None
        seen[req.id] = lineno
        requests.append(req)
    if not requests:
        raise InvalidUsage(f"{path}: the trace has no requests")
    return requests


def write_trace(path: str, requests: Iterable[TraceRequest]) -> None:
    """Writes requests as a JSONL trace (one line each, in the given order)."""
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r.to_json()) + "\n" for r in requests)


# ------------------------------------------------------------------------------------------------ metrics
@dataclasses.dataclass
class Outcome:
    """What became of one request of a replay. Times are seconds after the trace's start."""

    id: int
    arrival_s: float
    finish_s: float | None  # None: did not complete
    deadline_s: float | None
    state: str  # "DONE" when completed; "FAILED", "CANCELLED", "TIMEOUT", ...
    priority: int = 0

    @property
    def completed(self) -> bool:
        return self.state == "DONE" and self.finish_s is not None

    @property
    def latency_s(self) -> float | None:
        return self.finish_s - self.arrival_s if self.completed and self.finish_s is not None else None

    @property
    def met_deadline(self) -> bool:
        if not self.completed or self.finish_s is None or self.deadline_s is None:
            return False
        return self.finish_s <= self.deadline_s


@dataclasses.dataclass
class Interval:
    """One task on one rank, for the timeline plot. Times are seconds after the trace's start."""

    rank: int
    request_id: int
    kind: str  # "encode", "denoise", "migrate", "decode"
    start_s: float
    end_s: float


SUMMARY_KEYS = (
    "policy",
    "num_requests",
    "throughput_rps",
    "mean_latency_s",
    "p50_latency_s",
    "p99_latency_s",
    "slo_attainment",
    "utilization",
)


def summarize(policy: str, outcomes: Sequence[Outcome], busy_rank_s: float, num_ranks: int) -> dict[str, Any]:
    """The metrics of a replay.

    latency: finish - arrival of each completed request; mean and percentiles (p50, p99, by linear
    interpolation between closest ranks, ``gfdit.stats``) over them, None when none completed.
    The span of the replay runs from the first arrival to the last finish (over completed requests);
    throughput = completed / span; utilization = busy_rank_s / (num_ranks * span); both None without a
    span (nothing completed, or a single instantaneous request).
    slo_attainment: share of the requests that have a deadline and completed by it (None when no request
    has a deadline; requests that did not complete count as missed).
    """
    latencies = [lat for o in outcomes if (lat := o.latency_s) is not None]  # None: not completed
    finishes = [o.finish_s for o in outcomes if o.completed and o.finish_s is not None]
    span = max(finishes) - min(o.arrival_s for o in outcomes) if finishes else 0.0
    with_deadline = [o for o in outcomes if o.deadline_s is not None]
    return {
        "policy": policy,
        "num_requests": len(outcomes),
        "throughput_rps": len(latencies) / span if span > 0 else None,
        "mean_latency_s": mean(latencies) if latencies else None,
        "p50_latency_s": percentile(latencies, 50) if latencies else None,
        "p99_latency_s": percentile(latencies, 99) if latencies else None,
        "slo_attainment": (
            sum(o.met_deadline for o in with_deadline) / len(with_deadline) if with_deadline else None
        ),
        "utilization": busy_rank_s / (num_ranks * span) if span > 0 and num_ranks > 0 else None,
    }


def format_summary(summary: dict[str, Any]) -> str:
    """The metrics as aligned ``name  value`` lines, for people."""
    width = max(len(k) for k in summary)
    lines = []
    for k, v in summary.items():
        if v is None:
            s = "-"
        elif isinstance(v, float):
            s = f"{v:.4g}"
        else:
            s = str(v)
        lines.append(f"{k:<{width}}  {s}")
    return "\n".join(lines)
