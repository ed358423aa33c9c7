"""``gfdit bench``: a load generator against a running ``gfdit serve`` (or any server of the same API).

    gfdit bench --url http://127.0.0.1:8000 --rate 20 --duration 30 --workload image --json out.json
    gfdit bench --url http://127.0.0.1:8000 --trace image.jsonl --plot plots/
    gfdit bench --url http://127.0.0.1:8000 --concurrency 1 --requests 20

Open loop (``--trace`` or ``--rate``): each request is sent at its arrival time whatever became of the
earlier ones, so a slow server builds a queue (or answers 429) as it would under real traffic. A trace is
replayed as written (``gfdit.planning.trace`` format); ``--rate R --duration S --workload image|video|mixed`` draws
Poisson arrivals and request sizes from ``gfdit.planning.workload`` for the served model (asked of ``GET /v1/models``).
Closed loop (``--concurrency C --requests N``): C clients, each sends its next request when its last one is
answered, which measures a request's latency without queueing at C = 1.

Images go to ``POST /v1/images/generations``; videos (``num_frames`` > 1) to ``POST /v1/videos``, whose job is
polled until it ends (latency: until it is seen completed). Videos for a model that makes only images are not
sent: they count as ``unsupported_video`` errors.

Every request ends as ``ok`` or an error kind: ``"<status> <param>"`` for a 4xx naming a field (``400 size``),
``"<status> <code>"`` otherwise (``429 queue_full``, ``401 invalid_api_key``, ``500 generation_failed``),
``timeout``, ``connection``, ``unsupported_video``, ``video failed``, ``video cancelled`` or ``bad_answer``
(a 200 that is not the API's answer). Errors are data: the run completes and reports them (see
``summarize_records`` for the metrics).

The client is one event loop; its HTTP connections are spread over several httpx clients (see ``_Clients``)
so that it keeps up with a few hundred requests per second on one core.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import re
import shutil
import sys
from collections.abc import Callable, Sequence
from typing import Any

from gfdit import plots
from gfdit.planning.trace import TraceRequest
from gfdit.stats import percentile

DEFAULT_TIMEOUT_S = 600.0
DEFAULT_MAX_CONNECTIONS = 1024
DEFAULT_POLL_S = 0.1
PROMPT = "a red fox in the snow, photograph"
_SIZE = re.compile(r"^([1-9][0-9]*)x([1-9][0-9]*)$")
# The arch record behind a served model name where the two differ (as gfdit.Engine maps them).

OK = "ok"
UNSUPPORTED_VIDEO = "unsupported_video"
TIMEOUT = "timeout"
CONNECTION = "connection"
BAD_ANSWER = "bad_answer"


class BenchError(Exception):
    """The benchmark cannot run: bad arguments, or the server is unreachable or refuses the client."""


@dataclasses.dataclass
class RequestRecord:
    """What became of one request. Times are seconds after the run's start (the trace's time 0)."""

    id: int
    video: bool
    arrival_s: float  # when it was due (open loop); when its client was free (closed loop)
    sent_s: float | None  # None: not sent (unsupported_video)
    done_s: float | None  # when the answer (for videos: the completed status) came; None: no answer
    status: int | None  # HTTP status of the last answer; None: no answer
    kind: str  # "ok" or the error kind
    slo_s: float | None = None  # the latency budget (deadline - arrival) sent as slo_ms; None: no deadline
    engine_s: float | None = None  # images: the server's own "engine" time (Server-Timing), submit to result

    @property
    def ok(self) -> bool:
        return self.kind == OK

    @property
    def latency_s(self) -> float | None:
        """Answer time minus send time of a success; None otherwise."""
        if not self.ok or self.sent_s is None or self.done_s is None:
            return None
        return self.done_s - self.sent_s

    @property
    def met_slo(self) -> bool | None:
        """Whether a request with a deadline succeeded within it; None without a deadline."""
        if self.slo_s is None:
            return None
        lat = self.latency_s
        return lat is not None and lat <= self.slo_s

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["latency_s"] = self.latency_s
        d["met_slo"] = self.met_slo
        return d


def server_timing(header: str) -> dict[str, float]:
    """A Server-Timing header's durations in seconds by name ("engine;dur=91.5, total;dur=93" -> ...)."""
    out = {}
    for part in header.split(","):
        name, _, params = part.strip().partition(";")
        for p in params.split(";"):
            key, _, value = p.strip().partition("=")
            if key == "dur" and name:
                try:
                    out[name] = float(value) / 1000.0
                except ValueError:
                    pass
    return out


