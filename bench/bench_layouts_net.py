#!/usr/bin/env python3
"""Sequence-parallel layouts across an emulated 1 Gbit/s link, measured against the cost model's predictions.

A world of 2 nodes x 2 ranks on the emulated cluster of tests/python/netns_cluster.py (network, mount and UTS
namespaces, a private /dev/shm each, a tbf-shaped veth between the nodes: ranks of one node share memory, ranks of
different nodes talk over the link). Needs root; without it the benchmark says so and writes a result that records
the skip. The ranks run ``gfdit profile --network`` (gfdit.tools.profile_network) with the link's nominal rate:

1. The link, with the world's own collectives: one stream, both ranks of a node at once (``concurrent``), the round
   trip of a small message, a small all_to_all across the nodes and inside one. The link's own figures
   (``netns_cluster.measure_stream``: a plain socket's stream and round trip) are taken before and after as a
   reference.
2. tiny-wan at about 1k, 2.3k, 4k, 9k and 16k tokens, for each layout of the 4 ranks: Ulysses 4 and Ring 4 across
   everything, USP 2x2 with Ulysses inside the nodes (Ring across: USP's usual placement), USP 2x2 with Ring inside
   and Ulysses across (SwiftFusion's placement), and Torus 2x2 on SwiftFusion's placement (the all-to-all across
   pipelined against the ring inside). One attention call of the model's heads on each rank's shard, and one
   denoising step (both guidance passes), the slowest rank's time; the median of --repeats rounds (more, up to
   ten times, where they fit in --min-seconds: the small sizes are noisy), each round timing every layout in turn.

Beside each measured step: the analytic model's prediction with the inter-node terms fitted to the measured link
(NOTE [inter-node calibration] in src/runtime/cost.cpp) and with the datasheet's terms of the "cpu" hardware. At
each size: the layout the calibrated model picks against the best measured one (target: the pick's measured step
within 10% of the best), and SwiftFusion's claim in miniature (its placement, USP or Torus, over USP with Ulysses
inside).

The profile the ranks wrote is kept beside the results (layouts_net_profile.json): `python bench/experiments.py
--only layouts --links bench/results/layouts_net_profile.json` scales the h20x16 cluster's inter-node terms by it
(the report's own copy is bench/results/experiments/measured_links.json, experiments.py's default).

    python bench/bench_layouts_net.py                 # every size, >= 5 rounds (about 6 minutes on 2 cores)
    python bench/bench_layouts_net.py --quick         # 1k and 4k tokens, 3 rounds
    python bench/bench_layouts_net.py --json out.json # also writes out.md beside it
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))

import _common as C  # noqa: E402

MODEL = "tiny-wan"
RATE = "1gbit"
LINE_GBIT = 1.0
NODE_IDS = [0, 0, 1, 1]
STORE_PORT = 29531  # on node 0's own network namespace: nothing else listens there
SHAPES = ((256, 256, 13), (256, 256, 33), (256, 256, 61), (384, 384, 61), (512, 512, 61))
QUICK_SHAPES = ((256, 256, 13), (256, 256, 61))
TARGET_PICK = 1.10  # the calibrated model's pick, measured, over the best measured step
SWIFT_CLAIM = {"mean": 1.35, "max": 1.77}  # SwiftFusion over USP, as published


def where(r: dict[str, Any]) -> str:
    """A layout's name in the tables."""
    from gfdit.tools import profile_network

    return profile_network.NodeLayout(
        r["ulysses"], r["ring"], r["mode"], r["placement"], profile_network.layout_where(r)
    ).name


def datasheet_predictions(records: list[dict[str, Any]]) -> list[float]:
    """The analytic model's step for each record with the "cpu" hardware's own inter-node terms (not measured)."""
    from gfdit.planning import cost
    from gfdit.tools import profile_network

    cluster = cost.cluster("cpu", len(NODE_IDS))
    return [r["predicted_s"] for r in profile_network.predictions(MODEL, cluster, records)]


