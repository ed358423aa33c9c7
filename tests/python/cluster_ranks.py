"""The rank programs of the multi-node tests: one process of a world whose ranks run on the nodes of an emulated
cluster (netns_cluster), started by test_cluster_collectives.py, or by torchrun (test_torchrun_nodes.py).

    python cluster_ranks.py PROGRAM --out DIR --rank R --world-size N --store HOST:PORT [--timeout S] [...]
    torchrun ... cluster_ranks.py torchrun --out DIR

Rank 0 hosts the store; given port 0, it first prints `store PORT` on stdout, and the test starts the other ranks
with that port. Under torchrun the program takes --out alone: `gfdit.init()` reads what torchrun set. A rank
ends by writing DIR/rank<R>.json: what it saw of the world, the number of checks it made and every mismatch (or
the error that stopped it). Mismatches are collected, not raised, so that every rank goes on through the same
sequence of collectives and the world stays in step; an exception ends the rank (its peers then fail too).

Programs:
- `world`: the collectives on groups that cross nodes, stay inside one and overlap, against references each rank
  computes from the other ranks' deterministic inputs (and gloo for the whole world; cases_collectives.py); every
  attention layout against float64 attention in one process (attn_harness.py); a tiny Wan transformer step against
  the plain model on one rank (models_harness.py); then torch.distributed's "gfdit" backend against gloo
  (cases_torch_backend.py).
- `victim`: all_reduce over the world in a loop, printing `looping` once, until a peer dies: the error it got.
- `torchrun`: collectives and attention layouts across nodes in a world that `gfdit.init()` makes alone.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import json
import os
import socket
import struct
import sys
import time
import traceback
import types
from collections.abc import Iterator
from typing import Any

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

# A world of 2 nodes x 2 ranks: ranks 0 and 1 on one node, 2 and 3 on the other.
NODE_IDS = [0, 0, 1, 1]
CROSSING = [None, [0, 2], [3, 1], [1, 2], [2, 0, 3], [3, 2, 1, 0]]  # groups that span both nodes
INSIDE = [[0, 1], [2, 3], [1, 0]]  # groups inside one node
_SIOCGIFADDR = 0x8915


def interface_of(address: str) -> str | None:
    """The name of this host's network interface that has the IPv4 address `address`."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                req = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address
            if socket.inet_ntoa(req[20:24]) == address:
                return name
    return None


