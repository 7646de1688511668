"""The client commands of ``prime-traces``: upload, list, get, download, delete, delete-run.

:func:`add_client_commands` registers them on the CLI's subparsers; each sets
``func(args) -> int`` (exit status) as ``serve`` does, ``list`` also a
``check(args)`` for what spans options. ``prime_traces.cli`` wires them into
``prime-traces`` beside ``serve``; :mod:`prime_traces.cli_output` writes
what they print and states the rules (stdout, stderr, ``--json``, exit status).
Here:

- Every command takes ``--json``: the page, summary or receipts; ``{"trace_id",
  "path", "size_bytes"}`` for ``download``; ``{"deleted": "trace" | "run", ...}``.
- A failure exits 1 (130 when interrupted), never a traceback or the API key.
- Checked locally, before any request, exit 2: ``--limit`` 1..100, ``--created-*``
  ISO 8601, finite rewards with ``--reward-min`` <= ``--reward-max``, ``--sort``
  without blanks, ``--max-in-flight`` 1..8.
- ``delete-run`` asks first when stdin is a terminal, unless ``--yes``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import orjson

from prime_traces._api.reads import ReadAPI
from prime_traces._upload.batching import iter_file_lines
from prime_traces.cli_output import (
    cell,
    fail,
    finite_float,
    int_in,
    iso8601,
    no_blanks,
    print_json,
    summary_lines,
    table,
    when,
)
from prime_traces.client import MAX_IN_FLIGHT_LIMIT, TracesClient
from prime_traces.config import (
    ENV_API_KEY,
    ENV_TEAM_ID,
    ENV_TRACES_URL,
    resolve_config,
)
from prime_traces.errors import PrimeTracesError, UploadError

PROG = "prime-traces"
MAX_PAGE_LIMIT = 100  # contract §3: default 20, max 100
Command = Callable[[ReadAPI, argparse.Namespace], None]


class _Aborted(PrimeTracesError):
    """The user did not confirm."""


def _check_list(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.reward_min is not None and args.reward_max is not None and args.reward_min > args.reward_max:
        parser.error(f"--reward-min {args.reward_min} is above --reward-max {args.reward_max}")


# (option, dest, argparse keywords): the list filters of contract §3.
_LIST_FILTERS: list[tuple[str, str, dict[str, Any]]] = [
    ("--run-id", "run_id", {}),
    ("--environment-id", "environment_id", {}),
    ("--model-id", "model_id", {}),
    ("--model-provider", "model_provider", {}),
    ("--task-id", "task_id", {}),
    ("--outcome", "outcome", {}),
    ("--upload-id", "upload_id", {"action": "append", "help": "repeatable: any of them"}),
    ("--reward-min", "reward_min", {"type": finite_float}),
    ("--reward-max", "reward_max", {"type": finite_float}),
    ("--has-error", "has_error", {"action": argparse.BooleanOptionalAction}),
    ("--is-truncated", "is_truncated", {"action": argparse.BooleanOptionalAction}),
    ("--created-after", "created_after", {"type": iso8601, "metavar": "ISO8601"}),
    ("--created-before", "created_before", {"type": iso8601, "metavar": "ISO8601"}),
    ("--sort", "sort", {"type": no_blanks}),
    ("--limit", "limit", {"type": int_in(1, MAX_PAGE_LIMIT), "help": "page size, 1..100 (default: 20)"}),
    ("--cursor", "cursor", {"help": "next_cursor of the previous page"}),
]


def _context_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _common_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("connection")
    group.add_argument(
        "--api-key", default=None, help=f"API key (default: ${ENV_API_KEY}, then api_key in ~/.prime/config.json)"
    )
    group.add_argument(
        "--base-url",
        default=None,
        help=f"Traces service URL (default: ${ENV_TRACES_URL}, then traces_url in "
        "~/.prime/config.json, then https://api.primeintellect.ai)",
    )
    group.add_argument(
        "--team-id",
        default=None,
        help=f"team to act for (default: ${ENV_TEAM_ID}, then team_id in ~/.prime/config.json)",
    )
    return common


def add_client_commands(subparsers: Any) -> None:
    """Add ``upload``, ``list``, ``get``, ``download``, ``delete`` and ``delete-run``."""
    common = [_common_options()]
    p = subparsers.add_parser(
        "upload",
        parents=common,
        help="upload a JSONL file",
        description="Upload a JSONL file of traces (or, with --episode, of "
        "episode envelopes). Re-running it replays: nothing is "
        "stored twice.",
    )
    p.add_argument("path", metavar="FILE")
    p.add_argument("--episode", action="store_true", help="each line is an episode envelope")
    p.add_argument(
        "--context",
        dest="context",
        action="append",
        type=_context_pair,
        default=None,
        metavar="KEY=VALUE",
        help="repeatable: stored with every trace",
    )
    p.add_argument(
        "--max-in-flight",
        type=int_in(1, MAX_IN_FLIGHT_LIMIT),
        default=None,
        help="requests in flight (1..8, default 8)",
    )
    p.add_argument("--json", action="store_true", help="print the receipts as one JSON document")
    p.set_defaults(func=_command(_upload))
    p = subparsers.add_parser(
        "list", parents=common, help="list traces, newest first", description="List one page of traces, newest first."
    )
    for option, dest, kwargs in _LIST_FILTERS:
        p.add_argument(option, dest=dest, default=None, **kwargs)
    p.add_argument(
        "--context",
        dest="context",
        action="append",
        type=_context_pair,
        default=None,
        metavar="KEY=VALUE",
        help="repeatable: all must match",
    )
    p.add_argument("--json", action="store_true", help="print the page as one JSON document")
    p.set_defaults(func=_command(_list), check=partial(_check_list, p))

    p = subparsers.add_parser(
        "get",
        parents=common,
        help="show one trace",
        description="Show a trace's summary, or with --raw its stored document.",
    )
    p.add_argument("trace_id", metavar="ID")
    p.add_argument("--raw", action="store_true", help="write the stored document, byte for byte")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON document")
    p.set_defaults(func=_command(_get))

    p = subparsers.add_parser(
        "download",
        parents=common,
        help="save a trace's stored document",
        description="Save a trace's stored document to DEST; DEST is written only once the whole document has arrived.",
    )
    p.add_argument("trace_id", metavar="ID")
    p.add_argument("dest", metavar="DEST")
    p.add_argument("--json", action="store_true", help="print {path, size_bytes} as one JSON document")
    p.set_defaults(func=_command(_download))

    p = subparsers.add_parser(
        "delete", parents=common, help="delete a trace", description="Delete every stored copy of a trace."
    )
    p.add_argument("trace_id", metavar="ID")
    p.add_argument(
        "--created-at",
        type=iso8601,
        default=None,
        metavar="ISO8601",
        help="delete only the copies created at this time",
    )
    p.add_argument("--json", action="store_true", help="print what was deleted as one JSON document")
    p.set_defaults(func=_command(_delete))

    p = subparsers.add_parser(
        "delete-run",
        parents=common,
        help="delete every trace of a run",
        description="Delete every trace of a run (its episode rows stay). On a "
        "terminal it asks first; --yes does not ask.",
    )
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    p.add_argument("--json", action="store_true", help="print what was deleted as one JSON document")
    p.set_defaults(func=_command(_delete_run))


def _command(body: Command) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        api_key = args.api_key
        client: TracesClient | None = None
        try:
            config = resolve_config(api_key=args.api_key, base_url=args.base_url, team_id=args.team_id)
            api_key = config.api_key
            options = {"max_in_flight": args.max_in_flight} if getattr(args, "max_in_flight", None) else {}
            client = TracesClient(config.api_key, config.base_url, config.team_id, **options)
            body(client, args)
            return 0
        except BrokenPipeError:
            raise  # stdout's reader went away (the transport turns its own into TransportError)
        except KeyboardInterrupt:
            fail(PROG, "interrupted", api_key=api_key, as_json=args.json)
            return 130
        except (PrimeTracesError, OSError, ValueError) as err:
            fail(PROG, str(err), api_key=api_key, err=err, as_json=args.json)
            return 1
        except Exception as err:  # noqa: BLE001  (the CLI's promise: one line, no traceback)
            fail(PROG, f"unexpected error: {type(err).__name__}: {err}", api_key=api_key, err=err, as_json=args.json)
            return 1
        finally:
            if client is not None:
                client.close()  # its upload threads too, not only its sessions

    return run


def _upload(api: ReadAPI, args: argparse.Namespace) -> None:
    assert isinstance(api, TracesClient)
    context = dict(args.context) if args.context else None
    line_format = "episode" if args.episode else "trace"
    try:
        receipts = api.upload_lines(_whole_lines(args.path), line_format=line_format, context=context)
    except UploadError as err:
        raise PrimeTracesError(f"{err} (re-running the upload resends only what is missing)") from err
    if args.json:
        print_json([r.to_dict() for r in receipts])
        return
    for receipt in receipts:
        print(f"{receipt.upload_id}  {receipt.status}")
    print(f"{len(receipts)} batch(es) committed from {args.path}")


def _whole_lines(path: str) -> Iterator[bytes]:
    """The lines of a JSONL file, but a torn last line (no newline, not JSON) is set aside with a warning.

    A writer that died mid-line leaves one; the rest of the file is whole and
    is uploaded. The torn bytes are kept in ``PATH.torn`` for inspection.
    """
    previous: bytes | None = None
    for line in iter_file_lines(path):
        if previous is not None:
            yield previous
        previous = line
    if previous is None:
        return
    if not previous.endswith(b"\n") and previous.strip():
        try:
            orjson.loads(previous)
        except orjson.JSONDecodeError:
            aside = f"{path}.torn"
            with open(aside, "wb") as handle:
                handle.write(previous)
            print(
                f"{PROG}: {path}: the last line is torn ({len(previous)} bytes, no newline, not JSON); "
                f"set aside in {aside}, uploading the rest",
                file=sys.stderr,
            )
            return
    yield previous


def _list(api: ReadAPI, args: argparse.Namespace) -> None:
    filters = {dest: getattr(args, dest) for _, dest, _ in _LIST_FILTERS}
    filters["context"] = dict(args.context) if args.context else None
    page = api.list(**filters)
    if args.json:
        print_json(page.to_dict())
        return
    if not page.items:
        print("no traces")
    else:
        header = ("TRACE ID", "CREATED (UTC)", "RUN", "MODEL", "REWARD", "OUTCOME", "ERROR", "TOKENS")
        rows = [header] + [
            (
                t.trace_id,
                when(t.created_at),
                cell(t.run_id),
                cell(t.model.id),
                cell(t.score.reward),
                cell(t.score.outcome),
                cell(t.execution.has_error),
                str(t.total_tokens),
            )
            for t in page.items
        ]
        print(table(rows))
    if page.next_cursor:
        print(f"more: --cursor {page.next_cursor}")


def _get(api: ReadAPI, args: argparse.Namespace) -> None:
    if args.raw:
        document = api.get_raw(args.trace_id)
        sys.stdout.flush()
        # A pipe write cut short (its reader went, a signal came) returns a short
        # count, not an error: write the rest, so a closed pipe raises instead.
        rest = memoryview(document)
        while rest:
            rest = rest[sys.stdout.buffer.write(rest) :]
        sys.stdout.buffer.flush()
        return
    summary = api.get(args.trace_id)
    if args.json:
        print_json(summary.to_dict())
        return
    print(table(summary_lines(summary)))


def _download(api: ReadAPI, args: argparse.Namespace) -> None:
    path = api.download_raw(args.trace_id, args.dest)
    size = path.stat().st_size
    if args.json:
        print_json({"trace_id": args.trace_id, "path": str(path), "size_bytes": size})
        return
    print(f"saved {path} ({size} bytes)")


def _delete(api: ReadAPI, args: argparse.Namespace) -> None:
    api.delete(args.trace_id, created_at=args.created_at)
    if args.json:
        print_json({"deleted": "trace", "trace_id": args.trace_id, "created_at": args.created_at})
        return
    print(f"deleted trace {args.trace_id}")


def _delete_run(api: ReadAPI, args: argparse.Namespace) -> None:
    assert isinstance(api, TracesClient)
    # A person at a terminal gets a last look; a script (stdin not a terminal) does not.
    if not args.yes and sys.stdin is not None and sys.stdin.isatty():
        _confirm(f"delete every trace of run {args.run_id} on {api.config.base_url}? [y/N] ")
    api.delete_run(args.run_id)  # the service answers 202 with no body: nothing more to report
    if args.json:
        print_json({"deleted": "run", "run_id": args.run_id})
        return
    print(f"deleted the traces of run {args.run_id}")


def _confirm(question: str) -> None:
    """Ask on stderr (stdout may be a pipe); anything but y or yes, end of input included, aborts."""
    sys.stderr.write(question)
    sys.stderr.flush()
    if sys.stdin.readline().strip().lower() not in ("y", "yes"):
        raise _Aborted("aborted")
