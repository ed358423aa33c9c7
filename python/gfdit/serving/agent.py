"""``gfdit node-agent``: runs some of an engine's workers on this host (NOTE [node agents] in src/runtime/relay.cpp).

The control plane stays on the engine's host. An agent connects to the engine's node port (``gfdit serve --listen``,
``gfdit.Engine(listen=...)``), says hello with how many workers it can run, and gets from the engine which worker ids
they are and what they load. It makes this host's rings, starts each worker (``gfdit.serving.worker``, unchanged) on
them, and its C++ relay (``gfdit._C.runtime.AgentRelay``) moves their tasks, completions, outputs and abort word to and
from the engine. The agent reports each worker's end, kills a worker when the engine asks, and starts a replacement
when the engine replaces a dead one (NOTE [healing] in gfdit.serving.engine). When the engine shuts down or cannot be
heard for the node timeout (``GFDIT_NODE_TIMEOUT_S``), the agent stops its workers, removes what it made in /dev/shm
and ends; with ``rejoin`` it then connects again, and a running engine that lost this node's workers takes the new
ones in their place.

Under torchrun (``torchrun --nnodes N --nproc-per-node 1 --node-rank i --rdzv-endpoint HOST:PORT -m gfdit serve ...``)
``gfdit serve`` on every node rank but 0 runs an agent, which finds the engine's node port in the rendezvous store
(``engine_from_rendezvous``).
"""

from __future__ import annotations

import argparse
import datetime
import logging
import multiprocessing as mp
import os
import signal
import socket
import sys
import time
from typing import Any

from gfdit._C import Error, RemoteError
from gfdit._C import runtime as rt
from gfdit.serving import worker
from gfdit.serving.engine import node_timeout_s, parse_address, worker_devices

POLL_S = 0.1  # how often the agent looks at its workers' processes (the engine's liveness period)
RETRY_S = 0.5  # between attempts to reach an engine that does not listen yet
KILL_WAIT_S = 5.0  # how long a killed worker may take to be gone
RENDEZVOUS_KEY = (
    "gfdit/engine-node-port"  # where an engine under torchrun publishes "host:port" for its agents
)

log = logging.getLogger("gfdit.agent")


def under_torchrun() -> bool:
    """Whether torchrun started this process (it sets the node's rank and the rendezvous' address)."""
    return all(k in os.environ for k in ("GROUP_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE"))


def rendezvous_store(timeout_s: float) -> Any:
    """A client of the store torchrun's rendezvous serves (MASTER_ADDR, MASTER_PORT)."""
    import torch.distributed as dist

    return dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        None,
        False,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def address_toward(host: str) -> str:
    """This host's IPv4 address on the route to ``host`` (how other nodes of the rendezvous reach it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host, 9))  # no packet is sent: the kernel only picks the route
            return str(s.getsockname()[0])
        except OSError:
            return socket.gethostbyname(socket.gethostname())


def publish_engine(port: int, host: str | None, timeout_s: float) -> str:
    """Under torchrun: publishes the engine's node port in the rendezvous store for the other node ranks' agents;
    returns what it published ("host:port")."""
    if host is None or host in ("0.0.0.0", ""):
        host = address_toward(os.environ["MASTER_ADDR"])
    where = f"{host}:{port}"
    rendezvous_store(timeout_s).set(f"{RENDEZVOUS_KEY}/{os.environ.get('TORCHELASTIC_RUN_ID', '')}", where)
    return where


def engine_from_rendezvous(timeout_s: float) -> tuple[str, int]:
    """Under torchrun: the engine's node port, as node rank 0 published it (waits at most timeout_s)."""
    store = rendezvous_store(timeout_s)
    where = store.get(f"{RENDEZVOUS_KEY}/{os.environ.get('TORCHELASTIC_RUN_ID', '')}").decode()
    return parse_address(where, "engine")


def connect(host: str, port: int, num_workers: int, wait_s: float, timeout_s: float) -> Any:
    """An AgentRelay connected to the engine at host:port, trying again while the engine cannot be reached (it may
    not listen yet) for wait_s; a refusal by the engine is raised at once (gfdit.RemoteError with its reason)."""
    hello = rt.NodeHello()
    hello.host = socket.gethostname()
    hello.num_workers = num_workers
    hello.pid = os.getpid()
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return rt.AgentRelay(host, port, hello, max(1.0, wait_s), timeout_s)
        except RemoteError:  # the engine answered: it refused this node, or it is no gfdit engine
            raise
        except Error:  # not reached (yet): it may not listen yet
            if time.monotonic() + RETRY_S > deadline:
                raise
            time.sleep(RETRY_S)


