"""An emulated cluster on one host, for tests of gfdit worlds that span several machines.

Two modes with one API, so that a test is written once (the `cluster` fixture of conftest.py runs it in both):

- `EmulatedCluster` (root only): each node is a network, mount and UTS namespace of its own. The nodes
  are joined by veth links shaped with tc's token bucket filter (tbf), and every node has a fresh tmpfs on
  /dev/shm, so ranks of different nodes cannot share memory while ranks of one node can. Loopback is up in
  every node, and a node has no route but its link: traffic stays among the namespaces made here. Each node
  has a host name of its own (gfdit-emu-node<i>), as the messages that name a lost host need.
- `LocalNodes` (anyone): the nodes are labels on this host. Every node has the address 127.0.0.1 and shares
  /dev/shm; `world_env` also tells the collectives to use the network between nodes (GFDIT_NET_EDGES=nodes).

A process started on a node gets GFDIT_NET_ADDRESS, the node's address, for its network edges to listen on.

    with EmulatedCluster(nodes=2, rate="1gbit") as cl:
        node_ids = [0, 0, 1, 1]  # a world of 4 ranks, 2 per node
        env = cl.world_env(node_ids)  # GFDIT_NODE_IDS, and what the mode needs besides
        ranks = [cl.node(n).run([sys.executable, "rank.py", str(r)], env=env) for r, n in enumerate(node_ids)]
        cl.node(1).cut_link()  # node 1 falls off the network

`measure_stream` is the plain stream socket baseline between two nodes (bytes/s and round trips of small
messages) that the network transport is compared with.

Run as a script, this module is the small TCP programs that tests start on nodes (`serve`, `connect`,
`stream-server`, `stream-client`); it imports only the standard library, so they start fast.

NOTE [emulated cluster state]
Everything a cluster makes lives under one directory, STATE_PARENT/gfdit-emu-<pid>-<start>-<n> (the pid and
start time of the process that owns it): the directory is bind-mounted on itself and made private (a mount
namespace can be kept alive by a bind mount only on a private mount, and nothing made there propagates
elsewhere); in it, per node, the bind mounts that keep its network, mount and UTS namespaces alive
(node<i>.net, node<i>.mount, node<i>.uts), the tmpfs that is its /dev/shm (shm<i>, mounted here and bound onto
/dev/shm inside the node, so the host can list it), and for more than two nodes the namespace of the switch
(hub.net). The veth devices are created directly inside the namespaces and die with them; nothing is added to
the host's network namespace. Tearing a cluster down is one routine (`_tear_down`): kill every process in its
namespaces, lazily unmount what is mounted under the directory, remove it. A run that was killed leaves its
directory behind; the next cluster (or `clean_leftovers`) tears down every such directory whose owner process
is gone.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import functools
import itertools
import json
import os
import re
import selectors
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import time
import weakref
from collections.abc import Callable, Mapping, Sequence

PREFIX = "gfdit-emu"  # names every directory and tmpfs a cluster makes, so that leftovers are recognised
STATE_PARENT = "/run"
SUBNET = "10.213.7"  # private; node i is SUBNET.(i + 1)
NODE_IDS_ENV = "GFDIT_NODE_IDS"
# Network edges also between ranks of one host whose node ids differ: LocalNodes' worlds need it, an
# EmulatedCluster's do not (its nodes cannot share memory, which the collectives see by themselves).
NET_EDGES_ENV, NET_EDGES_BY_NODE = "GFDIT_NET_EDGES", "nodes"
# Where a rank's network edges listen: else the first address of an interface that is up and not loopback,
# which for LocalNodes would be this host's own outside address.
NET_ADDRESS_ENV = "GFDIT_NET_ADDRESS"
_LINK = "eth0"  # the node's end of its link, inside its namespace
_COMMAND_TIMEOUT_S = 20.0  # bound of one setup command (they take milliseconds)
_KILL_TIMEOUT_S = 5.0  # bound of the wait for killed processes to be gone


class ClusterError(RuntimeError):
    """Setting up or tearing down an emulated cluster failed."""


# ---- the rate of a link ------------------------------------------------------------------------------------

_RATE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(bit|kbit|mbit|gbit|bps|kbps|mbps|gbps)\s*$", re.IGNORECASE)
_RATE_SCALE = {
    "bit": 1 / 8,
    "kbit": 1e3 / 8,
    "mbit": 1e6 / 8,
    "gbit": 1e9 / 8,
    "bps": 1,
    "kbps": 1e3,
    "mbps": 1e6,
    "gbps": 1e9,
}


def rate_bytes_per_s(rate: str) -> float:
    """Bytes per second of a tc rate: "1gbit", "500mbit", "100mbps" (decimal units, bits or bytes), as tc."""
    m = _RATE.match(rate)
    if not m:
        raise ValueError(f"not a tc rate: {rate!r} (a number and one of {', '.join(_RATE_SCALE)})")
    return float(m.group(1)) * _RATE_SCALE[m.group(2).lower()]


# ---- system helpers ----------------------------------------------------------------------------------------

_MS_BIND = 4096
_MS_PRIVATE = 1 << 18
_MNT_DETACH = 2


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    rc = _libc().mount(
        source.encode(),
        target.encode(),
        fstype.encode() if fstype else None,
        flags,
        data.encode() if data else None,
    )
    if rc != 0:
        err = ctypes.get_errno()
        raise ClusterError(f"mount {source} on {target} ({fstype or 'bind'}): {os.strerror(err)}")


def _umount_lazily(target: str) -> str | None:
    """Detaches the mount on target (lazily, so that a busy one goes too); the error, if any.

    One that is gone already is no error: two runs may clean the same leftover at once."""
    if _libc().umount2(target.encode(), _MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):
            return f"umount {target}: {os.strerror(err)}"
    return None


def _mounts_under(path: str) -> list[tuple[str, str]]:
    """(mount point, file system type) of every mount at or under path, deepest first."""
    out = []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            point = fields[4].replace("\\040", " ")
            fstype = fields[fields.index("-") + 1]
            if point == path or point.startswith(path + "/"):
                out.append((point, fstype))
    return sorted(out, key=lambda m: -m[0].count("/"))


def _run(argv: Sequence[str], what: str) -> str:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=_COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ClusterError(f"{what}: `{' '.join(argv)}` took more than {_COMMAND_TIMEOUT_S} s") from None
    if done.returncode != 0:
        raise ClusterError(f"{what}: `{' '.join(argv)}` failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def _start_time(pid: int) -> str | None:
    """When process pid started (ticks since boot): it tells the process from a later one with its pid."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _scan_processes(matches: Callable[[str], bool]) -> list[int]:
    """Processes (but this one) whose pid matches() accepts; matches may raise OSError for a gone one."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if matches(entry):
                pids.append(int(entry))
        except OSError:
            pass  # gone meanwhile
    return pids


def _pids_in_namespaces(namespaces: set[tuple[int, int]]) -> list[int]:
    """Processes whose network or mount namespace (device, inode) is one of namespaces (zombies have none)."""

    def inside(pid: str) -> bool:
        for kind in ("net", "mnt"):
            st = os.stat(f"/proc/{pid}/ns/{kind}")
            if (st.st_dev, st.st_ino) in namespaces:
                return True
        return False

    return _scan_processes(inside) if namespaces else []


def _pids_in_groups(groups: set[int]) -> list[int]:
    """Live processes (not zombies) of the process groups groups."""

    def member(pid: str) -> bool:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0] != "Z" and int(fields[2]) in groups

    return _scan_processes(member) if groups else []


def _kill_until_gone(find: Callable[[], list[int]], timeout_s: float, reap=lambda: None) -> list[int]:
    """SIGKILLs what find() returns until it returns nothing or timeout_s passed; what is still there.

    A killed process dies when it is next scheduled, not at kill(): hence the repeated scans. `reap` runs
    between them so that the caller's own children do not stay as zombies."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = find()
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        reap()
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.01)


