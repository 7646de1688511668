"""Trace and episode reads and deletes (contract §3, §4).

Lists are keyset-paginated, newest first by ``created_at`` with ties broken
by storage order (``seq``), so a page boundary never skips or repeats an item
even when many traces share a timestamp. Every stored copy is an item: a
trace id uploaded twice (in two different uploads) is listed twice, while a
single-item GET answers its newest copy.

Filter semantics chosen where the contract leaves them open:

- ``created_after`` is inclusive and ``created_before`` exclusive;
  ``reward_min``/``reward_max`` are inclusive and exclude unscored traces.
- ``sort`` on ``GET /traces``: ``newest`` (or ``-created_at``,
  ``created_at_desc``; the default) and ``oldest`` (or ``created_at``,
  ``created_at_asc``); anything else is 400 ``invalid_filter``.
- ``limit`` outside 1..100 is 400 ``invalid_filter``, not clamped.
- A single-valued filter given twice is 400 ``invalid_filter``; parameters an
  endpoint does not define are ignored (as the hosted service does), except
  on ``DELETE /traces``, where anything but ``run_id`` is refused so that a
  delete never removes more than its caller narrowed it to.
- Episode ``run_step``/``step_min``/``step_max``/``context.<key>`` filters
  match when one member trace satisfies all of them together.
- The ``created_at`` hint of a trace delete matches copies within a
  millisecond of it, since summaries show created_at to the millisecond.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import Iterator, Sequence
from typing import Any

from prime_traces.errors import ErrorCode
from prime_traces.server import _models as m
from prime_traces.server._http import HTTPError, Request, Response, json_response, route
from prime_traces.server._pages import keyset_page

logger = logging.getLogger(__name__)

RAW_CHUNK_BYTES = 256 * 1024
_TRACE_EQUALITY = ("run_id", "environment_id", "model_id", "model_provider", "task_id", "outcome")
_SORTS = {
    "newest": True,
    "-created_at": True,
    "created_at_desc": True,
    "oldest": False,
    "created_at": False,
    "created_at_asc": False,
}
_HINT_TOLERANCE_S = 0.001
_NEWEST_TRACE = "SELECT * FROM traces WHERE trace_id = ? ORDER BY seq DESC LIMIT 1"
_NEWEST_EPISODE = "SELECT * FROM episodes WHERE episode_id = ? ORDER BY seq DESC LIMIT 1"


def _context_clause(column: str, context: dict[str, str], where: list[str], args: list[Any]) -> None:
    for key, value in sorted(context.items()):
        # json_each rather than a JSON path: any key works, quotes and dots included.
        where.append(
            f"EXISTS (SELECT 1 FROM json_each({column}) AS c WHERE c.key = ? AND c.type = 'text' AND c.value = ?)"
        )
        args += [key, value]


def _time_clauses(
    query: dict[str, list[str]], column: str, where: list[str], args: list[Any], filters: dict[str, Any]
) -> None:
    after, before = m.as_time(query, "created_after"), m.as_time(query, "created_before")
    if after is not None:
        where.append(f"{column} >= ?")
        args.append(after)
        filters["created_after"] = after
    if before is not None:
        where.append(f"{column} < ?")
        args.append(before)
        filters["created_before"] = before


def trace_filters(
    query: dict[str, list[str]], *, upload_ids: bool = True, prefix: str = ""
) -> tuple[list[str], list[Any], dict[str, Any]]:
    """``(where clauses, args, normalised filters)`` of the trace-list filters of §3."""
    where: list[str] = []
    args: list[Any] = []
    filters: dict[str, Any] = {}
    for name in _TRACE_EQUALITY:
        value = m.one(query, name)
        if value is not None:
            where.append(f"{prefix}{name} = ?")
            args.append(value)
            filters[name] = value
    ids = m.many(query, "upload_id") if upload_ids else []
    if ids:
        where.append(f"{prefix}upload_id IN ({', '.join('?' * len(ids))})")
        args += ids
        filters["upload_id"] = ids
    for name, op in (("reward_min", ">="), ("reward_max", "<=")):
        bound = m.as_float(query, name)
        if bound is not None:
            where.append(f"{prefix}reward {op} ?")
            args.append(bound)
            filters[name] = bound
    for name in ("has_error", "is_truncated"):
        flag = m.as_bool(query, name)
        if flag is not None:
            where.append(f"{prefix}{name} = ?")
            args.append(int(flag))
            filters[name] = flag
    _time_clauses(query, f"{prefix}created_at", where, args, filters)
    context = m.context_filters(query)
    if context:
        _context_clause(f"{prefix}context", context, where, args)
        filters["context"] = context
    return where, args, filters


def _trace_page(
    req: Request,
    select: str,
    where: list[str],
    args: list[Any],
    scope: str,
    filters: dict[str, Any],
    descending: bool = True,
) -> Response:
    with req.state.store.reader() as conn:
        rows, cursor = keyset_page(
            conn, req.query, select=select, where=where, args=args, scope=scope, filters=filters, descending=descending
        )
    return json_response(200, {"items": [m.trace_summary(r) for r in rows], "next_cursor": cursor})


def list_traces(req: Request) -> Response:
    where, args, filters = trace_filters(req.query)
    sort = m.one(req.query, "sort") or "newest"
    if sort not in _SORTS:
        raise m.bad_filter(f"sort must be one of {', '.join(_SORTS)}, not {sort!r}")
    filters["sort"] = _SORTS[sort]
    return _trace_page(req, "SELECT * FROM traces", where, args, "traces", filters, _SORTS[sort])


def _stream_raw(req: Request, lookup: str, key: str, table: str, missing: HTTPError) -> Response:
    """The stored bytes of the row ``lookup`` finds, streamed from one read snapshot."""
    stack = contextlib.ExitStack()
    try:
        conn = stack.enter_context(req.state.store.reader())
        # One read transaction: a concurrent delete cannot cut the stream short.
        conn.execute("BEGIN")
        stack.callback(conn.execute, "ROLLBACK")
        row = conn.execute(lookup, (key,)).fetchone()
        if row is None:
            raise missing
        blob = _open_blob(conn, table, row["seq"])
        stack.callback(blob.close)
        length = len(blob)
    except BaseException:
        stack.close()
        raise
    return Response(200, body=_chunks(blob, stack), length=length, content_type="application/json")


class _SubstrBlob:
    """``Connection.blobopen`` for Python 3.10: reads through ``substr``."""

    def __init__(self, conn: sqlite3.Connection, table: str, seq: int) -> None:
        self._conn, self._table, self._seq, self._at = conn, table, seq, 0
        self._length = conn.execute(f"SELECT length(raw) FROM {table} WHERE seq = ?", (seq,)).fetchone()[0]

    def __len__(self) -> int:
        return self._length

    def read(self, size: int) -> bytes:
        chunk = self._conn.execute(
            f"SELECT substr(raw, ?, ?) FROM {self._table} WHERE seq = ?", (self._at + 1, size, self._seq)
        ).fetchone()[0]
        self._at += len(chunk)
        return bytes(chunk)

    def close(self) -> None:
        return None


def _open_blob(conn: sqlite3.Connection, table: str, seq: int) -> Any:
    if hasattr(conn, "blobopen"):
        return conn.blobopen(table, "raw", seq, readonly=True)
    return _SubstrBlob(conn, table, seq)


def _chunks(blob: Any, stack: contextlib.ExitStack) -> Iterator[bytes]:
    try:
        while chunk := blob.read(RAW_CHUNK_BYTES):
            yield chunk
    finally:
        stack.close()


def get_trace(req: Request) -> Response:
    trace_id = req.params["trace_id"]
    missing = HTTPError(404, ErrorCode.TRACE_NOT_FOUND, f"trace {trace_id!r} not found")
    if m.as_bool(req.query, "raw"):
        return _stream_raw(req, _NEWEST_TRACE, trace_id, "trace_docs", missing)
    with req.state.store.reader() as conn:
        row = conn.execute(_NEWEST_TRACE, (trace_id,)).fetchone()
    if row is None:
        raise missing
    return json_response(200, m.trace_summary(row))


def _delete_traces(conn: sqlite3.Connection, condition: str, args: Sequence[Any]) -> int:
    conn.execute(f"DELETE FROM trace_docs WHERE seq IN (SELECT seq FROM traces WHERE {condition})", args)
    return conn.execute(f"DELETE FROM traces WHERE {condition}", args).rowcount


def delete_trace(req: Request) -> Response:
    trace_id = req.params["trace_id"]
    hint = m.one(req.query, "created_at")
    condition = "trace_id = ?"
    args: list[str | float] = [trace_id]
    if hint is not None:
        at = m.parse_time_filter(hint, "created_at")
        condition += " AND abs(created_at - ?) < ?"
        args += [at, _HINT_TOLERANCE_S]
    with req.state.store.writer() as conn:
        deleted = _delete_traces(conn, condition, args)
    if not deleted:
        where = f" with created_at {hint!r}" if hint is not None else ""
        raise HTTPError(404, ErrorCode.TRACE_NOT_FOUND, f"trace {trace_id!r}{where} not found")
    logger.info("deleted %d stored copies of trace %r", deleted, trace_id)
    return Response(202, content_type=None)


def delete_run_traces(req: Request) -> Response:
    unknown = sorted(set(req.query) - {"run_id"})
    if unknown:
        raise m.bad_filter(f"DELETE /traces takes only run_id, not {', '.join(unknown)}")
    run_id = m.one(req.query, "run_id")
    if run_id is None:
        raise m.bad_filter("DELETE /traces needs run_id")
    with req.state.store.writer() as conn:
        deleted = _delete_traces(conn, "run_id = ?", [run_id])
    if not deleted:
        raise HTTPError(404, ErrorCode.RUN_NOT_FOUND, f"run {run_id!r} has no traces")
    logger.info("deleted %d traces of run %r", deleted, run_id)
    return Response(202, content_type=None)


def list_episodes(req: Request) -> Response:
    query = req.query
    where: list[str] = []
    args: list[Any] = []
    filters: dict[str, Any] = {}
    for name in ("run_id", "environment_id", "outcome"):
        value = m.one(query, name)
        if value is not None:
            where.append(f"{name} = ?")
            args.append(value)
            filters[name] = value
    ids = m.many(query, "upload_id")
    if ids:
        where.append(f"upload_id IN ({', '.join('?' * len(ids))})")
        args += ids
        filters["upload_id"] = ids
    has_error = m.as_bool(query, "has_error")
    if has_error is not None:
        where.append("has_error = ?")
        args.append(int(has_error))
        filters["has_error"] = has_error
    _time_clauses(query, "created_at", where, args, filters)
    member_where: list[str] = []
    for name, op in (("run_step", "="), ("step_min", ">="), ("step_max", "<=")):
        step = m.as_int(query, name)
        if step is not None:
            member_where.append(f"t.run_step {op} ?")
            args.append(step)
            filters[name] = step
    context = m.context_filters(query)
    if context:
        _context_clause("t.context", context, member_where, args)
        filters["context"] = context
    if member_where:
        where.append(
            "EXISTS (SELECT 1 FROM traces AS t WHERE t.episode_seq = episodes.seq AND "
            + " AND ".join(member_where)
            + ")"
        )
    with req.state.store.reader() as conn:
        rows, cursor = keyset_page(
            conn, query, select="SELECT * FROM episodes", where=where, args=args, scope="episodes", filters=filters
        )
    return json_response(200, {"items": [m.episode_summary(r) for r in rows], "next_cursor": cursor})


def get_episode(req: Request) -> Response:
    episode_id = req.params["episode_id"]
    missing = HTTPError(404, ErrorCode.EPISODE_NOT_FOUND, f"episode {episode_id!r} not found")
    if m.as_bool(req.query, "raw"):
        return _stream_raw(req, _NEWEST_EPISODE, episode_id, "episode_docs", missing)
    with req.state.store.reader() as conn:
        conn.execute("BEGIN")
        row = conn.execute(_NEWEST_EPISODE, (episode_id,)).fetchone()
        if row is None:
            raise missing
        totals = conn.execute(
            "SELECT COUNT(*) AS trace_count, SUM(total_tokens) AS total_tokens, "
            "SUM(duration_ms) AS total_duration_ms, MAX(has_error) AS any_trace_error "
            "FROM traces WHERE episode_seq = ?",
            (row["seq"],),
        ).fetchone()
        names = [
            r[0]
            for r in conn.execute(
                "SELECT DISTINCT agent_name FROM traces WHERE episode_seq = ? "
                "AND agent_name IS NOT NULL ORDER BY agent_name",
                (row["seq"],),
            )
        ]
    return json_response(200, m.episode_detail(row, m.trace_aggregate(totals, names)))


def list_episode_traces(req: Request) -> Response:
    episode_id = req.params["episode_id"]
    where, args, filters = trace_filters(req.query, upload_ids=False)
    with req.state.store.reader() as conn:
        row = conn.execute(
            "SELECT seq FROM episodes WHERE episode_id = ? ORDER BY seq DESC LIMIT 1", (episode_id,)
        ).fetchone()
    if row is None:
        raise HTTPError(404, ErrorCode.EPISODE_NOT_FOUND, f"episode {episode_id!r} not found")
    where.insert(0, "episode_seq = ?")
    args.insert(0, row["seq"])
    return _trace_page(req, "SELECT * FROM traces", where, args, f"episode-traces:{episode_id}", filters)


ROUTES = [
    route("GET", "/traces", list_traces),
    route("DELETE", "/traces", delete_run_traces),
    route("GET", "/traces/{trace_id}", get_trace),
    route("DELETE", "/traces/{trace_id}", delete_trace),
    route("GET", "/episodes", list_episodes),
    route("GET", "/episodes/{episode_id}", get_episode),
    route("GET", "/episodes/{episode_id}/traces", list_episode_traces),
]
