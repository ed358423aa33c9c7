"""Soak: thousands of requests through ``gfdit serve``, and what must stay true after them.

Two servers as users start them (``gfdit serve``, each in its own process), loaded at the same time by
``gfdit bench``'s client (``gfdit.tools.loadgen.run_bench``, closed loop):

- the embedded default, tiny-qwen-image on 4 ranks (what ``make serve`` runs), with images: mostly small
  sizes, about one in ten larger (up to 256x256), one to four steps;
- tiny-wan on 2 ranks with video jobs (``POST /v1/videos``, polled until completed): the default model
  makes only images, and a server serves one model.

Each server first gets a warm-up share of its requests (every size and step count once, then more), then the
rest. Checked, against the issue's targets:

1. Nothing is lost: every request is answered 200 (a video job: completed), none with a 5xx.
2. The resident memory (VmRSS) of each server and of every process under it (its workers), sampled every
   ``--sample-s`` after the warm-up, grows by at most 10%: the peak of the last quarter of the samples over
   the peak of the first quarter (RSS_WINDOW says why peaks); the first sample, the max and the last are
   reported, and max / first.
3. Every rank keeps its worker process (none dies and is replaced).
4. ``/dev/shm`` holds nothing of either server once it has stopped (SIGTERM): no name carrying its queue
   set's tag (the rings ``gfdit-q-TAG...``, outputs ``gfdit-o-TAG-...``, world ``gfdit-w-TAG...``).

    python bench/bench_soak.py [--images 5000] [--videos 50] [--concurrency 8] [--json PATH]

tests/python/test_soak.py runs a short version (``soak(...)`` below) in ``make test``.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gfdit import stats
from gfdit.planning.trace import TraceRequest
from gfdit.tools.loadgen import run_bench

IMAGE_MODEL, IMAGE_WORLD = "tiny-qwen-image", 4  # make serve's
VIDEO_MODEL, VIDEO_WORLD = "tiny-wan", 2
# (width, height): multiples of both tiny models' 16-pixel stride
SMALL_SIZES = [(32, 32), (48, 48), (64, 48), (48, 64), (80, 48), (48, 80), (64, 64)]
LARGE_SIZES = [(128, 128), (176, 176), (256, 144), (256, 256)]
LARGE_SHARE = 0.1
IMAGE_STEPS = [1, 2, 2, 4]
VIDEO_SIZES = [(48, 32), (64, 48), (80, 48)]
VIDEO_FRAMES = [5, 9]
VIDEO_STEPS = [2, 3]
RSS_GROWTH_TARGET = 0.10
# A worker's RSS swings with what is in flight (a 256x256 image next to others: tens of MiB more, freed after),
# so a single sample is no baseline: growth is judged between the peaks of the first and the last quarter of
# the samples after the warm-up. max / first (which a trough at the first sample inflates) is reported too.
RSS_WINDOW = 0.25
_QUEUE_NAME = re.compile(r"/dev/shm/gfdit-q-([0-9a-f]+)")


# ---------------------------------------------------------------------------------------------- the load
def image_requests(n: int, seed: int) -> list[TraceRequest]:
    """n image requests: every small and large size and step count first (the warm-up sees each), then
    drawn, about LARGE_SHARE of them large."""
    rng = random.Random(seed)
    shapes = [(s, k) for s in SMALL_SIZES + LARGE_SIZES for k in IMAGE_STEPS]
    while len(shapes) < n:
        sizes = LARGE_SIZES if rng.random() < LARGE_SHARE else SMALL_SIZES
        shapes.append((rng.choice(sizes), rng.choice(IMAGE_STEPS)))
    return [TraceRequest(i, 0.0, IMAGE_MODEL, h, w, 1, k) for i, ((w, h), k) in enumerate(shapes[:n])]


def video_requests(n: int, seed: int) -> list[TraceRequest]:
    rng = random.Random(seed)
    return [
        TraceRequest(i, 0.0, VIDEO_MODEL, h, w, rng.choice(VIDEO_FRAMES), rng.choice(VIDEO_STEPS))
        for i, (w, h) in enumerate(rng.choice(VIDEO_SIZES) for _ in range(n))
    ]


# ---------------------------------------------------------------------------------------------- processes
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, world_size: int, serve_args: Sequence[str]) -> tuple[subprocess.Popen, str]:
    """``gfdit serve`` in its own process group (not yet healthy: see ``wait_healthy``)."""
    port = free_port()
    cmd = [sys.executable, "-m", "gfdit", "serve", "--model", model, "--world-size", str(world_size)]
    cmd += ["--policy", "fcfs", "--host", "127.0.0.1", "--port", str(port), *serve_args]
    log = tempfile.TemporaryFile()  # its log, read when it fails (a pipe nobody reads would block it)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    proc.log = log  # type: ignore[attr-defined]
    return proc, f"http://127.0.0.1:{port}"


def server_log(proc: subprocess.Popen, limit: int = 4000) -> str:
    log = proc.log  # type: ignore[attr-defined]
    log.seek(0)
    return log.read().decode(errors="replace")[-limit:]


def wait_healthy(proc: subprocess.Popen, url: str, timeout_s: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    stop_server(proc)
    raise RuntimeError(f"gfdit serve at {url} did not become healthy; its log ends:\n{server_log(proc)}")


def stop_server(proc: subprocess.Popen, grace_s: float = 60.0) -> int:
    """SIGTERM, as an operator stops it; SIGKILL to its group past ``grace_s``. Its exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return proc.returncode


