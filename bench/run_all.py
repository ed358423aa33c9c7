#!/usr/bin/env python3
"""Runs every gfdit benchmark (what `make bench` calls): prints each table, writes JSON under bench/results/.

  1. C++ group formation (Google Benchmark), if its binary is built: results/group_formation.json
  2. bench_groups.py (gfdit.new_group vs torch new_group, first collective on a fresh group): results/groups.json
  3. bench_collectives.py (bandwidth vs gloo and memcpy): results/collectives.json
  4. bench_attention.py (sequence-parallel attention and a tiny Wan forward vs gloo): results/attention.json
  5. bench_runtime.py (queue latencies, control-plane CPU per step, idle CPU, migration): results/runtime.json
  6. C++ scheduling round with 1,000 and 10,000 waiting requests, each policy against its full-list baseline
     (Google Benchmark): results/control.json
  7. bench_simulator.py (simulator speed on a 10,000-request Qwen-Image trace): results/simulator.json
  8. bench_fidelity.py (simulator vs real engine, same trace and policies): results/fidelity.json
  9. bench_serve.py (gfdit serve under gfdit bench: HTTP overhead over Engine.submit, overload): results/serve.json
 10. bench_torch_backend.py (torch.distributed on the "gfdit" backend vs gloo: new_group, diffusers context
     parallelism): results/torch_backend.json
 11. bench_heads.py (uneven heads against even degrees on tiny Wan and Qwen-Image; the attention plan cache
     off vs on): results/heads.json
 12. bench_cfg.py (CFG-parallel vs Ulysses 2 at world 2, one denoising step of tiny Wan and tiny Qwen-Image):
     results/cfg.json
 13. bench_decode.py (patch-parallel VAE decode at world 2 vs one rank, tiny Wan and tiny Qwen-Image):
     results/decode.json
 14. bench_batch_model.py (the batched denoising step vs one request at a time, tiny Qwen-Image and tiny Wan):
     results/batch_model.json
 15. bench_batch.py (four tiny Qwen-Image requests on one engine rank, batched vs one after another, end to
     end): results/batch.json
 16. bench_cache.py (step caches: FBCache's denoise time at about 40% of the passes reused vs uncached on one and
     two ranks, and the quality cost of FBCache and TeaCache on deep tiny models): results/cache.json
 17. bench_net.py (network edges across an emulated 1 Gbit/s link between two nodes vs a plain socket in the same
     run: bandwidth, round trips, group formation; needs root, else records the skip): results/net.json

and ends with a summary of every target. Defaults take about 25 minutes on 2 cores; --quick is a smoke
test. Exit status 0 when every benchmark ran (missed targets are reported, not an error) unless --strict.

    python bench/run_all.py [--quick] [--results DIR] [--cpp-bench PATH] [--strict]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import _common as C  # noqa: E402

CPP_BENCH_NAME = "group_formation_bench"
CPP_TARGET_NS = 1000.0


def find_cpp_bench(explicit: str | None, name: str = CPP_BENCH_NAME) -> str | None:
    if explicit:
        return explicit if os.path.isfile(explicit) else None
    candidates = []
    for pattern in (
        f"build/cpp/bench/{name}",
        f"build/cpp/{name}",
        f"build/**/{name}",
        f"**/build*/**/{name}",
    ):
        candidates += glob.glob(os.path.join(ROOT, pattern), recursive=True)
    candidates = [c for c in candidates if os.path.isfile(c) and os.access(c, os.X_OK)]
    if not candidates:
        return None
    return max(candidates, key=os.path.getmtime)  # the most recently built one


def run(cmd: list[str], timeout_s: float) -> tuple[int, float]:
    print("$ " + " ".join(cmd), flush=True)
    t0 = time.monotonic()
    try:
        rc = subprocess.run(cmd, cwd=ROOT, timeout=timeout_s).returncode
    except subprocess.TimeoutExpired:
        print(f"timed out after {timeout_s:.0f} s", flush=True)
        rc = 124
    return rc, time.monotonic() - t0


def cpp_targets(path: str) -> list[C.Target]:
    with open(path) as f:
        data = json.load(f)
    scale = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}
    out = []
    for b in data.get("benchmarks", []):
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        if b.get("run_type", "iteration") == "iteration" and b.get("repetitions", 1) > 1:
            continue
        if b.get("error_occurred"):
            out.append(
                C.Target(f"C++ {b.get('name')}: error", None, "runs", False, b.get("error_message", ""))
            )
            continue
        ns = b["real_time"] * scale.get(b.get("time_unit", "ns"), 1.0)
        name = b.get("run_name", b["name"]).split("/min_time")[0].split("/repeats")[0]
        out.append(
            C.Target(f"C++ {name}: median [ns]", ns, f"<= {CPP_TARGET_NS:.0f} ns", ns <= CPP_TARGET_NS)
        )
    return out


def control_targets(path: str) -> list[C.Target]:
    """One target per built-in policy: a scheduling round with 10,000 waiting requests at most 20 us (the
    full-list rows are the baseline, not a target)."""
    with open(path) as f:
        data = json.load(f)
    scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}
    out = []
    for b in data.get("benchmarks", []):
        name = b["name"]
        if (
            b.get("run_type") == "aggregate"
            or not name.startswith("scheduleRound/")
            or not name.endswith("/10000")
        ):
            continue
        us = b["real_time"] * scale.get(b.get("time_unit", "us"), 1.0)
        out.append(C.Target(f"C++ {name}: round [us]", us, "<= 20 us", us <= 20))
    return out


def _fmt_value(t: C.Target) -> str:
    if t.value is None:
        return "-"
    if "[s]" in t.name:
        return f"{C.fmt_us(t.value)} us"
    if "[ns]" in t.name:
        return f"{t.value:.1f} ns"
    if "memcpy" in t.name:
        return C.fmt_pct(t.value)
    return C.fmt_ratio(t.value)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke test of every benchmark")
    ap.add_argument("--results", default=os.path.join(HERE, "results"), help="JSON output directory")
    ap.add_argument(
        "--cpp-bench", default=None, help=f"path of the {CPP_BENCH_NAME} binary (default: search build/)"
    )
    ap.add_argument(
        "--skip",
        default="",
        help="comma separated: cpp,groups,collectives,attention,runtime,control,simulator,fidelity,serve,"
        "torch_backend,heads,cfg",
    )
    ap.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    ap.add_argument("--collectives-args", default="", help="extra arguments for bench_collectives.py")
    args = ap.parse_args(argv)
    skip = {s for s in args.skip.split(",") if s}
    os.makedirs(args.results, exist_ok=True)
    quick = ["--quick"] if args.quick else []
    t_start = time.monotonic()
    status: list[list[Any]] = []
    targets: list[C.Target] = []
    sources: list[tuple[str, list[C.Target]]] = []

    if "cpp" not in skip:
        exe = find_cpp_bench(args.cpp_bench)
        out = os.path.join(args.results, "group_formation.json")
        if exe is None:
            print(
                f"C++ benchmark {CPP_BENCH_NAME} not found under build/ (build it: make build); skipped",
                flush=True,
            )
            status.append(["C++ group formation", "not built", "-", "-"])
        else:
            cmd = [exe, f"--benchmark_out={out}", "--benchmark_out_format=json"]
            if args.quick:
                cmd.append("--benchmark_repetitions=3")
            rc, dt = run(cmd, 300)
            status.append(["C++ group formation", "ok" if rc == 0 else f"exit {rc}", f"{dt:.0f}", out])
            if rc == 0 and os.path.isfile(out):
                sources.append(("C++ group formation", cpp_targets(out)))
                targets += sources[-1][1]

    if "control" not in skip:
        exe = find_cpp_bench(None, "control_bench")
        out = os.path.join(args.results, "control.json")
        if exe is None:
            print(
                "C++ benchmark control_bench not found under build/ (build it: make build); skipped",
                flush=True,
            )
            status.append(["C++ scheduling round", "not built", "-", "-"])
        else:
            rc, dt = run([exe, f"--benchmark_out={out}", "--benchmark_out_format=json"], 300)
            status.append(["C++ scheduling round", "ok" if rc == 0 else f"exit {rc}", f"{dt:.0f}", out])
            if rc == 0 and os.path.isfile(out):
                sources.append(("C++ scheduling round", control_targets(out)))
                targets += sources[-1][1]

    py = sys.executable
    for key, script, json_name, timeout_s, extra in (
        ("groups", "bench_groups.py", "groups.json", 900, []),
        ("collectives", "bench_collectives.py", "collectives.json", 1800, args.collectives_args.split()),
        ("attention", "bench_attention.py", "attention.json", 900, []),
        ("runtime", "bench_runtime.py", "runtime.json", 900, []),
        ("simulator", "bench_simulator.py", "simulator.json", 600, []),
        ("fidelity", "bench_fidelity.py", "fidelity.json", 1200, []),
        ("serve", "bench_serve.py", "serve.json", 600, []),
        ("torch_backend", "bench_torch_backend.py", "torch_backend.json", 900, []),
        ("heads", "bench_heads.py", "heads.json", 900, []),
        ("cfg", "bench_cfg.py", "cfg.json", 900, []),
        ("decode", "bench_decode.py", "decode.json", 900, []),
        ("batch_model", "bench_batch_model.py", "batch_model.json", 600, []),
        ("batch", "bench_batch.py", "batch.json", 600, []),
        ("cache", "bench_cache.py", "cache.json", 2400, []),
        ("net", "bench_net.py", "net.json", 900, []),
    ):
        if key in skip:
            continue
        out = os.path.join(args.results, json_name)
        rc, dt = run([py, os.path.join(HERE, script), "--json", out] + quick + extra, timeout_s)
        status.append([script, "ok" if rc == 0 else f"exit {rc}", f"{dt:.0f}", out])
        if os.path.isfile(out):
            try:
                with open(out) as f:
                    sources.append((key, [C.Target(**t) for t in json.load(f).get("targets", [])]))
                targets += sources[-1][1]
            except (OSError, ValueError, TypeError) as e:
                print(f"could not read {out}: {e}", flush=True)

    C.print_table("Benchmarks run", ["benchmark", "status", "seconds", "json"], status)
    rows = []
    for source, ts in sources:
        judged = [t for t in ts if t.met is not None]
        missed = [t for t in judged if not t.met]
        rows.append(
            [
                source,
                len(judged) - len(missed),
                len(judged),
                "; ".join(t.name for t in missed[:3])
                + (f"; +{len(missed) - 3} more" if len(missed) > 3 else ""),
            ]
        )
    C.print_table("Targets by benchmark", ["benchmark", "met", "of", "missed (first 3)"], rows)
    rows = []
    for t in (t for source, ts in sources if source not in ("collectives", "attention") for t in ts):
        rows.append([t.name, _fmt_value(t), t.target, C.verdict(t.met)])
    C.print_table(
        "Group formation targets (collectives: see the table above and collectives.json)",
        ["measure", "value", "target", "meets"],
        rows,
    )
    print(C.target_summary(targets), flush=True)
    print(f"all benchmarks: {time.monotonic() - t_start:.0f} s; JSON in {args.results}", flush=True)
    failed = any(s[1] not in ("ok", "not built") for s in status)
    missed = any(t.met is False for t in targets)
    return 1 if failed or (args.strict and missed) else 0


if __name__ == "__main__":
    sys.exit(main())