def run_profile(
    cl: Any,
    shapes: tuple[tuple[int, int, int], ...],
    repeats: int,
    min_seconds: float,
    out_dir: str,
    timeout_s: float,
) -> str:
    """`gfdit profile --network` on the 4 ranks; the profile's path. Rank 0's output goes to stdout."""
    profile = os.path.join(out_dir, "profile.json")
    env = {"GFDIT_NODE_IDS": "", "GFDIT_NET_EDGES": "auto"} if cl.isolated else cl.world_env(NODE_IDS)
    env.update(
        MASTER_ADDR=cl.node(NODE_IDS[0]).address,
        MASTER_PORT=str(STORE_PORT if cl.isolated else C.free_port()),
        WORLD_SIZE=str(len(NODE_IDS)),
        PYTHONWARNINGS="ignore",
    )
    argv = [sys.executable, "-m", "gfdit", "profile", "--network", "--model", MODEL, "--out", profile]
    argv += ["--shapes", ",".join(f"{h}x{w}x{f}" for h, w, f in shapes), "--repeats", str(repeats)]
    argv += ["--line-gbit", str(LINE_GBIT), "--min-seconds", str(min_seconds)]
    procs = []
    for rank, node in enumerate(NODE_IDS):
        quiet = {} if rank == 0 else {"stdout": subprocess.DEVNULL}
        procs.append(cl.node(node).run(argv, env={**env, "RANK": str(rank)}, cwd=ROOT, **quiet))
    deadline = time.monotonic() + timeout_s
    try:
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"gfdit profile --network did not finish within {timeout_s:.0f} s") from None
    finally:
        for node in cl.nodes:
            node.kill_all()
    codes = [p.returncode for p in procs]
    if any(codes) or not os.path.isfile(profile):
        raise RuntimeError(f"gfdit profile --network failed: exit codes {codes}")
    return profile


def analyse(data: dict[str, Any]) -> dict[str, Any]:
    """Per size: the layouts' rows, the calibrated and the datasheet model's picks, SwiftFusion's ratios."""
    records = data["layouts"]
    for r, p in zip(records, datasheet_predictions(records)):
        r["predicted_datasheet_s"] = p
    sizes = []
    for tokens in sorted({r["tokens"] for r in records}):
        rows = [r for r in records if r["tokens"] == tokens]
        best = min(rows, key=lambda r: r["step_s"])
        pick = min(rows, key=lambda r: r["predicted_s"])
        pick_ds = min(rows, key=lambda r: r["predicted_datasheet_s"])
        mixed = [r for r in rows if r["ulysses"] > 1 and r["ring"] > 1]
        usp = next(r for r in mixed if r["mode"] == "usp" and r["placement"] == "ulysses-low")
        swift_usp = next(r for r in mixed if r["mode"] == "usp" and r["placement"] == "ring-low")
        torus = next(r for r in mixed if r["mode"] == "torus")
        swift = min((swift_usp, torus), key=lambda r: r["step_s"])
        sizes.append(
            {
                "tokens": tokens,
                "shape": [best["height"], best["width"], best["num_frames"]],
                "best": where(best),
                "best_step_s": best["step_s"],
                "pick": where(pick),
                "pick_ratio": pick["step_s"] / best["step_s"],
                "pick_datasheet": where(pick_ds),
                "pick_datasheet_ratio": pick_ds["step_s"] / best["step_s"],
                # SwiftFusion's placement (its better mode here) over USP with Ulysses inside: > 1 means it wins
                "swift_over_usp_step": usp["step_s"] / swift["step_s"],
                "torus_over_usp_step": usp["step_s"] / torus["step_s"],
                "swift_usp_over_usp_step": usp["step_s"] / swift_usp["step_s"],
                "torus_over_usp_attention": usp["attention_s"] / torus["attention_s"],
                "swift_usp_over_usp_attention": usp["attention_s"] / swift_usp["attention_s"],
                # the spread: the worst layout's step over the best one's
                "spread": max(r["step_s"] for r in rows) / best["step_s"],
            }
        )
    return {"sizes": sizes}


