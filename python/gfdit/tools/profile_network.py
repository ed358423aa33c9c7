"""``gfdit profile --network``: the links between the nodes of a world and the parallel layouts across them.

Run on every rank of a world that spans nodes (as torchrun starts it: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT;
``gfdit.init()`` joins it and finds the nodes from the ranks' hosts, NOTE [network edges] in
src/collectives/net_edges.h). Every rank runs the same measurements; rank 0 writes the profile file and prints the
tables.

1. Links (``cost.LinkMeasurement``, one per pair of nodes, measured between their first ranks with the world's own
   collectives): the bandwidth of one large send/recv (``stream``), of every rank of one node sending to its
   counterpart on the other at once (``concurrent``: what crosses when a layout's collectives all cross together),
   the round trip of a small send/recv, and the time of a small all_to_all of two members on the two nodes
   (``collective``) and on one node (``intra_collective``), in alternating blocks; beside them the link's nominal
   rate when the caller states it (``--line-gbit``). NOTE [inter-node calibration] in src/runtime/cost.cpp turns
   them into the analytic model's inter-node terms (``cost.calibrated_cluster``): fitted for the cluster measured,
   or scaled for another.
2. Layouts: for each layout of the whole world across its nodes (``network_layouts``: pure Ulysses and pure Ring,
   and for each ulysses x ring mix USP with Ulysses inside the nodes, USP with Ring inside and Ulysses across
   (SwiftFusion's placement), and Torus) and each shape, one attention call of the model's heads on the shards
   of that many tokens, and one denoising step of the model (both guidance passes), each the slowest rank's time
   (median of ``repeats`` rounds that time every layout in turn, or as many more, up to ten times, as fit in
   ``min_seconds``, after one untimed call of each), with the
   analytic model's prediction of the step on the calibrated cluster beside it. A layout's efficiency is the best measured step of the shape over its own.

The profile (format ``cost.PROFILE_FORMAT``) holds ``links`` and ``layouts`` and no stage entries: with it,
``cost.cost_model(model, "cpu", profile=FILE)`` is the analytic model on the cluster the links calibrate.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from gfdit._C import InvalidUsage
from gfdit.planning import cost

# tiny-wan at about 1k, 2.3k, 4k, 9k and 16k tokens (256 tokens a latent frame at 256x256, 576 at 384x384, 1024 at
# 512x512; a latent frame is four frames)
NETWORK_SHAPES = ((256, 256, 13), (256, 256, 33), (256, 256, 61), (384, 384, 61), (512, 512, 61))
LINK_BYTES = 32 << 20
LINK_PINGS = 300
COLLECTIVE_CALLS = 300
COLLECTIVE_BLOCKS = 5


@dataclasses.dataclass(frozen=True)
class NodeLayout:
    """A layout of one pass over the whole world in rank order (a node's ranks are consecutive)."""

    ulysses: int
    ring: int
    mode: str = "usp"
    placement: str = "auto"
    what: str = ""  # how it sits on the nodes, for tables

    @property
    def name(self) -> str:
        return f"{self.mode} {self.ulysses}x{self.ring}" + (f" ({self.what})" if self.what else "")

    def spec(self) -> Any:
        from gfdit.attention import ParallelSpec

        return ParallelSpec(ulysses=self.ulysses, ring=self.ring, mode=self.mode, placement=self.placement)

    def query(self) -> dict[str, Any]:
        """The cost model's arguments for this layout."""
        return {"ulysses": self.ulysses, "ring": self.ring, "mode": self.mode, "placement": self.placement}


def network_layouts(world_size: int, ranks_per_node: int, heads: int) -> list[NodeLayout]:
    """The layouts of a world of ``world_size`` ranks in nodes of ``ranks_per_node``: Ulysses alone (where the heads
    allow one per member), Ring alone, and for every ulysses x ring mix whose one axis fits a node: USP with Ulysses
    inside the nodes, USP with Ring inside and Ulysses across (SwiftFusion), and Torus (Ring inside)."""
    out = []
    if world_size <= heads:
        out.append(NodeLayout(world_size, 1, "usp", "ulysses-low", "all across"))
    out.append(NodeLayout(1, world_size, "usp", "ulysses-low", "all across"))
    for u in range(2, world_size):
        r = world_size // u
        if u * r != world_size or u > heads:
            continue
        if ranks_per_node % u == 0:
            out.append(NodeLayout(u, r, "usp", "ulysses-low", "ulysses inside"))
        if ranks_per_node % r == 0:
            out.append(NodeLayout(u, r, "usp", "ring-low", "ring inside, ulysses across"))
            out.append(NodeLayout(u, r, "torus", "ring-low", "ring inside, ulysses across"))
    return out


def _max_over_ranks(world: Any, values: Sequence[float]) -> list[float]:
    t = torch.tensor(list(values), dtype=torch.float64)
    out = torch.empty(world.world_size * len(values), dtype=torch.float64)
    world.all_gather_into_tensor(out, t)
    return out.view(world.world_size, len(values)).max(dim=0).values.tolist()


def _nodes(world: Any) -> list[list[int]]:
    """The ranks of each node, in rank order."""
    nodes: dict[int, list[int]] = {}
    for r in range(world.world_size):
        nodes.setdefault(world.node_of(r), []).append(r)
    return [nodes[k] for k in sorted(nodes)]


def _send_with_ack(world: Any, buf: torch.Tensor, src: int, dst: int) -> None:
    """buf from src to dst, then one element back, so that the sender's time covers the delivery."""
    ack = buf[:1].clone()
    if world.rank == src:
        world.send(buf, dst)
        world.recv(ack, dst)
    elif world.rank == dst:
        world.recv(buf, src)
        world.send(ack, src)


def measure_links(
    world: Any,
    nbytes: int = LINK_BYTES,
    pings: int = LINK_PINGS,
    repeats: int = 3,
    calls: int = COLLECTIVE_CALLS,
) -> list[Any]:
    """One ``cost.LinkMeasurement`` per pair of the world's nodes (the module's docstring); every rank calls it."""
    nodes = _nodes(world)
    rank = world.rank
    big = torch.zeros(max(1, nbytes // 4))
    small = torch.zeros(2)
    out = []
    for i in range(len(nodes)):
        for j in range(i + 1, len(nodes)):
            a, b = nodes[i][0], nodes[j][0]
            pairs = list(zip(nodes[i], nodes[j]))
            stream: list[float] = []
            concurrent: list[float] = []
            rtts: list[float] = []
            coll: list[float] = []
            intra: list[float] = []
            for _ in range(repeats):
                world.barrier()
                t = time.perf_counter()
                _send_with_ack(world, big, a, b)
                stream.append(time.perf_counter() - t if rank == a else 0.0)
                world.barrier()
                t = time.perf_counter()
                for src, dst in pairs:
                    if rank in (src, dst):
                        _send_with_ack(world, big, src, dst)
                concurrent.append(time.perf_counter() - t if rank in nodes[i] else 0.0)
            world.barrier()
            if rank in (a, b):
                for k in range(pings + pings // 10):
                    t = time.perf_counter()
                    if rank == a:
                        world.send(small, b)
                        world.recv(small, b)
                    else:
                        world.recv(small, a)
                        world.send(small, a)
                    if k >= pings // 10:
                        rtts.append(time.perf_counter() - t)
            # the collective across and the one inside a node in alternating blocks, so that both see the same
            # moments of a shared machine
            groups = [(sorted({a, b}), coll)] + ([(nodes[i][:2], intra)] if len(nodes[i]) >= 2 else [])
            x, y = torch.zeros(2), torch.zeros(2)
            for _ in range(COLLECTIVE_BLOCKS):
                for members, times in groups:
                    world.barrier()
                    if rank in members:
                        g = world.new_group(members)
                        per_block = max(1, calls // COLLECTIVE_BLOCKS)
                        for k in range(per_block + per_block // 10):
                            t = time.perf_counter()
                            world.all_to_all_single(y, x, group=g)
                            if k >= per_block // 10:
                                times.append(time.perf_counter() - t)
            world.barrier()
            worst = _max_over_ranks(
                world,
                [
                    statistics.median(stream),
                    statistics.median(concurrent),
                    statistics.median(rtts) if rtts else 0.0,
                    statistics.median(coll) if coll else 0.0,
                    statistics.median(intra) if intra else 0.0,
                ],
            )
            m = cost.LinkMeasurement()
            m.node_a, m.node_b = i, j
            m.ranks_per_node = len(pairs)
            m.stream_bytes_per_s = big.numel() * 4 / worst[0]
            m.concurrent_bytes_per_s = len(pairs) * big.numel() * 4 / worst[1]
            m.round_trip_s = worst[2]
            m.collective_s = worst[3]
            m.intra_collective_s = worst[4]
            out.append(m)
    return out


def measure_layouts(
    world: Any,
    model: str,
    shapes: Sequence[tuple[int, int, int]],
    layouts: Sequence[NodeLayout],
    repeats: int = 3,
    log: Callable[[str], None] | None = None,
    min_seconds: float = 0.0,
) -> list[dict[str, Any]]:
    """For each shape and layout, one attention call and one denoising step of ``model`` on the whole world (the
    module's docstring); every rank calls it. Records of ``cost.LAYOUT_FIELDS``."""
    import gfdit.models as gm
    from gfdit.attention import attention

    arch = cost.model_arch(model)
    m = gm.load(model)
    n = world.world_size
    num_nodes = len(_nodes(world))
    heads, head_dim = int(arch.heads), int(arch.head_dim)
    records: list[dict[str, Any]] = []
    for h, w, f in shapes:
        tokens = int(arch.tokens(h, w, f))
        if tokens % n:
            raise InvalidUsage(f"--shapes: {h}x{w}x{f} has {tokens} tokens, not a multiple of the {n} ranks")
        cond = m.encode("a lighthouse on a cliff at dusk", guidance_scale=float(arch.default_guidance))
        latent = m.init_latent(0, m.latent_shape(height=h, width=w, num_frames=f))
        state = m.initial_state(cond, latent, num_inference_steps=int(arch.default_steps))
        gen = torch.Generator().manual_seed(1000 + world.rank)
        q, k, v = (torch.randn(1, tokens // n, heads, head_dim, generator=gen) for _ in range(3))
        splits = [tokens // n] * n
        specs = [lay.spec() for lay in layouts]
        # every layout once untimed, then rounds that time each layout in turn: every layout sees the same
        # moments of a shared machine, and a slow moment costs one sample of each rather than all of one
        world.barrier()
        t = time.perf_counter()
        for spec in specs:
            attention(q, k, v, spec=spec, seq_splits=splits)
            m.denoise_step(state, 0, None, spec)
        # at least `repeats` rounds, more (up to 10 x) where they fit in min_seconds; every rank takes the largest
        # count any rank proposes, so that all run the same rounds
        warm = time.perf_counter() - t
        want = max(repeats, min(10 * repeats, math.ceil(min_seconds / max(warm, 1e-6))))
        rounds = int(_max_over_ranks(world, [float(want)])[0])
        times: list[float] = []  # per round, per layout: attention, step
        for _ in range(rounds):
            for spec in specs:
                world.barrier()
                t = time.perf_counter()
                attention(q, k, v, spec=spec, seq_splits=splits)
                times.append(time.perf_counter() - t)
                world.barrier()
                t = time.perf_counter()
                m.denoise_step(state, 0, None, spec)
                times.append(time.perf_counter() - t)
        worst = _max_over_ranks(world, times)  # the slowest rank's, sample by sample
        for i, lay in enumerate(layouts):
            attn = [worst[2 * (r * len(layouts) + i)] for r in range(rounds)]
            step = [worst[2 * (r * len(layouts) + i) + 1] for r in range(rounds)]
            records.append(
                {
                    "ulysses": lay.ulysses,
                    "ring": lay.ring,
                    "mode": lay.mode,
                    "placement": lay.placement,
                    "num_nodes": num_nodes,
                    "tokens": tokens,
                    "height": h,
                    "width": w,
                    "num_frames": f,
                    "attention_s": statistics.median(attn),
                    "step_s": statistics.median(step),
                    "step_samples_s": step,
                    "samples": len(step),
                }
            )
            if log:
                log(
                    f"  {tokens:>6} tokens  {lay.name:<40} attention {records[-1]['attention_s'] * 1e3:8.2f} ms  "
                    f"step {records[-1]['step_s'] * 1e3:9.2f} ms"
                )
    return records


def predictions(model: str, cluster: Any, records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each record with the analytic model's step on ``cluster`` (``predicted_s``) and the layout's efficiency (the
    best measured step of its shape over its own)."""
    cm = cost.cost_model(model, cluster)
    arch = cost.model_arch(model)
    best: dict[int, float] = {}
    for r in records:
        best[r["tokens"]] = min(best.get(r["tokens"], float("inf")), r["step_s"])
    out = []
    for r in records:
        degree = r["ulysses"] * r["ring"]
        predicted = cm.seconds(
            cost.Stage.DENOISE,
            r["height"],
            r["width"],
            r["num_frames"],
            num_steps=int(arch.default_steps),
            guidance_scale=float(arch.default_guidance),
            degree=degree,
            ulysses=r["ulysses"],
            ring=r["ring"],
            mode=r["mode"],
            placement=r["placement"],
            num_nodes=r["num_nodes"],
        )
        out.append({**r, "predicted_s": predicted, "efficiency": best[r["tokens"]] / r["step_s"]})
    return out


def format_tables(profile: Any, records: Sequence[dict[str, Any]]) -> str:
    """The links and the layouts (measured, predicted) as tables a person can read."""
    lines = ["links between nodes (measured with the world's collectives):"]
    head = (
        f"{'nodes':<6} {'ranks':>5} {'stream MB/s':>11} {'concurrent MB/s':>15} {'rtt us':>7} "
        f"{'collective us':>13} {'intra us':>8}"
    )
    lines += [head, "-" * len(head)]
    for lk in profile.links:
        lines.append(
            f"{lk.node_a}-{lk.node_b:<4} {lk.ranks_per_node:>5} {lk.stream_bytes_per_s / 1e6:>11.1f} "
            f"{lk.concurrent_bytes_per_s / 1e6:>15.1f} {lk.round_trip_s * 1e6:>7.1f} {lk.collective_s * 1e6:>13.1f} "
            f"{lk.intra_collective_s * 1e6:>8.1f}"
        )
    lines.append("")
    head = f"{'tokens':>6} {'layout':<44} {'attention ms':>12} {'step ms':>9} {'predicted ms':>12} {'efficiency':>10}"
    lines += [
        "layouts across the nodes (the slowest rank's median; predicted: the calibrated analytic model):"
    ]
    lines += [head, "-" * len(head)]
    for r in records:
        lay = NodeLayout(r["ulysses"], r["ring"], r["mode"], r["placement"], layout_where(r))
        lines.append(
            f"{r['tokens']:>6} {lay.name:<44} {r['attention_s'] * 1e3:>12.2f} {r['step_s'] * 1e3:>9.2f} "
            f"{r.get('predicted_s', float('nan')) * 1e3:>12.2f} {r.get('efficiency', float('nan')):>10.2f}"
        )
    return "\n".join(lines)


def layout_where(r: dict[str, Any]) -> str:
    """How a measured layout sits on the nodes, for tables."""
    if r["ulysses"] == 1 or r["ring"] == 1:
        return "all across"
    return "ulysses inside" if r["placement"] == "ulysses-low" else "ring inside, ulysses across"


def measure(
    model: str,
    shapes: Sequence[tuple[int, int, int]] | None = None,
    repeats: int = 3,
    log: Callable[[str], None] | None = None,
    link_bytes: int = LINK_BYTES,
    links_only: bool = False,
    line_bytes_per_s: float = 0.0,
    min_seconds: float = 0.0,
) -> tuple[Any, list[dict[str, Any]]] | None:
    """Joins the world ``gfdit.init()`` finds (torchrun's variables), measures, leaves; on rank 0 the profile (links,
    no entries) and the layout records with their predictions, elsewhere None. ``min_seconds``: per shape, the time
    the rounds of measure_layouts may take beyond ``repeats``. ``line_bytes_per_s``: the nominal
    rate of each node's link per direction, as its owner states it (0: unknown), kept in every link: with it the
    profile can also scale another cluster's inter-node terms (``cost.calibrated_cluster``, transfer)."""
    from gfdit.comm import world as gworld

    arch = cost.model_arch(model)
    world = gworld.init(timeout=600.0)
    try:
        nodes = _nodes(world)
        if len(nodes) < 2:
            raise InvalidUsage(
                "gfdit profile --network: every rank of this world is on one node (nothing crosses a network); "
                "start ranks on several hosts"
            )
        per_node = {len(x) for x in nodes}
        if len(per_node) != 1 or any(x != list(range(x[0], x[0] + len(x))) for x in nodes):
            raise InvalidUsage(
                "gfdit profile --network: the nodes must hold equal blocks of consecutive ranks, got "
                + "; ".join(",".join(map(str, x)) for x in nodes)
            )
        torch.set_num_threads(1)
        t0 = time.perf_counter()
        links = measure_links(world, nbytes=link_bytes)
        for lk in links:
            lk.line_bytes_per_s = line_bytes_per_s
        if log and world.rank == 0:
            log(f"links measured in {time.perf_counter() - t0:.1f} s")
        records: list[dict[str, Any]] = []
        if not links_only:
            layouts = network_layouts(world.world_size, len(nodes[0]), int(arch.heads))
            records = measure_layouts(
                world,
                model,
                shapes or NETWORK_SHAPES,
                layouts,
                repeats,
                log if world.rank == 0 else None,
                min_seconds=min_seconds,
            )
        world.barrier()
    finally:
        gworld.destroy()
    if world.rank != 0:
        return None
    prof = cost.Profile()
    prof.model = model
    prof.hardware = "cpu"
    prof.world_size = world.world_size
    prof.num_cores = os.cpu_count() or 1
    prof.links = links
    cluster = cost.calibrated_cluster(cost.cluster("cpu", world.world_size), links)
    return prof, predictions(model, cluster, records) if records else []
