#!/usr/bin/env python3
"""Network edges between hosts (NOTE [network edges] in src/collectives/net_edges.h) against a plain stream socket,
on an emulated cluster of two nodes joined by a 1 Gbit/s link (tests/python/netns_cluster.py: network, mount and
UTS namespaces, a private /dev/shm each, a tbf-shaped veth). Needs root; without it the benchmark says so and
writes a result that records the skip.

Two worlds run, one rank per node (1+1) and two per node (2+2, ranks 0 and 1 on node 0). In each, every
measurement of gfdit is interleaved with its baseline: a plain TCP socket that the same two rank processes (rank 0
on node 0, its counterpart on node 1) open over the same link, so that both see the same moment of a shared
machine. The link's own figures (`netns_cluster.measure_stream`: a stream and the round trip of a 64-byte message,
from programs that do nothing else) are taken before and after each world and printed as a reference.

1. Large messages (4, 16, 64 MiB per rank), bandwidth across the link per direction: the bytes the operation moves
   from one node to the other over its time (the slowest rank's, after a barrier), against the plain socket's
   stream of 32 MiB in the same repetition. Operations: send/recv (1+1: rank 0 to rank 1; 2+2: ranks 0 and 1 to
   ranks 2 and 3 at once), all_gather (S per rank: S per direction at 1+1, 4 S at 2+2), all_to_all (S per rank's
   input: S / 2 per direction at 1+1, S at 2+2). Ordinary tensors (staged messages). Target: >= 80% of the socket.
2. Small messages (8 B .. 4 KiB), ping-pong between rank 0 and its counterpart on the other node (the other ranks of
   the 2+2 world wait in a barrier): the median round trip of gfdit send + recv against the plain socket's round
   trip of the same message, both in blocks of alternating iterations. Twice: with the processes where the OS puts
   them (the emulated nodes share the machine's cores, so a message may wake its receiver on the sender's own
   core), and with each node's processes on a core of their own (as on two machines: every message wakes its
   receiver on another core, which on a virtual machine costs an interrupt between cores). Target: <= 2x.
3. Group formation across nodes: `World.new_group` of groups that span both nodes, timed in batches (median of
   the batches' per-call time, the slowest rank's), and the world's counters of network bytes
   (`WorldStats.net_bytes_sent` / `net_bytes_received`, the protocol's frames without keep-alive beats) before
   and after: no byte may move. Target: < 2 us per group, 0 bytes.

    python bench/bench_net.py                 # both worlds, every size (a few minutes)
    python bench/bench_net.py --quick         # fewer sizes and repetitions
    python bench/bench_net.py --json out.json # also writes out.md beside it
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
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

RATE = "1gbit"
LARGE = (4 * C.MIB, 16 * C.MIB, 64 * C.MIB)
QUICK_LARGE = (4 * C.MIB, 16 * C.MIB)
SMALL = (8, 64, 512, 4096)
OPS = ("send_recv", "all_gather", "all_to_all")
BASELINE_BYTES = 32 * C.MIB  # the socket's stream per repetition
TARGET_BANDWIDTH = 0.8  # of the socket's bytes/s
TARGET_RTT = 2.0  # x the socket's round trip
TARGET_GROUP_S = 2e-6
GROUPS_PER_BATCH = 2000


# ---------------------------------------------------------------------------------------------- the ranks
def cross_bytes(op: str, size: int, n: int) -> int:
    """Bytes an operation moves from node 0 to node 1 (as many go back) in a world of n ranks, n / 2 per node."""
    half = n // 2
    if op == "send_recv":  # every rank of node 0 sends `size` to its counterpart
        return half * size
    if op == "all_gather":  # every rank's `size` to each rank of the other node
        return half * half * size
    if op == "all_to_all":  # every rank's input of `size`, size / n to each member
        return half * half * (size // n)
    raise ValueError(op)


class _Socket:
    """The plain stream socket between rank 0 and its counterpart (the baseline), TCP_NODELAY as the edges."""

    def __init__(self, world: Any, store: Any, rank: int, peer: int) -> None:
        self.conn: socket.socket | None = None
        if rank == peer:
            return
        if rank > peer:  # the counterpart listens on its node's address, rank 0 connects
            srv = socket.create_server((os.environ.get("GFDIT_NET_ADDRESS", "127.0.0.1"), 0))
            store.set("baseline", f"{srv.getsockname()[0]} {srv.getsockname()[1]}")
            srv.settimeout(60)
            self.conn, _ = srv.accept()
            srv.close()
        else:
            host, port = store.get("baseline").decode().split()
            self.conn = socket.create_connection((host, int(port)), timeout=60)
        self.conn.settimeout(120)
        self.conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.first = rank < peer
        self.buf = bytearray(1 << 20)

    def _recv(self, n: int) -> None:
        view = memoryview(self.buf)
        while n > 0:
            k = self.conn.recv_into(view[: min(n, len(self.buf))])
            if k == 0:
                raise ConnectionError("the baseline socket closed")
            n -= k

    def stream(self, nbytes: int) -> float:
        """Seconds for `nbytes` from rank 0 to its counterpart, until the counterpart's 1-byte answer."""
        chunk = memoryview(bytes(1 << 20))
        t = time.perf_counter()
        if self.first:
            left = nbytes
            while left > 0:
                k = min(left, len(chunk))
                self.conn.sendall(chunk[:k])
                left -= k
            self._recv(1)
        else:
            self._recv(nbytes)
            self.conn.sendall(b"k")
        return time.perf_counter() - t

    def ping(self, msg: bytearray) -> float:
        t = time.perf_counter()
        if self.first:
            self.conn.sendall(msg)
            self._recv(len(msg))
        else:
            self._recv(len(msg))
            self.conn.sendall(msg)
        return time.perf_counter() - t


