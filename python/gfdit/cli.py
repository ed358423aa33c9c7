"""The ``gfdit`` command."""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gfdit", description="gfdit: DiT serving on group-free collectives")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="print what this build supports (CUDA, NVSHMEM, backends) as JSON")
    args = parser.parse_args(argv)
    if args.command == "info":
        import gfdit

        print(json.dumps(gfdit.build_info(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
