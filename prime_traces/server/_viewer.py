"""The read endpoints the web viewer needs beyond the public ones (local section).

Both are local-service additions, authenticated like every ``/api/v1`` route,
and keyset-paginated like the lists of §3 (``limit`` 1..100, default 20; an
opaque cursor bound to the filters):

- ``GET /api/v1/_viewer/runs?status=&kind=&limit=&cursor=``: every run of
  every producer, newest first by ``started_at`` (the lifecycle
  ``created_at``, else the first trace's), each row carrying what the runs
  table shows: ``run_id, name, kind, status, started_at, finished_at,
  last_activity_at, records, episodes, bytes, producer`` and ``sparkline``.
  ``kind`` is the run's type (``eval``, ``train``, ``unknown``, as the
  ``run_type`` of ``GET /runs``); ``status`` is the lifecycle status, or
  ``unknown`` for a run known only from its traces. Both filters repeat (OR).
  ``producer`` is the non-secret label of the credential that created the
  run (``key-`` and 12 hex digits of the token's SHA-256), never the token.
  ``sparkline`` is ``{"name", "values"}``: the first metric of the run's
  first stepped history row, sampled at most :data:`SPARKLINE_POINTS` times
  in step order (non-numbers, NaN among them, as null), or null without one.
- ``GET /api/v1/_viewer/runs/{run_id}/episodes?sort=&limit=&cursor=``: the
  run's episodes with what the episode table shows: ``episode_id,
  created_at, reward, trace_count, total_tokens, bytes, has_error,
  outcome``. ``reward`` is the mean of the member traces' rewards (null when
  none is scored). ``sort`` is ``newest`` (the default), ``oldest``,
  ``reward_desc`` or ``reward_asc``; unscored episodes sort below every
  scored one. An unknown run is 404 ``run_not_found``.
"""

from __future__ import annotations

import logging
import sqlite3
from typing import Any

from prime_traces.server import _models as m
from prime_traces.server._http import Request, Response, json_response, route
from prime_traces.server._metrics import require_run
from prime_traces.server._pages import keyset_page
from prime_traces.server._runs import RUN_TYPES, TERMINAL_STATUSES

logger = logging.getLogger(__name__)

SPARKLINE_POINTS = 64
RUN_STATUSES = ("running", *TERMINAL_STATUSES, "unknown")
EPISODE_SORTS = {
    "newest": ("created_at", True),
    "oldest": ("created_at", False),
    "reward_desc": ("reward_key", True),
    "reward_asc": ("reward_key", False),
}
# Below every real reward, so that keyset pages over the reward never meet a NULL.
_UNSCORED = -1.0e308

_RUNS_SQL = """
SELECT * FROM (
    SELECT ids.run_id AS run_id, r.name AS name,
           CASE WHEN r.kind IN ('eval', 'train') THEN r.kind
                WHEN f.run_type IN ('eval', 'train') THEN f.run_type
                ELSE 'unknown' END AS kind,
           COALESCE(r.status, 'unknown') AS status,
           COALESCE(r.created_at, agg.first_created) AS started_at,
           r.finished_at AS finished_at,
           COALESCE(agg.last_ingested, r.created_at) AS last_activity_at,
           COALESCE(agg.records, 0) AS records, COALESCE(agg.episodes, 0) AS episodes,
           COALESCE(agg.bytes, 0) AS bytes, COALESCE(r.created_by, f.producer) AS producer
    FROM (SELECT run_id FROM traces WHERE run_id IS NOT NULL AND run_id != '' UNION SELECT run_id FROM runs) AS ids
    LEFT JOIN runs AS r ON r.run_id = ids.run_id
    LEFT JOIN (
        SELECT run_id, MIN(created_at) AS first_created, MAX(ingested_at) AS last_ingested,
               COUNT(*) AS records, COUNT(DISTINCT episode_id) AS episodes,
               SUM(size_bytes) AS bytes, MIN(seq) AS first_seq
        FROM traces WHERE run_id IS NOT NULL GROUP BY run_id
    ) AS agg ON agg.run_id = ids.run_id
    LEFT JOIN traces AS f ON f.seq = agg.first_seq
)"""

_EPISODES_SQL = """
SELECT * FROM (
    SELECT e.seq AS seq, e.episode_id AS episode_id, e.created_at AS created_at, e.outcome AS outcome,
           e.has_error AS has_error, AVG(t.reward) AS reward, COALESCE(AVG(t.reward), ?) AS reward_key,
           COUNT(t.seq) AS trace_count, COALESCE(SUM(t.total_tokens), 0) AS total_tokens,
           COALESCE(SUM(t.size_bytes), 0) AS bytes
    FROM episodes AS e LEFT JOIN traces AS t ON t.episode_seq = e.seq
    WHERE e.run_id = ?
    GROUP BY e.seq
)"""

