"""``gfdit serve``: starts an engine and serves it with uvicorn; ``serving`` embeds a server on a thread (tests,
benchmarks). Nothing here imports FastAPI or uvicorn until it serves, so the ``gfdit`` command's other
subcommands work without the serving dependencies."""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
import time
from typing import Any

from gfdit.serving.server import defaults

ENGINE_WAIT_S = 120.0  # how long the engine waits for its workers (gfdit.Engine's start_timeout_s)
AGENT_WAIT_S = 300.0  # how long a node agent under torchrun keeps trying to reach the engine


@contextlib.contextmanager
def serving(app: Any, host: str = "127.0.0.1", port: int = 0, start_timeout_s: float = 30.0) -> Any:
    """Serves ``app`` with uvicorn on a thread of this process (port 0: a free one); yields its URL.

    For embedding a server beside an engine, tests and benchmarks. The socket is made as TCP explicitly:
    asyncio turns Nagle's algorithm off only on sockets whose protocol is IPPROTO_TCP, and without that a
    reply's body waits for the client's delayed ACK of its headers (40 ms on Linux) on a kept-alive
    connection.
    """
    import socket

    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="gfdit-serve", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        if not server.started:
            raise RuntimeError(
                f"gfdit.serving.server.serving: the server did not start within {start_timeout_s} s"
            )
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def add_arguments(p: argparse.ArgumentParser, command: str) -> None:
    p.add_argument(
        "--model", default="tiny-qwen-image", help="tiny-wan, tiny-qwen-image, wan2.2, wan2.1, qwen-image"
    )
    p.add_argument("--path", default=None, help="local folder with the model's weights (real models)")
    p.add_argument(
        "--world-size",
        type=int,
        default=None,
        help="worker processes (ranks) in all (default 2; under torchrun: --local-workers on each node)",
    )
    p.add_argument(
        "--local-workers",
        type=int,
        default=None,
        help="workers on this host (default: all of them); the others run on hosts whose node agents connect to "
        "--listen (gfdit node-agent --engine HOST:PORT --workers K). Under torchrun: the workers on each node",
    )
    p.add_argument(
        "--listen",
        default=None,
        help="HOST:PORT where node agents of other hosts connect (0.0.0.0:PORT: every interface); under torchrun: "
        "0.0.0.0:0 unless given, published in the rendezvous for the other node ranks",
    )
    p.add_argument(
        "--wait-s",
        type=float,
        default=None,
        help="how long the engine waits for its workers, those of other hosts included (default 120), and, under "
        "torchrun, how long a node agent keeps trying to reach the engine (default 300)",
    )
    p.add_argument("--policy", default="fcfs", help="fcfs, srtf, edf, priority, static:D")
    p.add_argument(
        "--profile",
        default=None,
        help="a profile file of this model on this machine (gfdit profile): the policies' cost model instead of "
        "the cached profile",
    )
    p.add_argument(
        "--cluster",
        default=None,
        help="the analytic cost model of this cluster instead of the cached profile (cpu, h20x8, h200x8, ...; "
        "'none': none, and the policies cannot tell whether more ranks help)",
    )
    p.add_argument(
        "--reprofile",
        action="store_true",
        help="measure the cached profile again (without --profile and --cluster the policies plan with a profile "
        "of this model, world size and machine, measured on first use and kept in ~/.cache/gfdit/profiles)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1/*")
    p.add_argument(
        "--max-queue",
        type=int,
        default=defaults.MAX_QUEUE,
        help="generations (images and video jobs) outstanding before 429",
    )
    p.add_argument(
        "--job-ttl-s", type=float, default=defaults.JOB_TTL_S, help="how long a finished video job is kept"
    )
    p.add_argument(
        "--max-video-mb",
        type=float,
        default=defaults.MAX_VIDEO_BYTES / 2**20,
        help="MP4s of finished video jobs kept in memory at most; past it the oldest jobs are forgotten",
    )
    p.add_argument(
        "--cache",
        default=None,
        help="the step cache of requests that name none: 'fbcache[:THRESHOLD]' or 'teacache[:THRESHOLD]' with "
        "optional ',warmup=N,max_skip=M' (README, 'Step caching'); default: none",
    )
    p.add_argument(
        "--forbid-request-cache",
        action="store_true",
        help="refuse (400) a request body's cache field: every request runs with --cache",
    )
    p.add_argument(
        "--grace-s",
        type=float,
        default=30.0,
        help="on SIGTERM/SIGINT, seconds to let requests in flight finish before they are cancelled",
    )
    ray = p.add_argument_group(
        "Ray", "workers on the nodes of a running Ray cluster (gfdit.serving.ray_launcher; needs gfdit[ray])"
    )
    ray.add_argument(
        "--ray",
        action="store_true",
        help="place a node agent on each other node of a Ray cluster (one placement group, STRICT_SPREAD); this "
        "process stays the engine and runs this node's workers",
    )
    ray.add_argument(
        "--ray-address",
        default="auto",
        help="the Ray cluster to join (ray.init's address; default 'auto': the one this node belongs to)",
    )
    ray.add_argument(
        "--workers-per-node",
        type=int,
        default=1,
        help="with --ray: workers on every node, the engine's included (default 1); the nodes: --world-size / this, "
        "or every alive Ray node without --world-size",
    )
    ray.add_argument(
        "--ray-resources",
        default=None,
        help="with --ray: a JSON object of resources each node's bundle also asks for, e.g. '{\"accel\": 1}' "
        "(default: a CPU per worker, and a GPU per worker where GFDIT_DEVICE says cuda)",
    )


