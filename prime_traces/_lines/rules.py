"""The contract's rules for one line (§2, step 9), shared by the local service and the SDK.

The local service applies them to every line it is sent; ``prime_runs``
applies the same functions, with the same messages, to each record an offline
run writes, so a record set aside locally is exactly one the service would
have refused. Rules that depend on the rest of a request (a repeated id, the
rows of a whole upload) need the ``seen`` state that only the service keeps.

Checks run in the contract's order and stop at the first failure, raised as
:class:`LineError` with its error code; the same record always gets the same
verdict, except for the time window, which moves with ``now``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import orjson

from prime_traces._lines.parts import MAX_LINE_BYTES
from prime_traces.errors import ErrorCode

MAX_ROWS_PER_UPLOAD = 1_000_000
MAX_TRACES_PER_EPISODE = 10_000
MAX_EPISODE_ID_CHARS = 256
MAX_ENVIRONMENT_ID_CHARS = 256
PAST_WINDOW_S = 365 * 24 * 3600
FUTURE_WINDOW_S = 300
#: The integers the service stores in columns are signed 64-bit.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class LineError(ValueError):
    """One line breaks a rule: ``code`` is the contract's error code, ``message`` says which rule."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class SeenIds:
    """The ids one request has claimed so far (duplicates within a request are refused)."""

    traces: set[str] = field(default_factory=set)
    episodes: set[str] = field(default_factory=set)


@dataclass
class LineFacts:
    """What the checks learned of a valid record: its members (episodes), their start times."""

    record: Mapping[str, Any]
    rows: int
    members: list[Mapping[str, Any]]
    starts: list[float]
    env_id: str | None = None


def check_line_size(size_bytes: int) -> None:
    """``trace_too_large`` for a line of more than :data:`MAX_LINE_BYTES` (newline excluded)."""
    if size_bytes > MAX_LINE_BYTES:
        raise LineError(ErrorCode.TRACE_TOO_LARGE, f"line is {size_bytes} bytes, over {MAX_LINE_BYTES}")


def parse_line(line: bytes | bytearray) -> dict[str, Any]:
    """The record of one line: a JSON object (:func:`check_record` checks the rest)."""
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError as err:
        raise LineError(ErrorCode.INVALID_TRACE, f"line is not JSON: {err}") from None
    if not isinstance(record, dict):
        raise LineError(ErrorCode.INVALID_TRACE, f"line is a JSON {type(record).__name__}, not an object")
    check_id(record)  # first, so the rejection can name the record's id
    return record


def check_id(record: Mapping[str, Any]) -> str:
    record_id = record.get("id")
    if not isinstance(record_id, str) or not record_id:
        raise LineError(ErrorCode.INVALID_TRACE, "record has no non-empty string 'id'")
    return record_id


def check_record(record: Mapping[str, Any], line_format: str, now: float, seen: SeenIds | None = None) -> LineFacts:
    """Apply the rules of one record (already known to be an object with an ``id``).

    Mappings and sequences stand for JSON objects and arrays, so a record
    about to be encoded gets the verdict its JSON would. With ``seen``, ids
    repeated within the request are refused too.
    """
    check_id(record)
    if line_format == "episode":
        return _episode(record, now, seen)
    if _is_array(record.get("traces")):
        raise LineError(
            ErrorCode.LINE_FORMAT_MISMATCH,
            "line is an episode (it has a 'traces' list) but the upload is "
            "trace format; send X-Prime-Line-Format: episode",
        )
    start = _created_at(record, now)
    check_stored_numbers(record, start)
    if seen is not None:
        _claim(seen.traces, record["id"], ErrorCode.DUPLICATE_TRACE_ID, "trace")
    return LineFacts(record, 1, [], [start])


