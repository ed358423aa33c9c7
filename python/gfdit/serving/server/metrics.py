"""The server's Prometheus metrics (``GET /metrics``), in a registry of its own (one per app)."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gfdit.serving.server.admission import Admission

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class _EngineCollector(Collector):
    """What the engine's control plane counts, read from one ``engine.stats()`` per scrape: regroups, batched
    steps and refused decisions (gauges of running totals, as before), workers alive, and the workers that died
    and the replacements that joined (counters; engines that replace no worker count neither, and read 0)."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    def collect(self) -> Iterator[Metric]:
        stats = self._engine.stats()
        yield GaugeMetricFamily(
            "gfdit_regroups",
            "regroupings by the control plane so far (use rate())",
            value=stats.get("regroups", 0),
        )
        yield GaugeMetricFamily(
            "gfdit_batched_steps",
            "denoise tasks that stepped two or more requests together so far (NOTE [batches]; use rate())",
            value=stats.get("batched_steps", 0),
        )
        yield GaugeMetricFamily(
            "gfdit_refused_decisions",
            "policy decisions the control plane refused as invalid so far (NOTE [refused decisions]; use rate())",
            value=stats.get("refused_decisions", 0),
        )
        yield GaugeMetricFamily(
            "gfdit_workers_alive",
            "workers the control plane counts as alive",
            value=sum(map(bool, stats.get("alive", ()))),
        )
        yield CounterMetricFamily(
            "gfdit_worker_deaths", "workers that died so far", value=stats.get("worker_deaths", 0)
        )
        yield CounterMetricFamily(
            "gfdit_worker_replacements",
            "replacement workers that joined so far",
            value=stats.get("replacements", 0),
        )


class Metrics:
    """Requests by kind and outcome, latencies, stage times, decodes by degree, request steps by batch and by
    whether they reused the step cache, SLO results, busy seconds per rank, and what the engine counts, read when
    scraped."""

    def __init__(self, engine: Any, admission: Admission) -> None:
        self.registry = r = CollectorRegistry()
        self._engine = engine
        states = Gauge("gfdit_requests_in_engine", "engine requests by state", ["state"], registry=r)
        for state in ("QUEUED", "RUNNING"):
            states.labels(state).set_function(functools.partial(self._count, state))
        Gauge("gfdit_outstanding_images", "images accepted and not yet answered", registry=r).set_function(
            lambda: admission.pending
        )
        self.requests = Counter(
            "gfdit_http_requests",
            "generation requests (images: one per HTTP request; videos: one per job) by kind and outcome",
            ["kind", "outcome"],
            registry=r,
        )
        self.latency = Histogram(
            "gfdit_request_latency_seconds",
            "end-to-end latency of a generation as the server saw it (videos: until the MP4 is ready)",
            ["kind"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.stage = Histogram(
            "gfdit_stage_seconds",
            "time of one stage task on its ranks (denoise: per step; a batched step once for each of its requests)",
            ["stage"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.slo = Counter(
            "gfdit_slo_requests",
            "generations with slo_ms by whether they met it",
            ["kind", "result"],
            registry=r,
        )
        self.decode_degree = Counter(
            "gfdit_decodes",
            "VAE decodes by how many ranks they split over (NOTE [parallel decode] in src/runtime/control.cpp)",
            ["degree"],
            registry=r,
        )
        self.request_steps = Counter(
            "gfdit_request_steps",
            "denoising steps of finished requests by batch: how many requests stepped together in one batched "
            "forward (NOTE [batches] in src/runtime/control.cpp). Each request counts its own steps, so a step of a "
            'batch of b adds b to batch="b"; divided by b, the batched forwards',
            ["batch"],
            registry=r,
        )
        self.steps = Counter(
            "gfdit_denoise_steps",
            "denoising steps of finished requests by whether every transformer pass of the step reused the "
            'request\'s step cache (cached="true") or not (NOTE [step caches] in include/gfdit/step_cache.h)',
            ["cached"],
            registry=r,
        )
        self.cached_passes = Counter(
            "gfdit_cached_passes",
            "transformer passes of finished requests that reused the step cache (a step with guidance runs two)",
            registry=r,
        )
        self.busy = Counter(
            "gfdit_rank_busy_seconds",
            "seconds each rank spent running tasks (a batched step shared out among its requests)",
            ["rank"],
            registry=r,
        )
        for w in range(len(engine.alive_workers())):
            self.busy.labels(str(w))
        r.register(_EngineCollector(engine))

    def _count(self, state: str) -> int:
        states = self._engine.requests().values()
        if state == "QUEUED":
            return sum(1 for s in states if s == "QUEUED")
        return sum(1 for s in states if s != "QUEUED")

    def observe(self, result: Any, slo_s: float | None, kind: str) -> None:
        """Stage times, steps by batch, busy seconds and the SLO result of a finished request."""
        for st in result.timeline:
            if not st.start_ns or st.end_ns < st.start_ns:
                continue  # dispatched, never ran
            batch = max(1, st.batch)
            if st.kind == "denoise":
                self.request_steps.labels(str(batch)).inc(st.num_steps)
                self.steps.labels("true").inc(st.cached_steps)
                self.steps.labels("false").inc(max(0, st.num_steps - st.cached_steps))
                self.cached_passes.inc(st.cached_passes)
            if st.end_ns > st.start_ns:
                dt = (st.end_ns - st.start_ns) / 1e9
                self.stage.labels(st.kind).observe(dt / max(1, st.num_steps))
                # every member's timeline holds a batched task: each counts its share, the task once in all
                for rank in st.ranks:
                    self.busy.labels(str(rank)).inc(dt / batch)
        decodes = [st for st in result.timeline if st.kind == "decode"]
        if result.state == "DONE" and decodes:  # the last one gave the output
            self.decode_degree.labels(str(len(decodes[-1].ranks))).inc()
        if slo_s is not None and result.transitions:
            e2e = (result.transitions[-1][2] - result.transitions[0][2]) / 1e9
            self.slo.labels(kind, "met" if e2e <= slo_s else "missed").inc()

    def count_error(self, kind: str, e: BaseException) -> None:
        """Counts a generation that ended in an error answer (or an exception) by its code."""
        from gfdit.serving.server.errors import APIError

        if isinstance(e, APIError):
            self.requests.labels(kind, e.code or ("bad_request" if e.status < 500 else "server_error")).inc()
        else:
            self.requests.labels(kind, "server_error").inc()
