"""Line validation of an upload (contract §2, step 9) and the rows it stores.

Validation is deterministic: the same bytes always get the same verdict, so
a client can trust that a retried 400 would fail again. Checks run line by
line, in the contract's order. Every line is checked: the first failure is
answered with its 1-based line number and the record's id, and the answer's
``errors`` lists every failing line (at most :data:`MAX_LISTED_ERRORS`), so
a client drops all its bad records in one round trip (contract §9).

Validation keeps no parsed line: its rows are built afterwards, a line at a
time, by :func:`iter_rows` as the store inserts them in chunks, so an upload
costs about its body rather than every parsed line and its row at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import orjson

from prime_traces._lines.rules import (
    MAX_ROWS_PER_UPLOAD,
    LineError,
    LineFacts,
    SeenIds,
    check_line_size,
    check_record,
    parse_line,
)
from prime_traces.errors import ErrorCode
from prime_traces.server._extract import UploadMeta, episode_columns, trace_columns
from prime_traces.server._http import HTTPError
from prime_traces.server._store import EpisodeRow, TraceRow

#: The most rejected lines one answer lists (contract §9).
MAX_LISTED_ERRORS = 1000


@dataclass
class IngestResult:
    """The counts of one validated upload."""

    lines: int = 0
    rows: int = 0


def _iter_lines(body: bytes | bytearray) -> Iterator[tuple[int, bytes | bytearray]]:
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


def count_records(body: bytes | bytearray) -> int:
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


def validate_light(body: bytes | bytearray, meta: UploadMeta) -> IngestResult:
    """Count lines and apply the reject marker; parse no JSON (load tests)."""
    lines = count_records(body)
    if lines > MAX_ROWS_PER_UPLOAD:
        raise _rejection(
            meta, ErrorCode.TOO_MANY_TRACES_IN_UPLOAD, f"more than {MAX_ROWS_PER_UPLOAD} rows in one upload", None, None
        )
    if meta.reject_marker is not None:
        errors: list[tuple[ErrorCode, str, int, str | None]] = []
        at, number, counted_to = body.find(meta.reject_marker), 1, 0
        while at >= 0 and len(errors) < MAX_LISTED_ERRORS:
            number += body.count(b"\n", counted_to, at)
            errors.append((ErrorCode.INVALID_TRACE, "line carries the reject marker", number, None))
            end = body.find(b"\n", at)
            if end < 0:
                break
            counted_to = end + 1
            number += 1
            at = body.find(meta.reject_marker, counted_to)
        if errors:
            raise _rejections(meta, errors)
    return IngestResult(lines=lines, rows=lines)


def validate_full(body: bytes | bytearray, meta: UploadMeta) -> IngestResult:
    """Validate every line; keep nothing of them but the ids seen."""
    result = IngestResult()
    seen = SeenIds()
    errors: list[tuple[ErrorCode, str, int, str | None]] = []
    for number, line in _iter_lines(body):
        record_id = None
        try:
            check_line_size(len(line))
            if meta.reject_marker is not None and meta.reject_marker in line:
                raise LineError(ErrorCode.INVALID_TRACE, "line carries the reject marker")
            record = parse_line(line)
            record_id = record["id"]
            members = record.get("traces")
            rows = 1 + (len(members) if meta.line_format == "episode" and isinstance(members, list) else 0)
            result.rows += rows
            if result.rows > MAX_ROWS_PER_UPLOAD:
                # About the request's size, not this line: answered alone, at once.
                raise _rejection(
                    meta,
                    ErrorCode.TOO_MANY_TRACES_IN_UPLOAD,
                    f"more than {MAX_ROWS_PER_UPLOAD} rows in one upload",
                    number,
                    record_id,
                )
            check_record(record, meta.line_format, meta.now, seen)
            result.lines += 1
        except LineError as err:
            errors.append((err.code, err.message, number, record_id))
            if len(errors) >= MAX_LISTED_ERRORS:
                break
    if errors:
        raise _rejections(meta, errors)
    return result


def iter_rows(body: bytes | bytearray, meta: UploadMeta) -> Iterator[TraceRow | EpisodeRow]:
    """The rows of a body that passed :func:`validate_full`, parsed again a line at a time."""
    for number, line in _iter_lines(body):
        raw = bytes(line)
        record = orjson.loads(raw)
        try:
            if meta.line_format == "episode":
                yield _episode_row(check_record(record, "episode", meta.now), meta)
            else:
                # timing.start was checked to be a finite number by validate_full.
                start = float(record["timing"]["start"])
                yield TraceRow(trace_columns(record, start, len(raw), meta, None), raw)
        except (OverflowError, ValueError) as err:  # a value no column can hold: this line's fault
            raise _rejection(
                meta, ErrorCode.INVALID_TRACE, f"record cannot be stored: {err}", number, record["id"]
            ) from None


def _rejection(meta: UploadMeta, code: ErrorCode, message: str, line: int | None, record_id: str | None) -> HTTPError:
    if meta.reject_omit_line:
        line = record_id = None
    return HTTPError(400, code, _located(message, line), line=line, record_id=record_id)


def _located(message: str, line: int | None) -> str:
    return f"line {line}: {message}" if line is not None else message


def _rejections(meta: UploadMeta, errors: list[tuple[ErrorCode, str, int, str | None]]) -> HTTPError:
    """The first failure, and every failing line in ``errors`` (none when lines are withheld)."""
    code, message, line, record_id = errors[0]
    rejection = _rejection(meta, code, message, line, record_id)
    if not (meta.reject_omit_line or meta.reject_first_only):
        rejection.errors = [
            {"line": n, **({"id": i} if i is not None else {}), "code": str(c), "message": _located(m, n)}
            for c, m, n, i in errors
        ]
    return rejection


def _episode_row(facts: LineFacts, meta: UploadMeta) -> EpisodeRow:
    record = facts.record
    rows = []
    for member, start in zip(facts.members, facts.starts):
        raw = orjson.dumps(member)
        rows.append(TraceRow(trace_columns(member, start, len(raw), meta, (record["id"], facts.env_id)), raw))
    envelope = dict(record)
    envelope["traces"] = [m["id"] for m in facts.members]
    created_at = min(facts.starts) if facts.starts else meta.now
    columns = episode_columns(record, facts.env_id, created_at, meta, rows)
    return EpisodeRow(columns, orjson.dumps(envelope), rows)
