"""The emulated cluster (netns_cluster) that multi-node tests stand on: what its nodes share and what they do
not, its links, their rate and their cuts, and that it leaves nothing behind.

Most tests take the `cluster` fixture (conftest.py) and run in both modes; where the modes differ, the test
says what each must show (`cluster.isolated`). The namespace mode needs root: without it those cases skip.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid

import netns_cluster as nc
import pytest

PY = [sys.executable, "-I", "-S", "-c"]


def _output(node: nc.Node, argv: list[str], **kwargs) -> str:
    proc = node.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err.decode()
    return out.decode()


def _alive(pid: int) -> bool:
    """Whether pid runs (a zombie, killed but not yet reaped by its parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _needs_namespaces() -> None:
    reason = nc.namespace_support()
    if reason is not None:
        pytest.skip(reason)


def test_settings_and_rates_without_a_cluster():
    local = nc.LocalNodes(nodes=3)
    assert local.world_env([0, 0, 1, 2]) == {"GFDIT_NODE_IDS": "0,0,1,2", "GFDIT_NET_EDGES": "nodes"}
    assert [n.address for n in local.nodes] == ["127.0.0.1"] * 3 and local.rate_bytes_per_s is None
    emulated = nc.EmulatedCluster(nodes=2, rate="500mbit")  # not started: nothing is made
    assert emulated.world_env([1, 0]) == {"GFDIT_NODE_IDS": "1,0"}
    assert emulated.rate_bytes_per_s == 62.5e6 and emulated.burst == 125_000
    assert nc.rate_bytes_per_s("1gbit") == 125e6 and nc.rate_bytes_per_s("10mbps") == 10e6
    with pytest.raises(ValueError, match="outside a cluster of 2 nodes"):
        emulated.world_env([0, 2])
    with pytest.raises(ValueError, match="not a tc rate"):
        nc.rate_bytes_per_s("fast")
    with pytest.raises(ValueError, match="2 to 64 nodes"):
        nc.LocalNodes(nodes=1)


def test_shm_is_shared_within_a_node_only(cluster):
    name = f"{nc.PREFIX}-test-{uuid.uuid4().hex[:12]}"
    token = uuid.uuid4().hex
    # what shm_open and mmap do: a file in /dev/shm, mapped shared; the writer keeps it open until killed
    writer_code = (
        "import mmap, os, time\n"
        f"fd = os.open('/dev/shm/{name}', os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)\n"
        "os.ftruncate(fd, 4096)\n"
        "m = mmap.mmap(fd, 4096)\n"
        f"m[:32] = b'{token}'\n"
        "print('ready', flush=True)\n"
        "time.sleep(30)\n"
    )
    reader_code = (
        "import json, mmap, os\n"
        "try:\n"
        f"    fd = os.open('/dev/shm/{name}', os.O_RDWR)\n"
        "except FileNotFoundError:\n"
        "    print(json.dumps(None))\n"
        "else:\n"
        "    print(json.dumps(bytes(mmap.mmap(fd, 4096)[:32]).decode()))\n"
    )
    writer = cluster.node(0).run(PY + [writer_code], stdout=subprocess.PIPE)
    try:
        assert nc.read_line(writer, 10) == "ready"
        assert json.loads(_output(cluster.node(0), PY + [reader_code])) == token
        seen = json.loads(_output(cluster.node(1), PY + [reader_code]))
        assert seen == (None if cluster.isolated else token)
        assert name in cluster.node(0).shm_names()
        assert (name in cluster.node(1).shm_names()) == (not cluster.isolated)
    finally:
        cluster.node(0).kill_all()
        if not cluster.isolated and os.path.exists(f"/dev/shm/{name}"):
            os.unlink(f"/dev/shm/{name}")


def test_nodes_reach_each_other_over_their_link(cluster):
    _, port = nc.echo_server(cluster.node(1))
    assert nc.echo_once(cluster.node(0), cluster.node(1).address, port).ok
    # a node's loopback is its own: node 1's server is not on node 0's 127.0.0.1
    through_loopback = nc.echo_once(cluster.node(0), "127.0.0.1", port)
    assert through_loopback.ok == (not cluster.isolated), through_loopback
    if cluster.isolated:
        assert "ConnectionRefused" in through_loopback.error
        assert cluster.node(0).address != cluster.node(1).address
        # no route but the link's: nothing leaves the cluster
        routes = json.loads(_output(cluster.node(0), ["ip", "-j", "route"]))
        assert [r["dst"] for r in routes] == [f"{nc.SUBNET}.0/30"]


@pytest.mark.cluster(nodes=3)
def test_three_nodes_reach_each_other_over_a_switch(cluster):
    ports = [nc.echo_server(cluster.node(i))[1] for i in range(3)]
    for a in range(3):
        for b in range(3):
            if a != b:
                assert nc.echo_once(cluster.node(a), cluster.node(b).address, ports[b]).ok, (a, b)


def test_shaped_link_runs_at_its_rate(cluster):
    if cluster.rate_bytes_per_s is None:
        pytest.skip("nodes on one host have no shaped link (it needs an EmulatedCluster)")
    nbytes = 40 << 20  # about 0.35 s at 1 Gbit/s
    link = nc.measure_stream(cluster.node(0), cluster.node(1), nbytes=nbytes)
    back = nc.measure_stream(cluster.node(1), cluster.node(0), nbytes=nbytes)
    loop = nc.measure_stream(cluster.node(0), cluster.node(0), nbytes=nbytes)
    for what, m in (("link 0->1", link), ("link 1->0", back), ("loopback", loop)):
        print(f"\n{what}: {m.bytes_per_s / 1e6:.0f} MB/s, round trip {m.rtt_s * 1e6:.0f} us", end="")
    for m in (link, back):
        assert 0.5 * cluster.rate_bytes_per_s <= m.bytes_per_s <= 1.2 * cluster.rate_bytes_per_s
        assert 0 < m.rtt_min_s <= m.rtt_s < 0.05
    assert loop.bytes_per_s > 3 * cluster.rate_bytes_per_s


def test_cut_link_fails_connections_in_bounded_time_and_restore_undoes_it(cluster):
    _, port1 = nc.echo_server(cluster.node(1))
    _, port0 = nc.echo_server(cluster.node(0))
    cluster.node(1).cut_link()
    # from the far side the packets vanish (a timeout); from the cut node's side there is no route at all
    far = nc.echo_once(cluster.node(0), cluster.node(1).address, port1, timeout_s=0.5)
    near = nc.echo_once(cluster.node(1), cluster.node(0).address, port0, timeout_s=0.5)
    assert not far.ok and far.seconds < 2, far
    assert far.error == "TimeoutError" or "unreachable" in far.error, far
    assert not near.ok and "unreachable" in near.error and near.seconds < 0.5, near
    cluster.node(1).restore_link()
    for _ in range(3):  # bounded: the first connect may wait for the neighbour entry the cut left failed
        back = nc.echo_once(cluster.node(0), cluster.node(1).address, port1, timeout_s=1.0)
        if back.ok:
            break
    assert back.ok, back
    assert nc.echo_once(cluster.node(1), cluster.node(0).address, port0).ok


def test_run_passes_environment_and_working_directory_and_kill_all_ends_a_node(cluster, tmp_path):
    env = cluster.world_env([0, 1])
    show = "import json, os, socket; e = os.environ; "
    show += (
        "print(json.dumps([e['GFDIT_NODE_IDS'], e['GFDIT_NET_ADDRESS'], socket.gethostname(), os.getcwd()]))"
    )
    seen = [json.loads(_output(cluster.node(i), PY + [show], env=env, cwd=str(tmp_path))) for i in range(2)]
    for i, node in enumerate(cluster.nodes):
        assert seen[i] == ["0,1", node.address, node.hostname, str(tmp_path)]
    assert (cluster.node(0).hostname != cluster.node(1).hostname) == cluster.isolated
    # kill_all ends what was started on the node and what that started
    parent = cluster.node(0).run(["sh", "-c", "sleep 30 & echo $!; wait"], stdout=subprocess.PIPE)
    child = int(nc.read_line(parent, 10))
    other = cluster.node(1).run(["sleep", "30"])
    cluster.node(0).kill_all()
    assert parent.returncode == -signal.SIGKILL and not _alive(child)
    assert other.poll() is None  # the other node's processes go on
    cluster.node(1).kill_all()
    assert other.returncode == -signal.SIGKILL


def test_a_closed_cluster_leaves_nothing_even_when_its_test_fails():
    _needs_namespaces()
    links_before = _host_links()
    with pytest.raises(RuntimeError, match="the test failed"):
        with nc.EmulatedCluster(nodes=2) as cl:
            path, namespaces = cl.path, cl.namespaces()
            # the directory and, per node, its network, mount and UTS namespaces and its /dev/shm
            assert len(namespaces) == 6 and len(nc._mounts_under(path)) == 9
            writer = cl.node(0).run(PY + [f"open('/dev/shm/{nc.PREFIX}-test', 'w').write('x')"])
            writer.wait(timeout=20)
            assert cl.node(0).shm_names() == {f"{nc.PREFIX}-test"}
            sleepers = [cl.node(i).run(["sleep", "30"]) for i in range(2)]
            raise RuntimeError("the test failed")
    assert not os.path.exists(path)
    assert nc._mounts_under(path) == []
    assert nc._pids_in_namespaces(namespaces) == []
    assert all(p.returncode == -signal.SIGKILL for p in sleepers)
    assert _host_links() == links_before  # the veth devices lived in the namespaces only


def _host_links() -> list[str]:
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, timeout=20, check=True).stdout
    return sorted(line.split(":")[1].strip() for line in out.splitlines())


