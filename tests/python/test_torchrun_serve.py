"""``gfdit serve`` under torchrun on two emulated nodes (netns_cluster, both modes of the `cluster` fixture).

Each node runs ``torchrun --nnodes 2 --nproc-per-node 1 --node-rank i ... -m gfdit serve --local-workers 1``: node
rank 0 serves over HTTP and publishes its node port in the rendezvous store, node rank 1 runs a node agent that finds
it there (NOTE [node agents] in src/runtime/relay.cpp). The static rendezvous (torchrun's default backend, with
--master-addr and --master-port) makes --node-rank the node's rank, so node 0 is the one that serves; the c10d one
numbers nodes in the order they join (test_torchrun_nodes.py). One image request is answered 200 on node 0; SIGTERM
to node 0's torchrun reaches gfdit serve, which drains and stops the engine, whose goodbye ends node 1's agent in
order; both torchruns end, and neither node's /dev/shm keeps anything of gfdit's.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
from netns_cluster import free_port
from test_torchrun_nodes import stop, torchrun

START_S = 180.0  # two torchruns, an engine, an agent and two workers on two shared cores

# Run on node 0 (in "netns" mode the host cannot reach the nodes' network): waits until /health says "ok" while
# the torchruns start, then posts one image request and prints what came back as JSON. The
# standard library alone: it starts in milliseconds.
_CLIENT = r"""
import json, os, sys, time, urllib.error, urllib.request
url, deadline = sys.argv[1], time.monotonic() + float(sys.argv[2])
def get(path):
    with urllib.request.urlopen(url + path, timeout=5) as r:
        return json.load(r)
health = None
while time.monotonic() < deadline:
    try:
        health = get("/health")
        if health["status"] == "ok":
            break
    except (OSError, ValueError):
        pass
    time.sleep(0.5)
else:
    print(json.dumps({"error": "not healthy in time", "health": health}))
    sys.exit(1)
body = {"prompt": "a lighthouse", "size": "64x64", "num_inference_steps": 2, "seed": 5}
req = urllib.request.Request(url + "/v1/images/generations", json.dumps(body).encode(),
                             {"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=120) as r:
        status, answer = r.status, json.load(r)
except urllib.error.HTTPError as e:
    status, answer = e.code, {"error": e.read().decode(errors="replace")}
images = [len(d.get("b64_json") or "") for d in answer.get("data", [])]
print(json.dumps({"status": status, "images": images, "answer": answer if status != 200 else None,
                  "health": get("/health")}))
"""


def serve_argv(cluster, node: int, master_port: int, http_port: int) -> list[str]:
    """Node `node`'s command line: torchrun with the static rendezvous on node 0, then gfdit serve."""
    return [
        *torchrun(),
        "--nnodes", str(cluster.num_nodes),
        "--nproc-per-node", "1",
        "--node-rank", str(node),
        "--master-addr", cluster.node(0).address,
        "--master-port", str(master_port),
        "--max-restarts", "0",
        "-m", "gfdit", "serve",
        "--model", "tiny-qwen-image",
        "--local-workers", "1",
        "--cluster", "none",
        "--wait-s", str(START_S),
        "--host", cluster.node(0).address,
        "--port", str(http_port),
    ]  # fmt: skip


def test_serve_arguments_under_torchrun_are_checked(monkeypatch):
    """What ``gfdit serve`` makes of torchrun's environment: node rank, nodes and workers per node, or a refusal."""
    import argparse

    from gfdit.serving import agent
    from gfdit.serving.server import main

    for name, value in {
        "GROUP_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "LOCAL_WORLD_SIZE": "1",
        "WORLD_SIZE": "3",
    }.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    assert agent.under_torchrun()
    assert main._torchrun_plan(argparse.Namespace(local_workers=None)) == (1, 3, 1)
    assert main._torchrun_plan(argparse.Namespace(local_workers=2)) == (1, 3, 2)
    assert "must be >= 1" in main._torchrun_plan(argparse.Namespace(local_workers=0))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert "--nproc-per-node 1" in main._torchrun_plan(argparse.Namespace(local_workers=None))


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_gfdit_serve_under_torchrun_on_two_nodes_answers_and_stops_cleanly(cluster, tmp_path):
    n0 = cluster.node(0)
    # a fresh namespace has every port free; on this host, ones that are free now
    master_port = 29500 if cluster.isolated else free_port()
    http = 8000 if cluster.isolated else free_port()
    env = {**cluster.world_env([0, 1]), "PYTHONWARNINGS": "ignore", "GFDIT_NODE_TIMEOUT_S": "10"}
    shm_before = [cluster.node(i).gfdit_shm() for i in range(2)]
    procs: list[subprocess.Popen] = []
    logs = [tmp_path / f"node{i}.log" for i in range(2)]

    def tails() -> str:
        return "\n".join(
            f"--- node {i}\n" + p.read_text(errors="replace")[-3000:] for i, p in enumerate(logs)
        )

    try:
        for i in range(2):
            with open(logs[i], "wb") as log:
                argv = serve_argv(cluster, i, master_port, http)
                procs.append(cluster.node(i).run(argv, env=env, stdout=log, stderr=subprocess.STDOUT))
        url = f"http://{n0.address}:{http}"
        argv = [sys.executable, "-I", "-S", "-c", _CLIENT, url, str(START_S)]
        client = n0.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = client.communicate(timeout=START_S + 150)
        assert client.returncode == 0, (out, err, tails())
        got = json.loads(out)
        assert got["status"] == 200, (got, tails())
        assert len(got["images"]) == 1 and got["images"][0] > 0, got
        assert got["health"]["status"] == "ok" and got["health"]["world_size"] == 2, got
        text = logs[0].read_text(errors="replace")
        assert "gfdit.Engine: node 1" in text and "runs workers [1]" in text, tails()

        # torchrun passes SIGTERM on to gfdit serve, which drains and stops the engine; its goodbye ends the agent
        procs[0].send_signal(signal.SIGTERM)
        codes = [p.wait(90) for p in procs]
        # node 0's torchrun reports the signal as its own failure, but the server drained and ended in order
        assert "Finished server process" in logs[0].read_text(errors="replace"), tails()
        assert codes[1] == 0, tails()  # the agent's node ended in order
        assert "the engine at" in logs[1].read_text(errors="replace"), tails()
    finally:
        for p in procs:
            stop(p)
    for i in range(2):
        assert cluster.node(i).gfdit_shm() <= shm_before[i], cluster.node(i).gfdit_shm() - shm_before[i]