def _max_over_ranks(world: Any, values: list[float]) -> list[float]:
    import torch

    t = torch.tensor(values, dtype=torch.float64)
    out = torch.empty(world.world_size * len(values), dtype=torch.float64)
    world.all_gather_into_tensor(out, t)
    return out.view(world.world_size, len(values)).max(dim=0).values.tolist()


def _large(world: Any, sock: _Socket, sizes: list[int], reps: int) -> list[dict[str, Any]]:
    import torch

    n, rank, half = world.world_size, world.rank, world.world_size // 2
    peer = (rank + half) % n
    rows = []
    for op in OPS:
        for size in sizes:
            elems = size // 4
            if op == "send_recv":
                buf = torch.full((elems,), float(rank))
                ack = torch.empty(1)
            elif op == "all_gather":
                inp, out = torch.full((elems,), float(rank)), torch.empty(n * elems)
            else:
                inp, out = torch.arange(elems, dtype=torch.float32) + rank * elems, torch.empty(elems)

            def run() -> None:
                if op == "send_recv":
                    if rank < half:
                        world.send(buf, peer)
                        world.recv(ack, peer)
                    else:
                        world.recv(buf, peer)
                        world.send(ack, peer)
                elif op == "all_gather":
                    world.all_gather_into_tensor(out, inp)
                else:
                    world.all_to_all_single(out, inp)

            run()  # untimed: first touches of the buffers and the mirrors
            ok = True
            if op == "send_recv":
                ok = rank < half or bool((buf == float(peer)).all())
            elif op == "all_gather":
                ok = bool((out.view(n, elems) == torch.arange(n, dtype=torch.float32)[:, None]).all())
            else:
                part = elems // n
                want = torch.cat(
                    [torch.arange(part, dtype=torch.float32) + rank * part + src * elems for src in range(n)]
                )
                ok = bool(torch.equal(out, want))
            gf, base = [], []
            for _ in range(reps):
                world.barrier()
                t = time.perf_counter()
                run()
                gf.append(time.perf_counter() - t)
                world.barrier()
                base.append(sock.stream(BASELINE_BYTES) if sock.conn is not None else 0.0)
            gf = _max_over_ranks(world, gf)
            base = _max_over_ranks(world, base)
            okv = _max_over_ranks(world, [0.0 if ok else 1.0])[0] == 0.0
            cross = cross_bytes(op, size, n)
            rows.append(
                {
                    "op": op,
                    "size": size,
                    "cross_bytes": cross,
                    "seconds": gf,
                    "baseline_seconds": base,
                    "bytes_per_s": [cross / t for t in gf],
                    "baseline_bytes_per_s": [BASELINE_BYTES / t for t in base],
                    "correct": okv,
                }
            )
            if rank == 0:
                bw = statistics.median(rows[-1]["bytes_per_s"])
                sb = statistics.median(rows[-1]["baseline_bytes_per_s"])
                print(
                    f"  [{n} ranks] {op} {C.fmt_size(size)}: {bw / 1e6:.1f} MB/s across, socket {sb / 1e6:.1f} MB/s "
                    f"({bw / sb:.2f})",
                    flush=True,
                )
    return rows