def world_info(world: Any) -> dict:
    """What a rank sees of where the world's ranks run, and where "auto" puts Ulysses and Ring."""
    from gfdit.attention import ParallelSpec, Topology, resolve_placement

    n = world.world_size
    topo = Topology.of_world(world)
    spec = ParallelSpec(ulysses=2, ring=n // 2, placement="auto")
    return {
        "rank": world.rank,
        "hostname": socket.gethostname(),
        "node_of": [world.node_of(r) for r in range(n)],
        "host_of": [world.host_of(r) for r in range(n)],
        "remote": [world.remote(r) for r in range(n)],
        "net_port": world.net_port,
        "node_ids_env": os.environ.get("GFDIT_NODE_IDS"),
        "auto": resolve_placement(spec, list(range(n)), topo),
        "auto_interleaved": resolve_placement(spec, [0, 2, 1, 3], topo) if n == 4 else None,
    }


# ---- collectives --------------------------------------------------------------------------------------------


def _overlapping(ctx: Any, seed: int) -> int:
    """all_reduce and all_gather on a chain of overlapping groups, inside and across nodes, one after another in one
    global order (each rank runs the calls of its groups), against references from every member's input."""
    import gfdit
    from cases_common import Checker, rand_tensor, reduce_ref, reduce_scale

    chk = Checker(ctx.rank)
    chain = [[0, 1], [1, 2], [2, 3], [3, 0], [1, 2, 3], [0, 1], [2, 0], None, [3, 2]]
    for rnd in range(3):
        for i, ranks in enumerate(chain):
            members = list(range(ctx.world_size)) if ranks is None else ranks
            if ctx.rank not in members:
                continue
            group = None if ranks is None else gfdit.new_group(ranks)
            key = (seed, rnd, i)
            x = rand_tensor((7 + i, 3), "float32", *key, ctx.rank, kind="sum", n=len(members))
            gfdit.all_reduce(x, group=group)
            ins = [rand_tensor((7 + i, 3), "float32", *key, r, kind="sum", n=len(members)) for r in members]
            want = reduce_ref(ins, "sum", "float32")
            chk.reduced(x, want, reduce_scale(ins), "float32", f"chain all_reduce {members}")
            mine = rand_tensor((2, i + 1), "int64", *key, 1, ctx.rank)
            out = torch.empty((2 * len(members), i + 1), dtype=torch.int64)
            gfdit.all_gather_into_tensor(out, mine, group=group)
            ref = torch.cat([rand_tensor((2, i + 1), "int64", *key, 1, r) for r in members])
            chk.equal(out, ref, f"chain all_gather {members}")
    return chk.raise_if_any()


def _symmetric_puts(ctx: Any, seed: int) -> int:
    """Symmetric heap tensors (one offset on every member, NOTE [symmetric allocation]) on groups across nodes, the
    heaps skewed first so that the members' own next offsets differ; every member puts its row into every other
    member's copy (put_with_signal) and waits for theirs (wait_signal)."""
    import gfdit
    from cases_common import Checker, rand_tensor

    chk = Checker(ctx.rank)
    world = gfdit.get_world()
    skew = gfdit.empty((1000 + 3000 * ctx.rank,))  # held to the end: the heaps differ between ranks
    for g, ranks in enumerate([[0, 2], [3, 1, 2], None]):
        members = list(range(ctx.world_size)) if ranks is None else ranks
        if ctx.rank not in members:
            continue
        group = None if ranks is None else gfdit.new_group(ranks)
        me = members.index(ctx.rank)
        buf = world.symmetric_empty((len(members), 33), torch.float32, group=group)
        buf.fill_(-1.0)
        world.barrier(group)  # every member's copy is ready before a put lands in it
        for peer in members:
            if peer != ctx.rank:
                world.put_with_signal(rand_tensor((33,), "float32", seed, g, me), buf[me], peer)
        for peer in members:
            if peer != ctx.rank:
                world.wait_signal(peer, 1)
        for j, peer in enumerate(members):
            if peer != ctx.rank:
                want = rand_tensor((33,), "float32", seed, g, j)
                chk.equal(buf[j], want, f"symmetric put from {peer} in {members}")
        chk.true(bool((buf[me] == -1.0).all()), f"own row untouched in {members}")
        world.barrier(group)  # no member frees its copy while a peer may still write into it
        del buf
    del skew
    return chk.raise_if_any()


def collective_checks(ctx: Any) -> tuple[int, list[str]]:
    """Every collective on groups across, inside and over nodes; (checks made, mismatches)."""
    import cases_collectives as cc

    checks, failures = 0, []

    def run(fn: Any, *args: Any, **kwargs: Any) -> None:
        nonlocal checks
        try:
            checks += fn(ctx, *args, **kwargs)
        except AssertionError as exc:  # a Checker's mismatches: the ranks are still in step
            failures.append(f"{fn.__name__}{args}{kwargs}: {exc}")

    dtypes = ["float32", "bfloat16", "int64", "uint8", "float16", "int32"]
    for i, ranks in enumerate(CROSSING + INSIDE):
        dtype = dtypes[i % len(dtypes)]
        seed = 10 + i
        run(cc.case_all_gather, seed, dtype, ranks=ranks)
        run(cc.case_all_to_all_single, seed, dtype, ranks=ranks, split="uneven")
        run(cc.case_all_to_all_single, seed, dtype, ranks=ranks, split="even", mems=cc.MEM_COMBOS[:2])
        if dtype != "uint8":
            run(cc.case_reduce_scatter, seed, dtype, op="sum", ranks=ranks)
            run(cc.case_all_reduce, seed, dtype, op="max" if i % 2 else "sum", ranks=ranks)
        members = list(range(ctx.world_size)) if ranks is None else ranks
        run(cc.case_broadcast, seed, dtype, members[-1], ranks=ranks)
        run(cc.case_all_to_all_4d, seed, dtype, ranks=ranks)
        run(cc.case_all_to_all_4d_head_splits, seed, dtype, ranks=ranks)
    # sizes above a staging slot take the chunked path through the network edges
    run(cc.case_all_gather, 40, "float32", ranks=None, size="large", mems=cc.MEM_COMBOS[:2])
    run(cc.case_all_to_all_single, 41, "bfloat16", ranks=[3, 1], split="large", mems=cc.MEM_COMBOS[1:3])
    run(cc.case_all_reduce, 42, "float32", ranks=[0, 2, 3], size="large", mems=("heap",))
    run(cc.case_all_to_all_4d, 43, "float32", ranks=[1, 2], mems=("plain",), large=True)
    transfers = [(0, 2), (2, 0), (1, 3), (3, 0), (0, 1), (2, 3), (3, 2), (1, 2), (3, 1), (2, 1)]
    run(cc.case_send_recv, 50, "float32", transfers)
    run(cc.case_send_recv, 51, "int64", [(3, 0), (0, 3)], size="large", mems=("plain", "heap"))
    run(cc.case_put_with_signal, 52, "float32")  # a ring 0 -> 1 -> 2 -> 3 -> 0: two of its edges cross nodes
    run(cc.case_put_with_signal, 53, "bfloat16")
    run(_symmetric_puts, 55)
    run(_overlapping, 54)
    return checks, failures


def staged_checks(ctx: Any) -> tuple[int, list[str]]:
    """The path of a device world across hosts (NOTE [device tensors across hosts]) with CPU tensors standing in
    for the device ones: every collective runs on host copies and copies its outputs back; (checks, mismatches)."""
    import cases_collectives as cc
    import gfdit

    world = gfdit.get_world()
    world._stage_cpu_tensors = True
    checks, failures = 0, []
    try:
        for i, ranks in enumerate([None, [0, 2], [3, 1, 2]]):
            for fn, args, kwargs in (
                (cc.case_all_gather, ("float32",), {}),
                (cc.case_all_to_all_single, ("bfloat16",), {"split": "uneven"}),
                (cc.case_reduce_scatter, ("float32",), {"op": "sum"}),
                (cc.case_all_reduce, ("int64",), {"op": "max"}),
                (cc.case_broadcast, ("float16", (ranks or [0, 1, 2, 3])[-1]), {}),
                (cc.case_all_to_all_4d, ("float32",), {}),
            ):
                try:
                    checks += fn(ctx, 70 + i, *args, ranks=ranks, **kwargs)
                except AssertionError as exc:
                    failures.append(f"staged {fn.__name__}{args}{kwargs} on {ranks}: {exc}")
        try:
            checks += cc.case_send_recv(ctx, 75, "float32", [(0, 2), (3, 1), (2, 3)])
        except AssertionError as exc:
            failures.append(f"staged case_send_recv: {exc}")
    finally:
        world._stage_cpu_tensors = False
    return checks, failures


# ---- attention and a model step -----------------------------------------------------------------------------


def attention_cases() -> list[dict]:
    """Every layout of a 2 x 2 world across its nodes: USP with Ulysses inside nodes (ulysses-low: Ulysses among
    ranks 0,1 and 2,3) and across them (ring-low, and auto, which the nodes resolve to ring-low), Ulysses and Ring
    over all four, Torus in both placements; joint tokens, uneven shards, bfloat16, sub-groups across nodes."""
    cases: list[dict] = []

    def add(name: str, spec: dict, shape: tuple, **kw: Any) -> None:
        cases.append({"name": name, "spec": spec, "shape": shape, "seed": 900 + len(cases), **kw})

    for mode in ("usp", "torus"):
        for placement in ("ulysses-low", "ring-low", "auto"):
            spec = {"ulysses": 2, "ring": 2, "mode": mode, "placement": placement}
            add(f"{mode}-2x2-{placement}", spec, (1, 64, 4, 16), joint=5, joint_pos="front")
            add(f"{mode}-2x2-{placement}-uneven", spec, (2, 39, 5, 8), splits=[13, 0, 9, 17], joint=3,
                joint_pos="rear")  # fmt: skip
            add(f"{mode}-2x2-{placement}-bf16", spec, (1, 48, 4, 16), dtype="bfloat16", cached=True)
        add(f"{mode}-ulysses4", {"ulysses": 4, "ring": 1, "mode": mode}, (1, 40, 6, 16), joint=4)
        add(f"{mode}-ring4", {"ulysses": 1, "ring": 4, "mode": mode}, (2, 44, 3, 8), splits=[5, 20, 0, 19])
    add("ulysses-pair-across", {"ulysses": 2, "ring": 1}, (1, 30, 3, 8), group=[3, 1], joint=2)
    add("ring-pair-across", {"ulysses": 1, "ring": 2}, (1, 26, 2, 8), group=[1, 2], splits=[20, 6])
    add("ring-pair-inside", {"ulysses": 1, "ring": 2}, (1, 24, 2, 8), group=[3, 2])
    add(
        "torus-2x2-reordered",
        {"ulysses": 2, "ring": 2, "mode": "torus", "placement": "auto", "torus_chunks": 1},
        (1, 64, 4, 16),
        group=[2, 0, 3, 1],
        splits=[10, 20, 30, 4],
    )
    add("ulysses3-across", {"ulysses": 3, "ring": 1, "mode": "usp"}, (1, 21, 5, 8), group=[3, 0, 1], joint=3)
    return cases


def model_cases() -> list[dict]:
    """A tiny Wan transformer step (two blocks) on the world with layouts across nodes."""
    specs = [
        {"ulysses": 2, "ring": 2, "placement": "auto"},
        {"ulysses": 4, "ring": 1},
        {"ulysses": 1, "ring": 4},
        {"ulysses": 2, "ring": 2, "mode": "torus", "placement": "ulysses-low"},
    ]
    return [{"model": "wan", "seed": 30 + i, "spec": s, "name": f"tiny-wan {s}"} for i, s in enumerate(specs)]


@contextlib.contextmanager
def auto_placements(result: dict) -> Iterator[None]:
    """Records in result["auto_calls"] what "auto" resolved to inside the attention calls meanwhile, and from which
    nodes: (group ranks, node ids, placement)."""
    from gfdit.attention import core

    resolved = set()
    resolve = core.resolve_placement

    def recording(spec: Any, ranks: Any, topology: Any) -> str:
        placement = resolve(spec, ranks, topology)
        resolved.add((tuple(ranks), tuple(topology.node_ids), placement))
        return placement

    core.resolve_placement = recording
    try:
        yield
    finally:
        core.resolve_placement = resolve
        result["auto_calls"] = sorted(resolved)


def layout_checks(ctx: Any, cases: list[dict], with_model: bool, result: dict) -> list[str]:
    """Attention layouts (and the model step) exact against one process: the mismatches; the cases run go to
    result["layouts"] and result["model_steps"]."""
    import attn_harness
    import mp_harness

    reports = mp_harness.run_batch(ctx, cases, attn_harness.run_case)
    result["layouts"], result["model_steps"] = len(reports), 0
    if with_model:
        import models_harness

        steps = mp_harness.run_batch(ctx, model_cases(), models_harness.run_case)
        result["model_steps"] = len(steps)
        reports += steps
    return [f"{r['name']}: {r.get('error') or r}" for r in reports if not r["ok"] or r.get("warnings")]


# ---- the torch.distributed backend --------------------------------------------------------------------------


def torch_backend_checks(ctx: Any) -> list[str]:
    """torch.distributed on the "gfdit" backend across nodes against gloo groups over the same ranks."""
    import cases_torch_backend as ctb
    import torch.distributed as dist

    backend = ctb.setup(ctx)  # the default group on gfdit: a second world, over the same hosts
    failures = [] if backend == "gfdit" else [f"the default group's backend is {backend}"]
    # every collective on groups across the nodes (not the functional ones: importing them costs each rank 2 s)
    failures += ctb.collectives(ctx, 7)
    pg = dist.group.WORLD
    world = pg._world
    if [world.node_of(r) for r in range(ctx.world_size)] != NODE_IDS:
        failures.append(f"the backend's world has nodes {[world.node_of(r) for r in range(ctx.world_size)]}")
    dist.destroy_process_group()
    return failures


# ---- programs -----------------------------------------------------------------------------------------------


def _store(args: argparse.Namespace) -> Any:
    import torch.distributed as dist

    host, port = args.store.rsplit(":", 1)
    timeout = datetime.timedelta(seconds=args.timeout)
    if args.rank == 0:
        store = dist.TCPStore(host, int(port), args.world_size, True, timeout=timeout, wait_for_workers=False)
        print(f"store {store.port}", flush=True)
        return store
    return dist.TCPStore(host, int(port), args.world_size, False, timeout=timeout)


def _finish(store: Any, rank: int, world_size: int) -> None:
    """Rank 0 serves the store: it stays until every rank is done with it."""
    store.add("cluster-ranks/done", 1)
    if rank == 0:
        deadline = time.monotonic() + 60
        while store.add("cluster-ranks/done", 0) < world_size and time.monotonic() < deadline:
            time.sleep(0.01)


def program_world(args: argparse.Namespace, result: dict) -> None:
    import gfdit
    import torch.distributed as dist

    store = _store(args)
    world = gfdit.init(args.rank, args.world_size, store, timeout=args.timeout)
    result["world"] = world_info(world)
    ctx = types.SimpleNamespace(rank=args.rank, world_size=args.world_size, store=store, timeout=args.timeout)
    # the reference: gloo over the same ranks, on the interface of this node's address
    address = os.environ.get("GFDIT_NET_ADDRESS", "127.0.0.1")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", interface_of(address) or "lo")
    dist.init_process_group(
        "gloo",
        store=dist.PrefixStore("gloo", store),
        rank=args.rank,
        world_size=args.world_size,
        timeout=datetime.timedelta(seconds=args.timeout),
    )
    sections = args.sections.split(",")
    started = time.perf_counter()
    if "collectives" in sections:
        result["collectives"], result["failures"]["collectives"] = collective_checks(ctx)
        result["seconds"]["collectives"] = time.perf_counter() - started
    if "staged" in sections:
        t = time.perf_counter()
        result["staged"], result["failures"]["staged"] = staged_checks(ctx)
        # USP across the nodes on host copies, as a device world across hosts runs it
        if "attention" in sections:
            import attn_harness
            import mp_harness

            world = gfdit.get_world()
            world._stage_cpu_tensors = True
            try:
                names = ("usp-2x2-ulysses-low", "usp-2x2-ring-low-uneven", "usp-ring4", "ulysses-pair-across")
                cases = [c for c in attention_cases() if c["name"] in names]
                reports = mp_harness.run_batch(ctx, cases, attn_harness.run_case)
            finally:
                world._stage_cpu_tensors = False
            result["staged_layouts"] = len(reports)
            result["failures"]["staged"] += [
                f"staged {r['name']}: {r.get('error') or r}"
                for r in reports
                if not r["ok"] or r.get("warnings")
            ]
        result["seconds"]["staged"] = time.perf_counter() - t
    if "attention" in sections or "model" in sections:
        t = time.perf_counter()
        with auto_placements(result):
            result["failures"]["layouts"] = layout_checks(ctx, attention_cases(), "model" in sections, result)
        result["seconds"]["layouts"] = time.perf_counter() - t
    dist.destroy_process_group()
    if "torch_backend" in sections:
        t = time.perf_counter()
        result["failures"]["torch_backend"] = torch_backend_checks(ctx)
        result["seconds"]["torch_backend"] = time.perf_counter() - t
    gfdit.barrier()
    gfdit.destroy()
    _finish(store, args.rank, args.world_size)


def program_victim(args: argparse.Namespace, result: dict) -> None:
    import gfdit

    store = _store(args)
    world = gfdit.init(args.rank, args.world_size, store, timeout=args.timeout, shm_prefix=args.shm_prefix)
    result["world"] = world_info(world)
    x = torch.ones(1 << 16)
    rounds = 0
    try:
        while True:
            gfdit.all_reduce(x)
            x.fill_(1.0)
            rounds += 1
            if rounds == 1:
                print("looping", flush=True)
    except gfdit.Error as exc:
        result["error"] = {
            "types": [c.__name__ for c in type(exc).__mro__],
            "message": str(exc),
            "usable": world.usable,
            "rounds": rounds,
        }
    gfdit.destroy()


def program_torchrun(args: argparse.Namespace, result: dict) -> None:
    """gfdit.init() with nothing but what torchrun set, then collectives and layouts across nodes."""
    import cases_collectives as cc
    import gfdit

    world = gfdit.init()
    result["world"] = world_info(world)
    result["env"] = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE")}
    ctx = types.SimpleNamespace(rank=world.rank, world_size=world.world_size, store=None, timeout=300.0)
    failures, checks = [], 0
    for fn, fargs, kwargs in [
        (cc.case_all_gather, (60, "float32"), {"ranks": [0, 2]}),
        (cc.case_all_to_all_single, (61, "bfloat16"), {"ranks": [3, 1, 0]}),
        (cc.case_reduce_scatter, (62, "float32"), {"ranks": [1, 2]}),
        (cc.case_broadcast, (63, "int64", 3), {"ranks": [3, 0]}),
        (cc.case_all_to_all_4d_head_splits, (64, "float32"), {"ranks": [2, 3, 0, 1]}),
        (cc.case_send_recv, (65, "float32", [(0, 3), (3, 0), (2, 1)]), {}),
        (cc.case_put_with_signal, (66, "float32"), {}),
        (_overlapping, (67,), {}),
    ]:
        try:
            checks += fn(ctx, *fargs, **kwargs)
        except AssertionError as exc:
            failures.append(f"{fn.__name__}: {exc}")
    x = torch.full((5,), float(world.rank + 1))
    gfdit.all_reduce(x)
    if x.tolist() != [float(sum(range(1, world.world_size + 1)))] * 5:
        failures.append(f"all_reduce over the world: {x.tolist()}")
    names = (
        "usp-2x2-auto",
        "usp-2x2-ulysses-low-uneven",
        "torus-2x2-ring-low",
        "usp-ring4",
        "torus-ulysses4",
    )
    cases = [c for c in attention_cases() if c["name"] in names]
    with auto_placements(result):
        bad = layout_checks(ctx, cases, False, result)
    result.update(collectives=checks, failures={"torchrun": failures + bad})
    gfdit.barrier()
    gfdit.destroy()


PROGRAMS = {"world": program_world, "victim": program_victim, "torchrun": program_torchrun}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("program", choices=sorted(PROGRAMS))
    parser.add_argument("--out", required=True, help="the directory of the result files")
    parser.add_argument("--rank", type=int, default=None)
    parser.add_argument("--world-size", type=int, default=None)
    parser.add_argument("--store", default=None, help="HOST:PORT of the store rank 0 serves (port 0: any)")
    parser.add_argument("--timeout", type=float, default=30.0, help="the world's timeout (seconds)")
    parser.add_argument("--shm-prefix", default="gfdit")
    parser.add_argument("--sections", default="collectives,attention,model,torch_backend")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rank = args.rank if args.rank is not None else int(os.environ["RANK"])
    result: dict = {"rank": rank, "failures": {}, "seconds": {}, "error": None}
    try:
        PROGRAMS[args.program](args, result)
    except BaseException as exc:  # noqa: BLE001 - reported to the test, then the exit status says it too
        result["exception"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        raise
    finally:
        path = os.path.join(args.out, f"rank{rank}.json")
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(result, f)
        os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main(sys.argv[1:])