# ------------------------------------------------------------------------------------------------ statistics
def summarize_records(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """The metrics of a run (every rate in requests per second, every time in seconds).

    duration_s: from the first send to the last answer (None with fewer than two such times apart);
    throughput_rps: successes / duration_s. send_rate_rps: (sent - 1) / (last send - first send), the rate
    the client achieved; offered_rate_rps the same over the due times (what the trace asked for). send_lag:
    send time minus due time (how far the client fell behind its schedule; open loop). Latency (answer minus
    send) of successes: mean, percentiles (``gfdit.stats``, as the simulator and the live page) and max, None when
    nothing succeeded. slo_attainment: the share of requests with a deadline that succeeded within it (those
    not sent or failed count as missed); None when no request has one. errors: count by kind, most first;
    num_5xx: answers with a 5xx status.
    """
    sent = sorted(r.sent_s for r in records if r.sent_s is not None)
    due = sorted(r.arrival_s for r in records if r.sent_s is not None)
    answered = [r.done_s for r in records if r.done_s is not None]
    lat = [r.latency_s for r in records if r.latency_s is not None]
    lags = [r.sent_s - r.arrival_s for r in records if r.sent_s is not None]
    ok = sum(r.ok for r in records)
    duration = max(answered) - sent[0] if sent and answered else None
    if duration is not None and duration <= 0:
        duration = None
    with_slo = [r for r in records if r.slo_s is not None]
    errors: dict[str, int] = {}
    for r in records:
        if not r.ok:
            errors[r.kind] = errors.get(r.kind, 0) + 1

    def rate(times: list[float]) -> float | None:
        return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else None

    return {
        "num_requests": len(records),
        "num_sent": len(sent),
        "num_ok": ok,
        "num_errors": len(records) - ok,
        "num_5xx": sum(1 for r in records if r.status is not None and r.status >= 500),
        "duration_s": duration,
        "send_rate_rps": rate(sent),
        "offered_rate_rps": rate(due),
        "throughput_rps": ok / duration if duration else None,
        "mean_latency_s": sum(lat) / len(lat) if lat else None,
        "p50_latency_s": percentile(lat, 50) if lat else None,
        "p95_latency_s": percentile(lat, 95) if lat else None,
        "p99_latency_s": percentile(lat, 99) if lat else None,
        "max_latency_s": max(lat) if lat else None,
        "p99_send_lag_s": percentile(lags, 99) if lags else None,
        "max_send_lag_s": max(lags) if lags else None,
        "num_with_deadline": len(with_slo),
        "slo_attainment": sum(bool(r.met_slo) for r in with_slo) / len(with_slo) if with_slo else None,
        "errors": dict(sorted(errors.items(), key=lambda kv: (-kv[1], kv[0]))),
    }


def format_report(report: dict[str, Any]) -> str:
    """The report as a table for people: one metric a line, then errors by kind."""

    def num(v: Any, unit: str = "", scale: float = 1.0, fmt: str = ".4g") -> str:
        return "-" if v is None else f"{v * scale:{fmt}}{unit}"

    mode = report.get("mode", "")
    if mode == "closed":
        mode = f"closed loop, concurrency {report.get('concurrency')}"
    elif mode == "open":
        mode = "open loop"
    send_rate = num(report["send_rate_rps"], "/s")
    if report.get("mode") != "closed":  # open loop: against the schedule
        send_rate += (
            f" (offered {num(report['offered_rate_rps'], '/s')}; "
            f"lag p99 {num(report['p99_send_lag_s'], ' ms', 1e3, '.3g')}, "
            f"max {num(report['max_send_lag_s'], ' ms', 1e3, '.3g')})"
        )
    rows = [
        ("server", f"{report.get('url', '-')} ({report.get('model', '-')}), {mode}"),
        ("requests", f"{report['num_requests']} ({report['num_sent']} sent)"),
        ("send rate", send_rate),
        ("duration", num(report["duration_s"], " s")),
        ("ok", f"{report['num_ok']} (throughput {num(report['throughput_rps'], '/s')})"),
        ("errors", f"{report['num_errors']} (5xx: {report['num_5xx']})"),
        (
            "latency",
            "mean {} p50 {} p95 {} p99 {} max {}".format(
                *(
                    num(report[k], " s")
                    for k in ("mean_latency_s", "p50_latency_s", "p95_latency_s", "p99_latency_s")
                ),
                num(report["max_latency_s"], " s"),
            ),
        ),
        (
            "SLO attainment",
            f"{num(report['slo_attainment'], '', 1.0, '.1%')} "
            f"of {report['num_with_deadline']} with deadlines",
        ),
    ]
    rows += [(f"  {kind}", str(count)) for kind, count in report["errors"].items()]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def error_kind(status: int, body: bytes) -> str:
    """The error kind of an HTTP answer (see the module's docstring): a 4xx names its field, else its code."""
    err: Any = None
    try:
        err = json.loads(body).get("error")
    except (ValueError, AttributeError):
        pass
    if not isinstance(err, dict):
        return str(status)
    name = err.get("param") if 400 <= status < 500 and status != 429 else None
    name = name or err.get("code") or err.get("type")
    return f"{status} {name}" if name else str(status)


# ------------------------------------------------------------------------------------------------ requests
def parse_size(text: str) -> tuple[int, int]:
    """ "WxH" as (width, height); BenchError if malformed."""
    m = _SIZE.match(text)
    if m is None:
        raise BenchError(f"size {text!r} is not of the form WIDTHxHEIGHT")
    return int(m.group(1)), int(m.group(2))


def arch_name(model: str) -> str:
    """The model registry's name of a served model (the registry resolves aliases such as wan2.1); the name
    itself when the registry does not know it."""
    from gfdit._C import InvalidUsage, cost

    try:
        return str(cost.model_arch(model).name)
    except InvalidUsage:
        return model


def is_video_model(model: str) -> bool | None:
    """Whether a served model makes videos; None when the model is not one gfdit knows."""
    from gfdit._C import InvalidUsage, cost

    try:
        return bool(cost.model_arch(model).is_video)
    except InvalidUsage:
        return None


def workload_requests(
    model: str,
    workload: str,
    rate: float,
    duration_s: float,
    seed: int = 0,
    *,
    slo_scale: float | None = None,
    cluster: str = "h20x8",
    profile: Any = None,
) -> list[TraceRequest]:
    """Poisson arrivals at ``rate`` over ``duration_s`` of a ``gfdit.planning.workload`` for the served ``model`` (its
    menus fitted to the model: the tiny models get small sizes). Deadlines only with ``slo_scale`` (times
    the alone latency on ``cluster`` or ``profile``, as ``gfdit trace``). BenchError for a workload the model
    cannot serve."""
    from gfdit._C import InvalidUsage
    from gfdit.planning.workload import generate

    name = arch_name(model)
    if workload in ("video", "mixed") and is_video_model(model) is False:
        raise BenchError(
            f"the {workload} workload needs a video model; the server's {model} makes only images"
        )
    try:
        reqs = generate(
            workload,
            "poisson",
            rate,
            duration_s,
            slo_scale if slo_scale is not None else 1.0,
            seed,
            model=name,
            cluster=cluster,
            profile=profile,
        )
    except InvalidUsage as e:
        raise BenchError(e.message) from None
    for r in reqs:
        r.model = model
        if slo_scale is None:
            r.deadline_s = None
    return reqs


@dataclasses.dataclass
class _Prepared:
    """A request ready to go: its endpoint and pre-built JSON body."""

    req: TraceRequest
    path: str  # "" when it cannot be sent (unsupported_video)
    body: bytes
    slo_s: float | None


def prepare(
    requests: Sequence[TraceRequest],
    model: str,
    *,
    video_ok: bool | None,
    size: tuple[int, int] | None = None,
    steps: int | None = None,
    slo_ms: float | None = None,
) -> list[_Prepared]:
    """The bodies of ``requests`` for a server of ``model`` (built once, before the clock starts).

    size (width, height) and steps override every request's; slo_ms is the deadline of requests without
    one. video_ok False: videos are not sent (unsupported_video)."""
    out = []
    for r in requests:
        width, height = size if size is not None else (r.width, r.height)
        slo_s = r.deadline_s - r.arrival_s if r.deadline_s is not None else None
        if slo_s is None and slo_ms is not None:
            slo_s = slo_ms / 1000.0
        body: dict[str, Any] = {
            "model": model,
            "prompt": PROMPT,
            "size": f"{width}x{height}",
            "num_inference_steps": steps if steps is not None else r.num_inference_steps,
            "seed": r.id,
            "priority": r.priority,
        }
        if slo_s is not None:
            body["slo_ms"] = slo_s * 1000.0
        video = r.num_frames > 1
        if video:
            body["num_frames"] = r.num_frames
            path = "" if video_ok is False else "/v1/videos"
        else:
            body["n"] = 1
            body["response_format"] = "b64_json"
            path = "/v1/images/generations"
        out.append(_Prepared(r, path, json.dumps(body).encode(), slo_s))
    return out


# ------------------------------------------------------------------------------------------------ the run
class _Progress:
    """Counts answers and shows them on a tqdm bar (refreshed on a timer, not per answer)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total = total
        self.answered = 0
        self.ok = 0
        self.bar = None
        self.interval_s = 0.2
        if enabled:
            from tqdm import tqdm

            tty = sys.stderr.isatty()
            size = shutil.get_terminal_size()  # (80, 24) where the terminal reports none
            self.interval_s = 0.2 if tty else 10.0  # a log file gets a line every 10 s, not a stream
            self.bar = tqdm(
                total=total,
                file=sys.stderr,
                unit="req",
                # a terminal that reports no size (a pseudo-terminal without one) would hide the bar
                ncols=size.columns,
                nrows=size.lines,
                ascii=not tty,
                mininterval=self.interval_s,
                desc="gfdit bench",
            )

    def add(self, ok: bool) -> None:
        self.answered += 1
        self.ok += ok

    def refresh(self) -> None:
        if self.bar is not None:
            self.bar.n = self.answered
            self.bar.set_postfix_str(f"ok={self.ok} errors={self.answered - self.ok}", refresh=False)
            self.bar.refresh()

    async def run(self) -> None:
        while True:
            self.refresh()
            await asyncio.sleep(self.interval_s)

    def close(self) -> None:
        if self.bar is not None:
            self.refresh()
            self.bar.close()


class _Runner:
    """Sends prepared requests on one AsyncClient and records their outcomes."""

    def __init__(
        self,
        client: _Clients,
        clock: Callable[[], float],
        *,
        timeout_s: float,
        poll_s: float,
        fetch_content: bool,
        progress: _Progress,
    ) -> None:
        self.client = client
        self.clock = clock
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.fetch_content = fetch_content
        self.progress = progress

    async def one(self, p: _Prepared, due_s: float) -> RequestRecord:
        import httpx

        video = p.req.num_frames > 1
        rec = RequestRecord(p.req.id, video, due_s, None, None, None, UNSUPPORTED_VIDEO, p.slo_s)
        if not p.path:
            self.progress.add(False)
            return rec
        rec.sent_s = self.clock()
        try:
            r = await self.client.post(p.path, content=p.body)
            rec.status = r.status_code
            if r.status_code != 200:
                rec.done_s = self.clock()
                rec.kind = error_kind(r.status_code, r.content)
                if video and r.status_code == 400 and rec.kind == "400 model":
                    rec.kind = UNSUPPORTED_VIDEO  # the server's model makes only images
            elif video:
                await self._wait_video(rec, r.json()["id"])
            else:
                rec.done_s = self.clock()
                rec.kind = OK
                rec.engine_s = server_timing(r.headers.get("server-timing", "")).get("engine")
        except httpx.TimeoutException:
            rec.kind = TIMEOUT
        except httpx.RequestError:  # refused, reset, closed early
            rec.kind = CONNECTION
        except (ValueError, KeyError, TypeError):  # a 200 whose body is not the API's video object
            rec.kind = BAD_ANSWER
        self.progress.add(rec.ok)
        return rec

    async def _wait_video(self, rec: RequestRecord, job_id: str) -> None:
        assert rec.sent_s is not None
        while True:
            if self.clock() - rec.sent_s > self.timeout_s:
                rec.kind = TIMEOUT
                return
            await asyncio.sleep(self.poll_s)
            r = await self.client.get(f"/v1/videos/{job_id}")
            rec.status = r.status_code
            if r.status_code != 200:
                rec.done_s = self.clock()
                rec.kind = error_kind(r.status_code, r.content)
                return
            status = r.json()["status"]
            if status in ("queued", "in_progress"):
                continue
            rec.done_s = self.clock()
            if status != "completed":
                rec.kind = f"video {status}"
                return
            rec.kind = OK
            if self.fetch_content:
                c = await self.client.get(f"/v1/videos/{job_id}/content")
                if c.status_code != 200:
                    rec.status = c.status_code
                    rec.kind = error_kind(c.status_code, c.content)
            return


async def _open_loop(runner: _Runner, prepared: Sequence[_Prepared], start: float) -> list[RequestRecord]:
    """Each request at its arrival time (seconds after ``start`` on the runner's clock)."""
    tasks = []
    for p in prepared:
        delay = start + p.req.arrival_s - runner.clock()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(runner.one(p, p.req.arrival_s)))
    return list(await asyncio.gather(*tasks))


async def _closed_loop(
    runner: _Runner, prepared: Sequence[_Prepared], start: float, concurrency: int
) -> list[RequestRecord]:
    """``concurrency`` clients, each sending its next request when its last one is answered."""
    records: list[RequestRecord | None] = [None] * len(prepared)
    next_idx = 0

    async def client() -> None:
        nonlocal next_idx
        while next_idx < len(prepared):
            idx = next_idx
            next_idx += 1
            records[idx] = await runner.one(prepared[idx], runner.clock() - start)

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return [r for r in records if r is not None]


class _Clients:
    """Several httpx.AsyncClients on one event loop; each request goes to the one with the fewest in flight.

    One client with many connections costs O(connections^2) per request (httpcore's pool scans its idle
    connections once per connection whenever a request starts or ends), which at a few hundred requests in
    flight makes the client, not the server, the bottleneck. Shards of at most SHARD_CONNECTIONS keep each
    pool small.
    """

    SHARD_CONNECTIONS = 32

    def __init__(self, url: str, api_key: str | None, timeout_s: float, max_connections: int) -> None:
        import httpx

        headers = {"Content-Type": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        num = max(1, math.ceil(max_connections / self.SHARD_CONNECTIONS))
        per = math.ceil(max_connections / num)
        limits = httpx.Limits(max_connections=per, max_keepalive_connections=per)
        options: dict[str, Any] = {"headers": headers, "limits": limits, "timeout": timeout_s}
        # one TLS context for all shards (each would load the certificates again, ~20 ms); none for http
        options["verify"] = httpx.create_ssl_context() if url.startswith("https:") else False
        self.base_url = url
        self._shards = [httpx.AsyncClient(base_url=url, **options) for _ in range(num)]
        self._inflight = [0] * num

    async def request(self, method: str, path: str, content: bytes | None = None) -> Any:
        i = min(range(len(self._shards)), key=self._inflight.__getitem__)
        self._inflight[i] += 1
        try:
            return await self._shards[i].request(method, path, content=content)
        finally:
            self._inflight[i] -= 1

    async def post(self, path: str, content: bytes) -> Any:
        return await self.request("POST", path, content)

    async def get(self, path: str) -> Any:
        return await self.request("GET", path)

    async def __aenter__(self) -> _Clients:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await asyncio.gather(*(c.aclose() for c in self._shards))


async def _served_model(client: _Clients) -> str:
    import httpx

    try:
        r = await client.get("/v1/models")
    except httpx.HTTPError as e:
        raise BenchError(f"cannot reach {client.base_url}: {e or type(e).__name__}") from None
    if r.status_code != 200:
        raise BenchError(f"GET /v1/models answered {r.status_code} ({error_kind(r.status_code, r.content)})")
    try:
        return str(r.json()["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise BenchError("GET /v1/models did not answer a model list") from None


def served_model(url: str, *, api_key: str | None = None, timeout_s: float = 10.0) -> str:
    """The id of the model ``url`` serves (``GET /v1/models``); BenchError when unreachable or refused."""

    async def ask() -> str:
        async with _Clients(url, api_key, timeout_s, 4) as client:
            return await _served_model(client)

    return asyncio.run(ask())


async def bench_async(
    url: str,
    requests: Sequence[TraceRequest],
    *,
    api_key: str | None = None,
    concurrency: int | None = None,
    size: tuple[int, int] | None = None,
    steps: int | None = None,
    slo_ms: float | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    poll_s: float = DEFAULT_POLL_S,
    fetch_content: bool = False,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    progress: bool = False,
) -> dict[str, Any]:
    """Sends ``requests`` to the server at ``url`` and returns the report: the metrics of
    ``summarize_records`` plus url, model, mode ("open" or "closed"), concurrency and ``records`` (one dict
    per request: id, video, arrival_s, sent_s, done_s, latency_s, status, kind, slo_s, met_slo).

    Open loop by default: each request is sent at its ``arrival_s`` after the start. ``concurrency=C``: closed
    loop, C clients sending the requests in order, each when its last one is answered (arrivals ignored).
    api_key: sent as Bearer. size (width, height) and steps override every request's; slo_ms is the deadline
    of requests without one. timeout_s: per HTTP request (for videos: until completed). poll_s: between
    polls of a video job; fetch_content downloads finished videos. progress: a tqdm bar on stderr. Raises
    BenchError when the server cannot be reached or refuses ``GET /v1/models`` (a wrong API key)."""
    if not requests:
        raise BenchError("no requests to send")
    if concurrency is not None and concurrency < 1:
        raise BenchError(f"concurrency must be >= 1, got {concurrency}")
    if not (timeout_s > 0 and poll_s > 0 and max_connections >= 1):
        raise BenchError("timeout_s and poll_s must be positive and max_connections at least 1")
    async with _Clients(url, api_key, timeout_s, max_connections) as client:
        model = await _served_model(client)
        prepared = prepare(
            requests, model, video_ok=is_video_model(model), size=size, steps=steps, slo_ms=slo_ms
        )
        bar = _Progress(len(prepared), progress)
        loop = asyncio.get_running_loop()
        runner = _Runner(
            client, loop.time, timeout_s=timeout_s, poll_s=poll_s, fetch_content=fetch_content, progress=bar
        )
        ticker = asyncio.create_task(bar.run()) if progress else None
        try:
            start = loop.time()
            if concurrency is None:
                records = await _open_loop(runner, prepared, start)
            else:
                records = await _closed_loop(runner, prepared, start, concurrency)
        finally:
            if ticker is not None:
                ticker.cancel()
            bar.close()
    for rec in records:  # times after the run's start
        rec.sent_s = None if rec.sent_s is None else rec.sent_s - start
        rec.done_s = None if rec.done_s is None else rec.done_s - start
    report: dict[str, Any] = {
        "url": url,
        "model": model,
        "mode": "open" if concurrency is None else "closed",
        "concurrency": concurrency,
    }
    report.update(summarize_records(records))
    report["records"] = [r.to_json() for r in records]
    return report


def run_bench(url: str, requests: Sequence[TraceRequest], **options: Any) -> dict[str, Any]:
    """``bench_async`` from synchronous code: the same keyword options, the same report."""
    return asyncio.run(bench_async(url, requests, **options))


# ------------------------------------------------------------------------------------------------ plots
def write_plots(report: dict[str, Any], directory: str) -> list[str]:
    """latency_cdf.png, latency_over_time.png and throughput.png of a report in ``directory`` (created);
    returns their paths."""
    os.makedirs(directory, exist_ok=True)
    recs = report["records"]
    ok = [r for r in recs if r["kind"] == OK]
    bad = [r for r in recs if r["kind"] != OK]
    title = f"{report.get('model', '')} at {report.get('url', '')}"
    paths = []

    # latency CDF of successes
    ax = plots.axes(7, 4.5)
    lat = sorted(r["latency_s"] for r in ok)
    if lat:
        plots.cdf(ax, lat)
        for q, style in ((50, ":"), (99, "--")):
            ax.axvline(percentile(lat, q), color="grey", linestyle=style, label=f"p{q}")
        ax.legend(loc="lower right", fontsize="small")
    else:
        plots.empty(ax, "no request succeeded")
    ax.set_xlabel("latency (s)")
    ax.set_ylabel(f"fraction of successes ({len(lat)})")
    ax.set_xlim(left=0)
    ax.set_ylim(0, 1.02)
    ax.grid(True, alpha=0.3)
    ax.set_title(f"latency CDF: {title}")
    paths.append(plots.save(ax, os.path.join(directory, "latency_cdf.png")))

    # latency by arrival, errors marked at their answer time after sending
    ax = plots.axes(9, 4.5)
    if ok:
        ax.scatter(
            [r["arrival_s"] for r in ok],
            [r["latency_s"] for r in ok],
            s=6,
            color="C0",
            label=f"ok ({len(ok)})",
        )
    by_kind: dict[str, list[dict]] = {}
    for r in bad:
        by_kind.setdefault(r["kind"], []).append(r)
    for i, (kind, rs) in enumerate(sorted(by_kind.items(), key=lambda kv: -len(kv[1]))):
        ax.scatter(
            [r["arrival_s"] for r in rs],
            [
                (r["done_s"] - r["sent_s"]) if r["done_s"] is not None and r["sent_s"] is not None else 0.0
                for r in rs
            ],
            s=12,
            marker="x",
            linewidths=0.8,
            color=f"C{(i + 1) % 10}",
            label=f"{kind} ({len(rs)})",
        )
    ax.set_xlabel("arrival (s after the start)")
    ax.set_ylabel("latency (s; errors: until answered)")
    ax.grid(True, alpha=0.3)
    ax.set_title(f"latency over time: {title}")
    if recs:
        ax.legend(loc="upper left", fontsize="small")
    paths.append(plots.save(ax, os.path.join(directory, "latency_over_time.png")))

    # answers per second: successes, errors, and sends
    ax = plots.axes(9, 4.5)
    ends = [r["done_s"] for r in recs if r["done_s"] is not None] + [
        r["sent_s"] for r in recs if r["sent_s"] is not None
    ]
    num_bins = max(1, math.ceil(max(ends))) if ends else 1
    centers = [i + 0.5 for i in range(num_bins)]

    def per_second(times: list[float]) -> list[int]:
        counts = [0] * num_bins
        for t in times:
            counts[min(num_bins - 1, max(0, int(t)))] += 1
        return counts

    sends = per_second([r["sent_s"] for r in recs if r["sent_s"] is not None])
    ax.plot(centers, sends, color="grey", linestyle="--", label="sent")
    ax.plot(centers, per_second([r["done_s"] for r in ok]), color="C0", label="ok")
    if bad:
        ax.plot(
            centers,
            per_second([r["done_s"] for r in bad if r["done_s"] is not None]),
            color="C3",
            label="errors",
        )
    ax.set_xlabel("time (s after the start)")
    ax.set_ylabel("requests per second")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper right", fontsize="small")
    ax.set_title(f"answers per second: {title}")
    paths.append(plots.save(ax, os.path.join(directory, "throughput.png")))
    return paths


# ------------------------------------------------------------------------------------------------ CLI
def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """Arguments of ``gfdit bench``."""
    parser.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    parser.add_argument(
        "--trace",
        help="send this JSONL trace's requests (gfdit.planning.trace format), open loop at its arrival times",
    )
    parser.add_argument(
        "--rate", type=float, help="open loop: Poisson arrivals, requests/s (with --duration)"
    )
    parser.add_argument("--duration", type=float, help="--rate: seconds of arrivals")
    parser.add_argument(
        "--concurrency",
        type=int,
        help="closed loop: this many clients, each sending its next request when its last one is answered",
    )
    parser.add_argument(
        "--requests", type=int, help="--concurrency: requests in all (with --trace: at most the trace's)"
    )
    parser.add_argument(
        "--workload",
        choices=("image", "video", "mixed"),
        default="image",
        help="sizes and steps of generated requests, fitted to the served model (default image)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of generated arrivals and sizes")
    parser.add_argument("--size", help="WIDTHxHEIGHT of every request (overrides the trace's or workload's)")
    parser.add_argument("--steps", type=int, help="num_inference_steps of every request")
    parser.add_argument("--slo-ms", type=float, help="deadline (ms after sending) of requests without one")
    parser.add_argument(
        "--slo-scale",
        type=float,
        help="deadlines of generated requests: K x their alone latency on --cluster, as gfdit trace "
        "(default: none)",
    )
    parser.add_argument("--cluster", default="h20x8", help="--slo-scale: the cluster whose cost model prices")
    parser.add_argument("--profile", help="--slo-scale: a profile from `gfdit profile` (with --cluster cpu)")
    parser.add_argument("--api-key", help="send 'Authorization: Bearer KEY'")
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"seconds before a request counts as a timeout (default {DEFAULT_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--poll-s", type=float, default=DEFAULT_POLL_S, help="seconds between polls of a video job"
    )
    parser.add_argument("--fetch-content", action="store_true", help="download each finished video")
    parser.add_argument(
        "--max-connections",
        type=int,
        default=DEFAULT_MAX_CONNECTIONS,
        help=f"HTTP connections at most (default {DEFAULT_MAX_CONNECTIONS})",
    )
    parser.add_argument("--json", metavar="OUT", help="write the report and per-request records here")
    parser.add_argument("--plot", metavar="DIR", help="write latency and throughput plots (PNG) here")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _requests_of(args: argparse.Namespace, model: str) -> list[TraceRequest]:
    from gfdit._C import InvalidUsage
    from gfdit.planning.trace import load_trace

    gen = {"slo_scale": args.slo_scale, "cluster": args.cluster, "profile": args.profile}
    if args.trace is not None:
        try:
            reqs = load_trace(args.trace)
        except InvalidUsage as e:
            raise BenchError(e.message) from None
        others = sorted({r.model for r in reqs} - {model, arch_name(model)})
        if others:
            print(
                f"gfdit bench: the trace names {', '.join(others)}; its requests go to the served {model}",
                file=sys.stderr,
            )
        if args.concurrency is not None and args.requests is not None:
            reqs = reqs[: args.requests]
        return reqs
    if args.rate is not None:
        return workload_requests(model, args.workload, args.rate, args.duration, args.seed, **gen)
    # closed loop: the first N of a workload drawn at a rate that surely gives N
    n = args.requests
    duration = 1.0
    while True:
        reqs = workload_requests(model, args.workload, 2.0 * n, duration, args.seed, **gen)
        if len(reqs) >= n:
            return reqs[:n]
        duration *= 2.0


def _check_args(args: argparse.Namespace) -> None:
    if args.trace is None and args.rate is None and args.concurrency is None:
        raise BenchError(
            "say what to send: --trace T, --rate R --duration S, or --concurrency C --requests N"
        )
    if args.rate is not None and (args.trace is not None or args.concurrency is not None):
        raise BenchError("--rate draws its own arrivals: use it without --trace and --concurrency")
    if args.rate is not None:
        if not (args.rate > 0 and math.isfinite(args.rate)):
            raise BenchError(f"--rate must be a positive number, got {args.rate}")
        if args.duration is None or not (args.duration > 0 and math.isfinite(args.duration)):
            raise BenchError("--rate needs --duration S (seconds, positive)")
    elif args.duration is not None:
        raise BenchError("--duration goes with --rate")
    if args.concurrency is not None:
        if args.concurrency < 1:
            raise BenchError(f"--concurrency must be >= 1, got {args.concurrency}")
        if args.requests is None and args.trace is None:
            raise BenchError("--concurrency needs --requests N (or --trace T)")
        if args.requests is not None and args.requests < 1:
            raise BenchError(f"--requests must be >= 1, got {args.requests}")
    elif args.requests is not None:
        raise BenchError("--requests goes with --concurrency")
    if args.steps is not None and args.steps < 1:
        raise BenchError(f"--steps must be >= 1, got {args.steps}")
    if args.slo_ms is not None and not (args.slo_ms > 0 and math.isfinite(args.slo_ms)):
        raise BenchError(f"--slo-ms must be a positive number, got {args.slo_ms}")
    if not (args.timeout_s > 0 and args.poll_s > 0):
        raise BenchError("--timeout-s and --poll-s must be positive")
    if args.max_connections < 1:
        raise BenchError("--max-connections must be >= 1")


def run(args: argparse.Namespace, command: str) -> int:
    """Runs ``gfdit bench``: 0 when the run completed (whatever the server answered), 2 for bad arguments,
    an unreachable server or outputs that cannot be written."""
    try:
        _check_args(args)
        size = parse_size(args.size) if args.size is not None else None
        if args.plot is not None:
            os.makedirs(args.plot, exist_ok=True)
        model = served_model(args.url, api_key=args.api_key, timeout_s=min(args.timeout_s, 30.0))
        requests = _requests_of(args, model)
        if not requests:
            raise BenchError("no request to send (a rate too low for the duration?)")
        report = run_bench(
            args.url,
            requests,
            api_key=args.api_key,
            concurrency=args.concurrency,
            size=size,
            steps=args.steps,
            slo_ms=args.slo_ms,
            timeout_s=args.timeout_s,
            poll_s=args.poll_s,
            fetch_content=args.fetch_content,
            max_connections=args.max_connections,
            progress=not args.no_progress,
        )
    except BenchError as e:
        print(f"gfdit {command}: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"gfdit {command}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"gfdit {command}: interrupted", file=sys.stderr)
        return 130
    print(format_report(report))
    try:
        if args.json is not None:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(report, f, indent=1)
                f.write("\n")
            print(f"wrote {args.json}")
        if args.plot is not None:
            for path in write_plots(report, args.plot):
                print(f"wrote {path}")
    except OSError as e:
        print(f"gfdit {command}: cannot write the results: {e}", file=sys.stderr)
        return 2
    return 0
