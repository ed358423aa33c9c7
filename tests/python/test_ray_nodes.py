"""``gfdit serve --ray`` (gfdit.serving.ray_launcher): the engine's node agents placed on a Ray cluster.

The cluster is Ray's own emulation (ray.cluster_utils.Cluster): a head and one more Ray node on this host, each with
one unit of a custom resource that every bundle asks for, so the placement group must spread over both. The served
engine has one worker on each node: the engine's own on the Ray node it joined, the other behind an agent actor on
the other Ray node. Both Ray nodes are on one host, so the world's ranks are told to talk over the network between
nodes (GFDIT_NET_EDGES=nodes, which the launcher passes on to its agents) as they would between machines. After
an HTTP request is answered, SIGTERM ends the server, and nothing of it is left: no actor alive, no placement group,
no process, nothing in /dev/shm. Ray is optional: without it these tests are skipped, and ``--ray`` is refused
with the reason.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid

import pytest
from gfdit.serving import ray_launcher
from gfdit.tools import cli
from netns_cluster import free_port

NODE_RESOURCE = "gfdit_test_node"  # one unit on each Ray node; every bundle asks for one
START_S = 120.0  # the Ray actor, the agent and two workers on two shared cores
MARK = "GFDIT_RAY_TEST_MARK"  # in the environment of every process the test's Ray nodes and server start


def _ray_or_skip():
    if not ray_launcher.ray_available():
        pytest.skip("Ray is not installed (pip install 'gfdit[ray]')")
    import ray

    return ray


@pytest.mark.parametrize(
    "world_size, per_node, alive, expected",
    [
        (None, 1, 3, (3, 3)),
        (None, 2, 2, (2, 4)),
        (4, 2, 3, (2, 4)),
        (2, 1, 2, (2, 2)),
        (4, 4, 1, (1, 4)),
        (3, 2, 4, "not a positive multiple of --workers-per-node 2"),
        (6, 2, 2, "needs 3 Ray nodes; the cluster has 2 alive"),
        (2, 0, 2, "--workers-per-node must be >= 1"),
    ],
)
def test_workers_split_evenly_over_the_nodes(world_size, per_node, alive, expected):
    got = ray_launcher.plan_nodes(world_size, per_node, alive)
    if isinstance(expected, str):
        assert isinstance(got, str) and expected in got, got
    else:
        assert got == expected


def test_bundles_and_resources():
    assert ray_launcher.node_bundle(2, None, {}) == {"CPU": 2.0}
    assert ray_launcher.node_bundle(2, "cuda", {"accel": 1}) == {"CPU": 2.0, "GPU": 2.0, "accel": 1.0}
    assert ray_launcher.node_bundle(1, "cpu", {"CPU": 0}) == {}
    assert ray_launcher.parse_resources('{"accel": 1}') == {"accel": 1.0}
    assert "not JSON" in ray_launcher.parse_resources("{accel")
    assert "JSON object" in ray_launcher.parse_resources('{"accel": -1}')
    assert "JSON object" in ray_launcher.parse_resources("[1]")


def test_ray_flag_without_ray_is_refused_with_the_reason(monkeypatch, capsys):
    monkeypatch.setattr(ray_launcher, "ray_available", lambda: False)
    assert cli.main(["serve", "--ray", "--world-size", "2"]) == 2
    assert ray_launcher.RAY_MISSING in capsys.readouterr().err


def test_ray_flag_with_local_workers_is_refused(capsys):
    _ray_or_skip()
    assert cli.main(["serve", "--ray", "--local-workers", "1"]) == 2
    assert "not --local-workers" in capsys.readouterr().err


def _healthy(url: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{url}/health", timeout=2).json().get("status") == "ok"
    except (httpx.HTTPError, ValueError):
        return False


def _gfdit_shm() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("gfdit")}


def _marked_gfdit_processes(mark: str) -> list[str]:
    """Processes of this test (their environment holds the mark) that are gfdit's: the server, an agent, a worker
    (a multiprocessing child)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"{MARK}={mark}".encode() not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if re.search(r"-m gfdit |node-agent|spawn_main", cmdline):
            found.append(f"{pid}: {cmdline}")
    return found


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_serve_ray_places_a_worker_on_each_ray_node_and_leaves_nothing(tmp_path, monkeypatch):
    ray = _ray_or_skip()
    from ray.cluster_utils import Cluster

    mark = uuid.uuid4().hex
    monkeypatch.setenv(MARK, mark)  # the Ray nodes and everything they start inherit it
    # both Ray nodes are on this host: the ranks talk over the network between nodes, as between machines
    monkeypatch.setenv("GFDIT_NET_EDGES", "nodes")
    monkeypatch.setenv("GFDIT_NODE_TIMEOUT_S", "10")  # a loaded machine is no lost node
    shm_before = _gfdit_shm()
    node_args = {"num_cpus": 1, "resources": {NODE_RESOURCE: 1}, "object_store_memory": 80 * 2**20}
    cluster = Cluster(initialize_head=True, head_node_args={**node_args, "include_dashboard": False})
    serve = None
    try:
        cluster.add_node(**node_args)
        cluster.wait_for_nodes()
        node_ids = {n.node_id for n in cluster.list_all_nodes()}
        assert len(node_ids) == 2
        http = free_port()
        log_path = tmp_path / "serve.log"
        argv = [
            sys.executable, "-m", "gfdit", "serve", "--ray", "--ray-address", cluster.address,
            "--world-size", "2", "--workers-per-node", "1", "--ray-resources", json.dumps({NODE_RESOURCE: 1}),
            "--model", "tiny-qwen-image", "--cluster", "none", "--wait-s", str(START_S),
            "--host", "127.0.0.1", "--port", str(http),
        ]  # fmt: skip
        with open(log_path, "wb") as log:
            serve = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{http}"
        deadline = time.monotonic() + START_S
        while not _healthy(url):
            assert serve.poll() is None, log_path.read_text(errors="replace")[-4000:]
            assert time.monotonic() < deadline, log_path.read_text(errors="replace")[-4000:]
            time.sleep(0.5)
        import httpx

        body = {"prompt": "a lighthouse", "size": "64x64", "num_inference_steps": 2, "seed": 5}
        r = httpx.post(f"{url}/v1/images/generations", json=body, timeout=120)
        assert r.status_code == 200, r.text
        assert len(r.json()["data"]) == 1 and r.json()["data"][0]["b64_json"]
        health = httpx.get(f"{url}/health", timeout=10).json()
        assert health["world_size"] == 2 and health["alive"] == [True, True], health

        # where the workers ran: worker 0 on the engine's Ray node, worker 1 behind an agent on the other one
        text = log_path.read_text(errors="replace")
        engine_node = re.search(r"the engine's Ray node (\w+) runs workers \[0\]", text)
        agent_node = re.search(r"Ray node (\w+) \(host [^)]*\) runs a node agent", text)
        assert engine_node and agent_node, text[-4000:]
        assert {engine_node.group(1), agent_node.group(1)} == node_ids, text[-4000:]
        assert re.search(r"gfdit\.Engine: node 1 \(host .*\) runs workers \[1\]", text), text[-4000:]

        ray.init(address=cluster.address, logging_level="WARNING")
        try:
            # the agent's actor dies: its node is a lost host, and the engine goes on with the other's worker
            (named,) = ray.util.list_named_actors(all_namespaces=True)
            assert named["name"].startswith(f"gfdit-agent-{serve.pid}-"), named
            ray.kill(ray.get_actor(named["name"], namespace=named["namespace"]), no_restart=True)
            deadline = time.monotonic() + 60
            while (health := httpx.get(f"{url}/health", timeout=10).json())["alive"] != [True, False]:
                assert time.monotonic() < deadline, health
                time.sleep(0.2)
            assert health["status"] == "degraded", health
            r = httpx.post(f"{url}/v1/images/generations", json=body, timeout=120)
            assert r.status_code == 200, r.text

            serve.terminate()  # drains, stops the workers, removes the group
            assert serve.wait(90) == 0, log_path.read_text(errors="replace")[-4000:]

            # nothing left in the cluster: every actor dead, every placement group removed
            from ray._private import state  # the GCS's tables, without the dashboard's state API

            actors = state.actors()
            assert actors and all(a["State"] == "DEAD" for a in actors.values()), actors
            groups = ray.util.placement_group_table()
            assert groups and all(g["state"] == "REMOVED" for g in groups.values()), groups
        finally:
            ray.shutdown()
        # both Ray nodes share this host's /dev/shm, where other tests may come and go: what this one made must
        # be gone within the bound
        deadline = time.monotonic() + 30
        while (_marked_gfdit_processes(mark) or _gfdit_shm() - shm_before) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _marked_gfdit_processes(mark) == []
        assert _gfdit_shm() <= shm_before, _gfdit_shm() - shm_before
    finally:
        if serve is not None and serve.poll() is None:
            serve.kill()
            serve.wait(30)
        cluster.shutdown()
