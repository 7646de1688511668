"""The ``prime-runs`` command line: ``demo``, ``sync`` and ``ls``."""

from __future__ import annotations

import argparse
import logging
import sys

from prime_runs._demo import add_demo_command
from prime_runs._sync_cli import add_sync_commands
from prime_traces._version import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="prime-runs", description="Prime runs: log RL episodes.")
    parser.add_argument("--version", action="version", version=f"prime-runs {__version__}")
    parser.add_argument("--log-level", default="WARNING", help="logging level (default: WARNING)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_demo_command(sub)
    add_sync_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    return int(args.func(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