def _torchrun_plan(args: argparse.Namespace) -> tuple[int, int, int] | str:
    """Under torchrun (``torchrun --nnodes N --nproc-per-node 1 --node-rank i --rdzv-endpoint HOST:PORT -m gfdit serve
    ...``): (this node's rank, nodes, workers per node), or what is wrong. Node rank 0 serves; the others are node
    agents (NOTE [node agents] in src/runtime/relay.cpp)."""
    import os

    per_host = int(os.environ["LOCAL_WORLD_SIZE"])
    if per_host != 1:
        return "under torchrun, start one gfdit serve per node (--nproc-per-node 1): it starts the node's workers"
    nodes = int(os.environ["WORLD_SIZE"])
    local = args.local_workers if args.local_workers is not None else 1
    if local < 1:
        return "--local-workers must be >= 1 under torchrun"
    return int(os.environ["GROUP_RANK"]), nodes, local


def _open_ray(args: argparse.Namespace) -> Any:
    """``gfdit serve --ray``: the launcher of the agents, with ``args`` set for the engine's node, or the exit
    status of a refusal."""
    from gfdit.serving import agent, ray_launcher

    if not ray_launcher.ray_available():
        print(f"gfdit serve: {ray_launcher.RAY_MISSING}", file=sys.stderr)
        return 2
    if agent.under_torchrun():
        print(
            "gfdit serve: --ray is not for torchrun: start gfdit serve once, on a node of the Ray cluster",
            file=sys.stderr,
        )
        return 2
    if args.local_workers is not None:
        print(
            "gfdit serve: with --ray every node runs --workers-per-node workers: not --local-workers",
            file=sys.stderr,
        )
        return 2
    resources = ray_launcher.parse_resources(args.ray_resources)
    if isinstance(resources, str):
        print(f"gfdit serve: {resources}", file=sys.stderr)
        return 2
    try:
        launcher = ray_launcher.RayLauncher.open(
            args.ray_address,
            args.workers_per_node,
            args.world_size,
            resources,
            args.wait_s or ENGINE_WAIT_S,
        )
    except Exception as e:  # not connected, not placed: nothing was left in the cluster
        print(f"gfdit serve: --ray: {e}", file=sys.stderr)
        return 2
    args.world_size = launcher.world_size
    args.local_workers = args.workers_per_node
    if launcher.nodes > 1 and args.listen is None:
        args.listen = launcher.listen
    return launcher


def run(args: argparse.Namespace, command: str) -> int:
    if not getattr(args, "ray", False):
        return _serve(args, None)
    launcher = _open_ray(args)
    if isinstance(launcher, int):
        return launcher
    try:
        return _serve(args, launcher)
    finally:
        launcher.close()  # the agents, their actors and the placement group


