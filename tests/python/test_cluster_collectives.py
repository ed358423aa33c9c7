"""A world of 2 nodes x 2 ranks on the emulated cluster (netns_cluster, both modes of the `cluster` fixture):
collectives, every attention layout, a tiny Wan step and the torch.distributed backend across the nodes, where
the node ids come from, and what a rank lost on the other node does to the survivors.

The ranks are processes of cluster_ranks.py started on the nodes: ranks 0 and 1 on node 0, ranks 2 and 3 on
node 1. Each test starts its ranks once and makes many checks inside them; the ranks write their results to
files, read here. In "netns" mode the nodes cannot share memory, so the world finds its nodes from the hosts
(no GFDIT_NODE_IDS); in "local" mode GFDIT_NODE_IDS and GFDIT_NET_EDGES=nodes make the same world on one host.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import cluster_ranks
import netns_cluster as nc
import pytest

PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cluster_ranks.py")
NODE_IDS = cluster_ranks.NODE_IDS
START_S = 60.0  # bound of a world's start (imports and rendezvous of 4 processes on 2 cores)


class Ranks:
    """The rank processes of one world on a cluster, rank r on node NODE_IDS[r]; their stderr goes to files."""

    def __init__(self, cluster, program: str, out_dir, timeout_s: float, *extra: str) -> None:
        self.cluster = cluster
        self.program = program
        self.out_dir = str(out_dir)
        self.procs: list[subprocess.Popen] = []
        # netns: the nodes are told nothing (empty: unset), the world finds them; local: the labels, and network
        # edges between them
        told = {"GFDIT_NODE_IDS": "", "GFDIT_NET_EDGES": "auto"}
        self.env = told if cluster.isolated else cluster.world_env(NODE_IDS)
        self.env["PYTHONWARNINGS"] = "ignore"
        size = str(len(NODE_IDS))
        common = ["--out", self.out_dir, "--world-size", size, "--timeout", str(timeout_s), *extra]
        store = cluster.node(NODE_IDS[0]).address
        try:
            self._start(0, [*common, "--store", f"{store}:0"])
            port = nc.read_line(self.procs[0], START_S).split()[1]
            for rank in range(1, len(NODE_IDS)):
                self._start(rank, [*common, "--store", f"{store}:{port}"])
        except BaseException:
            self.close()
            raise

    def _start(self, rank: int, args: list[str]) -> None:
        node = self.cluster.node(NODE_IDS[rank])
        with open(os.path.join(self.out_dir, f"rank{rank}.err"), "wb") as err:
            self.procs.append(
                node.run(
                    [sys.executable, PROGRAM, self.program, "--rank", str(rank), *args],
                    env=self.env,
                    stdout=subprocess.PIPE,
                    stderr=err,
                    bufsize=0,  # read_line reads a byte at a time: nothing is read ahead of the first line
                )
            )

    def wait(self, timeout_s: float) -> list[int]:
        """Exit statuses of every rank, waiting timeout_s at most in all."""
        deadline = time.monotonic() + timeout_s
        codes = []
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            codes.append(p.poll())
        return codes

    def result(self, rank: int) -> dict:
        path = os.path.join(self.out_dir, f"rank{rank}.json")
        if not os.path.exists(path):
            return {"rank": rank, "missing": True, "stderr": self.stderr(rank)}
        with open(path, encoding="utf-8") as f:
            return json.load(f)

    def stderr(self, rank: int) -> str:
        with open(os.path.join(self.out_dir, f"rank{rank}.err"), encoding="utf-8", errors="replace") as f:
            return f.read()[-4000:]

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)
            if p.stdout is not None:
                p.stdout.close()


def check_world_info(cluster, info: dict) -> None:
    """What a rank saw at the rendezvous: nodes, hosts, which peers are remote, where "auto" puts Ring."""
    me = info["rank"]
    assert info["node_of"] == NODE_IDS, info
    assert info["remote"] == [NODE_IDS[r] != NODE_IDS[me] for r in range(len(NODE_IDS))], info
    assert info["net_port"] > 0, info
    assert info["host_of"][me] == info["hostname"], info
    assert info["host_of"] == [cluster.node(n).hostname for n in NODE_IDS], info
    # Ring inside the nodes (rings 0,1 and 2,3), Ulysses across; the interleaved group order flips it
    assert (info["auto"], info["auto_interleaved"]) == ("ring-low", "ulysses-low"), info
    if cluster.isolated:
        assert not info["node_ids_env"], info  # derived from the hosts, not told


def test_the_cases_cross_the_nodes_as_they_say():
    """The groups and layouts the ranks run: groups that cross the nodes do, those inside one stay; the attention
    cases put Ulysses inside the nodes (ulysses-low) and across them (ring-low, and auto on these nodes), and span
    both nodes with Ulysses, Ring and Torus over the world."""
    from gfdit.attention import ParallelSpec, Topology, resolve_placement
    from gfdit.attention.spec import GridLayout

    def nodes(members: list[int]) -> set[int]:
        return {NODE_IDS[r] for r in members}

    assert all(len(nodes(g or list(range(4)))) == 2 for g in cluster_ranks.CROSSING)
    assert all(len(nodes(g)) == 1 for g in cluster_ranks.INSIDE)
    topology = Topology(tuple(NODE_IDS))
    seen = set()
    for case in cluster_ranks.attention_cases():
        members = case.get("group") or list(range(4))
        spec = ParallelSpec(**case["spec"])
        placement = resolve_placement(spec, members, topology)
        uls, rings = GridLayout.groups(spec.ulysses, spec.ring, placement)
        ulysses_crosses = any(len(nodes([members[i] for i in g])) > 1 for g in uls if len(g) > 1)
        ring_crosses = any(len(nodes([members[i] for i in g])) > 1 for g in rings if len(g) > 1)
        assert ulysses_crosses or ring_crosses or len(nodes(members)) == 1, case["name"]
        if spec.ulysses == 2 and spec.ring == 2 and members == [0, 1, 2, 3]:
            assert ulysses_crosses == (placement == "ring-low") != ring_crosses, case["name"]
            want = "ulysses-low" if spec.placement == "ulysses-low" else "ring-low"
            assert placement == want, case["name"]
        seen.add((spec.mode, spec.ulysses, spec.ring, ulysses_crosses, ring_crosses))
    for mode in ("usp", "torus"):
        assert {(mode, 2, 2, False, True), (mode, 2, 2, True, False), (mode, 4, 1, True, False)} <= seen
        assert (mode, 1, 4, False, True) in seen
    assert cluster_ranks.interface_of("127.0.0.1") == "lo"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_collectives_layouts_and_the_torch_backend_across_nodes(cluster, tmp_path):
    """One world, every check: the nodes it found, the collectives on groups across, inside and over the nodes,
    the same through host copies (the path of a device world across hosts, CPU tensors standing in), every
    attention layout and a tiny Wan step against one process, torch.distributed on "gfdit" against gloo."""
    sections = ["collectives", "staged", "attention", "torch_backend"]
    if cluster.isolated or nc.namespace_support() is not None:
        sections.append(
            "model"
        )  # in one mode (its diffusers import costs each rank 3 s): netns where it runs
    ranks = Ranks(cluster, "world", tmp_path, 60.0, "--sections", ",".join(sections))
    try:
        codes = ranks.wait(240)
        results = [ranks.result(r) for r in range(len(NODE_IDS))]
    finally:
        ranks.close()
    for r, res in enumerate(results):
        why = f"rank {r} (exit {codes[r]}): {res}\n{ranks.stderr(r)}"
        assert codes[r] == 0 and "exception" not in res, why
    for res in results:
        check_world_info(cluster, res["world"])
        assert res["failures"] == {"collectives": [], "staged": [], "layouts": [], "torch_backend": []}, res[
            "failures"
        ]
        assert res["collectives"] > 500 and res["layouts"] > 20, res
        assert res["staged"] > 50 and res["staged_layouts"] >= 3, res  # device tensors across hosts, on CPU
        assert res["model_steps"] == (len(cluster_ranks.model_cases()) if "model" in sections else 0), res
        # "auto" inside the attention calls: the nodes the world found, Ring inside them on the world's order
        auto = {(tuple(ranks), tuple(nodes), placement) for ranks, nodes, placement in res["auto_calls"]}
        assert ((0, 1, 2, 3), tuple(NODE_IDS), "ring-low") in auto, res["auto_calls"]
        assert ((2, 0, 3, 1), tuple(NODE_IDS), "ulysses-low") in auto, res["auto_calls"]  # interleaved order
        assert {nodes for _, nodes, _ in auto} == {tuple(NODE_IDS)}, res["auto_calls"]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_rank_killed_mid_collective_on_the_other_node(cluster, tmp_path):
    """Rank 3 (node 1) is killed while every rank runs all_reduce in a loop: within the world's timeout each
    survivor raises gfdit.RemoteError naming rank 3, and on node 0 also its host; no shared memory is left."""
    timeout_s = 20.0
    prefix = f"gfdit-clt-{uuid.uuid4().hex[:8]}"  # this world's names alone, whatever else runs on the host
    victim = 3
    ranks = Ranks(cluster, "victim", tmp_path, timeout_s, "--shm-prefix", prefix)
    try:
        for r, p in enumerate(ranks.procs):
            assert nc.read_line(p, START_S) == "looping", f"rank {r}: {ranks.stderr(r)}"
        killed_at = time.monotonic()
        ranks.procs[victim].kill()
        codes = ranks.wait(timeout_s + 10)
        waited = time.monotonic() - killed_at
        results = [ranks.result(r) for r in range(len(NODE_IDS))]
    finally:
        ranks.close()
    host = cluster.node(NODE_IDS[victim]).hostname
    for r, res in enumerate(results):
        if r == victim:
            continue
        assert codes[r] == 0 and res.get("error"), f"rank {r} (exit {codes[r]}): {res}\n{ranks.stderr(r)}"
        err = res["error"]
        assert "RemoteError" in err["types"] and not err["usable"], f"rank {r}: {err}"
        assert f"rank {victim}" in err["message"], f"rank {r}: {err}"
        if NODE_IDS[r] != NODE_IDS[victim]:  # across the link, the death is reported with the victim's host
            assert f"rank {victim} on {host}" in err["message"], f"rank {r}: {err}"
    assert waited < timeout_s, f"the survivors took {waited:.1f} s, the world's timeout is {timeout_s} s"
    for node in cluster.nodes:  # netns: the node's own /dev/shm; local: the host's, this world's names
        left = {n for n in node.shm_names() if n.startswith("gfdit" if cluster.isolated else prefix)}
        assert not left, f"node {node.index}: {left}"
