"""``gfdit serve --ray``: the engine's node agents placed on the nodes of a running Ray cluster.

The ``gfdit serve`` process stays the engine, and its control plane stays on its host (NOTE [node agents] in
src/runtime/relay.cpp). It connects to the Ray cluster (``--ray-address``, "auto": the cluster this host belongs
to) and reserves one bundle per node that hosts workers in a STRICT_SPREAD placement group: each bundle holds
what that node's ``--workers-per-node`` workers need (a CPU each, and a GPU each where ``GFDIT_DEVICE`` says
"cuda"; ``--ray-resources`` adds or overrides resources). The first bundle asks for a sliver of the engine node's
``node:<ip>`` resource, as vLLM's Ray executor does for its driver, so that the engine's node is one of the nodes.
Once the group is placed, the bundle on the engine's node is the engine's own: its workers run there as local
workers of the engine, outside Ray, and the bundle only keeps Ray from giving those resources to something else.
On every other bundle one actor (``NodeAgentActor``, holding the whole bundle, so a GPU bundle's devices are the
ones Ray made visible to it) runs ``gfdit node-agent`` as a child process, which connects back to the engine's
node port (by default the engine node's Ray address, on a free port).

How workers split: every node of the group, the engine's included, runs ``--workers-per-node`` K workers (default
1). The number of nodes is ``--world-size / K`` (which K must divide), or every alive Ray node when
``--world-size`` is not given. Worker ids follow the nodes: the engine's node has 0..K-1, then each agent's node
the next K, in the order the agents connected.

What the agents inherit: the engine's ``GFDIT_*`` settings (those that every rank of a world must agree on, such as
``GFDIT_NET_EDGES`` and ``GFDIT_NODE_TIMEOUT_S``) but not ``GFDIT_NET_ADDRESS`` or ``GFDIT_NODE_IDS``, which belong
to a host and to the engine's welcome.

Lifetime: on shutdown the engine says goodbye to its agents, which stop their workers and end; then each actor is
asked to stop its agent (SIGTERM, which also cleans up), the actors are killed, the placement group removed, and the
process leaves the Ray cluster. The actors and the group belong to the ``gfdit serve`` process, so Ray removes them
also when it dies. An agent actor that dies (its node lost, or killed) is a lost host: the engine goes on with the
other nodes' workers, and the agent process, which Linux tells of its parent's death, stops its workers and cleans
its /dev/shm. Ray does not restart the actor, and the lost workers stay lost until the engine is restarted.

Ray is optional: nothing here imports it until ``gfdit serve --ray`` runs, and without it that command ends with
exit status 2 and the reason (``RAY_MISSING``).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from typing import Any

log = logging.getLogger("gfdit.ray")

RAY_MISSING = "--ray needs Ray on every node: pip install 'gfdit[ray]' (or 'ray>=2.40')"
PLACEMENT_WARN_S = (
    10.0  # how often a placement group that is not placed yet is reported while it is waited for
)
AGENT_STOP_S = 30.0  # how long an agent may take to end after the engine's goodbye or a SIGTERM
# per-host settings: not copied from the engine to its agents
HOST_SETTINGS = ("GFDIT_NET_ADDRESS", "GFDIT_NODE_IDS")


def ray_available() -> bool:
    """Whether Ray can be imported here."""
    import importlib.util

    return importlib.util.find_spec("ray") is not None


def plan_nodes(world_size: int | None, workers_per_node: int, alive_nodes: int) -> tuple[int, int] | str:
    """(nodes, world size) of a placement with ``workers_per_node`` workers on each node, or what is wrong.

    With ``world_size`` None every alive Ray node hosts workers; else ``world_size`` must be a multiple of
    ``workers_per_node`` and need no more nodes than the cluster has."""
    if workers_per_node < 1:
        return f"--workers-per-node must be >= 1, not {workers_per_node}"
    if world_size is None:
        if alive_nodes < 1:
            return "the Ray cluster has no alive node"
        return alive_nodes, alive_nodes * workers_per_node
    if world_size < 1 or world_size % workers_per_node:
        return (
            f"--world-size {world_size} is not a positive multiple of --workers-per-node {workers_per_node}: "
            "every node runs that many workers"
        )
    nodes = world_size // workers_per_node
    if nodes > alive_nodes:
        return (
            f"--world-size {world_size} with --workers-per-node {workers_per_node} needs {nodes} Ray nodes; "
            f"the cluster has {alive_nodes} alive"
        )
    return nodes, world_size


def node_bundle(workers_per_node: int, device: str | None, extra: dict[str, float]) -> dict[str, float]:
    """What one node's bundle reserves: a CPU per worker, a GPU per worker where the workers run on CUDA, and
    ``extra`` (which may also override those two)."""
    bundle: dict[str, float] = {"CPU": float(workers_per_node)}
    if device is not None and device.strip().startswith("cuda"):
        bundle["GPU"] = float(workers_per_node)
    bundle.update({str(k): float(v) for k, v in extra.items()})
    return {k: v for k, v in bundle.items() if v > 0}


def parse_resources(text: str | None) -> dict[str, float] | str:
    """``--ray-resources``: a JSON object of resource names and amounts, or what is wrong with it."""
    if text is None:
        return {}
    try:
        got = json.loads(text)
    except ValueError as e:
        return f"--ray-resources is not JSON: {e}"
    if not isinstance(got, dict) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in got.values()
    ):
        return f"--ray-resources must be a JSON object of resource names and amounts >= 0, not {text!r}"
    return {str(k): float(v) for k, v in got.items()}


def agent_env() -> dict[str, str]:
    """The engine's settings its agents get (see the module's docstring)."""
    return {k: v for k, v in os.environ.items() if k.startswith("GFDIT_") and k not in HOST_SETTINGS}


# The agent's process: Linux sends it SIGTERM when the actor's process ends (PR_SET_PDEATHSIG survives exec), so
# that a killed actor's agent still stops its workers and cleans its /dev/shm; the flag is set in the child, not with
# Popen's preexec_fn, which is unsafe in a process with threads such as a Ray worker.
_AGENT_PRELUDE = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(143)\n"
    "from gfdit.tools.cli import main\n"
    "sys.exit(main(sys.argv[2:]))\n"
)


class NodeAgentActor:
    """A Ray actor (made with ``ray.remote`` by the launcher) that runs ``gfdit node-agent`` on its node as a child
    process, connected to the engine at host:port."""

    def __init__(self, host: str, port: int, workers: int, wait_s: float, env: dict[str, str]) -> None:
        argv = [
            sys.executable,
            "-c",
            _AGENT_PRELUDE,
            str(os.getpid()),
            "node-agent",
            "--engine",
            f"{host}:{port}",
            "--workers",
            str(workers),
            "--wait-s",
            str(wait_s),
        ]
        self.proc = subprocess.Popen(argv, env={**os.environ, **env}, stdin=subprocess.DEVNULL)

    def where(self) -> dict[str, Any]:
        """Where this agent runs: Ray node id, host name and the agent's pid."""
        import socket

        import ray

        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "host": socket.gethostname(),
            "pid": self.proc.pid,
        }

    def poll(self) -> int | None:
        """The agent's exit status, or None while it runs."""
        return self.proc.poll()

    def stop(self, timeout_s: float) -> int:
        """Waits up to timeout_s for the agent to end by itself (after the engine's goodbye), then sends it SIGTERM
        (it stops its workers and cleans up) and at last SIGKILL; returns its exit status."""
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            if sig is not None and self.proc.poll() is None:
                self.proc.send_signal(sig)
            try:
                return self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                continue
        return self.proc.wait()