def _episode(record: Mapping[str, Any], now: float, seen: SeenIds | None) -> LineFacts:
    members = record.get("traces")
    if not _is_array(members):
        raise LineError(
            ErrorCode.LINE_FORMAT_MISMATCH, "the upload is episode format but the line has no 'traces' list"
        )
    members = [_member(m, i) for i, m in enumerate(members)]
    starts = [_created_at(m, now) for m in members]
    for position, (member, start) in enumerate(zip(members, starts)):
        check_stored_numbers(member, start, f"traces[{position}].")
    if seen is not None:
        for member in members:
            _claim(seen.traces, member["id"], ErrorCode.DUPLICATE_TRACE_ID, "trace")
        _claim(seen.episodes, record["id"], ErrorCode.DUPLICATE_EPISODE_ID, "episode")
    if len(members) > MAX_TRACES_PER_EPISODE:
        raise LineError(
            ErrorCode.TOO_MANY_TRACES_IN_EPISODE, f"episode has {len(members)} traces, over {MAX_TRACES_PER_EPISODE}"
        )
    if len(record["id"]) > MAX_EPISODE_ID_CHARS:
        raise LineError(ErrorCode.EPISODE_ID_TOO_LONG, f"episode id is over {MAX_EPISODE_ID_CHARS} characters")
    env = record.get("env")
    env_id = env.get("id") if isinstance(env, Mapping) else None
    if isinstance(env_id, str) and len(env_id) > MAX_ENVIRONMENT_ID_CHARS:
        raise LineError(ErrorCode.ENVIRONMENT_ID_TOO_LONG, f"env.id is over {MAX_ENVIRONMENT_ID_CHARS} characters")
    return LineFacts(record, 1 + len(members), members, starts, env_id if isinstance(env_id, str) else None)


def _is_array(value: object) -> TypeGuard[list[Any] | tuple[Any, ...]]:
    return isinstance(value, (list, tuple))


def _member(member: Any, position: int) -> Mapping[str, Any]:
    if not isinstance(member, Mapping):
        raise LineError(ErrorCode.INVALID_TRACE, f"traces[{position}] is not an object")
    if not isinstance(member.get("id"), str) or not member["id"]:
        raise LineError(ErrorCode.INVALID_TRACE, f"traces[{position}] has no non-empty string 'id'")
    return member


def _created_at(trace: Mapping[str, Any], now: float) -> float:
    timing = trace.get("timing")
    start = timing.get("start") if isinstance(timing, Mapping) else None
    if not _is_number(start) or not math.isfinite(start):
        raise LineError(ErrorCode.CREATED_AT_OUT_OF_WINDOW, f"trace {trace['id']!r} has no numeric timing.start")
    if not now - PAST_WINDOW_S <= start <= now + FUTURE_WINDOW_S:
        raise LineError(
            ErrorCode.CREATED_AT_OUT_OF_WINDOW,
            f"trace {trace['id']!r} timing.start {start} is outside now-365d .. now+300s",
        )
    return float(start)


def check_stored_numbers(trace: Mapping[str, Any], start: float, prefix: str = "") -> None:
    """``invalid_trace`` for a number the service would derive a column from but cannot store.

    The step, the token counts and the duration (``timing.scoring.end`` less
    ``timing.start``, in ms) become signed 64-bit integers; a value outside
    that range (a ``step`` of 2**63, an end time of 1e300) is refused here,
    naming the field, rather than failing the whole request in the database.
    """
    run = trace.get("run")
    work = run.get("work") if isinstance(run, Mapping) else None
    if isinstance(work, Mapping):
        _check_int64(work.get("step"), f"{prefix}run.work.step", trace)
    calls = trace.get("calls")
    if _is_array(calls):
        for index, call in enumerate(calls):
            usage = call.get("usage") if isinstance(call, Mapping) else None
            if isinstance(usage, Mapping):
                _check_int64(usage.get("total_tokens"), f"{prefix}calls[{index}].usage.total_tokens", trace)
    timing = trace.get("timing")
    scoring = timing.get("scoring") if isinstance(timing, Mapping) else None
    end = scoring.get("end") if isinstance(scoring, Mapping) else None
    if _is_number(end) and math.isfinite(end):
        duration_ms = (end - start) * 1000
        if not (math.isfinite(duration_ms) and INT64_MIN <= duration_ms <= INT64_MAX):
            raise LineError(
                ErrorCode.INVALID_TRACE,
                f"trace {trace['id']!r} {prefix}timing.scoring.end {end} is too far from timing.start "
                f"{start} for a 64-bit duration in milliseconds",
            )


def _is_number(value: object) -> TypeGuard[float]:
    # numbers.Real also admits numpy scalars, which encode as JSON numbers. Narrowed to float,
    # as they compare and subtract like one: typeshed's numbers.Real does not compare with a float.
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check_int64(value: Any, path: str, trace: Mapping[str, Any]) -> None:
    # Floats with an integral value are stored as integers too.
    if not _is_number(value) or (isinstance(value, float) and not value.is_integer()):
        return
    if not INT64_MIN <= value <= INT64_MAX:
        raise LineError(
            ErrorCode.INVALID_TRACE, f"trace {trace['id']!r} {path} is {value}, outside the signed 64-bit range"
        )


def _claim(seen: set[str], key: str, code: ErrorCode, what: str) -> None:
    if key in seen:
        raise LineError(code, f"{what} id {key!r} appears more than once in this upload")
    seen.add(key)
