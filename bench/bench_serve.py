"""gfdit serve under `gfdit bench`: what the HTTP front end adds to a request, and overload without 5xx.

Targets (tiny-qwen-image, 4 CPU ranks, the server in the engine's process as `gfdit serve` runs it):

1. The server adds at most 2 ms to a request's latency over ``Engine.submit`` directly (median, one request at
   a time). Both are measured in this run, in alternating blocks: ``Engine.submit(...).result()`` in this
   process, and ``gfdit bench --concurrency 1`` (a separate client process) over HTTP, same sizes and seeds.
2. At 300 requests/s of Poisson arrivals (``gfdit bench --rate 300``, the server at ``--max-queue 16``) the
   client sends at least 200 requests/s, every request is answered (200 or 429) and none gets a 5xx.

    python bench/bench_serve.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from gfdit.engine import Engine, Request
from gfdit.loadgen import PROMPT
from gfdit.server import create_app, serving

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

MODEL = "tiny-qwen-image"
SIZE = (64, 64)  # width, height
OVERHEAD_TARGET_MS = 2.0
RATE_TARGET_RPS = 200.0


def bench_cli(url: str, args: list[str]) -> dict:
    """Runs `gfdit bench` in a client process; its JSON report."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "report.json")
        cmd = [
            sys.executable,
            "-m",
            "gfdit.cli",
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

    med_direct, med_http = statistics.median(direct), statistics.median(http)
    overhead_ms = (med_http - med_direct) * 1e3
    statuses = sorted({r["status"] for r in overload["records"]}, key=str)
    answered = all(r["status"] in (200, 429) for r in overload["records"])
    C.print_table(
        f"One request at a time ({size}, {args.steps} steps, {len(direct)} direct / {len(http)} over HTTP)",
        ["path", "median ms", "mean ms", "p99 ms"],
        [
            [
                name,
                f"{statistics.median(xs) * 1e3:.2f}",
                f"{statistics.mean(xs) * 1e3:.2f}",
                f"{C.percentile(xs, 0.99) * 1e3:.2f}",
            ]
            for name, xs in (("Engine.submit", direct), ("HTTP (gfdit bench)", http))
        ],
        [
            f"server overhead (median HTTP - median direct): {overhead_ms:.2f} ms "
            f"(target <= {OVERHEAD_TARGET_MS} ms), "
            f"ratio {med_http / med_direct:.3f}",
            f"per request, client latency - the server's engine time (Server-Timing): median "
            f"{statistics.median(outside) * 1e3:.2f} ms, p99 {C.percentile(outside, 0.99) * 1e3:.2f} ms",
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
            "targets": [t.as_dict() for t in targets],
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
