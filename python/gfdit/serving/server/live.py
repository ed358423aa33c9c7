"""The live page of ``gfdit serve``: what ran on which rank in the last minutes, and a prompt box.

``ActivityRecorder`` keeps the stages of requests that finished in the last ``window_s`` seconds as spans
(one per stage; consecutive denoise steps on the same ranks with the same layout and batch become one span) and
knows the requests still running. A batched denoise task (NOTE [batches] in src/runtime/control.cpp) is in the
timeline of each request it stepped, so each of them has its span, with the batch size. ``router`` serves ``GET /`` (the page: plain HTML and JavaScript from
``live.html``, nothing to build, nothing fetched from elsewhere) and ``GET /v1/timeline`` (its JSON).

Times: the runtime stamps stages with CLOCK_MONOTONIC nanoseconds (``gfdit._C.runtime.now_ns``, the clock of
Python's ``time.monotonic`` on Linux, shared by every process of a machine). The JSON gives them as seconds
relative to ``now_s``, the server's monotonic time when it answered, so a page needs no clock of its own.
"""

from __future__ import annotations

import collections
import dataclasses
import importlib.resources
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from gfdit import stats
from gfdit._C import runtime as rt
from gfdit.serving.server.schemas import error_responses

DEFAULT_WINDOW_S = 300.0
DEFAULT_MAX_SPANS = 20_000
# Consecutive denoise stages of a request on the same ranks and layout become one span when the second
# starts within this long of the first's end (dispatch gaps on a busy CPU reach tens of ms); a longer gap
# may hold another request's work on those ranks, so it stays visible.
MERGE_GAP_NS = 100_000_000
_RUNNING_STATES = ("ENCODING", "DENOISING", "DECODING")


@dataclasses.dataclass
class Span:
    """One stage (or a run of denoise steps) of a finished request: what, where, in which layout, when."""

    request_id: int
    kind: str  # encode, denoise, decode, migrate
    ranks: list[int]
    ulysses: int
    ring: int
    mode: str  # usp or torus
    step_begin: int
    num_steps: int
    start_ns: int
    end_ns: int
    regroup: bool  # a denoise span on other ranks than the request's previous denoise span
    cfg: int = 1  # 2: CFG-parallel
    batch: int = 1  # requests its denoise steps ran together in one batched forward, this one included
    cached_steps: int = (
        0  # of its denoise steps, those whose every pass reused the step cache (NOTE [step caches])
    )


@dataclasses.dataclass
class _Finished:
    request_id: int
    end_ns: int
    latency_s: float
    num_steps: int
    max_degree: int
    num_regroups: int


def layout_label(ulysses: int, ring: int, mode: str = "usp", cfg: int = 1) -> str:
    """A short name of a layout: "U2", "R2", "U2R2" (one rank: "U1"); torus layouts end in "t"; CFG-parallel
    ones start with "C2" ("C2" alone: one rank per guidance pass, "C2U2": Ulysses 2 in each half)."""
    label = "".join(f"{c}{n}" for c, n in (("U", ulysses), ("R", ring)) if n > 1)
    if cfg == 2:
        return "C2" + label + ("t" if mode == "torus" and label else "")
    return (label or "U1") + ("t" if mode == "torus" else "")


@dataclasses.dataclass
class _Running:
    state: str
    ranks: tuple[int, ...]
    step: int
    num_steps: int
    since_ns: int  # first seen on these ranks
    earlier: list[tuple[tuple[int, ...], int, int]]  # (ranks, first seen, last seen) of its earlier groups


_MAX_EARLIER = 64