def _serve(args: argparse.Namespace, launcher: Any) -> int:
    import uvicorn

    from gfdit._C import Error
    from gfdit.planning.cost import cost_model as make_cost_model
    from gfdit.serving import agent
    from gfdit.serving.engine import Engine
    from gfdit.serving.server.app import create_app

    publish = False
    if agent.under_torchrun():
        plan = _torchrun_plan(args)
        if isinstance(plan, str):
            print(f"gfdit serve: {plan}", file=sys.stderr)
            return 2
        node_rank, nodes, per_node = plan
        if node_rank != 0:  # this node runs workers of node rank 0's engine
            try:
                where = agent.engine_from_rendezvous(args.wait_s or AGENT_WAIT_S)
            except Exception as e:
                print(
                    f"gfdit serve: node rank {node_rank} found no engine in the rendezvous: {e}",
                    file=sys.stderr,
                )
                return 2
            return agent.serve_node(where, per_node, wait_s=args.wait_s or AGENT_WAIT_S)
        args.local_workers = per_node
        if args.world_size is None:
            args.world_size = per_node * nodes
        if args.listen is None and nodes > 1:
            args.listen = "0.0.0.0:0"
        publish = nodes > 1
    if args.world_size is None:
        args.world_size = 2
    if args.max_queue < 1:
        print("gfdit serve: --max-queue must be >= 1", file=sys.stderr)
        return 2
    if not (args.job_ttl_s > 0 and args.max_video_mb >= 0):
        print("gfdit serve: --job-ttl-s must be > 0 and --max-video-mb >= 0", file=sys.stderr)
        return 2
    if args.reprofile and (args.profile is not None or args.cluster is not None):
        print(
            "gfdit serve: --reprofile measures the cached profile: not with --profile or --cluster",
            file=sys.stderr,
        )
        return 2
    if args.cache is not None:  # before any worker starts: a typo costs nothing
        from gfdit._C.runtime import CacheSpec

        try:
            CacheSpec.parse(args.cache)
        except Error as e:
            print(f"gfdit serve: --cache: {e.message}", file=sys.stderr)
            return 2
    try:
        cost_model: Any = None  # the cached profile (NOTE [cached profiles] in gfdit.tools.profile_cache)
        if args.profile is not None:
            cost_model = make_cost_model(args.model, profile=args.profile)
        elif args.cluster == "none":
            cost_model = False
        elif args.cluster is not None:
            cost_model = make_cost_model(args.model, args.cluster)
        on_listen = None
        if publish:  # the other node ranks' agents find the engine's node port in the rendezvous

            def on_listen(host: str, port: int) -> None:
                agent.publish_engine(port, host, args.wait_s or AGENT_WAIT_S)

        elif launcher is not None and launcher.nodes > 1:  # --ray: an agent on every other node of the group
            on_listen = launcher.start_agents

        engine = Engine(
            model=args.model,
            model_path=args.path,
            world_size=args.world_size,
            policy=args.policy,
            cost_model=cost_model,
            reprofile=args.reprofile,
            local_workers=args.local_workers,
            listen=args.listen,
            start_timeout_s=args.wait_s or ENGINE_WAIT_S,
            on_listen=on_listen,
        )
    except (Error, RuntimeError, ValueError, OSError) as e:
        print(f"gfdit serve: {e}", file=sys.stderr)
        return 2
    with engine:
        try:
            app = create_app(
                engine,
                model=args.model,
                api_key=args.api_key,
                max_queue=args.max_queue,
                job_ttl_s=args.job_ttl_s,
                max_video_bytes=int(args.max_video_mb * 2**20),
                cache=args.cache,
                request_cache=not args.forbid_request_cache,
            )
        except Error as e:  # --cache that the model refuses (the engine stops on leaving `with`)
            print(f"gfdit serve: --cache: {e.message}", file=sys.stderr)
            return 2
        config = uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_level="info",
            timeout_graceful_shutdown=max(0.0, args.grace_s),
        )
        _draining_server_class()(config).run()
    return 0


def _draining_server_class() -> type:
    """uvicorn's server, except that a SIGTERM or SIGINT is not raised again once serving ends.

    On the signal uvicorn stops accepting and waits for requests in flight up to the grace period; then ``run``
    returns, and the engine's shutdown cancels what is left and stops every worker (re-raising the signal, as
    uvicorn does, would kill the process before that). Built lazily: uvicorn is a serving dependency.
    """
    import signal

    import uvicorn

    class DrainingServer(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Any:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            original = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in original.items():
                    signal.signal(sig, handler)

    return DrainingServer
