"""gfdit serve under `gfdit bench`: what the HTTP front end adds to a request, and overload without 5xx.

Targets (tiny-qwen-image, 4 CPU ranks, the server in the engine's process as `gfdit serve` runs it):

1. The server adds at most 2 ms to a request's latency over ``Engine.submit`` directly (median, one request at
   a time). Both are measured in this run, in alternating blocks: ``Engine.submit(...).result()`` in this
   process, and ``gfdit bench --concurrency 1`` (a separate client process) over HTTP, same sizes and seeds.
2. At 300 requests/s of Poisson arrivals (``gfdit bench --rate 300``, the server at ``--max-queue 16``) the
   client sends at least 200 requests/s, every request is answered (200 or 429) and none gets a 5xx.

Then the embedded default as users run it: ``gfdit serve`` (its own process) with ``static:1`` and with
``fcfs``, both given a profile of this machine measured in this run by ``gfdit profile`` (the cost model
the policies read), ``fcfs`` started fresh (no ``--profile``, an empty profile cache: it measures its cached
profile before it serves; target: within 5% of ``static:1`` in mean latency), and ``fcfs`` with the analytic CPU
cost model instead; ``gfdit bench`` replays the same Poisson image workload (seeded) against each at two rates.

    python bench/bench_serve.py [--quick] [--skip-policies] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

from gfdit.serving.engine import Engine, Request
from gfdit.serving.server import create_app, serving
from gfdit.tools.loadgen import PROMPT

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

MODEL = "tiny-qwen-image"
SIZE = (64, 64)  # width, height
OVERHEAD_TARGET_MS = 2.0
RATE_TARGET_RPS = 200.0
FRESH_TARGET = 1.05  # a fresh gfdit serve's fcfs over static:1 with a profile, in mean latency (issue target)


def bench_cli(url: str, args: list[str]) -> dict:
    """Runs `gfdit bench` in a client process; its JSON report."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "report.json")
        cmd = [
            sys.executable,
            "-m",
            "gfdit.tools.cli",
            "bench",
            "--url",
            url,
            "--no-progress",
            "--json",
            out,
            *args,
        ]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=600)
        with open(out) as f:
            return json.load(f)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_process(
    world_size: int, policy: str, cost_args: list[str], cache: str | None = None
) -> tuple[subprocess.Popen, str]:
    """``gfdit serve`` as users start it, in its own process, its profile cache in ``cache`` (None: the user's);
    waits for /health (an empty cache: after the server measured its profile)."""
    import httpx

    port = free_port()
    cmd = [sys.executable, "-m", "gfdit", "serve", "--model", MODEL, "--world-size", str(world_size)]
    cmd += ["--policy", policy, "--port", str(port), *cost_args]
    env = {**os.environ, "XDG_CACHE_HOME": cache} if cache else None
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=env
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"gfdit serve --policy {policy} did not become healthy")


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def policy_runs(world_size: int, quick: bool) -> list[dict]:
    """static:1 and fcfs on ``gfdit serve`` under the same seeded Poisson image workload (see the docstring)."""
    rates, duration = ([1.5], 10.0) if quick else ([1.5, 3.0], 30.0)
    with tempfile.TemporaryDirectory() as tmp:
        profile = os.path.join(tmp, "profile.json")
        shapes = "48x80x1,128x128x1,256x256x1"  # the default and the workload's range of sizes
        cmd = [
            sys.executable,
            "-m",
            "gfdit.tools.cli",
            "profile",
            "--model",
            MODEL,
            "--world-size",
            str(world_size),
        ]
        subprocess.run([*cmd, "--shapes", shapes, "--out", profile], check=True, stdout=subprocess.DEVNULL)
        # "fresh": no --profile and an empty profile cache, as a new user starts it: the server measures its
        # profile before it answers /health (NOTE [cached profiles] in gfdit.tools.profile_cache)
        configs = [
            ("static:1", "profile", ["--profile", profile]),
            ("fcfs", "profile", ["--profile", profile]),
            ("fcfs", "fresh", []),
            ("fcfs", "analytic cpu", ["--cluster", "cpu"]),
        ]
        runs = []
        for rate in rates:
            for policy, cost, cost_args in configs:
                cache = tempfile.mkdtemp(dir=tmp) if cost == "fresh" else None
                t_start = time.perf_counter()
                proc, url = serve_process(world_size, policy, cost_args, cache)
                start_s = time.perf_counter() - t_start
                try:
                    bench = ["--rate", str(rate), "--duration", str(duration), "--workload", "image"]
                    report = bench_cli(url, [*bench, "--seed", "3", "--slo-ms", "3000"])
                finally:
                    stop(proc)
                report.pop("records")
                runs.append(
                    {"policy": policy, "cost_model": cost, "rate": rate, "start_s": start_s, **report}
                )

    def mean_of(rate: float, policy: str, cost: str) -> float:
        return next(
            r["mean_latency_s"]
            for r in runs
            if (r["rate"], r["policy"], r["cost_model"]) == (rate, policy, cost)
        )

    C.print_table(
        f"gfdit serve ({MODEL}, {world_size} ranks), gfdit bench Poisson image workload, {duration:g} s, "
        "deadline 3 s",
        [
            "rate /s",
            "policy",
            "cost model",
            "start s",
            "ok",
            "errors",
            "thr /s",
            "mean s",
            "p50 s",
            "p95 s",
            "p99 s",
            "SLO",
        ],
        [
            [
                f"{r['rate']:g}",
                r["policy"],
                r["cost_model"],
                f"{r['start_s']:.1f}",
                r["num_ok"],
                r["num_sent"] - r["num_ok"],
                f"{r['throughput_rps']:.3f}",
                f"{r['mean_latency_s']:.3f}",
                f"{r['p50_latency_s']:.3f}",
                f"{r['p95_latency_s']:.3f}",
                f"{r['p99_latency_s']:.3f}",
                f"{100 * r['slo_attainment']:.1f}%",
            ]
            for r in runs
        ],
        [
            f"rate {rate:g}/s: fresh fcfs / static:1 mean latency "
            f"{mean_of(rate, 'fcfs', 'fresh') / mean_of(rate, 'static:1', 'profile'):.3f} (target <= {FRESH_TARGET:g})"
            for rate in rates
        ],
    )
    return runs