def tables(
    data: dict[str, Any], result: dict[str, Any], links_ref: list[dict[str, Any]]
) -> tuple[list[str], list[C.Target]]:
    out: list[str] = []
    rows = []
    for lk in data["links"]:
        rows.append(
            [
                f"{lk['node_a']}-{lk['node_b']}",
                str(lk["ranks_per_node"]),
                f"{lk['stream_bytes_per_s'] / 1e6:.1f}",
                f"{lk['concurrent_bytes_per_s'] / 1e6:.1f}",
                f"{lk['concurrent_bytes_per_s'] / lk['line_bytes_per_s']:.2f}"
                if lk.get("line_bytes_per_s")
                else "-",
                f"{lk['round_trip_s'] * 1e6:.1f}",
                f"{lk['collective_s'] * 1e6:.1f}",
                f"{lk['intra_collective_s'] * 1e6:.1f}",
            ]
        )
    rows += [
        [
            f"socket {x['when']}",
            "1",
            f"{x['bytes_per_s'] / 1e6:.1f}",
            "-",
            "-",
            f"{x['rtt_s'] * 1e6:.1f}",
            "-",
            "-",
        ]
        for x in links_ref
    ]
    out.append(
        C.print_table(
            f"The link between the nodes ({RATE} tbf, {LINE_GBIT * 125:.0f} MB/s per direction)",
            [
                "nodes",
                "ranks",
                "stream MB/s",
                "concurrent MB/s",
                "of line",
                "rtt us",
                "across us",
                "inside us",
            ],
            rows,
            [
                "stream: one rank to one rank; concurrent: both ranks of a node to their counterparts at once (all "
                "of them together); of line: concurrent over the nominal rate; across / inside: a 4-byte all_to_all "
                "of two members on two nodes / on one node (median); socket: a plain TCP stream and 64-byte round "
                "trip between the nodes (netns_cluster.measure_stream)"
            ],
        )
    )
    cal = data["calibrated"]
    out.append(
        C.print_table(
            "Inter-node terms of the analytic model (per rank)",
            ["cluster", "inter_node_bw MB/s", "inter_node_latency us"],
            [
                [
                    "cpu datasheet",
                    f"{cal['datasheet_bw'] / 1e6:.0f}",
                    f"{cal['datasheet_latency_s'] * 1e6:.1f}",
                ],
                ["cpu fitted to the link", f"{cal['bw'] / 1e6:.1f}", f"{cal['latency_s'] * 1e6:.1f}"],
            ],
        )
    )
    targets = []
    for s in result["sizes"]:
        rows = []
        for r in data["layouts"]:
            if r["tokens"] != s["tokens"]:
                continue
            rows.append(
                [
                    where(r),
                    f"{r['attention_s'] * 1e3:.1f}",
                    f"{r['step_s'] * 1e3:.1f}",
                    f"{min(r['step_samples_s']) * 1e3:.0f}-{max(r['step_samples_s']) * 1e3:.0f}",
                    f"{r['predicted_s'] * 1e3:.1f}",
                    f"{r['predicted_datasheet_s'] * 1e3:.1f}",
                    f"{r['efficiency']:.2f}",
                ]
            )
        h, w, f = s["shape"]
        met = s["pick_ratio"] <= TARGET_PICK
        out.append(
            C.print_table(
                f"{MODEL} {h}x{w}x{f}: {s['tokens']} tokens on 2 nodes x 2 ranks",
                [
                    "layout",
                    "attention ms",
                    "step ms",
                    "step range",
                    "predicted ms",
                    "datasheet ms",
                    "efficiency",
                ],
                rows,
                [
                    f"best measured: {s['best']}; the calibrated model picks {s['pick']} "
                    f"(measured {s['pick_ratio']:.2f}x the best; target <= {TARGET_PICK:.2f}); the datasheet's terms "
                    f"pick {s['pick_datasheet']} ({s['pick_datasheet_ratio']:.2f}x); SwiftFusion's placement over USP "
                    f"(Ulysses inside): {s['swift_over_usp_step']:.2f}x the step (Torus {s['torus_over_usp_step']:.2f}x, "
                    f"USP {s['swift_usp_over_usp_step']:.2f}x)"
                ],
            )
        )
        targets.append(
            C.Target(
                f"{s['tokens']} tokens: the calibrated model's pick / the best measured step",
                s["pick_ratio"],
                f"<= {TARGET_PICK:.2f}",
                met,
                f"picks {s['pick']}, best {s['best']}",
            )
        )
    rows = [
        [
            str(s["tokens"]),
            f"{s['swift_usp_over_usp_step']:.2f}",
            f"{s['torus_over_usp_step']:.2f}",
            f"{s['swift_usp_over_usp_attention']:.2f}",
            f"{s['torus_over_usp_attention']:.2f}",
        ]
        for s in result["sizes"]
    ]
    sw = result["swift"]
    out.append(
        C.print_table(
            "SwiftFusion's placement (Ring inside, Ulysses across) over USP with Ulysses inside (> 1: it wins)",
            ["tokens", "USP step", "Torus step", "USP attention", "Torus attention"],
            rows,
            [
                f"its better mode at each size over USP: mean {sw['mean']:.2f}x, max {sw['max']:.2f}x (published on GPU "
                f"clusters: mean {SWIFT_CLAIM['mean']}x, up to {SWIFT_CLAIM['max']}x)"
            ],
        )
    )
    return out, targets


