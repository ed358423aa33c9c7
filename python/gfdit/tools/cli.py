"""The ``gfdit`` command: one subcommand per module, each with ``add_arguments(parser)`` and ``run(args)``."""

from __future__ import annotations

import argparse
import importlib
import json
import sys

# subcommand -> (module, help). A module provides add_arguments(parser, command) and run(args, command) -> int.
COMMANDS = {
    "cost": ("gfdit.planning.cost", "predicted stage times of one request (analytic cost model)"),
    "profile": (
        "gfdit.tools.profile",
        "measure every stage on this machine and write a profile for the cost model",
    ),
    "trace": (
        "gfdit.planning.workload",
        "generate a synthetic request trace (image, video or mixed; Poisson or bursty arrivals; deadlines)",
    ),
    "simulate": (
        "gfdit.planning.simulate",
        "replay a trace on the simulated cluster (the control plane on a virtual clock)",
    ),
    "run-trace": ("gfdit.tools.replay", "replay a trace on the real engine in real time"),
    "serve": (
        "gfdit.serving.server.main",
        "serve a model over HTTP (OpenAI-compatible /v1/images/generations)",
    ),
    "node-agent": (
        "gfdit.serving.agent",
        "run some of an engine's workers on this host (the engine: gfdit serve --listen HOST:PORT)",
    ),
    "bench": (
        "gfdit.tools.loadgen",
        "load a running server: replay a trace or Poisson arrivals (or a closed loop); latency, SLO, errors",
    ),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gfdit", description="gfdit: DiT serving on group-free collectives")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser(
        "info",
        help="print what this build supports (CUDA, NVSHMEM, backends) and every GFDIT_* setting (its default, "
        "meaning and value here) as JSON",
    )
    for command, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(command, help=help_text, description=help_text)
        importlib.import_module(module).add_arguments(p, command)
    args = parser.parse_args(argv)
    if args.command == "info":
        from gfdit import settings
        from gfdit._C import build_info

        print(json.dumps({**dict(build_info()), "settings": settings.entries()}, indent=2, default=str))
        return 0
    tool = importlib.import_module(COMMANDS[args.command][0])
    return int(tool.run(args, args.command) or 0)


if __name__ == "__main__":
    sys.exit(main())