def direct_latencies(engine: Engine, n: int, steps: int, seed0: int) -> list[float]:
    out = []
    for i in range(n):
        req = Request(prompt=PROMPT, width=SIZE[0], height=SIZE[1], num_inference_steps=steps, seed=seed0 + i)
        t0 = time.perf_counter()
        engine.submit(req).result(timeout=60)
        out.append(time.perf_counter() - t0)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default="bench/results/serve.json")
    ap.add_argument("--world-size", type=int, default=4)
    ap.add_argument("--steps", type=int, default=4, help="steps of the overhead requests")
    ap.add_argument("--skip-policies", action="store_true", help="leave out static:1 vs fcfs on gfdit serve")
    args = ap.parse_args()
    env = C.environment()
    C.header("gfdit serve under gfdit bench", env)
    blocks, per_block = (2, 5) if args.quick else (4, 10)
    rate, duration = 300.0, (2.0 if args.quick else 5.0)

    with Engine(model=MODEL, world_size=args.world_size, policy="fcfs") as engine:
        with serving(create_app(engine, model=MODEL, max_queue=16)) as url:
            direct_latencies(engine, 3, args.steps, 10_000)  # warm up
            direct: list[float] = []
            http: list[float] = []
            outside: list[float] = []  # per HTTP request: client latency - the server's engine time
            size = f"{SIZE[0]}x{SIZE[1]}"
            for b in range(blocks):
                direct += direct_latencies(engine, per_block, args.steps, 0)  # seeds 0.. as the client's ids
                report = bench_cli(
                    url,
                    [
                        "--concurrency",
                        "1",
                        "--requests",
                        str(per_block),
                        "--size",
                        size,
                        "--steps",
                        str(args.steps),
                    ],
                )
                ok = [r for r in report["records"] if r["kind"] == "ok"]
                http += [r["latency_s"] for r in ok]
                outside += [r["latency_s"] - r["engine_s"] for r in ok if r["engine_s"] is not None]
            overload = bench_cli(
                url, ["--rate", str(rate), "--duration", str(duration), "--workload", "image"]
            )

    med_direct, med_http = C.median(direct), C.median(http)
    overhead_ms = (med_http - med_direct) * 1e3
    statuses = sorted({r["status"] for r in overload["records"]}, key=str)
    answered = all(r["status"] in (200, 429) for r in overload["records"])
    C.print_table(
        f"One request at a time ({size}, {args.steps} steps, {len(direct)} direct / {len(http)} over HTTP)",
        ["path", "median ms", "mean ms", "p99 ms"],
        [
            [
                name,
                f"{C.median(xs) * 1e3:.2f}",
                f"{C.stats.mean(xs) * 1e3:.2f}",
                f"{C.percentile(xs, 99) * 1e3:.2f}",
            ]
            for name, xs in (("Engine.submit", direct), ("HTTP (gfdit bench)", http))
        ],
        [
            f"server overhead (median HTTP - median direct): {overhead_ms:.2f} ms "
            f"(target <= {OVERHEAD_TARGET_MS} ms), "
            f"ratio {med_http / med_direct:.3f}",
            f"per request, client latency - the server's engine time (Server-Timing): median "
            f"{C.median(outside) * 1e3:.2f} ms, p99 {C.percentile(outside, 99) * 1e3:.2f} ms",
        ],
    )
    C.print_table(
        f"Overload: Poisson {rate:g}/s for {duration:g} s against --max-queue 16",
        ["sent", "send rate /s", "ok", "429", "5xx", "statuses", "p99 send lag ms"],
        [
            [
                overload["num_sent"],
                f"{overload['send_rate_rps']:.1f}",
                overload["num_ok"],
                overload["errors"].get("429 queue_full", 0),
                overload["num_5xx"],
                ",".join(str(s) for s in statuses),
                f"{overload['p99_send_lag_s'] * 1e3:.1f}",
            ]
        ],
    )
    targets = [
        C.Target(
            "serve: HTTP overhead over Engine.submit, median [ms]",
            overhead_ms,
            f"<= {OVERHEAD_TARGET_MS} ms",
            overhead_ms <= OVERHEAD_TARGET_MS,
        ),
        C.Target(
            "serve: send rate under overload [req/s]",
            overload["send_rate_rps"],
            f">= {RATE_TARGET_RPS:.0f}/s, all answered 200/429, no 5xx",
            overload["send_rate_rps"] >= RATE_TARGET_RPS and answered and overload["num_5xx"] == 0,
            f"5xx {overload['num_5xx']}, statuses {statuses}",
        ),
    ]
    policies = [] if args.skip_policies else policy_runs(args.world_size, args.quick)
    print(C.target_summary(targets), flush=True)
    overload.pop("records")
    C.write_json(
        args.json,
        {
            "environment": env,
            "overhead": {
                "size": size,
                "steps": args.steps,
                "direct_s": direct,
                "http_s": http,
                "median_overhead_ms": overhead_ms,
                "outside_engine_s": outside,
            },
            "overload": overload,
            "policies": policies,
            "targets": [t.as_dict() for t in targets],
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
