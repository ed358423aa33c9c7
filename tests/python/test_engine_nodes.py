"""The engine across hosts (NOTE [node agents] in src/runtime/relay.cpp): an engine on node 0 of an emulated cluster
(netns_cluster, both modes through the `cluster` fixture) with two workers of its own and two on node 1 behind a
node agent. Its outputs equal, bit for bit, those of the same requests on an engine whose four workers all run on
one host; refused connections leave it serving; when node 1 is killed, or cut off and back, every request completes
on the survivors, the cut-off agent cleans up and comes back, and nothing is left in either node's /dev/shm.
``gfdit serve`` with a worker on each node answers an HTTP request."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import engine_nodes_driver as driver
import gfdit
import netns_cluster as nc
import pytest
import torch
from gfdit import Engine, Request
from gfdit._C import runtime as rt

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER = os.path.join(HERE, "engine_nodes_driver.py")
NODE_TIMEOUT_S = "3"  # how long a silent node lasts: a lost one is noticed quickly
START_S = 240.0  # an engine of four workers on two shared cores: tens of seconds, more on a busy machine


@pytest.fixture(scope="module")
def reference():
    """The requests' outputs on one host: four local workers, the same policy."""
    with Engine(
        model=driver.MODEL, world_size=4, policy=driver.AllRanks(), cost_model=False, timeout_s=30.0
    ) as eng:
        trace = [eng.submit(Request(**q)) for q in driver.TRACE]
        trace_out = [h.result(timeout=300).output for h in trace]
        long = [eng.submit(Request(**q)) for q in driver.LONG]
        long_out = [h.result(timeout=300).output for h in long]
    return {"trace": trace_out, "long": long_out}


class Driven:
    """The engine of engine_nodes_driver on a node: commands in, events out."""

    def __init__(
        self, node: nc.Node, out: str, env: dict, world_size: int, local_workers: int, log: str
    ) -> None:
        self.log = open(log, "wb")
        self.proc = node.run(
            [
                sys.executable,
                DRIVER,
                "--listen",
                f"{node.address}:0",
                "--world-size",
                str(world_size),
                "--local-workers",
                str(local_workers),
                "--out",
                out,
            ],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            cwd=HERE,
        )
        self.port = self.expect("listening", 60)["port"]

    def expect(self, event: str, timeout_s: float) -> dict:
        line = nc.read_line(self.proc, timeout_s)
        got = json.loads(line)
        assert got["event"] == event, (got, self.stderr())
        return got

    def send(self, **cmd) -> None:
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        self.proc.stdin.flush()

    def stats(self) -> dict:
        self.send(cmd="stats")
        return self.expect("stats", 30)

    def quit(self) -> None:
        self.send(cmd="quit")
        self.expect("closed", 120)
        assert self.proc.wait(30) == 0, self.stderr()

    def stderr(self) -> str:
        self.log.flush()
        with open(self.log.name, "rb") as f:
            return f.read().decode(errors="replace")[-4000:]


def _agent(node: nc.Node, engine: str, workers: int, env: dict, log: str, *extra: str) -> subprocess.Popen:
    argv = [
        sys.executable,
        "-m",
        "gfdit",
        "node-agent",
        "--engine",
        engine,
        "--workers",
        str(workers),
        *extra,
    ]
    return node.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=open(log, "wb"))


# Run on a node: what the engine's node port answers to garbage, to a greeting of another protocol version, and to an
# agent's hello (magic "gfditNOD", the version, then a hello frame: NodeHello of src/runtime/relay.cpp) when it has
# all its workers. The standard library alone: it starts in milliseconds.
_PROBE = r"""
import json, socket, struct, sys
host, port, version = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def answer(data):
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(data)
        got = b""
        while len(got) < 256:
            part = s.recv(256 - len(got))
            if not part:
                break
            got += part
    return [struct.unpack_from("<i", got, 12)[0], got[16:].split(b"\0")[0].decode()] if len(got) == 256 else None
def greeting(v):
    return b"gfditNOD" + struct.pack("<Ii", v, 0) + bytes(240)
hello = struct.pack("<II", 0x4E480001, 5) + b"probe" + struct.pack("<ii", 1, 0)
print(json.dumps([
    answer(b"GET / HTTP/1.1\r\n" + b"x" * 240),
    answer(greeting(99)),
    answer(greeting(version) + struct.pack("<IiQQ", 1, -1, len(hello), 0) + hello),
]))
"""


