"""Runs: summaries computed from traces (contract §3, §5) and the lifecycle (§9).

A run exists when a stored trace names it in ``run.id`` or when it was
created through ``POST /runs``; both kinds are listed and summarised. The
summary is computed from the traces on every read; the lifecycle row adds
``name, kind, status, config, summary, tags, error, created_at,
finished_at`` (all null for a run known only from traces).

Choices where the contracts leave room:

- ``first_user_id`` is the credential label of the first stored trace's
  uploader, else the lifecycle creator; the ``created_by`` filter matches it.
- A run's type (the ``run_type`` filter, and an extra ``run_type`` field) is
  the lifecycle ``kind``, else the first stored trace's ``run.type`` when it
  is ``eval`` or ``train``, else ``unknown``.
- ``created_after``/``created_before`` (inclusive/exclusive) apply to
  ``first_trace_created_at``; the list is ordered by
  ``last_trace_ingested_at``, newest first, ties by run id.
- ``environment_ids``/``model_ids`` leave out nulls and empty strings.
- ``POST /runs`` answers 201 both when it creates the run and when the id
  already has a lifecycle row (returned unchanged); ``"created"`` tells which.
- ``PATCH /runs/{id}`` merges ``config``/``summary`` shallowly (top-level
  keys replace). A terminal run keeps its status: the same terminal status
  again is accepted without changing status, error or finished_at (merges
  still apply, so a retried final PATCH is harmless); another status is 409
  ``run_finished`` and changes nothing. ``error`` needs a terminal status.
  A run known only from traces gets its lifecycle row on its first PATCH.
- ``GET /runs/{id}`` adds ``metrics``, the summary of the run's metrics
  history (``_metrics.metrics_summary``; ``{}`` without one); the runs list
  does not carry it.
- Runs the platform's routes create (§10, ``_platform``) are rows of the same
  table, listed and summarised alike; their ``platform`` field holds what
  those routes were told (null for every other run).
"""

from __future__ import annotations

import logging
import secrets
import sqlite3
import time
from typing import Any
from urllib.parse import quote

import orjson

from prime_traces.errors import ErrorCode
from prime_traces.server import _models as m
from prime_traces.server._http import HTTPError, Request, Response, json_response, route
from prime_traces.server._metrics import metrics_summary
from prime_traces.server._pages import keyset_page

logger = logging.getLogger(__name__)

RUN_KINDS = ("train", "eval")
RUN_TYPES = ("eval", "train", "unknown")
TERMINAL_STATUSES = ("completed", "failed", "cancelled", "crashed")
MAX_RUN_ID_CHARS = 256

_RUNS_SQL = """
WITH agg AS (
    SELECT run_id,
           MIN(created_at) AS first_created, MAX(created_at) AS last_created,
           MAX(ingested_at) AS last_ingested, COUNT(*) AS trace_count,
           COUNT(DISTINCT episode_id) AS episode_count, AVG(reward) AS avg_reward,
           MIN(run_step) AS step_min, MAX(run_step) AS step_max,
           COUNT(DISTINCT run_step) AS step_count, MAX(has_error) AS has_error,
           MIN(seq) AS first_seq,
           json_group_array(DISTINCT environment_id) AS environment_ids,
           json_group_array(DISTINCT model_id) AS model_ids
    FROM traces WHERE run_id IS NOT NULL AND run_id != '' {scope}
    GROUP BY run_id
),
ids AS (SELECT run_id FROM agg UNION SELECT run_id FROM runs WHERE 1 {scope}),
joined AS (
    SELECT ids.run_id AS run_id,
           COALESCE(agg.first_created, r.created_at) AS first_trace_created_at,
           COALESCE(agg.last_created, r.created_at) AS last_trace_created_at,
           COALESCE(agg.last_ingested, r.created_at) AS last_trace_ingested_at,
           COALESCE(agg.trace_count, 0) AS trace_count,
           COALESCE(agg.episode_count, 0) AS episode_count,
           agg.avg_reward AS avg_reward, agg.step_min AS step_min, agg.step_max AS step_max,
           COALESCE(agg.step_count, 0) AS step_count, COALESCE(agg.has_error, 0) AS has_error,
           COALESCE(f.producer, r.created_by) AS first_user_id,
           agg.environment_ids AS environment_ids, agg.model_ids AS model_ids,
           f.context AS context,
           CASE WHEN r.kind IN ('eval', 'train') THEN r.kind
                WHEN f.run_type IN ('eval', 'train') THEN f.run_type
                ELSE 'unknown' END AS run_type,
           r.run_id IS NOT NULL AS lc_exists, r.name AS lc_name, r.kind AS lc_kind,
           r.status AS lc_status, r.config AS lc_config, r.summary AS lc_summary,
           r.tags AS lc_tags, r.error AS lc_error, r.created_at AS lc_created_at,
           r.finished_at AS lc_finished_at, r.platform AS lc_platform
    FROM ids
    LEFT JOIN agg ON agg.run_id = ids.run_id
    LEFT JOIN runs AS r ON r.run_id = ids.run_id
    LEFT JOIN traces AS f ON f.seq = agg.first_seq
)
SELECT * FROM joined"""


