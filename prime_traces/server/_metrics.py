"""Run metrics history (contract §9): rows in, pages of rows and a summary out.

``POST /runs/{id}/metrics`` takes ``{"rows": [{"step", "time", "metrics"}]}``
and stores it in one transaction; ``GET /runs/{id}/metrics`` pages it back in
the same row shape; ``GET /runs/{id}`` shows :func:`metrics_summary`. A run is
known when it has a lifecycle row or a stored trace (as ``GET /runs/{id}``
decides); any other run id is 404 ``run_not_found``. Posting never creates
the run's lifecycle row.

Storage: one ``run_metrics`` row per stepped ``(run, step)`` and one per
unstepped post, its metrics a JSON object in text.

Choices where the contract leaves room:

- A stepped row merges into the stored row of its step: the names it carries
  replace the stored values, other names stay, and the row's ``time`` is the
  later of the two. Rows of the same step within one request merge in request
  order. A replay therefore changes nothing (and writes nothing).
- ``accepted`` counts every row of a valid request, replayed ones included; a
  request with one invalid row stores nothing.
- Bodies: at most 10,000 rows and 64 MiB. ``step`` is an integer in the int64
  range, or null or missing; ``time`` a finite number, required; ``metrics``
  an object (any string is a name, ``""`` included, as the contract says)
  whose values are numbers, booleans, strings or null. Other row keys are ignored. Any other body is
  400 ``invalid_run`` (the code of the other run endpoints) naming the row
  (``rows[3]``, 0-based) and the name.
- Order of ``GET``: stepped rows by step, then unstepped rows by time, then
  storage order. ``min_step``/``max_step`` are inclusive and leave out the
  unstepped rows (they have no step to compare); ``min_step`` above
  ``max_step`` is 400 ``invalid_filter``. ``names=a,b`` (the parameter may also
  repeat) keeps those names in each row and skips rows that carry none of
  them; the empty name and names containing ``,`` cannot be asked for
  this way (empty pieces are dropped; no name at all is ``invalid_filter``).
- Bad query values are 400 ``invalid_filter``; ``limit`` outside 1..10,000 is
  refused, not clamped. The cursor is opaque, bound to the run and filters.
- The summary follows the ``GET`` order: a name's ``last`` is its value in the
  last row carrying it (so an unstepped row, which sorts after every stepped
  one, wins over them), ``last_step`` that row's step (null for an unstepped
  row). ``min``/``max`` range over numbers only (not booleans, and not the
  strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``); null when there are none.
  Only ``GET /runs/{id}`` carries it, not the runs list.
"""

from __future__ import annotations

import logging
import math
import sqlite3
from typing import Any

import orjson

from prime_traces.errors import ErrorCode
from prime_traces.server import _models as m
from prime_traces.server._http import HTTPError, Request, Response, json_response, route
from prime_traces.server._pages import decode_cursor, encode_cursor, page_limit

logger = logging.getLogger(__name__)

MAX_ROWS_PER_REQUEST = 10_000
MAX_METRICS_BODY_BYTES = 64 * 1024 * 1024
DEFAULT_ROWS_PER_PAGE = 1_000
MAX_ROWS_PER_PAGE = 10_000
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_MISSING = object()
# Cursor key: [0, step, time] after a stepped row, [1, seq, time] after an unstepped one.
_CURSOR_TYPES = (int, int, float)
_STEPPED, _UNSTEPPED = 0, 1

_KNOWN_RUN = "SELECT EXISTS (SELECT 1 FROM runs WHERE run_id = ?) OR EXISTS (SELECT 1 FROM traces WHERE run_id = ?)"
_NAMES_CLAUSE = "EXISTS (SELECT 1 FROM json_each(metrics) AS n WHERE n.key IN (SELECT value FROM json_each(?)))"

Row = tuple[int | None, float, dict[str, Any]]


def require_run(conn: sqlite3.Connection, run_id: str) -> None:
    """404 ``run_not_found`` unless ``run_id`` has a lifecycle row or a stored trace."""
    if not conn.execute(_KNOWN_RUN, (run_id, run_id)).fetchone()[0]:
        raise HTTPError(404, ErrorCode.RUN_NOT_FOUND, f"run {run_id!r} not found")


# -- validation --------------------------------------------------------------


def _invalid(message: str) -> HTTPError:
    return HTTPError(400, ErrorCode.INVALID_RUN, message)


def _kind(value: Any) -> str:
    if value is _MISSING:
        return "missing"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    return "an object" if isinstance(value, dict) else "a list"


def _is_value(value: Any) -> bool:
    if value is None or isinstance(value, (str, bool, int)):
        return True
    # orjson never yields a non-finite float; this guards any other caller.
    return isinstance(value, float) and math.isfinite(value)