def descendants(pid: int) -> list[int]:
    """pid and every live process under it (from /proc/*/stat's parent ids)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])  # the fields after "(comm) state"
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def rss_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def queue_tag(pid: int) -> str | None:
    """The 16-character tag of the engine's names in /dev/shm, read from what the server maps."""
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8") as f:
            for line in f:
                m = _QUEUE_NAME.search(line)
                if m:
                    return m.group(1)[:16]
    except OSError:
        pass
    return None


def command_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return "?"
    text = " ".join(a.decode(errors="replace") for a in args if a)
    return text if len(text) <= 120 else text[:117] + "..."


@dataclass
class Server:
    """One server under soak: its process, what was sampled of it and what its load returned."""

    name: str
    model: str
    world_size: int
    proc: subprocess.Popen
    url: str
    tag: str | None = None
    warm: bool = False  # the warm-up share has been answered
    rss: dict[int, list[tuple[float, int, bool]]] = field(default_factory=dict)  # pid: (t, KiB, warm)
    names: dict[int, str] = field(default_factory=dict)
    reports: list[dict[str, Any]] = field(default_factory=list)
    exit_status: int | None = None

    def sample(self, now: float) -> None:
        for pid in descendants(self.proc.pid):
            kib = rss_kib(pid)
            if kib is None:
                continue
            if pid not in self.names:
                self.names[pid] = command_name(pid)
            self.rss.setdefault(pid, []).append((now, kib, self.warm))
        if self.tag is None:
            self.tag = queue_tag(self.proc.pid)


def _sampler(servers: Sequence[Server], period_s: float, done: threading.Event, t0: float) -> None:
    while not done.is_set():
        now = time.monotonic() - t0
        for s in servers:
            if s.proc.poll() is None:
                s.sample(now)
        done.wait(period_s)


def _load(
    server: Server, requests: list[TraceRequest], warmup: int, concurrency: int, timeout_s: float
) -> None:
    """The warm-up share, then the rest (sampling marks what comes after the warm-up)."""
    for part in (requests[:warmup], requests[warmup:]):
        if part:
            server.reports.append(
                run_bench(server.url, part, concurrency=concurrency, timeout_s=timeout_s, poll_s=0.05)
            )
        server.warm = True


