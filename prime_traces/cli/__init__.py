"""The ``prime-traces`` command line: ``serve`` runs the local Traces service; the
other commands (``upload``, ``list``, ``get``, ...) talk to a Traces service.

The rules every command follows (:mod:`prime_traces.cli_output` has them):
results on stdout, with ``--json`` as one JSON document; errors on stderr as
one line, ``prime-traces: <message>``, plus a JSON error document on stdout
under ``--json``. Exit status: 0 on success; 1 on failure (2 when ``serve``
cannot start); 2 for a bad command line, refused before any request; 130 on
Ctrl-C; 141 when stdout's reader went away (``| head``), which ends quietly.
``--log-level`` (default WARNING) comes before the command; ``serve
--log-level`` is accepted too. Logging is configured once, here.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

from prime_traces.cli_output import (
    EXIT_USAGE,
    Parser,
    configure_logging,
    log_level,
    parse_command_line,
    run_until_closed_pipe,
)
from prime_traces.server._body import (
    DEFAULT_MAX_BODY_MEMORY_BYTES,
    DEFAULT_READ_TIMEOUT_S,
)
from prime_traces.server._faults import DEFAULT_SATURATED_RETRY_AFTER_S, FAIL_STATUSES
from prime_traces.version import __version__

SERVE_API_KEY_ENV = "PRIME_TRACES_SERVE_API_KEY"
DEFAULT_DB_PATH = "prime-traces.db"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _add_serve(sub: Any) -> None:
    p = sub.add_parser(
        "serve",
        help="run the local Traces service",
        description=(
            "Run the local Traces service (SQLite) and its web viewer. Prints "
            "'listening on http://HOST:PORT' when ready, then the viewer's URL; stops on SIGTERM or SIGINT."
        ),
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="port; 0 picks a free one (default: 0)")
    p.add_argument("--db", default=DEFAULT_DB_PATH, help=f"SQLite file (default: ./{DEFAULT_DB_PATH})")
    p.add_argument(
        "--api-key",
        default=None,
        help=f"require 'Authorization: Bearer KEY' (or set {SERVE_API_KEY_ENV}); "
        "without it any bearer token is accepted, each counted as its own producer, and only "
        "requests whose Host names this machine (localhost, 127.0.0.1, [::1], --host) are answered",
    )
    p.add_argument("--no-ui", action="store_true", help="do not serve the web viewer at /")
    p.add_argument(
        "--max-uploads-in-flight",
        type=int,
        default=8,
        help="per-credential limit; past it uploads get 503 (default: 8)",
    )
    p.add_argument(
        "--store",
        choices=("sqlite", "none"),
        default="sqlite",
        help="'none' runs every check but keeps no documents (default: sqlite)",
    )
    p.add_argument(
        "--validate",
        choices=("full", "light"),
        default="full",
        help="'light': digest, decoding and line counts only; needs --store none",
    )
    p.add_argument("--max-body-bytes", type=int, default=None, help="largest request body accepted")
    p.add_argument(
        "--saturated-retry-after-s",
        type=float,
        default=DEFAULT_SATURATED_RETRY_AFTER_S,
        help="Retry-After sent with a 503 refusal (default: %(default)s)",
    )
    p.add_argument(
        "--read-timeout-s",
        type=float,
        default=DEFAULT_READ_TIMEOUT_S,
        help="longest wait for each read from a client; past it the connection is closed (default: %(default)s)",
    )
    p.add_argument(
        "--max-body-memory-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_MEMORY_BYTES,
        help="memory held by request bodies and their decompression, all requests "
        "together; past it uploads get 503; on glibc, free memory at the heap's top is given "
        "back only past this much, at most 2 GiB (default: %(default)s)",
    )
    f = p.add_argument_group("fault injection")
    f.add_argument("--latency-ms", type=float, default=0.0, help="added to every request")
    f.add_argument("--bandwidth-mb-s", type=float, default=None, help="cap on reading each body")
    f.add_argument("--link-mb-s", type=float, default=None, help="cap on reading all bodies together (one uplink)")
    f.add_argument("--fail-fraction", type=float, default=0.0, help="fraction of uploads refused")
    f.add_argument("--fail-count", type=int, default=0, help="refuse the next N uploads")
    f.add_argument(
        "--fail-status",
        type=int,
        choices=FAIL_STATUSES,
        default=503,
        help="429 and 503 are refusals (with a code); 500, 502 and 504 carry none",
    )
    f.add_argument("--fail-retry-after-s", type=float, default=1.0)
    f.add_argument("--reject-marker", default=None, help="400 invalid_trace for lines containing it")
    f.add_argument("--reject-omit-line", action="store_true", help="leave line and id out of 400s")
    f.add_argument("--reject-first-only", action="store_true", help="name the first rejected line, not all")
    f.add_argument("--hang-uploads", action="store_true", help="never answer uploads")
    f.add_argument(
        "--drop-after-body", type=int, default=0, help="close the next N upload connections after reading the body"
    )
    f.add_argument(
        "--drop-before-commit",
        action="store_true",
        help="with --drop-after-body: drop before committing (default: after)",
    )
    # Kept from before --log-level moved up to prime-traces itself: it wins when given.
    p.add_argument(
        "--log-level", dest="serve_log_level", type=log_level, default=None, help="the same as prime-traces --log-level"
    )
    p.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    from prime_traces.server import LocalTracesService
    from prime_traces.server._allocator import keep_freed_memory

    api_key = args.api_key or os.environ.get(SERVE_API_KEY_ENV) or None
    options: dict[str, Any] = {
        "host": args.host,
        "port": args.port,
        "api_key": api_key,
        "max_uploads_in_flight": args.max_uploads_in_flight,
        "store": args.store,
        "validate": args.validate,
        "saturated_retry_after_s": args.saturated_retry_after_s,
        "read_timeout_s": args.read_timeout_s,
        "max_body_memory_bytes": args.max_body_memory_bytes,
        "ui": not args.no_ui,
        "latency_ms": args.latency_ms,
        "bandwidth_mb_s": args.bandwidth_mb_s,
        "link_mb_s": args.link_mb_s,
        "fail_fraction": args.fail_fraction,
        "fail_count": args.fail_count,
        "fail_status": args.fail_status,
        "fail_retry_after_s": args.fail_retry_after_s,
        "reject_marker": args.reject_marker,
        "reject_omit_line": args.reject_omit_line,
        "reject_first_only": args.reject_first_only,
        "hang_uploads": args.hang_uploads,
        "drop_after_body": args.drop_after_body,
        "drop_after_commit": not args.drop_before_commit,
    }
    if args.max_body_bytes is not None:
        options["max_body_bytes"] = args.max_body_bytes
    # Block the stop signals before any service thread exists (threads inherit
    # the mask), then take them synchronously on the main thread: a Python
    # handler waking an Event can be lost while the main thread blocks.
    stop_signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    try:
        service = LocalTracesService(args.db, **options)
        # This process is the service's own: its requests reuse what earlier ones freed (before any thread starts).
        keep_freed_memory(args.max_body_memory_bytes)
        service.start()
    except (ValueError, OSError) as err:
        print(f"prime-traces serve: {err}", file=sys.stderr)
        return 2
    try:
        print(f"listening on {service.url}", flush=True)
        if service.viewer_url is not None:
            print(f"viewer: {service.viewer_url}", flush=True)
        signal.sigwait(stop_signals)
    finally:
        service.stop()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stop_signals)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="prime-traces", description="Prime Traces client and local service.")
    parser.add_argument("--version", action="version", version=f"prime-traces {__version__}")
    parser.add_argument(
        "--log-level", type=log_level, default="WARNING", help="logging level, on stderr (default: WARNING)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_serve(sub)
    from prime_traces.cli.client_commands import add_client_commands

    add_client_commands(sub)
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
    configure_logging(getattr(args, "serve_log_level", None) or args.log_level, LOG_FORMAT)
    return int(args.func(args))