def _row(index: int, row: Any) -> Row:
    where = f"rows[{index}]"
    if not isinstance(row, dict):
        raise _invalid(f"{where} must be an object, not {_kind(row)}")
    step = row.get("step")
    if step is not None and (type(step) is not int or not INT64_MIN <= step <= INT64_MAX):
        raise _invalid(f"{where}.step must be an integer in the int64 range or null, not {_kind(step)}")
    when = row.get("time", _MISSING)
    if type(when) not in (int, float) or not math.isfinite(when):
        raise _invalid(f"{where}.time must be a finite number (epoch seconds), not {_kind(when)}")
    metrics = row.get("metrics", _MISSING)
    if not isinstance(metrics, dict):
        raise _invalid(f"{where}.metrics must be an object, not {_kind(metrics)}")
    for name, value in metrics.items():
        if not _is_value(value):
            raise _invalid(
                f"{where}.metrics[{name!r}] must be a number, boolean, string or null, "
                f'not {_kind(value)} (non-finite floats travel as "NaN", '
                '"Infinity", "-Infinity")'
            )
    return step, float(when), metrics


def parse_rows(body: Any) -> list[Row]:
    """The rows of a ``POST /runs/{id}/metrics`` body; 400 ``invalid_run`` at the first bad one."""
    if not isinstance(body, dict):
        raise _invalid(f"the body must be an object with a rows list, not {_kind(body)}")
    rows = body.get("rows", _MISSING)
    if not isinstance(rows, list):
        raise _invalid(f"rows must be a list, not {_kind(rows)}")
    if len(rows) > MAX_ROWS_PER_REQUEST:
        raise _invalid(
            f"at most {MAX_ROWS_PER_REQUEST:,} rows a request, not {len(rows):,}; send them in several requests"
        )
    return [_row(index, row) for index, row in enumerate(rows)]


# -- writes ------------------------------------------------------------------


def _dumps(metrics: dict[str, Any]) -> str:
    return orjson.dumps(metrics).decode()


def _merge_stepped(conn: sqlite3.Connection, run_id: str, stepped: dict[int, tuple[float, dict[str, Any]]]) -> int:
    """Merge each step's row into the stored one; returns how many rows changed."""
    stored = {
        r["step"]: (r["time"], r["metrics"])
        for r in conn.execute(
            "SELECT step, time, metrics FROM run_metrics WHERE run_id = ? AND step IN (SELECT value FROM json_each(?))",
            (run_id, orjson.dumps(list(stepped))),
        )
    }
    inserts, updates = [], []
    for step, (when, metrics) in stepped.items():
        if step not in stored:
            inserts.append((run_id, step, when, _dumps(metrics)))
            continue
        old_time, old_text = stored[step]
        merged_time = max(old_time, when)
        # Compare the JSON text, not the dicts: 1 == 1.0 == True in Python.
        merged_text = _dumps({**orjson.loads(old_text), **metrics})
        if merged_time != old_time or merged_text != old_text:
            updates.append((merged_time, merged_text, run_id, step))
    conn.executemany("INSERT INTO run_metrics (run_id, step, time, metrics) VALUES (?, ?, ?, ?)", inserts)
    conn.executemany("UPDATE run_metrics SET time = ?, metrics = ? WHERE run_id = ? AND step = ?", updates)
    return len(inserts) + len(updates)


def store_rows(conn: sqlite3.Connection, run_id: str, rows: list[Row]) -> int:
    """Store valid ``rows`` of ``run_id`` inside the caller's transaction; returns how many rows changed.

    Stepped rows merge into their step's row (rows of one step merge in
    order first); unstepped rows are appended.
    """
    stepped: dict[int, tuple[float, dict[str, Any]]] = {}
    unstepped: list[tuple[str, float, str]] = []
    for step, when, metrics in rows:
        if step is None:
            unstepped.append((run_id, when, _dumps(metrics)))
        elif step in stepped:
            earlier_time, earlier = stepped[step]
            stepped[step] = (max(earlier_time, when), {**earlier, **metrics})
        else:
            stepped[step] = (when, metrics)
    changed = _merge_stepped(conn, run_id, stepped) if stepped else 0
    conn.executemany("INSERT INTO run_metrics (run_id, step, time, metrics) VALUES (?, NULL, ?, ?)", unstepped)
    return changed + len(unstepped)


def post_metrics(req: Request) -> Response:
    run_id = req.params["run_id"]
    rows = parse_rows(req.json_body(max_bytes=MAX_METRICS_BODY_BYTES))
    with req.state.store.writer() as conn:
        require_run(conn, run_id)
        changed = store_rows(conn, run_id, rows)
    logger.debug("run %r: %d metric rows accepted, %d stored rows changed", run_id, len(rows), changed)
    return json_response(200, {"accepted": len(rows)})


# -- reads -------------------------------------------------------------------


def _names(query: dict[str, list[str]]) -> list[str] | None:
    if "names" not in query:
        return None
    names = sorted({name for value in query["names"] for name in value.split(",") if name})
    if not names:
        raise m.bad_filter("names needs at least one metric name: names=a,b")
    return names


def _step_filter(query: dict[str, list[str]], name: str) -> int | None:
    step = m.as_int(query, name)
    if step is not None and not INT64_MIN <= step <= INT64_MAX:
        raise m.bad_filter(f"{name} must be in the int64 range, not {step}")
    return step