def run_node(relay: Any, device: Any = None) -> int:
    """Runs the workers the engine gave ``relay`` until the engine ends or is lost; 0 when it ended in order."""
    welcome = relay.welcome
    queue_name = relay.start()
    config = worker.WorkerConfig(
        welcome.world_size,
        welcome.store_host or relay.engine_address,
        welcome.store_port,
        queue_name,
        welcome.model,
        welcome.model_path or None,
        welcome.timeout_s,
        welcome.heap_bytes or None,
        welcome.threads,
        node_ids=tuple(welcome.node_of),
    )
    local = list(welcome.workers)
    devices = dict(zip(local, worker_devices(device, len(local)), strict=True))
    ctx = mp.get_context("spawn")
    host = socket.gethostname()

    def start(w: int, inherited: bool) -> Any:
        # a replacement (or a joiner of a running engine) attaches by the descriptor and waits for a REINIT
        fd = worker.InheritedFd(relay.queue_fd) if inherited else None
        p = ctx.Process(
            target=worker.main, name=f"gfdit-worker-{w}", daemon=True, args=(w, config, devices[w], fd)
        )
        p.start()
        relay.worker_started(w, int(p.pid or 0))
        return p

    procs = {w: start(w, welcome.joining) for w in local}
    reported: set[int] = set()
    log.warning(
        "gfdit node-agent: node %d runs workers %s of %d (%s)",
        welcome.node,
        local,
        welcome.world_size,
        "joining a running engine" if welcome.joining else "a new engine",
    )
    try:
        while True:
            req = relay.next(POLL_S)
            if req is not None:
                if req.kind == rt.AgentRequest.Kind.END:
                    (log.warning if req.orderly else log.error)("gfdit node-agent: %s", req.reason)
                    return 0 if req.orderly else 1
                p = procs.get(req.worker)
                if req.kind == rt.AgentRequest.Kind.KILL and p is not None and p.is_alive():
                    log.warning("gfdit node-agent: killing worker %d: %s", req.worker, req.reason)
                    p.kill()
                elif req.kind == rt.AgentRequest.Kind.START and p is not None:
                    p.join(KILL_WAIT_S)  # reported dead: only reaped here
                    procs[req.worker] = start(req.worker, True)
                    reported.discard(req.worker)
            for w, p in procs.items():
                if w not in reported and p.exitcode is not None:
                    reported.add(w)
                    relay.worker_died(
                        w,
                        int(p.exitcode),
                        f"worker {w} (pid {p.pid}) on host {host} exited with code {p.exitcode}",
                    )
    finally:
        for p in procs.values():
            if p.is_alive():
                p.kill()
        for p in procs.values():
            p.join(KILL_WAIT_S)


def serve_node(
    engine: tuple[str, int],
    num_workers: int,
    device: Any = None,
    wait_s: float = 300.0,
    rejoin: bool = False,
) -> int:
    """Connects to the engine and runs its workers (``run_node``); with ``rejoin``, connects again after a lost
    connection. Returns the exit status for ``gfdit node-agent``."""
    host, port = engine
    timeout_s = node_timeout_s()
    while True:
        try:
            relay = connect(host, port, num_workers, wait_s, timeout_s)
        except Error as e:
            print(f"gfdit node-agent: {e.message}", file=sys.stderr)
            return 2
        try:
            rc = run_node(relay, device)
        finally:
            relay.close()  # nothing of this node is left in /dev/shm
        if rc == 0 or not rejoin:
            return rc
        log.warning("gfdit node-agent: connecting to the engine at %s:%d again", host, port)


def add_arguments(p: argparse.ArgumentParser, command: str) -> None:
    p.add_argument(
        "--engine",
        default=None,
        help="HOST:PORT of the engine's node port (gfdit serve --listen); under torchrun: found in the rendezvous",
    )
    p.add_argument("--workers", type=int, default=1, help="worker processes this host runs")
    p.add_argument(
        "--device",
        default=None,
        help="where this host's workers run: cpu, cuda (worker k on device k), cuda:N; default: GFDIT_DEVICE",
    )
    p.add_argument(
        "--wait-s",
        type=float,
        default=300.0,
        help="how long to keep trying to reach an engine that does not answer yet",
    )
    p.add_argument(
        "--rejoin",
        action="store_true",
        help="after a lost connection, connect again: a running engine takes the new workers in the lost ones' place",
    )


def run(args: argparse.Namespace, command: str) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    signal.signal(
        signal.SIGTERM, lambda *_: sys.exit(143)
    )  # the workers and /dev/shm are cleaned on the way out
    if args.workers < 1:
        print("gfdit node-agent: --workers must be >= 1", file=sys.stderr)
        return 2
    try:
        if args.engine is not None:
            engine = parse_address(args.engine, "engine")
        elif under_torchrun():
            engine = engine_from_rendezvous(args.wait_s)
        else:
            print("gfdit node-agent: --engine HOST:PORT is needed (outside torchrun)", file=sys.stderr)
            return 2
    except Error as e:
        print(f"gfdit node-agent: {e.message}", file=sys.stderr)
        return 2
    return serve_node(engine, args.workers, args.device, args.wait_s, args.rejoin)
