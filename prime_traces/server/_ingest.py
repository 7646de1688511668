"""Line validation of an upload (contract §2, step 9) and the rows it stores.

Validation is deterministic: the same bytes always get the same verdict, so
a client can trust that a retried 400 would fail again. Checks run line by
line, in the contract's order, and the first failure is answered with its
1-based line number and the record's id (contract §9).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import orjson

from prime_traces.errors import ErrorCode
from prime_traces.server._extract import episode_columns, trace_columns
from prime_traces.server._http import HTTPError
from prime_traces.server._store import EpisodeRow, TraceRow

MAX_LINE_BYTES = 64 * 1024 * 1024
MAX_ROWS_PER_UPLOAD = 1_000_000
MAX_TRACES_PER_EPISODE = 10_000
MAX_EPISODE_ID_CHARS = 256
MAX_ENVIRONMENT_ID_CHARS = 256
PAST_WINDOW_S = 365 * 24 * 3600
FUTURE_WINDOW_S = 300


@dataclass
class UploadMeta:
    """What every row of one upload shares."""

    upload_id: str
    line_format: str
    context: dict[str, str]
    schema_version: int
    producer: str
    now: float
    reject_marker: bytes | None = None
    reject_omit_line: bool = False
    keep_rows: bool = True


@dataclass
class IngestResult:
    """The rows to store and the counts of one validated upload."""

    lines: int = 0
    rows: int = 0
    traces: list[TraceRow] = field(default_factory=list)
    episodes: list[EpisodeRow] = field(default_factory=list)


class _LineError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _iter_lines(body: bytes) -> Any:
    start, number = 0, 0
    size = len(body)
    while start < size:
        end = body.find(b"\n", start)
        if end < 0:
            end = size
        number += 1
        line = body[start:end]
        start = end + 1
        if line and not line.isspace():
            yield number, line


_BLANK = frozenset(b" \t\r\n\x0b\x0c")


def count_records(body: bytes) -> int:
    """Non-blank lines, without copying any line that starts with a non-blank byte."""
    count, start, size = 0, 0, len(body)
    while start < size:
        end = body.find(b"\n", start)
        if end < 0:
            end = size
        if end > start and (body[start] not in _BLANK or not body[start:end].isspace()):
            count += 1
        start = end + 1
    return count


def validate_light(body: bytes, meta: UploadMeta) -> IngestResult:
    """Count lines and apply the reject marker; parse no JSON (load tests)."""
    lines = count_records(body)
    if lines > MAX_ROWS_PER_UPLOAD:
        raise _rejection(meta, ErrorCode.TOO_MANY_TRACES_IN_UPLOAD,
                         f"more than {MAX_ROWS_PER_UPLOAD} rows in one upload", None, None)  # fmt: skip
    if meta.reject_marker is not None:
        at = body.find(meta.reject_marker)
        if at >= 0:
            number = body.count(b"\n", 0, at) + 1
            raise _rejection(meta, ErrorCode.INVALID_TRACE, "line carries the reject marker", number, None)
    return IngestResult(lines=lines, rows=lines)


def validate_full(body: bytes, meta: UploadMeta) -> IngestResult:
    """Validate every line and build the rows to store."""
    result = IngestResult()
    seen_traces: set[str] = set()
    seen_episodes: set[str] = set()
    episode = meta.line_format == "episode"
    for number, line in _iter_lines(body):
        record_id = None
        try:
            if len(line) > MAX_LINE_BYTES:
                raise _LineError(ErrorCode.TRACE_TOO_LARGE,
                                 f"line is {len(line)} bytes, over {MAX_LINE_BYTES}")  # fmt: skip
            if meta.reject_marker is not None and meta.reject_marker in line:
                raise _LineError(ErrorCode.INVALID_TRACE, "line carries the reject marker")
            record = _parse(line)
            record_id = record["id"]
            members = record.get("traces")
            rows = 1 + (len(members) if episode and isinstance(members, list) else 0)
            result.rows += rows
            if result.rows > MAX_ROWS_PER_UPLOAD:
                raise _LineError(ErrorCode.TOO_MANY_TRACES_IN_UPLOAD,
                                 f"more than {MAX_ROWS_PER_UPLOAD} rows in one upload")  # fmt: skip
            if episode:
                row = _episode(record, line, meta, seen_traces, seen_episodes)
                if row is not None:
                    result.episodes.append(row)
            else:
                trace = _bare_trace(record, line, meta, seen_traces)
                if trace is not None:
                    result.traces.append(trace)
            result.lines += 1
        except _LineError as err:
            raise _rejection(meta, err.code, err.message, number, record_id) from None
    return result


def _rejection(meta: UploadMeta, code: ErrorCode, message: str, line: int | None,
               record_id: str | None) -> HTTPError:
    if meta.reject_omit_line:
        line = record_id = None
    where = f"line {line}: " if line is not None else ""
    return HTTPError(400, code, where + message, line=line, record_id=record_id)


def _parse(line: bytes) -> dict[str, Any]:
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError as err:
        raise _LineError(ErrorCode.INVALID_TRACE, f"line is not JSON: {err}") from None
    if not isinstance(record, dict):
        raise _LineError(ErrorCode.INVALID_TRACE, f"line is a JSON {type(record).__name__}, not an object")
    if not isinstance(record.get("id"), str) or not record["id"]:
        raise _LineError(ErrorCode.INVALID_TRACE, "record has no non-empty string 'id'")
    return record


def _check_member(member: Any, position: int) -> dict[str, Any]:
    if not isinstance(member, dict):
        raise _LineError(ErrorCode.INVALID_TRACE, f"traces[{position}] is not an object")
    if not isinstance(member.get("id"), str) or not member["id"]:
        raise _LineError(ErrorCode.INVALID_TRACE, f"traces[{position}] has no non-empty string 'id'")
    return member


def _check_created_at(trace: dict[str, Any], now: float) -> float:
    timing = trace.get("timing")
    start = timing.get("start") if isinstance(timing, dict) else None
    if isinstance(start, bool) or not isinstance(start, (int, float)) or not math.isfinite(start):
        raise _LineError(ErrorCode.CREATED_AT_OUT_OF_WINDOW,
                         f"trace {trace['id']!r} has no numeric timing.start")  # fmt: skip
    if not now - PAST_WINDOW_S <= start <= now + FUTURE_WINDOW_S:
        raise _LineError(
            ErrorCode.CREATED_AT_OUT_OF_WINDOW,
            f"trace {trace['id']!r} timing.start {start} is outside now-365d .. now+300s",
        )
    return float(start)


def _claim(seen: set[str], key: str, code: ErrorCode, what: str) -> None:
    if key in seen:
        raise _LineError(code, f"{what} id {key!r} appears more than once in this upload")
    seen.add(key)


def _bare_trace(record: dict[str, Any], line: bytes, meta: UploadMeta, seen: set[str]) -> TraceRow | None:
    if isinstance(record.get("traces"), list):
        raise _LineError(ErrorCode.LINE_FORMAT_MISMATCH,
                         "line is an episode (it has a 'traces' list) but the upload is "
                         "trace format; send X-Prime-Line-Format: episode")  # fmt: skip
    created_at = _check_created_at(record, meta.now)
    _claim(seen, record["id"], ErrorCode.DUPLICATE_TRACE_ID, "trace")
    if not meta.keep_rows:
        return None
    return TraceRow(trace_columns(record, created_at, len(line), meta, None), bytes(line))


def _episode(record: dict[str, Any], line: bytes, meta: UploadMeta, seen_traces: set[str],
             seen_episodes: set[str]) -> EpisodeRow | None:
    members = record.get("traces")
    if not isinstance(members, list):
        raise _LineError(ErrorCode.LINE_FORMAT_MISMATCH,
                         "the upload is episode format but the line has no 'traces' list")  # fmt: skip
    members = [_check_member(m, i) for i, m in enumerate(members)]
    starts = [_check_created_at(m, meta.now) for m in members]
    for member in members:
        _claim(seen_traces, member["id"], ErrorCode.DUPLICATE_TRACE_ID, "trace")
    _claim(seen_episodes, record["id"], ErrorCode.DUPLICATE_EPISODE_ID, "episode")
    if len(members) > MAX_TRACES_PER_EPISODE:
        raise _LineError(ErrorCode.TOO_MANY_TRACES_IN_EPISODE,
                         f"episode has {len(members)} traces, over {MAX_TRACES_PER_EPISODE}")  # fmt: skip
    if len(record["id"]) > MAX_EPISODE_ID_CHARS:
        raise _LineError(ErrorCode.EPISODE_ID_TOO_LONG,
                         f"episode id is over {MAX_EPISODE_ID_CHARS} characters")  # fmt: skip
    env = record.get("env")
    env_id = env.get("id") if isinstance(env, dict) else None
    if isinstance(env_id, str) and len(env_id) > MAX_ENVIRONMENT_ID_CHARS:
        raise _LineError(ErrorCode.ENVIRONMENT_ID_TOO_LONG,
                         f"env.id is over {MAX_ENVIRONMENT_ID_CHARS} characters")  # fmt: skip
    if not meta.keep_rows:
        return None
    env_id = env_id if isinstance(env_id, str) else None
    rows = []
    for member, start in zip(members, starts):
        raw = orjson.dumps(member)
        rows.append(TraceRow(trace_columns(member, start, len(raw), meta, (record["id"], env_id)), raw))
    envelope = dict(record)
    envelope["traces"] = [m["id"] for m in members]
    created_at = min(starts) if starts else meta.now
    columns = episode_columns(record, env_id, created_at, meta, rows)
    return EpisodeRow(columns, orjson.dumps(envelope), rows)
