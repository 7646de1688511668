"""What the ``prime-traces`` and ``prime-runs`` command lines write, and how they fail.

The rules both follow:

- Results go to stdout: a table or ``key value`` lines for people, or with
  ``--json`` exactly one JSON document for scripts.
- Errors go to stderr as one line, ``PROG: <message>``: never a traceback, never
  the API key. Under ``--json`` a failure also prints one JSON document on
  stdout, ``{"error": {"message", "code", "status"}}`` (the service's error code
  and HTTP status, ``null`` when there was no answer), so a script reading
  stdout always gets JSON.
- A bad command line exits with status 2 before any request, the way argparse
  does (usage and ``PROG COMMAND: error: ...`` on stderr), JSON error included
  under ``--json``. The argument types here (:func:`int_in`, :func:`iso8601`,
  :func:`finite_float`, :func:`no_blanks`, :func:`log_level`) check locally
  what can be.
- A reader that goes away (``prime-traces list | head -1``) ends the command
  quietly: nothing on stderr, exit status 141 (128 + SIGPIPE, what a shell shows
  for a writer killed by a closed pipe).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any, NoReturn

import orjson

from prime_traces._api.models import TraceSummary
from prime_traces._http.redact import redact
from prime_traces.errors import APIError

__all__ = [
    "EXIT_BROKEN_PIPE",
    "EXIT_USAGE",
    "LOG_LEVELS",
    "Parser",
    "UsageError",
    "cell",
    "configure_logging",
    "error_document",
    "fail",
    "finite_float",
    "int_in",
    "iso8601",
    "log_level",
    "no_blanks",
    "positive_float",
    "one_line",
    "parse_command_line",
    "print_json",
    "run_until_closed_pipe",
    "summary_lines",
    "table",
    "wants_json",
    "when",
]

EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 141
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class UsageError(SystemExit):
    """argparse refused the command line; exits with status 2 like argparse's own exit.

    A ``SystemExit`` still, so whatever expected argparse's exit keeps working;
    ``message`` is the text after ``error:``, for the JSON error document.
    """

    def __init__(self, message: str) -> None:
        super().__init__(EXIT_USAGE)
        self.message = message


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` (subparsers included) whose errors raise :class:`UsageError`."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise UsageError(message)


def wants_json(argv: Sequence[str]) -> bool:
    """Whether ``--json`` is among the options of ``argv`` (the words before a ``--``)."""
    words = list(argv)
    if "--" in words:
        words = words[: words.index("--")]
    return "--json" in words


def parse_command_line(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """Parse ``argv``, then run the command's ``check(args)`` (checks that span options) if it set one.

    A refusal prints the JSON error document too when ``--json`` was asked for,
    then raises :class:`UsageError`.
    """
    try:
        args = parser.parse_args(list(argv))
        check = getattr(args, "check", None)
        if check is not None:
            check(args)
    except UsageError as err:
        if wants_json(argv):
            print_json(error_document(err.message))
        raise
    return args


def log_level(value: str) -> str:
    """argparse ``type`` of ``--log-level``: a level name, in any case."""
    level = value.strip().upper()
    if not isinstance(logging.getLevelName(level), int):  # WARN and FATAL are names too
        raise argparse.ArgumentTypeError(f"unknown level {value!r}: use one of {', '.join(LOG_LEVELS)}")
    return level


def int_in(low: int, high: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer in ``low..high``."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {value!r}") from None
        if not low <= number <= high:
            raise argparse.ArgumentTypeError(f"must be between {low} and {high}, not {number}")
        return number

    return parse


def iso8601(value: str) -> str:
    """An argparse ``type``: the text unchanged (the service reads it) once it parses as an ISO 8601 time.

    A trailing ``Z`` is UTC.
    """
    moment = value.strip()
    if moment[-1:] in ("Z", "z"):
        moment = moment[:-1] + "+00:00"  # Python 3.10's fromisoformat does not take Z
    try:
        datetime.fromisoformat(moment)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an ISO 8601 time such as 2026-07-20T18:02:11Z, got {value!r}"
        ) from None
    return value


def finite_float(value: str) -> float:
    """An argparse ``type``: a finite number (no nan, no inf)."""
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {value!r}")
    return number


def positive_float(value: str) -> float:
    """An argparse ``type``: a finite number greater than 0 (a timeout)."""
    number = finite_float(value)
    if not number > 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, not {value}")
    return number


def no_blanks(value: str) -> str:
    """An argparse ``type``: a non-empty word without blanks.

    For ``--sort``: the contract does not pin its values for the hosted
    service, so only the shape is checked.
    """
    if not value or any(c.isspace() for c in value):
        raise argparse.ArgumentTypeError(f"expected a sort key without blanks, got {value!r}")
    return value


def configure_logging(level: str, log_format: str) -> None:
    """The command line is the application, so it (and only it) configures the root logger, once."""
    logging.basicConfig(level=level, format=log_format)


def run_until_closed_pipe(command: Callable[[], int]) -> int:
    """Run ``command`` and flush stdout; a reader that closed the pipe ends it quietly, 141.

    ``command`` may also end by ``SystemExit`` (``--help``, ``--version``, a bad
    command line): stdout is flushed before it goes on.
    """
    try:
        try:
            return command()
        finally:
            sys.stdout.flush()  # now, while a failure can still be caught
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE


def _silence_stdout() -> None:
    # Python flushes stdout once more at exit, and that flush would fail again
    # with "Exception ignored ... BrokenPipeError": /dev/null takes the rest.
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # a captured stream has no descriptor
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def print_json(document: Any) -> None:
    print(orjson.dumps(document, option=orjson.OPT_INDENT_2).decode())


def one_line(message: str, api_key: str | None = None) -> str:
    """``message`` on one line, with the API key (as a whole token) and any bearer credential redacted."""
    return " ".join(redact(message, api_key).split()) or "failed"


def _api_error(err: BaseException | None) -> APIError | None:
    # The service's answer may sit under a wrapper: an UploadError's first
    # failure (``.error``), or the cause of an error the CLI re-worded.
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, APIError):
            return err
        seen.add(id(err))
        err = getattr(err, "error", None) or err.__cause__
    return None


def error_document(message: str, err: BaseException | None = None) -> dict[str, Any]:
    """``{"error": {"message", "code", "status"}}``: code and status of the service's answer, if any."""
    answer = _api_error(err)
    code = str(answer.code) if answer is not None and answer.code is not None else None
    status = answer.status_code if answer is not None else None
    return {"error": {"message": message, "code": code, "status": status}}