def _cursor(token: str, scope: str, filters: dict[str, Any]) -> list[Any]:
    key = decode_cursor(token, scope, filters, _CURSOR_TYPES)
    if key[0] not in (_STEPPED, _UNSTEPPED) or not INT64_MIN <= key[1] <= INT64_MAX:
        raise HTTPError(400, ErrorCode.INVALID_CURSOR, "cursor is not one this service issued")
    key[2] = float(key[2])  # an int there would overflow SQLite's binding past int64
    return key


def _select(conn: sqlite3.Connection, where: list[str], args: list[Any], order: str, count: int) -> list[sqlite3.Row]:
    sql = f"SELECT seq, step, time, metrics FROM run_metrics WHERE {' AND '.join(where)} ORDER BY {order} LIMIT ?"
    return conn.execute(sql, [*args, count]).fetchall()


def _page(
    conn: sqlite3.Connection,
    run_id: str,
    names: list[str] | None,
    min_step: int | None,
    max_step: int | None,
    after: list[Any] | None,
    count: int,
) -> list[sqlite3.Row]:
    """Up to ``count`` rows after ``after``: the stepped ones, then the unstepped ones."""
    common = ["run_id = ?"]
    common_args: list[Any] = [run_id]
    if names is not None:
        common.append(_NAMES_CLAUSE)
        common_args.append(orjson.dumps(names).decode())
    rows: list[sqlite3.Row] = []
    if after is None or after[0] == _STEPPED:
        where, args = [*common, "step IS NOT NULL"], list(common_args)
        after_step = after[1] if after is not None else None
        for clause, bound in (("step > ?", after_step), ("step >= ?", min_step), ("step <= ?", max_step)):
            if bound is not None:
                where.append(clause)
                args.append(bound)
        rows = _select(conn, where, args, "step", count)
    if len(rows) < count and min_step is None and max_step is None:
        where, args = [*common, "step IS NULL"], list(common_args)
        if after is not None and after[0] == _UNSTEPPED:
            where.append("(time > ? OR (time = ? AND seq > ?))")
            args += [after[2], after[2], after[1]]
        rows += _select(conn, where, args, "time, seq", count - len(rows))
    return rows


def _render(row: sqlite3.Row, names: list[str] | None) -> dict[str, Any]:
    metrics = orjson.loads(row["metrics"])
    if names is not None:
        metrics = {name: metrics[name] for name in names if name in metrics}
    return {"step": row["step"], "time": row["time"], "metrics": metrics}


def get_metrics(req: Request) -> Response:
    run_id, query = req.params["run_id"], req.query
    names = _names(query)
    min_step, max_step = _step_filter(query, "min_step"), _step_filter(query, "max_step")
    if min_step is not None and max_step is not None and min_step > max_step:
        raise m.bad_filter(f"min_step ({min_step}) is above max_step ({max_step})")
    limit = page_limit(query, DEFAULT_ROWS_PER_PAGE, MAX_ROWS_PER_PAGE)
    scope = f"metrics:{run_id}"
    filters = {"names": names, "min_step": min_step, "max_step": max_step}
    token = m.one(query, "cursor")
    after = _cursor(token, scope, filters) if token else None
    with req.state.store.reader() as conn:
        conn.execute("BEGIN")  # one snapshot for both halves of the page
        require_run(conn, run_id)
        rows = _page(conn, run_id, names, min_step, max_step, after, limit + 1)
    next_cursor = None
    if len(rows) > limit:
        rows = rows[:limit]
        last = rows[-1]
        key = (
            [_STEPPED, last["step"], last["time"]]
            if last["step"] is not None
            else [_UNSTEPPED, last["seq"], last["time"]]
        )
        next_cursor = encode_cursor(scope, filters, key)
    return json_response(200, {"rows": [_render(r, names) for r in rows], "next_cursor": next_cursor})


# -- the run summary's "metrics" -----------------------------------------------


def metrics_summary(conn: sqlite3.Connection, run_id: str) -> dict[str, dict[str, Any]]:
    """``{name: {"last", "min", "max", "count", "last_step"}}`` over the run's history."""
    summary: dict[str, dict[str, Any]] = {}
    rows = conn.execute(
        "SELECT step, metrics FROM run_metrics WHERE run_id = ? ORDER BY step IS NULL, step, time, seq", (run_id,)
    )
    for step, text in rows:
        for name, value in orjson.loads(text).items():
            entry = summary.get(name)
            if entry is None:
                entry = summary[name] = {"last": None, "min": None, "max": None, "count": 0, "last_step": None}
            entry["last"], entry["last_step"] = value, step
            entry["count"] += 1
            if type(value) in (int, float):
                if entry["min"] is None or value < entry["min"]:
                    entry["min"] = value
                if entry["max"] is None or value > entry["max"]:
                    entry["max"] = value
    return summary


ROUTES = [
    route("POST", "/runs/{run_id}/metrics", post_metrics),
    route("GET", "/runs/{run_id}/metrics", get_metrics),
]