_KILLED_RUN = """
import sys, time
sys.path.insert(0, {here!r})
import netns_cluster as nc
cl = nc.EmulatedCluster(nodes=2)
cl.start()
sleeper = cl.node(1).run(["sleep", "30"])
print(cl.path, sleeper.pid, flush=True)
time.sleep(30)
"""


def test_leftovers_of_a_killed_run_are_cleaned_at_the_next_start():
    _needs_namespaces()
    here = os.path.dirname(os.path.abspath(__file__))
    run = subprocess.Popen([sys.executable, "-c", _KILLED_RUN.format(here=here)], stdout=subprocess.PIPE)
    try:
        try:
            path, sleeper = nc.read_line(run, 20).split()
        finally:
            run.kill()
            run.wait(timeout=10)
        assert os.path.isdir(path) and nc._mounts_under(path) and _alive(int(sleeper))
        with nc.EmulatedCluster(nodes=2) as live:  # starting a cluster cleans what a dead run left
            assert not os.path.exists(path) and nc._mounts_under(path) == []
            assert not _alive(int(sleeper))
            assert nc.clean_leftovers() == []  # and never a cluster whose owner still runs
            assert os.path.isdir(live.path) and len(nc._mounts_under(live.path)) == 9
    finally:
        nc.clean_leftovers()  # what the dead run left, whatever failed above