def _tear_down(path: str, reap=lambda: None) -> list[str]:
    """Removes a cluster's directory and everything it holds (NOTE [emulated cluster state]); the errors."""
    errors = []
    mounts = _mounts_under(path)
    namespaces = set()
    for point, fstype in mounts:
        if fstype == "nsfs":
            try:
                st = os.stat(point)
                namespaces.add((st.st_dev, st.st_ino))
            except OSError as e:
                errors.append(f"stat {point}: {e}")
    left = _kill_until_gone(lambda: _pids_in_namespaces(namespaces), _KILL_TIMEOUT_S, reap)
    if left:
        errors.append(f"processes still in the cluster's namespaces after {_KILL_TIMEOUT_S} s: {left}")
    for point, _ in mounts:  # deepest first, the directory's own bind mount last
        if (err := _umount_lazily(point)) is not None:
            errors.append(err)

    def not_removed(_f, p: str, e) -> None:
        if not isinstance(e[1], FileNotFoundError):
            errors.append(f"remove {p}: {e[1]}")

    shutil.rmtree(path, onerror=not_removed)
    return errors


def _tear_down_at_exit(path: str, owner: int) -> None:
    if os.getpid() == owner:  # not in a forked child, which shares the finalizer but not the cluster
        _tear_down(path)


