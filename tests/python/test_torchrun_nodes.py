"""torchrun as the launcher of a gfdit world on two nodes (netns_cluster, both modes of the `cluster` fixture).

Each node runs one `torchrun --nnodes 2 --nproc-per-node 2` with the c10d rendezvous on node 0; its workers
run cluster_ranks.py's `torchrun` program, which calls `gfdit.init()` with no arguments and checks collectives
and attention layouts across the nodes. What torchrun sets for a worker: RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, GROUP_RANK (its node's rank in the rendezvous), GROUP_WORLD_SIZE, ROLE_RANK, MASTER_ADDR and
MASTER_PORT (the store that node 0's agent already serves: TORCHELASTIC_USE_AGENT_STORE=True), and
TORCHELASTIC_RUN_ID / _RESTART_COUNT / _MAX_RESTARTS. The rendezvous numbers the nodes in the order they join,
not by --node-rank, so a test may not assume that ranks 0 and 1 run on node 0.

In "netns" mode the world finds its nodes from the hosts. The nodes' host names resolve nowhere, so each
torchrun is told its address (--local-addr: what MASTER_ADDR becomes on node 0) and whether it serves the
rendezvous (--rdzv-conf is_host=1 on node 0, 0 elsewhere); on machines whose names resolve neither is needed.
In "local" mode both torchruns run on this host: GFDIT_NET_EDGES=nodes without GFDIT_NODE_IDS makes gfdit.init
take each rank's node from GROUP_RANK.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid

import cluster_ranks
import pytest
from netns_cluster import free_port

PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cluster_ranks.py")
NPROC = 2


def torchrun() -> list[str]:
    """The torchrun of this interpreter's environment."""
    beside = os.path.join(os.path.dirname(sys.executable), "torchrun")
    return [beside] if os.path.exists(beside) else [shutil.which("torchrun") or "torchrun"]


def torchrun_argv(cluster, node: int, port: int, run_id: str, out_dir: str) -> list[str]:
    """The command line of node `node`'s torchrun."""
    return [
        *torchrun(),
        "--nnodes", str(cluster.num_nodes),
        "--nproc-per-node", str(NPROC),
        "--node-rank", str(node),
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"{cluster.node(0).address}:{port}",
        "--rdzv-id", run_id,
        "--rdzv-conf", f"is_host={int(node == 0)}",
        "--local-addr", cluster.node(node).address,
        "--max-restarts", "0",
        PROGRAM, "torchrun", "--out", out_dir,
    ]  # fmt: skip


def children(pid: int) -> list[int]:
    """The processes whose parent is pid."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry))
        except OSError:
            pass  # gone meanwhile
    return out


def stop(proc: subprocess.Popen) -> None:
    """Ends a torchrun that still runs, and its workers: torchrun starts each in a session of its own, where
    killing the torchrun, or its process group, does not reach them."""
    if proc.poll() is None:
        for worker in children(proc.pid):
            try:
                os.killpg(worker, signal.SIGKILL)  # the worker leads its session and group
            except ProcessLookupError:
                pass
        proc.kill()
    proc.wait(timeout=10)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_torchrun_on_two_nodes_runs_collectives_and_attention_across_them(cluster, tmp_path):
    # the rendezvous port on node 0: a fresh namespace has every port free; on this host, one that is free now
    port = 29400 if cluster.isolated else free_port()
    # the nodes are not told (empty: unset); on one host the network between them, and gfdit.init takes them from
    # GROUP_RANK
    env = {
        "PYTHONWARNINGS": "ignore",
        "GFDIT_NODE_IDS": "",
        "GFDIT_NET_EDGES": "auto" if cluster.isolated else "nodes",
    }
    run_id = uuid.uuid4().hex[:8]
    procs = []
    try:
        for node in range(cluster.num_nodes):
            argv = torchrun_argv(cluster, node, port, run_id, str(tmp_path))
            with open(tmp_path / f"node{node}.log", "wb") as log:
                procs.append(cluster.node(node).run(argv, env=env, stdout=log, stderr=subprocess.STDOUT))
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=180))
            except subprocess.TimeoutExpired:
                codes.append(None)
    finally:
        for p in procs:
            stop(p)
    logs = "\n".join((tmp_path / f"node{n}.log").read_text(errors="replace")[-3000:] for n in range(2))
    assert codes == [0] * cluster.num_nodes, logs
    world_size = cluster.num_nodes * NPROC
    results = []
    for rank in range(world_size):
        with open(tmp_path / f"rank{rank}.json", encoding="utf-8") as f:
            results.append(json.load(f))
    for res in results:
        info, rank = res["world"], res["rank"]
        assert res["failures"] == {"torchrun": []}, res
        assert res["collectives"] > 50 and res["layouts"] > 0, res
        # torchrun numbers the ranks node by node
        assert res["env"]["GROUP_RANK"] == str(rank // NPROC), res["env"]
        assert res["env"]["LOCAL_RANK"] == str(rank % NPROC), res["env"]
        assert info["node_of"] == cluster_ranks.NODE_IDS, info
        assert info["remote"] == [r // NPROC != rank // NPROC for r in range(world_size)], info
        assert info["host_of"][rank] == info["hostname"], info
        assert (info["auto"], info["auto_interleaved"]) == ("ring-low", "ulysses-low"), info
        assert [[0, 1, 2, 3], cluster_ranks.NODE_IDS, "ring-low"] in res["auto_calls"], res["auto_calls"]
        if cluster.isolated:  # the hosts told the nodes apart
            assert not info["node_ids_env"], info
            assert len(set(info["host_of"])) == cluster.num_nodes, info
        else:  # GROUP_RANK did
            assert info["node_ids_env"] == "0,0,1,1", info


def test_init_under_torchrun_uses_the_agents_store_and_group_rank(monkeypatch):
    """gfdit.init() with only what torchrun sets: every rank is a client of the store the agent serves, and where
    nodes are emulated on one host (GFDIT_NET_EDGES=nodes) without GFDIT_NODE_IDS, GROUP_RANK gives them."""
    import datetime

    import gfdit
    import torch.distributed as dist

    if gfdit.is_initialized():
        pytest.skip("this process already has a default world")
    timeout = datetime.timedelta(seconds=10)
    agent = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timeout, wait_for_workers=False)
    for name, value in {
        "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(agent.port), "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_RESTART_COUNT": "0", "GFDIT_NET_EDGES": "nodes",
    }.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("GFDIT_NODE_IDS", raising=False)  # and restored afterwards: init sets it
    try:
        world = gfdit.init(timeout=10.0)
        assert world.node_of(0) == 0 and os.environ["GFDIT_NODE_IDS"] == "0"
        assert agent.get("gfdit-nodes/0/0") == b"0"  # exchanged through the agent's store
    finally:
        gfdit.destroy()
    # outside torchrun nothing says where the nodes are: refused, naming the setting
    monkeypatch.delenv("GROUP_RANK")
    monkeypatch.delenv("GFDIT_NODE_IDS")
    with pytest.raises(gfdit.InvalidUsage, match="GFDIT_NET_EDGES=nodes needs GFDIT_NODE_IDS"):
        gfdit.init(timeout=10.0)
    assert not gfdit.is_initialized()