_FIRST_METRIC = (
    "SELECT n.key FROM run_metrics, json_each(run_metrics.metrics) AS n "
    "WHERE run_id = ? AND step IS NOT NULL ORDER BY step, n.id LIMIT 1"
)
# Every stride-th stepped row that carries the name, in step order.
_SAMPLES = """
SELECT v FROM (
    SELECT (SELECT value FROM json_each(metrics) WHERE key = :name) AS v,
           ROW_NUMBER() OVER (ORDER BY step) - 1 AS i, COUNT(*) OVER () AS n
    FROM run_metrics
    WHERE run_id = :run AND step IS NOT NULL
      AND EXISTS (SELECT 1 FROM json_each(metrics) WHERE key = :name)
) WHERE i % MAX(1, (n + :points - 1) / :points) = 0 ORDER BY i"""


def _choice(query: dict[str, list[str]], name: str, allowed: tuple[str, ...]) -> list[str]:
    values = m.many(query, name)
    bad = [v for v in values if v not in allowed]
    if bad:
        raise m.bad_filter(f"{name} must be one of {', '.join(allowed)}, not {bad[0]!r}")
    return values


def _number_or_none(value: Any) -> float | int | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def sparkline(conn: sqlite3.Connection, run_id: str) -> dict[str, Any] | None:
    """The first metric of ``run_id``'s history, sampled for a sparkline; None without a history."""
    first = conn.execute(_FIRST_METRIC, (run_id,)).fetchone()
    if first is None:
        return None
    name = first[0]
    rows = conn.execute(_SAMPLES, {"name": name, "run": run_id, "points": SPARKLINE_POINTS}).fetchall()
    return {"name": name, "values": [_number_or_none(r[0]) for r in rows]}


def _run_row(conn: sqlite3.Connection, row: sqlite3.Row) -> dict[str, Any]:
    started, finished = row["started_at"], row["finished_at"]
    return {
        "run_id": row["run_id"],
        "name": row["name"],
        "kind": row["kind"],
        "status": row["status"],
        "started_at": m.iso(started) if started is not None else None,
        "finished_at": m.iso(finished) if finished is not None else None,
        "last_activity_at": m.iso(row["last_activity_at"]) if row["last_activity_at"] is not None else None,
        "records": int(row["records"]),
        "episodes": int(row["episodes"]),
        "bytes": int(row["bytes"]),
        "producer": row["producer"],
        "sparkline": sparkline(conn, row["run_id"]),
    }


def list_viewer_runs(req: Request) -> Response:
    where: list[str] = []
    args: list[Any] = []
    filters: dict[str, Any] = {}
    for name, allowed in (("status", RUN_STATUSES), ("kind", RUN_TYPES)):
        values = _choice(req.query, name, allowed)
        if values:
            where.append(f"{name} IN ({', '.join('?' * len(values))})")
            args += values
            filters[name] = values
    with req.state.store.reader() as conn:
        conn.execute("BEGIN")  # the page and its sparklines from one snapshot
        rows, cursor = keyset_page(
            conn,
            req.query,
            select=_RUNS_SQL,
            where=where,
            args=args,
            scope="viewer-runs",
            filters=filters,
            keys=("started_at", "run_id"),
            key_types=(float, str),
        )
        items = [_run_row(conn, row) for row in rows]
    return json_response(200, {"items": items, "next_cursor": cursor})


def _episode_row(row: sqlite3.Row) -> dict[str, Any]:
    return {
        "episode_id": row["episode_id"],
        "created_at": m.iso(row["created_at"]),
        "reward": float(row["reward"]) if row["reward"] is not None else None,
        "trace_count": int(row["trace_count"]),
        "total_tokens": int(row["total_tokens"]),
        "bytes": int(row["bytes"]),
        "has_error": bool(row["has_error"]),
        "outcome": row["outcome"],
    }


def list_run_episodes(req: Request) -> Response:
    run_id = req.params["run_id"]
    sort = m.one(req.query, "sort") or "newest"
    if sort not in EPISODE_SORTS:
        raise m.bad_filter(f"sort must be one of {', '.join(EPISODE_SORTS)}, not {sort!r}")
    key, descending = EPISODE_SORTS[sort]
    with req.state.store.reader() as conn:
        conn.execute("BEGIN")
        require_run(conn, run_id)
        rows, cursor = keyset_page(
            conn,
            req.query,
            select=_EPISODES_SQL,
            where=[],
            args=[_UNSCORED, run_id],
            scope=f"viewer-episodes:{run_id}",
            filters={"sort": sort},
            keys=(key, "seq"),
            key_types=(float, int),
            descending=descending,
        )
    return json_response(200, {"items": [_episode_row(r) for r in rows], "next_cursor": cursor})


ROUTES = [
    route("GET", "/_viewer/runs", list_viewer_runs),
    route("GET", "/_viewer/runs/{run_id}/episodes", list_run_episodes),
]
