"""The client commands of ``prime-traces``: upload, list, get, download, delete, delete-run.

:func:`add_client_commands` registers them on the CLI's subparsers; each sets
``func(args) -> int`` (exit status) as ``serve`` does. Output is a table or
key/value lines for people, or with ``--json`` one JSON document on stdout for
scripts. A failure is one line on stderr, ``prime-traces: <message>``, and
exit status 1: never a traceback, never the API key. ``prime_traces.cli``
wires them into ``prime-traces`` beside ``serve``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timezone
from typing import Any

import orjson

from prime_traces._batching import iter_file_lines
from prime_traces._config import (
    ENV_API_KEY,
    ENV_TEAM_ID,
    ENV_TRACES_URL,
    resolve_config,
)
from prime_traces._models import TraceSummary
from prime_traces._read_api import ReadAPI
from prime_traces.client import TracesClient
from prime_traces.errors import PrimeTracesError, UploadError

PROG = "prime-traces"
Command = Callable[[ReadAPI, argparse.Namespace], None]

# (option, dest, argparse keywords): the list filters of contract §3.
_LIST_FILTERS: list[tuple[str, str, dict[str, Any]]] = [
    ("--run-id", "run_id", {}),
    ("--environment-id", "environment_id", {}),
    ("--model-id", "model_id", {}),
    ("--model-provider", "model_provider", {}),
    ("--task-id", "task_id", {}),
    ("--outcome", "outcome", {}),
    ("--upload-id", "upload_id", {"action": "append", "help": "repeatable: any of them"}),
    ("--reward-min", "reward_min", {"type": float}),
    ("--reward-max", "reward_max", {"type": float}),
    ("--has-error", "has_error", {"action": argparse.BooleanOptionalAction}),
    ("--is-truncated", "is_truncated", {"action": argparse.BooleanOptionalAction}),
    ("--created-after", "created_after", {"metavar": "ISO8601"}),
    ("--created-before", "created_before", {"metavar": "ISO8601"}),
    ("--sort", "sort", {}),
    ("--limit", "limit", {"type": int, "help": "page size, 1..100 (default: 20)"}),
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
    group.add_argument("--api-key", default=None,
                       help=f"API key (default: ${ENV_API_KEY}, then api_key in ~/.prime/config.json)")
    group.add_argument("--base-url", default=None,
                       help=f"Traces service URL (default: ${ENV_TRACES_URL}, then traces_url in "
                            "~/.prime/config.json, then https://api.primeintellect.ai)")
    group.add_argument("--team-id", default=None,
                       help=f"team to act for (default: ${ENV_TEAM_ID}, then team_id in ~/.prime/config.json)")
    return common  # fmt: skip


def add_client_commands(subparsers: Any) -> None:
    """Add ``upload``, ``list``, ``get``, ``download``, ``delete`` and ``delete-run``."""
    common = [_common_options()]
    p = subparsers.add_parser("upload", parents=common, help="upload a JSONL file",
                              description="Upload a JSONL file of traces (or, with --episode, of "
                                          "episode envelopes). Re-running it replays: nothing is "
                                          "stored twice.")  # fmt: skip
    p.add_argument("path", metavar="FILE")
    p.add_argument("--episode", action="store_true", help="each line is an episode envelope")
    p.add_argument("--context", dest="context", action="append", type=_context_pair, default=None,
                   metavar="KEY=VALUE", help="repeatable: stored with every trace")  # fmt: skip
    p.add_argument("--max-in-flight", type=int, default=None, help="requests in flight (1..8, default 8)")
    p.add_argument("--json", action="store_true", help="print the receipts as one JSON document")
    p.set_defaults(func=_command(_upload))
    p = subparsers.add_parser("list", parents=common, help="list traces, newest first",
                              description="List one page of traces, newest first.")  # fmt: skip
    for option, dest, kwargs in _LIST_FILTERS:
        p.add_argument(option, dest=dest, default=None, **kwargs)
    p.add_argument("--context", dest="context", action="append", type=_context_pair, default=None,
                   metavar="KEY=VALUE", help="repeatable: all must match")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the page as one JSON document")
    p.set_defaults(func=_command(_list))

    p = subparsers.add_parser("get", parents=common, help="show one trace",
                              description="Show a trace's summary, or with --raw its stored document.")  # fmt: skip
    p.add_argument("trace_id", metavar="ID")
    p.add_argument("--raw", action="store_true", help="write the stored document, byte for byte")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON document")
    p.set_defaults(func=_command(_get))

    p = subparsers.add_parser("download", parents=common, help="save a trace's stored document",
                              description="Save a trace's stored document to DEST; DEST is written "
                                          "only once the whole document has arrived.")  # fmt: skip
    p.add_argument("trace_id", metavar="ID")
    p.add_argument("dest", metavar="DEST")
    p.set_defaults(func=_command(_download))

    p = subparsers.add_parser("delete", parents=common, help="delete a trace",
                              description="Delete every stored copy of a trace.")  # fmt: skip
    p.add_argument("trace_id", metavar="ID")
    p.add_argument("--created-at", default=None, metavar="ISO8601",
                   help="delete only the copies created at this time")  # fmt: skip
    p.set_defaults(func=_command(_delete))

    p = subparsers.add_parser("delete-run", parents=common, help="delete every trace of a run",
                              description="Delete every trace of a run (its episode rows stay).")  # fmt: skip
    p.add_argument("run_id", metavar="RUN_ID")
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
        except KeyboardInterrupt:
            _fail("interrupted", api_key)
            return 130
        except (PrimeTracesError, OSError, ValueError) as err:
            _fail(str(err), api_key)
            return 1
        except Exception as err:  # noqa: BLE001  (the CLI's promise: one line, no traceback)
            _fail(f"unexpected error: {type(err).__name__}: {err}", api_key)
            return 1
        finally:
            if client is not None:
                client.close()  # its upload threads too, not only its sessions

    return run


def _fail(message: str, api_key: str | None) -> None:
    if api_key:
        message = message.replace(api_key, "***")
    line = " ".join(message.split()) or "failed"
    print(f"{PROG}: {line}", file=sys.stderr)


def _print_json(document: Any) -> None:
    print(orjson.dumps(document, option=orjson.OPT_INDENT_2).decode())


def _when(moment: datetime | None) -> str:
    if moment is None:
        return "-"
    if moment.tzinfo is not None:
        moment = moment.astimezone(timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M:%S")


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def _upload(api: ReadAPI, args: argparse.Namespace) -> None:
    assert isinstance(api, TracesClient)
    context = dict(args.context) if args.context else None
    line_format = "episode" if args.episode else "trace"
    try:
        receipts = api.upload_lines(_whole_lines(args.path), line_format=line_format, context=context)
    except UploadError as err:
        raise PrimeTracesError(f"{err} (re-running the upload resends only what is missing)") from err
    if args.json:
        _print_json([r.to_dict() for r in receipts])
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
            print(f"{PROG}: {path}: the last line is torn ({len(previous)} bytes, no newline, not JSON); "
                  f"set aside in {aside}, uploading the rest", file=sys.stderr)  # fmt: skip
            return
    yield previous


def _list(api: ReadAPI, args: argparse.Namespace) -> None:
    filters = {dest: getattr(args, dest) for _, dest, _ in _LIST_FILTERS}
    filters["context"] = dict(args.context) if args.context else None
    page = api.list(**filters)
    if args.json:
        _print_json(page.to_dict())
        return
    if not page.items:
        print("no traces")
    else:
        header = ("TRACE ID", "CREATED (UTC)", "RUN", "MODEL", "REWARD", "OUTCOME", "ERROR", "TOKENS")
        rows = [header] + [
            (t.trace_id, _when(t.created_at), _text(t.run_id), _text(t.model.id),
             _text(t.score.reward), _text(t.score.outcome), _text(t.execution.has_error),
             str(t.total_tokens))
            for t in page.items
        ]  # fmt: skip
        print(_table(rows))
    if page.next_cursor:
        print(f"more: --cursor {page.next_cursor}")


def _summary_lines(t: TraceSummary) -> list[tuple[str, str]]:
    return [
        ("trace_id", t.trace_id), ("upload_id", t.upload_id), ("episode_id", _text(t.episode_id)),
        ("created_at", _when(t.created_at)), ("ingested_at", _when(t.ingested_at)),
        ("run_id", _text(t.run_id)), ("environment_id", _text(t.environment_id)),
        ("model", f"{_text(t.model.provider)} / {_text(t.model.id)}"),
        ("task_id", _text(t.task_id)), ("agent_name", _text(t.agent_name)),
        ("reward", _text(t.score.reward)), ("outcome", _text(t.score.outcome)),
        ("has_error", _text(t.execution.has_error)), ("is_truncated", _text(t.execution.is_truncated)),
        ("duration_ms", str(t.duration_ms)), ("total_tokens", str(t.total_tokens)),
        ("size_bytes", str(t.size_bytes)),
        ("context", ", ".join(f"{k}={v}" for k, v in sorted(t.context.items())) or "-"),
    ]  # fmt: skip


def _get(api: ReadAPI, args: argparse.Namespace) -> None:
    if args.raw:
        document = api.get_raw(args.trace_id)
        sys.stdout.flush()
        sys.stdout.buffer.write(document)
        sys.stdout.buffer.flush()
        return
    summary = api.get(args.trace_id)
    if args.json:
        _print_json(summary.to_dict())
        return
    print(_table(_summary_lines(summary)))


def _download(api: ReadAPI, args: argparse.Namespace) -> None:
    path = api.download_raw(args.trace_id, args.dest)
    print(f"saved {path} ({path.stat().st_size} bytes)")


def _delete(api: ReadAPI, args: argparse.Namespace) -> None:
    api.delete(args.trace_id, created_at=args.created_at)
    print(f"deleted trace {args.trace_id}")


def _delete_run(api: ReadAPI, args: argparse.Namespace) -> None:
    api.delete_run(args.run_id)
    print(f"deleted the traces of run {args.run_id}")