class RayLauncher:
    """The placement group and the node agents of ``gfdit serve --ray``.

    ``open`` connects to Ray and places the group; the engine is then made with ``local_workers`` workers here and
    ``listen`` as its node port, and ``start_agents`` (the engine's ``on_listen``) starts an agent on every other
    node; ``close`` ends them and removes the group."""

    def __init__(self) -> None:
        self.pg: Any = None
        self.actors: list[Any] = []
        self.agents: list[dict[str, Any]] = []
        self.engine_node_id = ""
        self.node_ip = ""
        self.remote_bundles: list[int] = []
        self.bundle: dict[str, float] = {}
        self.workers_per_node = 0
        self.nodes = 0
        self.world_size = 0
        self.wait_s = 0.0

    @classmethod
    def open(
        cls,
        address: str,
        workers_per_node: int,
        world_size: int | None,
        resources: dict[str, float],
        wait_s: float,
    ) -> RayLauncher:
        """Connects to the Ray cluster at ``address`` and places one bundle per node that hosts workers (see the
        module's docstring). Raises RuntimeError with the reason when that cannot be done within wait_s."""
        import ray
        from ray.util.placement_group import placement_group, placement_group_table

        from gfdit import settings

        self = cls()
        self.workers_per_node, self.wait_s = workers_per_node, wait_s
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=True)
        try:
            alive = [n for n in ray.nodes() if n.get("Alive")]
            plan = plan_nodes(world_size, workers_per_node, len(alive))
            if isinstance(plan, str):
                raise RuntimeError(plan)
            self.nodes, self.world_size = plan
            self.engine_node_id = ray.get_runtime_context().get_node_id()
            self.node_ip = ray.util.get_node_ip_address()
            self.bundle = node_bundle(workers_per_node, settings.get("GFDIT_DEVICE"), resources)
            bundles = [dict(self.bundle) for _ in range(self.nodes)]
            # a sliver of the engine node's own resource: one of the bundles must be on it
            bundles[0][f"node:{self.node_ip}"] = 0.001
            self.pg = placement_group(bundles, strategy="STRICT_SPREAD", name=f"gfdit-serve-{os.getpid()}")
            self._wait_placed(ray, bundles)
            where = placement_group_table(self.pg)["bundles_to_node_id"]
            mine = [i for i, node in where.items() if node == self.engine_node_id]
            if not mine:
                raise RuntimeError(
                    f"the placement group left out the engine's Ray node {self.engine_node_id}: start gfdit serve "
                    "on a node that can host --workers-per-node workers"
                )
            self.remote_bundles = sorted(i for i in where if i not in mine)
            log.warning(
                "gfdit serve --ray: %d nodes, %d workers each (bundle %s); the engine's Ray node %s runs workers %s",
                self.nodes,
                workers_per_node,
                self.bundle,
                self.engine_node_id,
                list(range(workers_per_node)),
            )
        except BaseException:
            self.close()
            raise
        return self

    def _wait_placed(self, ray: Any, bundles: list[dict[str, float]]) -> None:
        deadline = time.monotonic() + self.wait_s
        ready = self.pg.ready()
        while True:
            left = deadline - time.monotonic()
            done, _ = ray.wait([ready], timeout=max(0.0, min(PLACEMENT_WARN_S, left)))
            if done:
                return
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"Ray did not place {len(bundles)} bundles of {self.bundle} on as many nodes (STRICT_SPREAD) "
                    f"within {self.wait_s:.0f} s; available now: {ray.available_resources()}"
                )
            log.warning(
                "gfdit serve --ray: waiting for Ray to place %d bundles of %s on as many nodes",
                len(bundles),
                self.bundle,
            )

    @property
    def listen(self) -> str:
        """The engine's node port: the engine node's Ray address, a free port."""
        return f"{self.node_ip}:0"

    def start_agents(self, host: str, port: int) -> None:
        """Starts a node agent on every bundle but the engine's, connected to the engine at host:port."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if host in ("", "0.0.0.0"):
            host = self.node_ip
        env = agent_env()
        custom = {k: v for k, v in self.bundle.items() if k not in ("CPU", "GPU", "memory")}
        actor_class = ray.remote(NodeAgentActor)
        for i in self.remote_bundles:
            self.actors.append(
                actor_class.options(
                    name=f"gfdit-agent-{os.getpid()}-{i}",
                    num_cpus=self.bundle.get("CPU", 0.0),
                    num_gpus=self.bundle.get("GPU", 0.0),
                    resources=custom,
                    max_restarts=0,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        placement_group=self.pg, placement_group_bundle_index=i
                    ),
                ).remote(host, port, self.workers_per_node, self.wait_s, env)
            )
        self.agents = ray.get([a.where.remote() for a in self.actors], timeout=self.wait_s)
        for agent in self.agents:
            log.warning(
                "gfdit serve --ray: Ray node %s (host %s) runs a node agent (pid %d) for the engine at %s:%d",
                agent["node_id"],
                agent["host"],
                agent["pid"],
                host,
                port,
            )

    def close(self) -> None:
        """Ends the agents (see the module's docstring), removes the placement group and leaves the Ray cluster."""
        import ray
        from ray.util.placement_group import remove_placement_group

        try:
            if self.actors:
                stops = [a.stop.remote(AGENT_STOP_S) for a in self.actors]
                try:
                    ray.get(stops, timeout=3 * AGENT_STOP_S + 10)
                except Exception as e:  # an actor already dead: its agent got SIGTERM with it
                    log.warning("gfdit serve --ray: stopping the node agents: %s", str(e).splitlines()[0])
                for a in self.actors:
                    ray.kill(a, no_restart=True)
                self.actors = []
            if self.pg is not None:
                remove_placement_group(self.pg)
                self.pg = None
        finally:
            ray.shutdown()