def _wait(cond, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_workers_on_two_nodes_give_the_one_host_outputs_and_survive_the_loss_of_a_node(
    cluster, reference, tmp_path
):
    n0, n1 = cluster.node(0), cluster.node(1)
    env = {**cluster.world_env([0, 0, 1, 1]), "GFDIT_NODE_TIMEOUT_S": NODE_TIMEOUT_S}
    shm_before = (n0.gfdit_shm(), n1.gfdit_shm())
    eng = Driven(n0, str(tmp_path), env, 4, 2, str(tmp_path / "engine.log"))
    where = f"{n0.address}:{eng.port}"
    agent = _agent(n1, where, 2, env, str(tmp_path / "agent.log"), "--wait-s", "60", "--rejoin")
    eng.expect("ready", START_S)

    # connections it refuses leave it serving: garbage, another protocol version, an agent it has no place for
    argv = [
        sys.executable,
        "-I",
        "-S",
        "-c",
        _PROBE,
        n0.address,
        str(eng.port),
        str(rt.NODE_PROTOCOL_VERSION),
    ]
    probe = n1.run(argv, stdout=subprocess.PIPE)
    garbage, other, extra = json.loads(probe.communicate(timeout=30)[0])
    assert garbage[0] == 1 and "not a gfdit node agent" in garbage[1], garbage
    assert other[0] == 1 and "version 99" in other[1], other
    assert extra[0] == 1 and extra[1] == "the engine has all its workers", extra
    # a mixed trace: every output bit for bit the one-host engine's
    eng.send(cmd="run", name="trace", requests=driver.TRACE)
    done = eng.expect("done", 300)
    assert done["states"] == ["DONE"] * len(driver.TRACE), done["reasons"]
    for k, ref in enumerate(reference["trace"]):
        out = torch.load(tmp_path / f"trace-{k}.pt")
        assert torch.equal(out, ref), f"request {k} differs from the one-host engine's"
    st = eng.stats()
    assert st["nodes"][0]["workers"] == [2, 3] and st["nodes"][0]["connected"], st["nodes"]
    assert len(st["refusals"]) == 3, st["refusals"]

    if cluster.isolated:
        # node 1 falls off the network mid-run: its workers count as dead once it is silent for the node timeout,
        # the requests complete on node 0; node 1's agent stops its workers and cleans up, and once the link is
        # back it connects again and its new workers take the lost ones' place
        eng.send(cmd="run", name="cut", requests=driver.LONG, mid_run=True)
        eng.expect("denoising", 120)
        n1.cut_link()
        done = eng.expect("done", 300)
        assert done["states"] == ["DONE"] * len(driver.LONG), done["reasons"]
        st = eng.stats()
        assert st["stats"]["lost"] == [2, 3] and not st["nodes"][0]["connected"], st
        assert "nothing came from it" in st["nodes"][0]["why"], st["nodes"]
        for k, ref in enumerate(reference["long"]):
            out = torch.load(tmp_path / f"cut-{k}.pt")
            assert float((out.double() - ref.double()).norm() / ref.double().norm()) <= 1e-4
        _wait(lambda: n1.gfdit_shm() == set(), 60, "node 1's agent removed what it made in /dev/shm")
        n1.restore_link()
        _wait(lambda: all(eng.stats()["stats"]["alive"]), START_S, "node 1's new workers joined")
        st = eng.stats()
        assert [n["connected"] for n in st["nodes"]] == [False, True], st["nodes"]
        assert st["stats"]["replacements"] >= 2, st["stats"]
        eng.send(cmd="run", name="after", requests=driver.TRACE[:1])
        done = eng.expect("done", 300)
        assert done["states"] == ["DONE"], done["reasons"]
        assert torch.equal(torch.load(tmp_path / "after-0.pt"), reference["trace"][0])

    # the whole of node 1 dies mid-run: the requests complete on node 0
    eng.send(cmd="run", name="kill", requests=driver.LONG, mid_run=True)
    eng.expect("denoising", 120)
    n1.kill_all()
    done = eng.expect("done", 300)
    assert done["states"] == ["DONE"] * len(driver.LONG), done["reasons"]
    for k, ref in enumerate(reference["long"]):
        out = torch.load(tmp_path / f"kill-{k}.pt")
        assert float((out.double() - ref.double()).norm() / ref.double().norm()) <= 1e-4
    st = eng.stats()
    assert st["stats"]["lost"] == [2, 3] and not st["nodes"][-1]["connected"], st
    assert agent.poll() is not None
    eng.quit()
    assert n0.gfdit_shm() <= shm_before[0], n0.gfdit_shm() - shm_before[0]
    assert n1.gfdit_shm() <= shm_before[1], n1.gfdit_shm() - shm_before[1]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_gfdit_serve_with_a_worker_on_each_node_answers_an_image_request(tmp_path):
    http = nc.free_port()
    with nc.LocalNodes(nodes=2) as cluster:
        n0, n1 = cluster.node(0), cluster.node(1)
        env = {**cluster.world_env([0, 1]), "GFDIT_NODE_TIMEOUT_S": NODE_TIMEOUT_S}
        node_port = nc.free_port()
        serve = n0.run(
            [
                sys.executable,
                "-m",
                "gfdit",
                "serve",
                "--model",
                "tiny-qwen-image",
                "--world-size",
                "2",
                "--local-workers",
                "1",
                "--listen",
                f"{n0.address}:{node_port}",
                "--cluster",
                "none",
                "--host",
                n0.address,
                "--port",
                str(http),
            ],
            env=env,
            stderr=open(tmp_path / "serve.log", "wb"),
        )
        agent = _agent(n1, f"{n0.address}:{node_port}", 1, env, str(tmp_path / "agent.log"), "--wait-s", "60")
        import httpx

        url = f"http://{n0.address}:{http}"
        _wait(lambda: _healthy(url), START_S, "the server answered /health")
        body = {"prompt": "a lighthouse", "size": "64x64", "num_inference_steps": 2, "seed": 5}
        r = httpx.post(f"{url}/v1/images/generations", json=body, timeout=120)
        assert r.status_code == 200, r.text
        assert len(r.json()["data"]) == 1 and r.json()["data"][0]["b64_json"]
        models = httpx.get(f"{url}/health", timeout=10).json()
        assert models["status"] == "ok", models
        serve.terminate()  # drains, stops the workers and says goodbye to the agent
        assert serve.wait(60) == 0
        assert agent.wait(60) == 0  # an orderly end


def _healthy(url: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.parametrize(
    "kwargs, param",
    [
        ({"local_workers": 1}, "listen"),
        ({"local_workers": 3, "listen": "127.0.0.1:0"}, "local_workers"),
        ({"local_workers": True, "listen": "127.0.0.1:0"}, "local_workers"),
        ({"local_workers": 1, "listen": "no port"}, "listen"),
        ({"local_workers": 1, "listen": "127.0.0.1:0", "reprofile": True}, "reprofile"),
    ],
)
def test_arguments_for_workers_on_other_hosts_are_refused_before_anything_starts(kwargs, param):
    with pytest.raises(gfdit.InvalidUsage) as e:
        Engine(model=driver.MODEL, world_size=2, **kwargs)
    assert e.value.param == param


def test_an_agent_the_engine_has_no_place_for_learns_why():
    relay = rt.NodeRelay(2, "127.0.0.1", 0, 5.0)
    try:
        hello = rt.NodeHello()
        hello.host, hello.num_workers = "elsewhere", 1
        refused: list[str] = []

        def dial() -> None:
            try:
                rt.AgentRelay("127.0.0.1", relay.port, hello, 10.0)
            except gfdit.RemoteError as e:
                refused.append(e.message)

        import threading

        t = threading.Thread(target=dial)
        t.start()
        p = relay.accept(10.0)
        assert p is not None and p.hello.host == "elsewhere" and p.hello.num_workers == 1
        relay.refuse(p.id, "the engine has all its workers")
        t.join(10.0)
        assert refused and "refused this node: the engine has all its workers" in refused[0], refused
        assert relay.refusals()[-1].endswith("the engine has all its workers")
    finally:
        relay.close()