def write_markdown(
    path: str, env: dict[str, Any], texts: list[str], targets: list[C.Target], extra: str
) -> None:
    lines = [
        "# Layouts across an emulated 1 Gbit/s link, measured and predicted",
        "",
        "Written by `bench/bench_layouts_net.py` (its docstring says what each number is). "
        f"{env.get('time')}, {env.get('cpu_count')} cpus, load average at the start {env.get('loadavg_1_5_15')}"
        + extra,
        "",
    ]
    for text in texts:
        lines += ["```", text, "```", ""]
    lines += ["Targets:", ""]
    for t in targets:
        lines.append(f"- {t.name}: {t.value:.3f}, {t.detail} -> {C.verdict(t.met)} (target {t.target})")
    lines += ["", C.target_summary(targets)]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {path}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="two sizes, 3 rounds")
    ap.add_argument(
        "--repeats", type=int, default=None, help="rounds of every layout per size (default 5, quick 3)"
    )
    ap.add_argument(
        "--min-seconds",
        type=float,
        default=None,
        help="per size, more rounds (up to 10 x --repeats) while they fit in this time (default 15, quick 0)",
    )
    ap.add_argument("--timeout", type=float, default=1200.0, help="seconds allowed for the measurement")
    ap.add_argument(
        "--json",
        default=os.path.join(HERE, "results", "layouts_net.json"),
        help="JSON output (default %(default)s); the markdown report and the profile go beside it",
    )
    args = ap.parse_args(argv)

    import netns_cluster as nc

    env = C.environment()
    C.header("gfdit layouts across an emulated 1 Gbit/s link: measured vs the cost model", env)
    base = os.path.splitext(args.json)[0]
    md_path, profile_path = base + ".md", base + "_profile.json"
    reason = nc.namespace_support()
    if reason is not None:
        print(f"skipped: {reason}", flush=True)
        C.write_json(
            args.json, {"benchmark": "layouts_net", "environment": env, "skipped": reason, "targets": []}
        )
        with open(md_path, "w") as f:
            f.write(f"# Layouts across an emulated link\n\nNot measured on this machine: {reason}.\n")
        return 0
    ok, why = C.gfdit_importable()
    if not ok:
        print(f"gfdit is not importable ({why}); build it first (make build)", file=sys.stderr)
        return 2
    from gfdit.planning import cost

    shapes = QUICK_SHAPES if args.quick else SHAPES
    repeats = args.repeats or (3 if args.quick else 5)
    if args.min_seconds is None:
        args.min_seconds = 0.0 if args.quick else 15.0
    links_ref: list[dict[str, Any]] = []
    t0 = time.monotonic()
    load_start = [round(x, 2) for x in os.getloadavg()]
    with (
        nc.EmulatedCluster(nodes=2, rate=RATE) as cl,
        tempfile.TemporaryDirectory(prefix="gfdit-layouts-net-") as tmp,
    ):

        def link(when: str) -> None:
            m = nc.measure_stream(cl.node(0), cl.node(1), nbytes=64 * C.MIB, num_pings=1000)
            links_ref.append(
                {"when": when, "bytes_per_s": m.bytes_per_s, "rtt_s": m.rtt_s, "rtt_min_s": m.rtt_min_s}
            )

        link("before")
        profile = run_profile(cl, shapes, repeats, args.min_seconds, tmp, args.timeout)
        link("after")
        os.makedirs(os.path.dirname(os.path.abspath(profile_path)), exist_ok=True)
        shutil.copyfile(profile, profile_path)
    wall = time.monotonic() - t0
    load_end = [round(x, 2) for x in os.getloadavg()]
    with open(profile_path) as f:
        data = json.load(f)
    fitted = cost.calibrated_cluster("cpu", profile_path)
    sheet = cost.cluster("cpu", len(NODE_IDS))
    h20 = cost.cluster("h20x16")
    h20_scaled = cost.calibrated_cluster(h20, profile_path, transfer=True)
    data["calibrated"] = {
        "bw": fitted.hw.inter_node_bw,
        "latency_s": fitted.hw.inter_node_latency_s,
        "datasheet_bw": sheet.hw.inter_node_bw,
        "datasheet_latency_s": sheet.hw.inter_node_latency_s,
        "h20x16": {
            "inter_node_bw": [h20.hw.inter_node_bw, h20_scaled.hw.inter_node_bw],
            "inter_node_latency_s": [h20.hw.inter_node_latency_s, h20_scaled.hw.inter_node_latency_s],
        },
    }
    result = analyse(data)
    ratios = [s["swift_over_usp_step"] for s in result["sizes"]]
    result["swift"] = {"mean": statistics.mean(ratios), "max": max(ratios), "min": min(ratios)}
    texts, targets = tables(data, result, links_ref)
    print(C.target_summary(targets), flush=True)
    print(
        f"measured in {wall:.0f} s; load average {load_start} at the start, {load_end} at the end", flush=True
    )
    C.write_json(
        args.json,
        {
            "benchmark": "layouts_net",
            "environment": env,
            "config": {
                "model": MODEL,
                "rate": RATE,
                "shapes": shapes,
                "repeats": repeats,
                "quick": args.quick,
            },
            "wall_s": wall,
            "loadavg_start_1_5_15": load_start,
            "loadavg_end_1_5_15": load_end,
            "links": data["links"],
            "links_socket": links_ref,
            "calibrated": data["calibrated"],
            "layouts": data["layouts"],
            "sizes": result["sizes"],
            "swift": result["swift"],
            "tables": texts,
            "targets": [t.as_dict() for t in targets],
        },
    )
    write_markdown(
        md_path,
        env,
        texts,
        targets,
        f"; at least {repeats} rounds per size (more where they fit in {args.min_seconds:g} s); measured in {wall:.0f} s, load average {load_start} at the start and "
        f"{load_end} at the end (other work shared the 2 cores)",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
