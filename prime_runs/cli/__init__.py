"""The ``prime-runs`` command line: ``demo``, ``sync``, ``ls`` and ``show``.

The rules every command follows (:mod:`prime_traces.cli_output` has them, for
``prime-traces`` too): results on stdout, with ``ls --json`` as one JSON
document; errors on stderr as one line, ``prime-runs: <message>``, plus a JSON
error document on stdout under ``--json``; a bad command line exits 2; a
reader of stdout that went away (``prime-runs ls | head -1``) ends the command
quietly with status 141. ``--log-level`` (default WARNING) comes before the
command; logging is configured once, here.
"""

from __future__ import annotations

import argparse
import sys

from prime_runs.cli.demo import add_demo_command
from prime_runs.cli.ls import add_ls_command
from prime_runs.cli.show import add_show_command
from prime_runs.cli.sync import add_sync_command
from prime_traces.cli_output import (
    EXIT_USAGE,
    Parser,
    configure_logging,
    log_level,
    parse_command_line,
    run_until_closed_pipe,
)
from prime_traces.version import __version__

LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="prime-runs", description="Prime runs: log RL episodes.")
    parser.add_argument("--version", action="version", version=f"prime-runs {__version__}")
    parser.add_argument("--log-level", type=log_level, default="WARNING", help="logging level (default: WARNING)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_demo_command(sub)
    add_sync_command(sub)
    add_ls_command(sub)
    add_show_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; return its exit status (a bad command line raises SystemExit(2), as argparse does)."""
    return run_until_closed_pipe(lambda: _run(sys.argv[1:] if argv is None else list(argv)))


def _run(argv: list[str]) -> int:
    parser = build_parser()
    args = parse_command_line(parser, argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    configure_logging(args.log_level, LOG_FORMAT)
    return int(args.func(args))