def _pin(cpus: set[int] | None) -> None:
    """Every thread of this process (its network edges' too) on `cpus` (None: every cpu of the machine)."""
    cpus = cpus if cpus is not None else set(range(os.cpu_count() or 1))
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:
            pass  # a thread that ended meanwhile


def _small(
    world: Any, sock: _Socket, sizes: list[int], blocks: int, per_block: int, placement: str
) -> list[dict[str, Any]]:
    import torch

    n, rank, half = world.world_size, world.rank, world.world_size // 2
    peer = (rank + half) % n
    active = rank in (0, half)
    rows = []
    for size in sizes:
        t = torch.zeros(max(1, size // 4))
        msg = bytearray(size)
        gf, base = [], []
        world.barrier()
        if active:
            for _ in range(per_block):  # warm both paths
                sock.ping(msg)
            for b in range(blocks + 1):
                for _ in range(per_block):
                    s = time.perf_counter()
                    if rank < half:
                        world.send(t, peer)
                        world.recv(t, peer)
                    else:
                        world.recv(t, peer)
                        world.send(t, peer)
                    if b > 0:
                        gf.append(time.perf_counter() - s)
                for _ in range(per_block):
                    dt = sock.ping(msg)
                    if b > 0:
                        base.append(dt)
        world.barrier()
        if rank == 0:
            rows.append(
                {
                    "size": size,
                    "placement": placement,
                    "rtt_s": statistics.median(gf),
                    "rtt_p10_s": C.percentile(gf, 10),
                    "rtt_p90_s": C.percentile(gf, 90),
                    "baseline_rtt_s": statistics.median(base),
                    "baseline_p10_s": C.percentile(base, 10),
                    "baseline_p90_s": C.percentile(base, 90),
                    "samples": len(gf),
                }
            )
            r = rows[-1]
            print(
                f"  [{n} ranks, {placement}] ping-pong {size} B: {r['rtt_s'] * 1e6:.1f} us, socket "
                f"{r['baseline_rtt_s'] * 1e6:.1f} us "
                f"({r['rtt_s'] / r['baseline_rtt_s']:.2f}x)",
                flush=True,
            )
    return rows


def _groups(world: Any, store: Any, batches: int) -> dict[str, Any]:
    """Each rank in turn times new_group while the others wait on the store (not on the edges: nothing may reach
    the rank that measures while it counts its network bytes)."""
    n, rank, half = world.world_size, world.rank, world.world_size // 2
    spanning = [[0, half], [half, 0], list(range(n)), list(range(n))[::-1]]
    world.barrier()
    time.sleep(
        0.3
    )  # acknowledgements held back by the barrier go now, not during the loop (NOTE [network edges])
    per_call: dict[str, float] = {}
    sent = received = 0
    for turn in range(n):
        if rank == turn:
            before = world.stats()
            for ranks in spanning:
                for _ in range(200):
                    world.new_group(ranks)
                samples = []
                for _ in range(batches):
                    t = time.perf_counter_ns()
                    for _ in range(GROUPS_PER_BATCH):
                        world.new_group(ranks)
                    samples.append((time.perf_counter_ns() - t) / GROUPS_PER_BATCH / 1e9)
                per_call[",".join(map(str, ranks))] = statistics.median(samples)
            after = world.stats()
            sent = after.net_bytes_sent - before.net_bytes_sent
            received = after.net_bytes_received - before.net_bytes_received
            store.set(f"groups/{turn}", "done")
        else:
            store.wait([f"groups/{turn}"])
    spans = all(len({world.node_of(r) for r in g}) == 2 for g in spanning)
    keys = [",".join(map(str, g)) for g in spanning]
    worst = _max_over_ranks(world, [per_call[k] for k in keys] + [float(sent), float(received)])
    return {
        "per_call_s": dict(zip(keys, worst[: len(keys)])),
        "net_bytes_sent": int(worst[len(keys)]),
        "net_bytes_received": int(worst[len(keys) + 1]),
        "groups_span_nodes": spans,
        "remote_peers": [r for r in range(n) if world.remote(r)],
    }


def rank_main(args: argparse.Namespace) -> int:
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, n = args.rank, args.world_size
    host, port = args.store.rsplit(":", 1)
    store = dist.TCPStore(host, int(port), n, rank == 0, timeout=datetime.timedelta(seconds=120))
    import gfdit

    world = gfdit.World(rank, n, store, timeout=120.0, heap_bytes=64 * C.MIB)
    half = n // 2
    counterpart = {0: half, half: 0}.get(rank, rank)
    sock = _Socket(world, store, rank, counterpart)
    result: dict[str, Any] = {"world_size": n, "nodes": [world.node_of(r) for r in range(n)]}
    result["large"] = _large(world, sock, args.sizes, args.reps)
    result["small"] = _small(world, sock, SMALL, args.blocks, args.per_block, "shared cores")
    cpus = os.cpu_count() or 1
    if cpus >= 2:  # each node on a core of its own, as two machines (NOTE in the module's docstring)
        _pin({world.node_of(rank) % cpus})
        result["small"] += _small(world, sock, SMALL, args.blocks, args.per_block, "a core per node")
        _pin(None)
    result["groups"] = _groups(world, store, args.group_batches)
    world.barrier()
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(result, f)
    if sock.conn is not None:
        sock.conn.close()
    return 0


# ---------------------------------------------------------------------------------------------- the driver
def run_world(cl: Any, n: int, opts: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """A world of n ranks, n / 2 on each node of the cluster; rank 0's result."""
    node_ids = [0] * (n // 2) + [1] * (n // 2)
    env = cl.world_env(node_ids)
    store = f"{cl.node(0).address}:{random.randint(20000, 40000)}"
    with tempfile.TemporaryDirectory(prefix="gfdit-bench-net-") as tmp:
        out = os.path.join(tmp, "rank0.json")
        argv = [
            sys.executable,
            os.path.abspath(__file__),
            "--rank-of",
            str(n),
            "--store",
            store,
            "--out",
            out,
        ]
        argv += ["--sizes", ",".join(map(str, opts["sizes"])), "--reps", str(opts["reps"])]
        argv += ["--blocks", str(opts["blocks"]), "--per-block", str(opts["per_block"])]
        argv += ["--group-batches", str(opts["group_batches"])]
        procs = [
            cl.node(node).run(argv + ["--rank", str(r)], env=env, cwd=ROOT) for r, node in enumerate(node_ids)
        ]
        deadline = time.monotonic() + timeout_s
        try:
            for p in procs:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"the world of {n} did not finish within {timeout_s:.0f} s") from None
        finally:
            for node in cl.nodes:
                node.kill_all()
        codes = [p.returncode for p in procs]
        if any(codes) or not os.path.isfile(out):
            raise RuntimeError(f"the world of {n} failed: exit codes {codes}")
        with open(out) as f:
            return json.load(f)


def _med(xs: list[float]) -> float:
    return statistics.median(xs)


def report(
    worlds: dict[int, dict[str, Any]], links: list[dict[str, Any]]
) -> tuple[list[str], list[C.Target]]:
    tables, targets = [], []
    rows = []
    for n, res in worlds.items():
        for r in res["large"]:
            ratios = [a / b for a, b in zip(r["bytes_per_s"], r["baseline_bytes_per_s"])]
            bw, base = _med(r["bytes_per_s"]), _med(r["baseline_bytes_per_s"])
            ratio = _med(ratios)
            r["ratio"] = ratio
            r["ratio_range"] = [min(ratios), max(ratios)]
            met = ratio >= TARGET_BANDWIDTH and r["correct"]
            layout = f"{n // 2}+{n // 2}"
            rows.append(
                [
                    layout,
                    r["op"],
                    C.fmt_size(r["size"]),
                    f"{r['cross_bytes'] / C.MIB:.0f}",
                    f"{bw / 1e6:.1f}",
                    f"{base / 1e6:.1f}",
                    f"{ratio:.2f} ({min(ratios):.2f}-{max(ratios):.2f})",
                    "yes" if r["correct"] else "NO",
                    C.verdict(met),
                ]
            )
            targets.append(
                C.Target(
                    f"{layout} {r['op']} {C.fmt_size(r['size'])}: bandwidth across / socket",
                    ratio,
                    f">= {TARGET_BANDWIDTH:.0%}",
                    met,
                    f"{bw / 1e6:.1f} MB/s vs {base / 1e6:.1f} MB/s; range {min(ratios):.2f}-{max(ratios):.2f}",
                )
            )
    tables.append(
        C.print_table(
            "Large messages across the 1 Gbit/s link (per direction; median of the repetitions, the slowest rank's)",
            [
                "world",
                "op",
                "per rank",
                "MiB across",
                "gfdit MB/s",
                "socket MB/s",
                "ratio (range)",
                "correct",
                "meets",
            ],
            rows,
            [
                "MiB across: what the operation moves from one node to the other (as much goes back); socket: a "
                f"plain TCP stream of {BASELINE_BYTES // C.MIB} MiB between the same two processes, right after "
                "each repetition; ratio: per repetition, then the median (range over repetitions)"
            ],
        )
    )
    rows = []
    for n, res in worlds.items():
        for r in res["small"]:
            ratio = r["rtt_s"] / r["baseline_rtt_s"]
            r["ratio"] = ratio
            layout = f"{n // 2}+{n // 2}, {r['placement']}"
            met = ratio <= TARGET_RTT
            rows.append(
                [
                    layout,
                    f"{r['size']} B",
                    f"{r['rtt_s'] * 1e6:.1f} ({r['rtt_p10_s'] * 1e6:.0f}-{r['rtt_p90_s'] * 1e6:.0f})",
                    f"{r['baseline_rtt_s'] * 1e6:.1f} ({r['baseline_p10_s'] * 1e6:.0f}-{r['baseline_p90_s'] * 1e6:.0f})",
                    f"{ratio:.2f}x",
                    C.verdict(met),
                ]
            )
            targets.append(
                C.Target(
                    f"{layout} ping-pong {r['size']} B: round trip / socket's",
                    ratio,
                    f"<= {TARGET_RTT:.0f}x",
                    met,
                    f"{r['rtt_s'] * 1e6:.1f} us vs {r['baseline_rtt_s'] * 1e6:.1f} us",
                )
            )
    tables.append(
        C.print_table(
            "Small messages: ping-pong round trip across the link, us (median, p10-p90)",
            ["world", "message", "gfdit send+recv", "plain socket", "ratio", "meets"],
            rows,
            [
                "gfdit: send then recv (and the reverse on the other node) of an ordinary tensor; socket: sendall "
                "then recv of the same bytes, TCP_NODELAY, between the same two processes; blocks of iterations "
                "alternate between the two",
                "shared cores: the OS places every process on any core (the nodes share the machine's cores); a "
                "core per node: each node's processes (all their threads) on a core of their own, as on two "
                "machines, where a message always wakes its receiver on another core",
            ],
        )
    )
    rows = []
    for n, res in worlds.items():
        g = res["groups"]
        layout = f"{n // 2}+{n // 2}"
        worst = max(g["per_call_s"].values())
        met = worst < TARGET_GROUP_S and g["net_bytes_sent"] == 0 and g["net_bytes_received"] == 0
        for ranks, s in g["per_call_s"].items():
            rows.append(
                [
                    layout,
                    f"[{ranks}]",
                    f"{s * 1e9:.0f}",
                    str(g["net_bytes_sent"]),
                    str(g["net_bytes_received"]),
                ]
            )
        targets.append(
            C.Target(
                f"{layout} new_group across nodes [s]",
                worst,
                f"< {TARGET_GROUP_S * 1e6:.0f} us, 0 bytes",
                met,
                f"net bytes sent {g['net_bytes_sent']}, received {g['net_bytes_received']} during "
                f"{len(g['per_call_s'])} x batches of {GROUPS_PER_BATCH} calls; remote peers of rank 0: "
                f"{g['remote_peers']}",
            )
        )
    tables.append(
        C.print_table(
            "Group formation across nodes: World.new_group, ns per call (median of batches, slowest rank)",
            ["world", "ranks", "ns", "net bytes sent", "net bytes received"],
            rows,
            [
                "net bytes: the change of WorldStats.net_bytes_sent / net_bytes_received (the protocol's frames, "
                "keep-alive beats not counted) over all the calls, the largest over the ranks"
            ],
        )
    )
    rows = [
        [
            lk["when"],
            f"{lk['bytes_per_s'] / 1e6:.1f}",
            f"{lk['rtt_s'] * 1e6:.1f}",
            f"{lk['rtt_min_s'] * 1e6:.1f}",
        ]
        for lk in links
    ]
    tables.append(
        C.print_table(
            "The link alone (netns_cluster.measure_stream: 64 MiB stream, 64-byte round trips)",
            ["when", "MB/s", "rtt median us", "rtt min us"],
            rows,
        )
    )
    return tables, targets


def write_markdown(
    path: str, env: dict[str, Any], tables: list[str], targets: list[C.Target], extra: str
) -> None:
    lines = [
        "# Network edges: collectives across an emulated 1 Gbit/s link vs a plain stream socket",
        "",
        "Written by `bench/bench_net.py` (its docstring says what each number is). "
        f"{env.get('time')}, {env.get('cpu_count')} cpus, load average at the start {env.get('loadavg_1_5_15')}"
        + extra,
        "",
    ]
    for t in tables:
        lines += ["```", t, "```", ""]
    lines += ["Targets:", ""]
    for t in targets:
        lines.append(f"- {t.name}: {t.detail} -> {C.verdict(t.met)} (target {t.target})")
    lines.append("")
    lines.append(C.target_summary(targets))
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {path}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer sizes and repetitions")
    ap.add_argument(
        "--reps", type=int, default=None, help="repetitions per large message (default 5, quick 3)"
    )
    ap.add_argument("--worlds", default="2,4", help="world sizes, one half per node (default 2,4)")
    ap.add_argument("--timeout", type=float, default=1200.0, help="seconds allowed per world")
    ap.add_argument(
        "--json",
        default=os.path.join(HERE, "results", "net.json"),
        help="JSON output (default %(default)s); the markdown report goes beside it (.md)",
    )
    # a rank of a world (started on a node by the driver)
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--rank-of", dest="world_size", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--sizes", help=argparse.SUPPRESS)
    ap.add_argument("--blocks", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--per-block", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--group-batches", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.rank is not None:
        args.sizes = [int(s) for s in args.sizes.split(",")]
        return rank_main(args)

    import netns_cluster as nc

    env = C.environment()
    C.header("gfdit network edges across an emulated 1 Gbit/s link vs a plain stream socket", env)
    md_path = os.path.splitext(args.json)[0] + ".md"
    reason = nc.namespace_support()
    if reason is not None:
        print(f"skipped: {reason}", flush=True)
        C.write_json(args.json, {"benchmark": "net", "environment": env, "skipped": reason, "targets": []})
        with open(md_path, "w") as f:
            f.write(f"# Network edges\n\nNot measured on this machine: {reason}.\n")
        return 0
    ok, why = C.gfdit_importable()
    if not ok:
        print(f"gfdit is not importable ({why}); build it first (make build)", file=sys.stderr)
        return 2
    opts = {
        "sizes": list(QUICK_LARGE if args.quick else LARGE),
        "reps": args.reps or (3 if args.quick else 5),
        "blocks": 4 if args.quick else 10,
        "per_block": 50 if args.quick else 100,
        "group_batches": 5 if args.quick else 15,
    }
    worlds: dict[int, dict[str, Any]] = {}
    links: list[dict[str, Any]] = []
    errors: dict[str, str] = {}
    loads: dict[str, list[float]] = {}
    t_start = time.monotonic()
    with nc.EmulatedCluster(nodes=2, rate=RATE) as cl:

        def link(when: str) -> None:
            m = nc.measure_stream(cl.node(0), cl.node(1), nbytes=64 * C.MIB, num_pings=1000)
            links.append(
                {"when": when, "bytes_per_s": m.bytes_per_s, "rtt_s": m.rtt_s, "rtt_min_s": m.rtt_min_s}
            )
            print(
                f"link {when}: {m.bytes_per_s / 1e6:.1f} MB/s, round trip {m.rtt_s * 1e6:.1f} us", flush=True
            )

        for n in [int(x) for x in args.worlds.split(",") if x.strip()]:
            link(f"before {n // 2}+{n // 2}")
            print(f"world of {n} ({n // 2}+{n // 2}), load {os.getloadavg()}", flush=True)
            loads[f"{n // 2}+{n // 2} start"] = [round(x, 2) for x in os.getloadavg()]
            try:
                worlds[n] = run_world(cl, n, opts, args.timeout)
            except Exception as e:
                errors[f"world_size={n}"] = str(e)
                print(f"world of {n} FAILED: {e}", file=sys.stderr, flush=True)
            loads[f"{n // 2}+{n // 2} end"] = [round(x, 2) for x in os.getloadavg()]
            link(f"after {n // 2}+{n // 2}")
    tables, targets = report(worlds, links) if worlds else ([], [])
    if targets:
        print(C.target_summary(targets), flush=True)
    load_end = [round(x, 2) for x in os.getloadavg()]
    print(f"total {time.monotonic() - t_start:.0f} s; load averages {loads}", flush=True)
    C.write_json(
        args.json,
        {
            "benchmark": "net",
            "environment": env,
            "loadavg_end_1_5_15": load_end,
            "loadavg_by_world": loads,
            "config": dict(opts, quick=args.quick, rate=RATE, baseline_bytes=BASELINE_BYTES),
            "links": links,
            "worlds": {str(n): r for n, r in worlds.items()},
            "tables": tables,
            "targets": [t.as_dict() for t in targets],
            "errors": errors,
        },
    )
    write_markdown(md_path, env, tables, targets, f"; load averages by world {loads}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