# ---------------------------------------------------------------------------------------------- figures
def rss_figures(server: Server) -> list[dict[str, Any]]:
    """Per process, after the warm-up: RSS (MiB) at its first sample, its max and its last; growth = max /
    first - 1 and last_growth = last / first - 1; peak_growth = the max of the last quarter of its samples
    over the max of the first quarter - 1 (what the check bounds, see RSS_WINDOW); the samples themselves
    (seconds since the start, MiB). Processes that started after the warm-up are marked so."""
    out = []
    for pid, series in sorted(server.rss.items()):
        after = [(t, kib) for t, kib, warm in series if warm]
        if not after:
            continue
        kib = [k for _, k in after]
        first, peak, last = kib[0], max(kib), kib[-1]
        window = max(1, round(len(kib) * RSS_WINDOW))
        early, late = max(kib[:window]), max(kib[-window:])
        out.append(
            {
                "pid": pid,
                "command": server.names.get(pid, "?"),
                "role": _role(server, pid),
                "started_after_warmup": series[0][2],
                "num_samples": len(kib),
                "first_mib": first / 1024,
                "max_mib": peak / 1024,
                "last_mib": last / 1024,
                "growth": peak / first - 1,
                "last_growth": last / first - 1,
                "early_peak_mib": early / 1024,
                "late_peak_mib": late / 1024,
                "peak_growth": late / early - 1,
                "samples": [(round(t, 1), round(k / 1024, 1)) for t, k in after],
            }
        )
    return out


def _role(server: Server, pid: int) -> str:
    if pid == server.proc.pid:
        return "server"
    return "tracker" if "resource_tracker" in server.names.get(pid, "") else "worker"


def shm_left(tag: str | None) -> list[str]:
    """What /dev/shm still holds of the engine with this tag."""
    if tag is None:
        return []
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith("gfdit-") and tag in n)


