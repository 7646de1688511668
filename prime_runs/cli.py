"""The ``prime-runs`` command line."""

from __future__ import annotations

import argparse
import sys

from prime_traces._version import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prime-runs",
        description=(
            "Manage Prime runs. Commands (demo, sync) arrive with the run SDK; "
            "for now use `prime-traces serve` to run the local Traces service."
        ),
    )
    parser.add_argument("--version", action="version", version=f"prime-runs {__version__}")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    parser.parse_args(argv)
    parser.print_help(sys.stdout)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