_cluster_numbers = itertools.count(1)
_STATE_DIR = re.compile(re.escape(PREFIX) + r"-(\d+)-(\d+)-\d+$")


def clean_leftovers(parent: str = STATE_PARENT) -> list[str]:
    """Tears down the clusters under parent whose owner process is gone (a killed run); their directories."""
    cleaned = []
    try:
        entries = sorted(os.listdir(parent))
    except FileNotFoundError:
        return cleaned
    for name in entries:
        m = _STATE_DIR.match(name)
        if not m or _start_time(int(m.group(1))) == m.group(2):
            continue  # not a cluster's, or its owner still runs
        path = os.path.join(parent, name)
        errors = _tear_down(path)
        if errors:
            raise ClusterError(f"cleaning the leftover cluster {path}: " + "; ".join(errors))
        cleaned.append(path)
    return cleaned


@functools.cache
def namespace_support() -> str | None:
    """Why an EmulatedCluster cannot be made here, or None when it can.

    Besides root and the commands, it tries what the cluster needs in a throwaway namespace (gone when the
    probe exits): network and mount namespaces, a veth pair, a tbf qdisc and a tmpfs."""
    if os.geteuid() != 0:
        return f"an emulated cluster needs root (namespaces, veth, tc); running as uid {os.geteuid()}"
    missing = [c for c in ("ip", "tc", "unshare", "nsenter") if shutil.which(c) is None]
    if missing:
        return f"an emulated cluster needs the commands {', '.join(missing)}"
    helps = {
        c: subprocess.run([c, "--help"], capture_output=True, text=True, timeout=10).stdout
        for c in ("unshare", "nsenter")
    }
    if "--mount[=<file>]" not in helps["unshare"] or "--wd" not in helps["nsenter"]:
        return "this util-linux lacks unshare --mount=FILE (a mount namespace kept in a file) or nsenter --wd"
    probe = (
        f"ip link add {PREFIX}-a type veth peer name {PREFIX}-b"
        f" && tc qdisc add dev {PREFIX}-a root tbf rate 1gbit burst 64kb latency 10ms"
        f" && mount -t tmpfs {PREFIX}-probe /dev/shm"
    )
    try:
        done = subprocess.run(
            ["unshare", "--net", "--mount", "--propagation", "private", "--", "sh", "-c", probe],
            capture_output=True,
            text=True,
            timeout=_COMMAND_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return "probing namespaces, veth and tbf took too long"
    if done.returncode != 0:
        return f"namespaces, veth, tbf or tmpfs unavailable here: {done.stderr.strip()}"
    return None


# ---- the stream baseline -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StreamMeasurement:
    """One TCP connection between two nodes: a bulk transfer and round trips of small messages."""

    nbytes: int
    seconds: float  # from the first byte sent to the receiver's acknowledgement of the last
    rtt_s: float  # median round trip of a msg_bytes message (TCP_NODELAY)
    rtt_min_s: float
    msg_bytes: int

    @property
    def bytes_per_s(self) -> float:
        return self.nbytes / self.seconds


def measure_stream(
    client: Node,
    server: Node,
    nbytes: int = 32 << 20,
    num_pings: int = 200,
    msg_bytes: int = 64,
    timeout_s: float = 30.0,
) -> StreamMeasurement:
    """A plain stream socket from client to server, two nodes of one cluster (one node: over 127.0.0.1).

    The programs run on the nodes (`stream-server`, `stream-client` of this module); timeout_s bounds all."""
    deadline = time.monotonic() + timeout_s
    host = "127.0.0.1" if client is server else server.address
    srv = server.run(
        program("stream-server", host, str(timeout_s)), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        port = _read_line(srv, deadline)
        cli = client.run(
            program("stream-client", host, port, str(nbytes), str(num_pings), str(msg_bytes), str(timeout_s)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            out, err = cli.communicate(timeout=max(0.1, deadline - time.monotonic()))
        finally:
            _stop(cli)
        if cli.returncode != 0:
            raise ClusterError(
                f"stream client {client.index} -> {server.index} failed: {err.decode().strip()}"
            )
        r = json.loads(out)
        return StreamMeasurement(nbytes, r["seconds"], r["rtt_s"], r["rtt_min_s"], msg_bytes)
    finally:
        _stop(srv)


@dataclasses.dataclass(frozen=True)
class Echo:
    """How one connection to an echo server went."""

    ok: bool
    error: str  # when not ok, the exception's name and message ("OSError: Network is unreachable")
    seconds: float


def echo_server(node: Node, host: str = "0.0.0.0", lifetime_s: float = 20.0) -> tuple[subprocess.Popen, int]:
    """Starts on node a server that echoes one message per connection (for lifetime_s); it and its port."""
    proc = node.run(program("serve", host, str(lifetime_s)), stdout=subprocess.PIPE)
    return proc, int(read_line(proc, 10.0))


def echo_once(node: Node, host: str, port: int, timeout_s: float = 0.5) -> Echo:
    """One connection from node to an echo server at host:port and one message, each step within timeout_s."""
    proc = node.run(program("connect", host, str(port), str(timeout_s)), stdout=subprocess.PIPE)
    try:
        out, _ = proc.communicate(timeout=timeout_s + _COMMAND_TIMEOUT_S)
    finally:
        _stop(proc)
    return Echo(**json.loads(out))


def free_port() -> int:
    """A TCP port of this host's loopback that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def program(name: str, *args: str) -> list[str]:
    """argv of a program of this module (-I -S: it needs the standard library only)."""
    return [sys.executable, "-I", "-S", os.path.abspath(__file__), name, *args]


def read_line(proc: subprocess.Popen, timeout_s: float) -> str:
    """The first line proc writes to its stdout (a pipe), waiting timeout_s at most."""
    return _read_line(proc, time.monotonic() + timeout_s)


def _read_line(proc: subprocess.Popen, deadline: float) -> str:
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        if not sel.select(max(0.0, deadline - time.monotonic())):
            raise ClusterError(f"process {proc.args} wrote nothing in time")
        line = proc.stdout.readline().decode().strip()
    finally:
        sel.close()
    if not line:
        proc.wait(timeout=_KILL_TIMEOUT_S)
        err = proc.stderr.read().decode().strip() if proc.stderr else ""
        raise ClusterError(f"process {proc.args} exited ({proc.returncode}) {err}")
    return line


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=_KILL_TIMEOUT_S)
    for f in (proc.stdout, proc.stderr):
        if f is not None:
            f.close()


# ---- nodes and clusters ------------------------------------------------------------------------------------


class Node:
    """One machine of a cluster: an address, processes started on it, its /dev/shm and its link."""

    def __init__(self, cluster: _Cluster, index: int, address: str, hostname: str) -> None:
        self.cluster = cluster
        self.index = index
        self.address = address
        self.hostname = hostname
        self._procs: list[subprocess.Popen] = []

    def run(
        self, argv: Sequence[str], env: Mapping[str, str] | None = None, **popen_kwargs
    ) -> subprocess.Popen:
        """Starts argv on this node with this process's environment, GFDIT_NET_ADDRESS (this node's address)
        and env, as the leader of a new process group (setsid: what it starts is killed with it)."""
        full_env = {**os.environ, NET_ADDRESS_ENV: self.address, **(env or {})}
        proc = subprocess.Popen(
            self._argv(list(argv), popen_kwargs.get("cwd")),
            env=full_env,
            start_new_session=True,
            **popen_kwargs,
        )
        self._procs.append(proc)
        return proc

    def shm_names(self) -> set[str]:
        """What is in this node's /dev/shm now."""
        return set(os.listdir(self._shm_dir()))

    def gfdit_shm(self) -> set[str]:
        """What gfdit has in this node's /dev/shm now."""
        return {n for n in self.shm_names() if n.startswith("gfdit")}

    def cut_link(self) -> None:
        """Takes this node off the network: its end of its link goes down."""
        raise NotImplementedError

    def restore_link(self) -> None:
        """Puts this node back on the network (undoes cut_link)."""
        raise NotImplementedError

    def kill_all(self, timeout_s: float = _KILL_TIMEOUT_S) -> None:
        """SIGKILLs every process started on this node (and, in a namespace, everything else in it)."""
        raise NotImplementedError

    def _argv(self, argv: list[str], cwd: str | None) -> list[str]:
        return argv

    def _shm_dir(self) -> str:
        return "/dev/shm"

    def _reap(self) -> None:
        self._procs = [p for p in self._procs if p.poll() is None]

    def _reap_all(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for p in self._procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise ClusterError(
                    f"node {self.index}: process {p.pid} ({p.args}) outlived SIGKILL"
                ) from None
        self._procs = []


class _Cluster:
    """What both modes share: nodes, the environment of a world's ranks, a context that always closes."""

    kind = ""
    isolated = False  # whether nodes have separate network stacks and /dev/shm
    rate_bytes_per_s: float | None = None  # of each direction of a node's link; None: not shaped

    def __init__(self, nodes: int) -> None:
        if not 2 <= nodes <= 64:
            raise ValueError(f"a cluster has 2 to 64 nodes, not {nodes}")
        self.num_nodes = nodes
        self.nodes: list[Node] = []

    def node(self, index: int) -> Node:
        return self.nodes[index]

    def world_env(self, node_ids: Sequence[int]) -> dict[str, str]:
        """The environment every rank of a world gets, node_ids[rank] being the node it is started on."""
        if any(not 0 <= n < self.num_nodes for n in node_ids):
            raise ValueError(f"node ids {list(node_ids)} outside a cluster of {self.num_nodes} nodes")
        return {NODE_IDS_ENV: ",".join(str(n) for n in node_ids)}

    def start(self) -> None:
        pass

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class LocalNodes(_Cluster):
    """Nodes that are labels on this host: one network stack (127.0.0.1) and one /dev/shm for all."""

    kind = "local"

    def __init__(
        self,
        nodes: int = 2,
        rate: str | None = None,
        burst: int | None = None,
        latency: str | None = None,
        shm_size: str | None = None,
        parent: str | None = None,
    ) -> None:
        # EmulatedCluster's other arguments are taken, so that one test can pass them to either mode: nothing
        # here is shaped or made
        super().__init__(nodes)
        self.nodes = [_LocalNode(self, i, "127.0.0.1", socket.gethostname()) for i in range(nodes)]

    def world_env(self, node_ids: Sequence[int]) -> dict[str, str]:
        # the nodes could share memory: only this setting makes their ranks use the network between nodes
        return {**super().world_env(node_ids), NET_EDGES_ENV: NET_EDGES_BY_NODE}

    def close(self) -> None:
        for n in self.nodes:
            n.kill_all()


class _LocalNode(Node):
    def cut_link(self) -> None:
        import pytest

        pytest.skip("nodes on one host have no link of their own to cut (it needs an EmulatedCluster)")

    restore_link = cut_link

    def kill_all(self, timeout_s: float = _KILL_TIMEOUT_S) -> None:
        # each started process leads a group: what it started goes too, unless it left the group
        groups = {p.pid for p in self._procs}
        left = _kill_until_gone(lambda: _pids_in_groups(groups), timeout_s, self._reap)
        if left:
            raise ClusterError(f"node {self.index}: processes {left} outlived SIGKILL for {timeout_s} s")
        self._reap_all(timeout_s)


class EmulatedCluster(_Cluster):
    """Nodes in network and mount namespaces of their own on tbf-shaped veth links (NOTE [emulated cluster
    state]).

    Two nodes share one veth pair (a /30); more hang on a bridge in a switch namespace (a /24), each port
    shaped in both directions. rate is a tc rate ("1gbit"); burst (bytes) defaults to 2 ms at that rate and
    64 KiB at least; latency bounds tbf's queue; shm_size is the size of each node's /dev/shm tmpfs (None:
    tmpfs's default, half the memory). Needs root: `namespace_support()` says why not."""

    kind = "netns"
    isolated = True

    def __init__(
        self,
        nodes: int = 2,
        rate: str = "1gbit",
        burst: int | None = None,
        latency: str = "20ms",
        shm_size: str | None = None,
        parent: str = STATE_PARENT,
    ) -> None:
        super().__init__(nodes)
        self.rate = rate
        self.rate_bytes_per_s = rate_bytes_per_s(rate)
        self.burst = burst if burst is not None else max(64 << 10, int(self.rate_bytes_per_s * 0.002))
        self.latency = latency
        self.shm_size = shm_size
        self.parent = parent
        self.path = ""
        self._finalizer: weakref.finalize | None = None

    def start(self) -> None:
        reason = namespace_support()
        if reason is not None:
            raise ClusterError(reason)
        clean_leftovers(self.parent)
        owner = os.getpid()
        self.path = os.path.join(
            self.parent, f"{PREFIX}-{owner}-{_start_time(owner)}-{next(_cluster_numbers)}"
        )
        os.makedirs(self.path)
        # closed at interpreter exit too when a test forgets; a killed run is cleaned by the next one instead
        self._finalizer = weakref.finalize(self, _tear_down_at_exit, self.path, owner)
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def _build(self) -> None:
        _mount(self.path, self.path, None, _MS_BIND)
        _mount("none", self.path, None, _MS_PRIVATE)
        two = self.num_nodes == 2
        prefix_len = 30 if two else 24
        for i in range(self.num_nodes):
            shm = self._file(f"shm{i}")
            os.mkdir(shm)
            opts = "mode=1777" + (f",size={self.shm_size}" if self.shm_size else "")
            _mount(f"{PREFIX}-shm{i}", shm, "tmpfs", 0, opts)
            for kind in _NODE_NAMESPACES:
                open(self._file(f"node{i}.{kind}"), "w").close()
            hostname = f"{PREFIX}-node{i}"
            # inside the new namespaces: its tmpfs on /dev/shm, the cluster's state out of sight, its host name,
            # loopback up
            setup = (
                f"mount --bind {shm} /dev/shm && umount -l {self.path} && hostname {hostname}"
                f" && ip link set lo up && {_NO_IPV6}"
            )
            _run(
                ["unshare", *(f"--{kind}={self._file(f'node{i}.{kind}')}" for kind in _NODE_NAMESPACES),
                 "--propagation", "private", "--", "sh", "-c", setup],
                f"node {i}'s namespaces",
            )  # fmt: skip
            self.nodes.append(_NamespaceNode(self, i, f"{SUBNET}.{i + 1}", hostname))
        tbf = ["tbf", "rate", self.rate, "burst", str(self.burst), "latency", self.latency]
        if two:
            _run(
                ["ip", "link", "add", "name", _LINK, "netns", self._file("node0.net"), "type", "veth",
                 "peer", "name", _LINK, "netns", self._file("node1.net")],
                "the link",
            )  # fmt: skip
        else:
            hub = self._file("hub.net")
            open(hub, "w").close()
            shaping = " ".join(tbf)
            ports = " && ".join(
                f"ip link set p{i} master br0 && tc qdisc add dev p{i} root {shaping} && ip link set p{i} up"
                for i in range(self.num_nodes)
            )
            _run(
                ["unshare", f"--net={hub}", "--", "sh", "-c", f"{_NO_IPV6} && ip link add br0 type bridge"],
                "the switch",
            )
            for i in range(self.num_nodes):
                _run(
                    ["ip", "link", "add", "name", _LINK, "netns", self._file(f"node{i}.net"), "type", "veth",
                     "peer", "name", f"p{i}", "netns", hub],
                    f"node {i}'s link",
                )  # fmt: skip
            _run(
                ["nsenter", f"--net={hub}", "--", "sh", "-c", f"{ports} && ip link set br0 up"],
                "the switch's ports",
            )
        for node in self.nodes:
            node._ip(
                f"ip addr add {node.address}/{prefix_len} dev {_LINK}"
                f" && tc qdisc add dev {_LINK} root {' '.join(tbf)} && ip link set {_LINK} up",
                "its address and shaping",
            )
        for node in self.nodes:
            node._wait_link_up()

    def close(self) -> None:
        if self._finalizer is None or not self._finalizer.alive:
            return
        self._finalizer.detach()
        errors = _tear_down(self.path, reap=lambda: [n._reap() for n in self.nodes])
        for n in self.nodes:
            try:
                n._reap_all(_KILL_TIMEOUT_S)
            except ClusterError as e:
                errors.append(str(e))
        if errors:
            raise ClusterError(f"tearing down {self.path}: " + "; ".join(errors))

    def namespaces(self) -> set[tuple[int, int]]:
        """(device, inode) of every namespace of this cluster, as os.stat of /proc/<pid>/ns/* gives them."""
        out = set()
        for name in os.listdir(self.path):
            if name.endswith(tuple(f".{kind}" for kind in _NODE_NAMESPACES)):
                st = os.stat(self._file(name))
                out.add((st.st_dev, st.st_ino))
        return out


_NODE_NAMESPACES = ("net", "mount", "uts")  # a node's namespaces, as unshare and nsenter name them
_NO_IPV6 = (
    # a quiet link: no IPv6 address configuration or neighbour discovery on it (without IPv6: nothing to do)
    "{ [ ! -w /proc/sys/net/ipv6/conf/all/disable_ipv6 ] || "
    "{ echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6"
    " && echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6; }; }"
)


class _NamespaceNode(Node):
    cluster: EmulatedCluster

    def _ns(self, kind: str) -> str:
        """The file that keeps this node's namespace of kind (as unshare and nsenter name them) alive."""
        return self.cluster._file(f"node{self.index}.{kind}")

    def _argv(self, argv: list[str], cwd: str | None) -> list[str]:
        # entering a mount namespace moves to its root: --wd keeps the working directory (same file system)
        wd = os.path.abspath(cwd) if cwd else os.getcwd()
        return [
            "nsenter",
            *(f"--{kind}={self._ns(kind)}" for kind in _NODE_NAMESPACES),
            f"--wd={wd}",
            "--",
            *argv,
        ]

    def _shm_dir(self) -> str:
        return self.cluster._file(f"shm{self.index}")

    def _ip(self, script: str, what: str) -> str:
        return _run(
            ["nsenter", f"--net={self._ns('net')}", "--", "sh", "-c", script], f"node {self.index}: {what}"
        )

    def _wait_link_up(self, timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            state = json.loads(self._ip(f"ip -j link show {_LINK}", "its link"))[0]
            if "LOWER_UP" in state["flags"]:
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"node {self.index}: link not up after {timeout_s} s: {state['flags']}")
            time.sleep(0.01)

    def cut_link(self) -> None:
        self._ip(f"ip link set {_LINK} down", "cut its link")

    def restore_link(self) -> None:
        # a veth end has its carrier when it comes up (if its peer is up): nothing to wait for
        self._ip(f"ip link set {_LINK} up", "restore its link")

    def kill_all(self, timeout_s: float = _KILL_TIMEOUT_S) -> None:
        namespaces = set()
        for kind in ("net", "mount"):
            st = os.stat(self._ns(kind))
            namespaces.add((st.st_dev, st.st_ino))
        left = _kill_until_gone(lambda: _pids_in_namespaces(namespaces), timeout_s, self._reap)
        if left:
            raise ClusterError(f"node {self.index}: processes {left} outlived SIGKILL for {timeout_s} s")
        self._reap_all(timeout_s)


# ---- programs run on the nodes -----------------------------------------------------------------------------


def _serve(host: str, lifetime_s: float) -> None:
    """Echoes one message per connection, for lifetime_s at most; prints its port first."""
    deadline = time.monotonic() + lifetime_s
    with socket.create_server((host, 0)) as srv:
        print(srv.getsockname()[1], flush=True)
        while (left := deadline - time.monotonic()) > 0:
            srv.settimeout(left)
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                return
            with conn:
                conn.settimeout(max(0.1, deadline - time.monotonic()))
                try:
                    conn.sendall(conn.recv(4096))
                except OSError:
                    pass  # a client that went away


def _connect(host: str, port: str, timeout_s: float) -> None:
    """One connection to a `serve` and one echoed message; prints {"ok", "error", "seconds"}."""
    t0 = time.monotonic()
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as c:
            c.sendall(b"ping")
            ok, error = c.recv(16) == b"ping", ""
    except OSError as e:
        ok, error = False, type(e).__name__ if not e.strerror else f"{type(e).__name__}: {e.strerror}"
    print(json.dumps({"ok": ok, "error": error, "seconds": time.monotonic() - t0}), flush=True)


_HEADER = struct.Struct("!QQQ")  # num_pings, msg_bytes, nbytes


def _recv_exactly(conn: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        k = conn.recv_into(view[got:])
        if k == 0:
            raise ConnectionError("the peer closed the connection")
        got += k


def _stream_server(host: str, timeout_s: float) -> None:
    with socket.create_server((host, 0)) as srv:
        print(srv.getsockname()[1], flush=True)
        srv.settimeout(timeout_s)
        conn, _ = srv.accept()
    with conn:
        conn.settimeout(timeout_s)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        header = bytearray(_HEADER.size)
        _recv_exactly(conn, memoryview(header))
        num_pings, msg_bytes, nbytes = _HEADER.unpack(header)
        msg = memoryview(bytearray(msg_bytes))
        for _ in range(num_pings):
            _recv_exactly(conn, msg)
            conn.sendall(msg)
        buf = memoryview(bytearray(1 << 20))
        got = 0
        while got < nbytes:
            k = conn.recv_into(buf[: min(len(buf), nbytes - got)])
            if k == 0:
                raise ConnectionError("the client closed the connection mid-transfer")
            got += k
        conn.sendall(b"k")


def _stream_client(
    host: str, port: str, nbytes: int, num_pings: int, msg_bytes: int, timeout_s: float
) -> None:
    with socket.create_connection((host, int(port)), timeout=timeout_s) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.sendall(_HEADER.pack(num_pings, msg_bytes, nbytes))
        msg = memoryview(bytearray(os.urandom(msg_bytes)))
        rtts = []
        for _ in range(num_pings):
            t = time.perf_counter()
            conn.sendall(msg)
            _recv_exactly(conn, msg)
            rtts.append(time.perf_counter() - t)
        chunk = memoryview(os.urandom(1 << 20))
        t = time.perf_counter()
        sent = 0
        while sent < nbytes:
            n = min(len(chunk), nbytes - sent)
            conn.sendall(chunk[:n])
            sent += n
        _recv_exactly(conn, memoryview(bytearray(1)))
        seconds = time.perf_counter() - t
    print(json.dumps({"seconds": seconds, "rtt_s": statistics.median(rtts) if rtts else 0.0,
                      "rtt_min_s": min(rtts) if rtts else 0.0}), flush=True)  # fmt: skip


def _main(argv: list[str]) -> None:
    cmd, args = argv[0], argv[1:]
    if cmd == "serve":
        _serve(args[0], float(args[1]))
    elif cmd == "connect":
        _connect(args[0], args[1], float(args[2]))
    elif cmd == "stream-server":
        _stream_server(args[0], float(args[1]))
    elif cmd == "stream-client":
        _stream_client(args[0], args[1], int(args[2]), int(args[3]), int(args[4]), float(args[5]))
    else:
        raise SystemExit(f"unknown program {cmd!r}")


if __name__ == "__main__":
    _main(sys.argv[1:])