def load_figures(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """The warm-up and the measured part together: counts, errors, answers that were not 200."""
    records = [r for rep in reports for r in rep["records"]]
    errors: dict[str, int] = {}
    for rep in reports:
        for kind, n in rep["errors"].items():
            errors[kind] = errors.get(kind, 0) + n
    latencies = [r["latency_s"] for r in records if r.get("latency_s") is not None]
    return {
        "num_requests": len(records),
        "num_ok": sum(rep["num_ok"] for rep in reports),
        "num_not_200": sum(1 for r in records if r["status"] != 200),
        "num_5xx": sum(rep["num_5xx"] for rep in reports),
        "errors": errors,
        "duration_s": sum(rep["duration_s"] or 0.0 for rep in reports),
        "p50_latency_s": stats.median(latencies) if latencies else None,
        "max_latency_s": max(latencies, default=None),
        "measured": {k: v for k, v in reports[-1].items() if k != "records"} if reports else None,
    }


def soak(
    num_images: int,
    num_videos: int,
    *,
    concurrency: int = 8,
    warmup_share: float = 0.1,
    sample_s: float = 1.0,
    serve_args: Sequence[str] = (),
    timeout_s: float = 600.0,
    seed: int = 0,
) -> dict[str, Any]:
    """Runs the soak (see the module docstring) and returns its figures; ``passed`` says whether every
    check held. serve_args go to both ``gfdit serve`` commands (e.g. the cost model's options)."""
    plan = []
    if num_images:
        plan.append(("images", IMAGE_MODEL, IMAGE_WORLD, image_requests(num_images, seed)))
    if num_videos:
        plan.append(("videos", VIDEO_MODEL, VIDEO_WORLD, video_requests(num_videos, seed)))
    servers = []
    t0 = time.monotonic()
    try:
        for name, model, world, _ in plan:
            proc, url = start_server(model, world, serve_args)
            servers.append(Server(name, model, world, proc, url))
        for s in servers:
            wait_healthy(s.proc, s.url, timeout_s)
        startup_s = time.monotonic() - t0
        done = threading.Event()
        sampler = threading.Thread(target=_sampler, args=(servers, sample_s, done, t0), daemon=True)
        sampler.start()
        failures: list[BaseException] = []

        def run_load(s: Server, reqs: list[TraceRequest]) -> None:
            warmup = max(1, min(len(reqs), round(len(reqs) * warmup_share)))
            try:
                _load(s, reqs, warmup, concurrency, timeout_s)
            except BaseException as e:  # reported after both loads ended
                failures.append(e)

        loads = [
            threading.Thread(target=run_load, args=(s, reqs))
            for s, (_, _, _, reqs) in zip(servers, plan, strict=True)
        ]
        for t in loads:
            t.start()
        for t in loads:
            t.join()
        load_s = time.monotonic() - t0 - startup_s
        for s in servers:
            s.sample(time.monotonic() - t0)  # the last sample: after the load
        done.set()
        sampler.join()
        if failures:
            raise failures[0]
    finally:
        for s in servers:
            s.exit_status = stop_server(s.proc)
    result: dict[str, Any] = {
        "concurrency": concurrency,
        "warmup_share": warmup_share,
        "sample_s": sample_s,
        "serve_args": list(serve_args),
        "startup_s": startup_s,
        "load_s": load_s,
        "servers": {},
    }
    passed = True
    for s, (_, _, _, reqs) in zip(servers, plan, strict=True):
        load = load_figures(s.reports)
        rss = rss_figures(s)
        left = shm_left(s.tag)
        growth = max((p["peak_growth"] for p in rss), default=None)
        checks = {
            "nothing_lost": load["num_ok"] == len(reqs) and load["num_not_200"] == 0 and load["num_5xx"] == 0,
            "rss_growth_within_target": growth is not None and growth <= RSS_GROWTH_TARGET,
            "shm_clean": s.tag is not None and not left,
            # one process per rank throughout: none died and was replaced
            "workers_stable": sum(p["role"] == "worker" and not p["started_after_warmup"] for p in rss)
            == s.world_size
            and not any(p["started_after_warmup"] for p in rss),
        }
        passed = passed and all(checks.values())
        result["servers"][s.name] = {
            "model": s.model,
            "world_size": s.world_size,
            "exit_status": s.exit_status,
            "load": load,
            "rss": rss,
            "max_rss_peak_growth": growth,
            "max_rss_growth_over_first": max((p["growth"] for p in rss), default=None),
            "queue_tag": s.tag,
            "shm_left": left,
            "checks": checks,
        }
    result["passed"] = passed
    return result


def format_result(result: dict[str, Any]) -> str:
    lines = [
        f"startup {result['startup_s']:.1f} s, load {result['load_s']:.1f} s, concurrency "
        f"{result['concurrency']}, warm-up {result['warmup_share']:.0%} of each server's requests"
    ]
    for name, s in result["servers"].items():
        load = s["load"]
        lines.append(
            f"{name}: {s['model']} on {s['world_size']} ranks: {load['num_ok']}/{load['num_requests']} ok, "
            f"{load['num_not_200']} not 200, {load['num_5xx']} 5xx, errors {load['errors'] or 'none'}; "
            f"p50 {load['p50_latency_s'] or 0:.3f} s, max {load['max_latency_s'] or 0:.3f} s"
        )
        for p in s["rss"]:
            lines.append(
                f"  {p['role']:7} pid {p['pid']:>7}: RSS first {p['first_mib']:7.1f} MiB, max {p['max_mib']:7.1f}, "
                f"last {p['last_mib']:7.1f} (max/first {p['growth']:+.1%}, last/first {p['last_growth']:+.1%}, peaks first to last quarter "
                f"{p['early_peak_mib']:.1f} -> {p['late_peak_mib']:.1f} MiB {p['peak_growth']:+.1%}; {p['num_samples']} samples)"
            )
        lines.append(
            f"  /dev/shm after stop (tag {s['queue_tag']}): {s['shm_left'] or 'clean'}; exit status "
            f"{s['exit_status']}; checks {s['checks']}"
        )
    lines.append(f"soak {'PASSED' if result['passed'] else 'FAILED'}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=5000)
    ap.add_argument("--videos", type=int, default=50)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--warmup-share", type=float, default=0.1)
    ap.add_argument("--sample-s", type=float, default=1.0)
    ap.add_argument("--json", default="bench/results/soak.json")
    ap.add_argument(
        "serve_args",
        nargs="*",
        help="more options for both gfdit serve commands (after --), e.g. --cluster cpu",
    )
    args = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _common as C

    env = C.environment()
    C.header("gfdit serve soak", env)
    result = soak(
        args.images,
        args.videos,
        concurrency=args.concurrency,
        warmup_share=args.warmup_share,
        sample_s=args.sample_s,
        serve_args=args.serve_args,
    )
    print(format_result(result), flush=True)
    C.write_json(args.json, {"environment": env, **result})
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