def _in(column: str, values: list[str], where: list[str], args: list[Any]) -> None:
    where.append(f"{column} IN ({', '.join('?' * len(values))})")
    args += values


def list_runs(req: Request) -> Response:
    query = req.query
    where: list[str] = []
    args: list[Any] = []
    filters: dict[str, Any] = {}
    run_types = m.many(query, "run_type")
    bad = [t for t in run_types if t not in RUN_TYPES]
    if bad:
        raise m.bad_filter(f"run_type must be one of {', '.join(RUN_TYPES)}, not {bad[0]!r}")
    if run_types:
        _in("run_type", run_types, where, args)
        filters["run_type"] = run_types
    users = m.many(query, "created_by")
    if users:
        _in("first_user_id", users, where, args)
        filters["created_by"] = users
    for name, op in (("created_after", ">="), ("created_before", "<")):
        at = m.as_time(query, name)
        if at is not None:
            where.append(f"first_trace_created_at {op} ?")
            args.append(at)
            filters[name] = at
    with req.state.store.reader() as conn:
        rows, cursor = keyset_page(
            conn,
            query,
            select=_RUNS_SQL.format(scope=""),
            where=where,
            args=args,
            scope="runs",
            filters=filters,
            keys=("last_trace_ingested_at", "run_id"),
            key_types=(float, str),
        )
    return json_response(200, {"items": [m.run_summary(r) for r in rows], "next_cursor": cursor})


def _summary_row(conn: sqlite3.Connection, run_id: str) -> sqlite3.Row | None:
    sql = _RUNS_SQL.format(scope="AND run_id = ?")
    return conn.execute(sql, (run_id, run_id)).fetchone()


def get_run(req: Request) -> Response:
    run_id = req.params["run_id"]
    with req.state.store.reader() as conn:
        conn.execute("BEGIN")  # the summary and its metrics from one snapshot
        row = _summary_row(conn, run_id)
        if row is None:
            raise HTTPError(404, ErrorCode.RUN_NOT_FOUND, f"run {run_id!r} not found")
        metrics = metrics_summary(conn, run_id)
    return json_response(200, {**m.run_summary(row), "metrics": metrics})


def get_run_steps(req: Request) -> Response:
    run_id = req.params["run_id"]
    with req.state.store.reader() as conn:
        rows = conn.execute(
            "SELECT run_step AS step, COUNT(*) AS trace_count, "
            "COUNT(DISTINCT episode_id) AS episode_count, AVG(reward) AS avg_reward "
            "FROM traces WHERE run_id = ? AND run_step IS NOT NULL "
            "GROUP BY run_step ORDER BY run_step",
            (run_id,),
        ).fetchall()
    items = [m.run_step(r) for r in rows]
    return json_response(
        200,
        {
            "step_min": items[0]["step"] if items else None,
            "step_max": items[-1]["step"] if items else None,
            "step_count": len(items),
            "items": items,
        },
    )


# -- lifecycle ---------------------------------------------------------------


def _invalid(message: str) -> HTTPError:
    return HTTPError(400, ErrorCode.INVALID_RUN, message)


def _object_field(body: dict[str, Any], name: str) -> dict[str, Any] | None:
    value = body.get(name)
    if value is not None and not isinstance(value, dict):
        raise _invalid(f"{name} must be a JSON object, not {type(value).__name__}")
    return value