class ActivityRecorder:
    """Spans of the requests that finished in the last ``window_s`` seconds, and the requests running now.

    ``record(result)`` takes a finished ``gfdit.Result``; ``on_progress(progress)`` each progress event the
    engine pushes (``Engine.add_progress_listener``), so the page sees when a request took its ranks, and when
    it moved, as the control plane decided it. ``snapshot(engine)`` is what ``GET /v1/timeline`` answers.
    Memory is bounded: spans older than the window are dropped, and past ``max_spans`` spans (or finished
    requests) the oldest go first. Thread-safe. ``clock`` returns monotonic nanoseconds (a test may pass its
    own).
    """

    def __init__(
        self,
        window_s: float = DEFAULT_WINDOW_S,
        *,
        max_spans: int = DEFAULT_MAX_SPANS,
        clock: Callable[[], int] = rt.now_ns,
    ) -> None:
        if not (window_s > 0 and math.isfinite(window_s)):
            raise ValueError(f"window_s must be a positive number, got {window_s!r}")
        if max_spans < 1:
            raise ValueError(f"max_spans must be >= 1, got {max_spans!r}")
        self.window_s = float(window_s)
        self.max_spans = max_spans
        self._clock = clock
        self._lock = threading.Lock()
        self._spans: collections.deque[Span] = collections.deque()  # in the order requests finished
        self._finished: collections.deque[_Finished] = collections.deque()
        self._running: dict[int, _Running] = {}  # requests that run now, as their progress said

    # ---- input ----

    def on_progress(self, p: Any) -> None:
        """One progress event of the engine (a ``gfdit._C.runtime.RequestProgress``): where a request runs now."""
        state = p.state.name
        ranks = tuple(p.ranks)
        with self._lock:
            if state not in _RUNNING_STATES or not ranks:
                self._running.pop(p.id, None)
                return
            prev = self._running.get(p.id)
            if prev is None:
                self._running[p.id] = _Running(state, ranks, p.step, p.num_steps, p.t_ns, [])
                return
            if prev.ranks != ranks:  # moved: the earlier group ends now
                prev.earlier = (prev.earlier + [(prev.ranks, prev.since_ns, p.t_ns)])[-_MAX_EARLIER:]
                prev.ranks, prev.since_ns = ranks, p.t_ns
            prev.state, prev.step = state, p.step

    def record(self, result: Any) -> None:
        """Adds the stages of a finished request (a ``gfdit.Result``)."""
        spans: list[Span] = []
        num_regroups = 0
        for st in result.timeline:
            if st.start_ns <= 0 or st.end_ns < st.start_ns:
                continue  # dispatched, never ran (the request was cancelled or its worker died)
            last = spans[-1] if spans else None
            if (
                st.kind == "denoise"
                and last is not None
                and last.kind == "denoise"
                and last.ranks == list(st.ranks)
                and (last.ulysses, last.ring, last.mode, last.cfg) == (st.ulysses, st.ring, st.mode, st.cfg)
                and last.batch == max(1, st.batch)
                # cached steps and computed ones stay apart, so the page can mark the cached ones
                and (last.cached_steps > 0) == (st.cached_steps > 0)
                and last.step_begin + last.num_steps == st.step_begin
                and st.start_ns - last.end_ns <= MERGE_GAP_NS
            ):
                last.num_steps += st.num_steps
                last.cached_steps += st.cached_steps
                last.end_ns = max(last.end_ns, st.end_ns)
                continue
            regroup = bool(st.regroup)  # the control plane's mark (NOTE [regroups])
            num_regroups += regroup
            span = Span(
                request_id=int(result.request_id),
                kind=st.kind,
                ranks=list(st.ranks),
                ulysses=st.ulysses,
                ring=st.ring,
                mode=st.mode,
                step_begin=st.step_begin,
                num_steps=st.num_steps,
                start_ns=st.start_ns,
                end_ns=st.end_ns,
                regroup=regroup,
                cfg=st.cfg,
                batch=max(1, st.batch),
                cached_steps=int(st.cached_steps) if st.kind == "denoise" else 0,
            )
            spans.append(span)
        times = [t for _, _, t in result.transitions]
        end_ns = max([s.end_ns for s in spans] + times[-1:] or [self._clock()])
        finished = _Finished(
            request_id=int(result.request_id),
            end_ns=end_ns,
            latency_s=(times[-1] - times[0]) / 1e9 if len(times) >= 2 else 0.0,
            num_steps=sum(s.num_steps for s in spans if s.kind == "denoise"),
            max_degree=max((len(s.ranks) for s in spans if s.kind == "denoise"), default=0),
            num_regroups=num_regroups,
        )
        with self._lock:
            self._spans.extend(spans)
            self._finished.append(finished)
            self._running.pop(finished.request_id, None)
            self._prune(self._clock())

    # ---- output ----

    def snapshot(self, engine: Any) -> dict:
        """The JSON of GET /v1/timeline (see ``timeline``)."""
        states = engine.requests()  # id -> state, every request submitted and not finished
        with self._lock:
            # read under the lock: progress is stamped with a time read before it takes the lock,
            # so a time read here is never earlier than any stamp (since_s <= 0)
            now = self._clock()
            self._prune(now)
            spans = [self._span_json(s, now) for s in self._spans]
            finished = list(self._finished)
            live_json = [
                {
                    "request_id": rid,
                    "state": r.state.lower(),
                    "ranks": list(r.ranks),
                    "step": r.step,
                    "num_steps": r.num_steps,
                    "since_s": (r.since_ns - now) / 1e9,
                    "earlier": [
                        {"ranks": list(ranks), "start_s": (t0 - now) / 1e9, "end_s": (t1 - now) / 1e9}
                        for ranks, t0, t1 in r.earlier
                    ],
                }
                for rid, r in sorted(self._running.items())
                if rid in states
            ]
        lat = stats.summary([f.latency_s for f in finished], (50, 95))
        latency = {"count": lat["count"], "mean_s": lat["mean"], "p50_s": lat["p50"], "p95_s": lat["p95"]}
        return {
            "now_s": now / 1e9,
            "wall_time": time.time(),
            "window_s": self.window_s,
            "world_size": engine.world_size,
            "alive": engine.alive_workers(),
            "queued": sum(1 for s in states.values() if s == "QUEUED"),
            "running": sum(1 for s in states.values() if s != "QUEUED"),
            "latency": latency,
            "spans": spans,
            "live": live_json,
            "requests": [
                {
                    "request_id": f.request_id,
                    "end_s": (f.end_ns - now) / 1e9,
                    "latency_s": f.latency_s,
                    "num_steps": f.num_steps,
                    "max_degree": f.max_degree,
                    "regroups": f.num_regroups,
                }
                for f in finished
            ],
        }

    # ---- internals ----

    @staticmethod
    def _span_json(s: Span, now: int) -> dict:
        return {
            "request_id": s.request_id,
            "kind": s.kind,
            "ranks": s.ranks,
            "ulysses": s.ulysses,
            "ring": s.ring,
            "mode": s.mode,
            "cfg": s.cfg,
            "layout": layout_label(s.ulysses, s.ring, s.mode, s.cfg),
            "step_begin": s.step_begin,
            "num_steps": s.num_steps,
            "start_s": (s.start_ns - now) / 1e9,
            "end_s": (s.end_ns - now) / 1e9,
            "regroup": s.regroup,
            "batch": s.batch,
            "cached_steps": s.cached_steps,
        }

    def _prune(self, now: int) -> None:
        """Drops what ended before the window, then the oldest spans past max_spans (lock held)."""
        horizon = now - int(self.window_s * 1e9)
        if any(s.end_ns < horizon for s in self._spans):
            self._spans = collections.deque(s for s in self._spans if s.end_ns >= horizon)
        while len(self._spans) > self.max_spans:
            self._spans.popleft()
        while self._finished and (self._finished[0].end_ns < horizon or len(self._finished) > self.max_spans):
            self._finished.popleft()