def fail(
    prog: str, message: str, *, api_key: str | None = None, err: BaseException | None = None, as_json: bool = False
) -> None:
    """Report a failure: one line on stderr, and under ``--json`` the error document on stdout."""
    line = one_line(message, api_key)
    if as_json:
        print_json(error_document(line, err))
    print(f"{prog}: {line}", file=sys.stderr)


def when(moment: datetime | None) -> str:
    if moment is None:
        return "-"
    if moment.tzinfo is not None:
        moment = moment.astimezone(timezone.utc)  # datetime.UTC is 3.11+; 3.10 is supported
    return moment.strftime("%Y-%m-%d %H:%M:%S")


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def table(rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns two spaces apart, no trailing blanks."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def summary_lines(t: TraceSummary) -> list[tuple[str, str]]:
    """``get``'s ``key value`` lines of a trace summary."""
    return [
        ("trace_id", t.trace_id),
        ("upload_id", t.upload_id),
        ("episode_id", cell(t.episode_id)),
        ("created_at", when(t.created_at)),
        ("ingested_at", when(t.ingested_at)),
        ("run_id", cell(t.run_id)),
        ("environment_id", cell(t.environment_id)),
        ("model", f"{cell(t.model.provider)} / {cell(t.model.id)}"),
        ("task_id", cell(t.task_id)),
        ("agent_name", cell(t.agent_name)),
        ("reward", cell(t.score.reward)),
        ("outcome", cell(t.score.outcome)),
        ("has_error", cell(t.execution.has_error)),
        ("is_truncated", cell(t.execution.is_truncated)),
        ("duration_ms", str(t.duration_ms)),
        ("total_tokens", str(t.total_tokens)),
        ("size_bytes", str(t.size_bytes)),
        ("context", ", ".join(f"{k}={v}" for k, v in sorted(t.context.items())) or "-"),
    ]
