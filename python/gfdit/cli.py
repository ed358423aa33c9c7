"""The ``gfdit`` command: one subcommand per module, each with ``add_arguments(parser)`` and ``run(args)``."""

from __future__ import annotations

import argparse
import importlib
import json
import sys

# subcommand -> (module, help). A module provides add_arguments(parser, command) and run(args, command) -> int.
COMMANDS = {
    "cost": ("gfdit.cost", "predicted stage times of one request (analytic cost model)"),
    "profile": (
        "gfdit.profile",
        "measure every stage on this machine and write a profile for the cost model",
    ),
    "trace": (
        "gfdit.workload",
        "generate a synthetic request trace (image, video or mixed; Poisson or bursty arrivals; deadlines)",
    ),
    "simulate": (
        "gfdit.simulate",
        "replay a trace on the simulated cluster (the control plane on a virtual clock)",
    ),
    "run-trace": ("gfdit.simulate", "replay a trace on the real engine in real time"),
    "serve": ("gfdit.server", "serve a model over HTTP (OpenAI-compatible /v1/images/generations)"),
    "bench": (
        "gfdit.loadgen",
        "load a running server: replay a trace or Poisson arrivals (or a closed loop); latency, SLO, errors",
    ),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gfdit", description="gfdit: DiT serving on group-free collectives")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="print what this build supports (CUDA, NVSHMEM, backends) as JSON")
    for command, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(command, help=help_text, description=help_text)
        importlib.import_module(module).add_arguments(p, command)
    args = parser.parse_args(argv)
    if args.command == "info":
        import gfdit

        print(json.dumps(gfdit.build_info(), indent=2))
        return 0
    module = importlib.import_module(COMMANDS[args.command][0])
    return int(module.run(args, args.command) or 0)


if __name__ == "__main__":
    sys.exit(main())