def page_html() -> str:
    """The live page: one HTML file with its CSS and JavaScript inline."""
    return importlib.resources.files("gfdit.serving.server").joinpath("live.html").read_text(encoding="utf-8")


router = APIRouter()
_PAGE: str | None = None


@router.get("/", response_class=HTMLResponse)
def live_page() -> HTMLResponse:
    """The live page; it needs no key (it holds no data)."""
    global _PAGE
    if _PAGE is None:
        _PAGE = page_html()
    return HTMLResponse(_PAGE, headers={"Cache-Control": "no-cache"})


@router.get("/v1/timeline", responses=error_responses())
def timeline(request: Request) -> dict:
    """The live page's data, through the API key like all of /v1.

    Its JSON: ``now_s`` (the server's monotonic seconds; every other time is relative to it, so negative),
    ``wall_time``, ``window_s``, ``model``, ``is_video``, ``defaults``, ``policy``, ``world_size``, ``alive``
    (per rank), ``queued`` and ``running`` (engine requests), ``latency`` (count, mean_s, p50_s, p95_s of the
    requests that finished in the window, submit to done), ``spans`` (request_id, kind, ranks, ulysses, ring,
    mode, cfg, layout, step_begin, num_steps, start_s, end_s, regroup, batch: the requests a denoise span's steps
    ran together, this one included, cached_steps: of a denoise span's steps, those whose every pass reused the
    step cache, and a span's steps are all cached or all computed but for a task of several steps; a decode's ranks
    are its group, NOTE [parallel decode]), ``live`` (requests running now:
    request_id, state, ranks, step, num_steps, since_s: since when it runs on these ranks, earlier: the rank
    sets it held before, each with start_s and end_s) and ``requests`` (one line per finished request:
    request_id, end_s, latency_s, num_steps, max_degree, regroups).
    """
    server = request.app.state.server  # a gfdit.serving.server.state.ServerState
    server.check_key(request)
    engine = server.engine
    about = {
        "model": server.model,
        "is_video": bool(server.info.is_video),
        "defaults": server.defaults_json(),
        "policy": getattr(engine, "policy_name", None),
    }
    return {**about, **server.live.snapshot(engine)}