def _string_field(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise _invalid(f"{name} must be a string, not {type(value).__name__}")
    return value


def _body(req: Request) -> dict[str, Any]:
    body = req.json_body()
    if not isinstance(body, dict):
        raise _invalid("the body must be a JSON object")
    return body


def _check_run_id(run_id: str) -> None:
    if not run_id or len(run_id) > MAX_RUN_ID_CHARS or "/" in run_id or run_id in (".", ".."):
        raise _invalid(f"id must be 1..{MAX_RUN_ID_CHARS} characters without '/', not {run_id!r}")


def _url(req: Request, run_id: str) -> str:
    return f"{req.base_url()}/api/v1/runs/{quote(run_id, safe='')}"


def new_run_id(conn: sqlite3.Connection, prefix: str) -> str:
    """``<prefix>-<12 hex>``, unused by any run with a lifecycle row."""
    while True:
        candidate = f"{prefix}-{secrets.token_hex(6)}"
        if conn.execute("SELECT 1 FROM runs WHERE run_id = ?", (candidate,)).fetchone() is None:
            return candidate


def create_run(req: Request) -> Response:
    body = _body(req)
    name = _string_field(body, "name")
    kind = body.get("kind")
    if kind not in RUN_KINDS:
        raise _invalid(f"kind must be one of {', '.join(RUN_KINDS)}, not {kind!r}")
    config = _object_field(body, "config") or {}
    tags = body.get("tags")
    if tags is None:
        tags = []
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise _invalid("tags must be a list of strings")
    run_id = _string_field(body, "id")
    if run_id is not None:
        _check_run_id(run_id)
    with req.state.store.writer() as conn:
        if run_id is None:
            run_id = new_run_id(conn, "run")
        row = conn.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        created = row is None
        if created:
            insert_run_row(conn, run_id, name=name, kind=kind, config=config, tags=tags, producer=req.producer)
            row = conn.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    if created:
        logger.info("created %s run %r (%s)", kind, run_id, name)
    return json_response(201, {**m.lifecycle_view(row, _url(req, run_id)), "created": created})


def insert_run_row(
    conn: sqlite3.Connection,
    run_id: str,
    *,
    name: str | None,
    kind: str,
    config: dict[str, Any],
    tags: list[str],
    producer: str,
    platform: dict[str, Any] | None = None,
) -> None:
    """Insert a new running run's lifecycle row; ``platform``: what the platform's routes were told of it."""
    conn.execute(
        "INSERT INTO runs (run_id, name, kind, config, summary, tags, status, error, "
        "created_at, finished_at, created_by, platform) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
        (
            run_id,
            name,
            kind,
            orjson.dumps(config).decode(),
            "{}",
            orjson.dumps(tags).decode(),
            "running",
            None,
            time.time(),
            None,
            producer,
            None if platform is None else orjson.dumps(platform).decode(),
        ),
    )


def adopt_traced_run(conn: sqlite3.Connection, run_id: str) -> sqlite3.Row | None:
    """The lifecycle row of a run known only from traces, created now; None if unknown."""
    first = conn.execute(
        "SELECT run_type, producer FROM traces WHERE run_id = ? ORDER BY seq LIMIT 1", (run_id,)
    ).fetchone()
    if first is None:
        return None
    kind = first["run_type"] if first["run_type"] in RUN_KINDS else None
    conn.execute(
        "INSERT INTO runs (run_id, name, kind, config, summary, tags, status, error, "
        "created_at, finished_at, created_by) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
        (run_id, None, kind, "{}", "{}", "[]", "running", None, time.time(), None, first["producer"]),
    )
    return conn.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()


def patch_run(req: Request) -> Response:
    run_id = req.params["run_id"]
    body = _body(req)
    config = _object_field(body, "config")
    summary = _object_field(body, "summary")
    status = _string_field(body, "status")
    error = _string_field(body, "error")
    if status is not None and status not in ("running", *TERMINAL_STATUSES):
        raise _invalid(f"status must be one of {', '.join(TERMINAL_STATUSES)}, not {status!r}")
    if error is not None and status not in TERMINAL_STATUSES:
        raise _invalid("error can only be set together with a terminal status")
    with req.state.store.writer() as conn:
        row = conn.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if row is None:
            row = adopt_traced_run(conn, run_id)
        if row is None:
            raise HTTPError(404, ErrorCode.RUN_NOT_FOUND, f"run {run_id!r} not found")
        current = row["status"]
        changes: dict[str, Any] = {}
        if status is not None and status != current:
            if current in TERMINAL_STATUSES:
                raise HTTPError(
                    409,
                    ErrorCode.RUN_FINISHED,
                    f"run {run_id!r} already finished as {current}; it cannot become {status}",
                )
            changes.update(status=status, error=error, finished_at=time.time())
        if config:
            changes["config"] = orjson.dumps({**orjson.loads(row["config"]), **config}).decode()
        if summary:
            changes["summary"] = orjson.dumps({**orjson.loads(row["summary"]), **summary}).decode()
        if changes:
            assignments = ", ".join(f"{column} = ?" for column in changes)
            conn.execute(f"UPDATE runs SET {assignments} WHERE run_id = ?", (*changes.values(), run_id))
            row = conn.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    if "status" in changes:
        logger.info("run %r finished as %s", run_id, status)
    return json_response(200, m.lifecycle_view(row, _url(req, run_id)))


ROUTES = [
    route("GET", "/runs", list_runs),
    route("POST", "/runs", create_run),
    route("GET", "/runs/{run_id}", get_run),
    route("PATCH", "/runs/{run_id}", patch_run),
    route("GET", "/runs/{run_id}/steps", get_run_steps),
]
