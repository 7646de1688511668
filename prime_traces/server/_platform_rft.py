"""External training runs: the platform's train run routes (contract §10), played locally.

- ``POST /rft/external-runs`` with ``{"base_model", "max_steps",
  "environments": [{"id"}], "team_id", "name"?, "batch_size"?,
  "rollouts_per_example"?, "seq_len"?, "run_config"?, "wandb_project"?,
  "wandb_entity"?, "wandb_run_name"?}`` creates a running ``train`` run
  (``train-`` and 12 hex digits; ``run_config`` is its config, the rest is
  kept in its ``platform`` field) and answers 201 ``{"run": {"id", "name",
  "status": "RUNNING", ...}}``.
- ``PUT /rft/external-runs/{id}/status`` with ``{"status":
  "completed"|"failed", "error_message"?}`` closes the run; a run that is
  already closed is 409 ``run_finished`` and keeps its status.
- ``POST /rft/finalize`` with ``{"run_id", "exit_code"}`` closes the run as
  ``completed`` (exit code 0) or ``failed`` (``exit code N``), and keeps the
  code in ``platform``. Finalizing it again with the same outcome is a
  success that changes nothing; a run closed otherwise is 409.
- ``POST /rft/metrics`` with ``{"run_id", "metrics": {..., "step"?,
  "_timestamp"?}}`` stores one row of the run's metrics history (the one
  ``GET /runs/{id}/metrics`` and the viewer's charts read) and answers
  ``{"data": {"status": "success"}}``.

Choices where the contract leaves room for the metrics:

- ``step`` is the row's step (an integer) and ``_timestamp`` its time
  (epoch seconds; now when absent). A row with a step merges into the stored
  row of that step, the names it carries replacing theirs, so the replay the
  SDK makes after an ambiguous failure changes nothing and a step keeps one
  row. A row without a step is appended, unless the history already holds an
  unstepped row with the same time and metrics: a replay of the same request.
- Nested objects flatten into names joined with ``/`` (``{"train": {"loss":
  1}}`` is ``train/loss``), as the SDK's own history does; a list, which no
  chart can draw, is kept as its JSON text. A row with no metric left is
  accepted and stores nothing.

Statuses are read without regard to case; ``exit_code`` may be left out
(it is then 0).
"""

from __future__ import annotations

import logging
import math
import sqlite3
import time
from typing import Any

import orjson

from prime_traces.server import _models as m
from prime_traces.server._http import Request, Response, json_response, platform_routes
from prime_traces.server._metrics import INT64_MAX, INT64_MIN, store_rows
from prime_traces.server._platform import (
    MAX_NAME_CHARS,
    close_run,
    environment_refs,
    insert_run,
    integer,
    invalid,
    json_field,
    json_object,
    merged,
    platform_status,
    recorded_status,
    required_string,
    run_of_kind,
    string,
    viewer_url,
)
from prime_traces.server._runs import new_run_id

logger = logging.getLogger(__name__)

#: The platform's statuses of a closed training run.
CLOSING_STATUSES = ("completed", "failed")
_SIZES = ("batch_size", "rollouts_per_example", "seq_len")
_WANDB = ("wandb_project", "wandb_entity", "wandb_run_name")
_SUCCESS = {"data": {"status": "success"}}


def _view(req: Request, row: sqlite3.Row) -> dict[str, Any]:
    return {
        **orjson.loads(row["platform"] or "{}"),
        "id": row["run_id"],
        "name": row["name"],
        "status": platform_status(row["status"]),
        "error_message": row["error"],
        "viewer_url": viewer_url(req, row["run_id"]),
        "created_at": m.iso(row["created_at"]),
        "finished_at": m.iso(row["finished_at"]) if row["finished_at"] is not None else None,
    }


def create_external_run(req: Request) -> Response:
    body = json_object(req)
    platform: dict[str, Any] = {
        "api": "rft",
        "base_model": required_string(body, "base_model", max_chars=MAX_NAME_CHARS),
        "max_steps": integer(body, "max_steps", required=True),
        "environments": environment_refs(body),
        "team_id": required_string(body, "team_id", max_chars=MAX_NAME_CHARS),
    }
    for size in _SIZES:
        value = integer(body, size, minimum=1)
        if value is not None:
            platform[size] = value
    for name in _WANDB:
        text = string(body, name)
        if text is not None:
            platform[name] = text
    run_name = string(body, "name", max_chars=MAX_NAME_CHARS)
    config = json_field(body, "run_config") or {}
    with req.state.store.writer() as conn:
        row = insert_run(
            conn,
            new_run_id(conn, "train"),
            name=run_name,
            kind="train",
            config=config,
            tags=[],
            producer=req.producer,
            platform=platform,
        )
    return json_response(201, {"run": _view(req, row)})


def update_status(req: Request) -> Response:
    run_id = req.params["run_id"]
    body = json_object(req)
    status = required_string(body, "status").lower()
    if status not in CLOSING_STATUSES:
        raise invalid(f"status must be one of {', '.join(CLOSING_STATUSES)}, not {body['status']!r}")
    error = string(body, "error_message")
    with req.state.store.writer() as conn:
        row = run_of_kind(conn, run_id, "train", adopt=True)
        assert row is not None  # adopt=True
        row = close_run(conn, row, recorded_status(status, error), error, again_is_ok=False)
    return json_response(200, {"run": _view(req, row)})


def finalize(req: Request) -> Response:
    body = json_object(req)
    run_id = required_string(body, "run_id")
    exit_code = integer(body, "exit_code", minimum=INT64_MIN) or 0
    status, error = ("completed", None) if exit_code == 0 else ("failed", f"exit code {exit_code}")
    with req.state.store.writer() as conn:
        row = run_of_kind(conn, run_id, "train", adopt=True)
        assert row is not None  # adopt=True
        platform = merged(row["platform"], {"exit_code": exit_code})
        row = close_run(conn, row, status, error, again_is_ok=True, platform=platform)
    return json_response(200, {**_SUCCESS, "run": _view(req, row)})


def _flatten(values: dict[str, Any], prefix: str, into: dict[str, Any]) -> dict[str, Any]:
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            _flatten(value, f"{name}/", into)
        elif isinstance(value, list):
            into[name] = orjson.dumps(value).decode()
        else:
            into[name] = value
    return into


def _metric_row(metrics: dict[str, Any]) -> tuple[int | None, float, dict[str, Any]]:
    """``(step, time, flat metrics)`` of one ``/rft/metrics`` record."""
    values = dict(metrics)
    step = values.pop("step", None)
    if step is not None and (type(step) is not int or not INT64_MIN <= step <= INT64_MAX):
        raise invalid(f"metrics.step must be an integer, not {step!r}")
    when = values.pop("_timestamp", None)
    if when is None:
        when = time.time()
    elif type(when) not in (int, float) or not math.isfinite(when):
        raise invalid(f"metrics._timestamp must be a number (epoch seconds), not {when!r}")
    return step, float(when), _flatten(values, "", {})


def post_metrics(req: Request) -> Response:
    body = json_object(req)
    run_id = required_string(body, "run_id")
    metrics = json_field(body, "metrics")
    if metrics is None:
        raise invalid("metrics is required: an object of metric names and values")
    step, when, flat = _metric_row(metrics)
    with req.state.store.writer() as conn:
        run_of_kind(conn, run_id, "train", adopt=False)
        replayed = (
            step is None
            and conn.execute(
                "SELECT 1 FROM run_metrics WHERE run_id = ? AND step IS NULL AND time = ? AND metrics = ?",
                (run_id, when, orjson.dumps(flat).decode()),
            ).fetchone()
            is not None
        )
        if flat and not replayed:
            store_rows(conn, run_id, [(step, when, flat)])
    return json_response(200, _SUCCESS)


ROUTES = [
    *platform_routes("POST", "/rft/external-runs", create_external_run),
    *platform_routes("PUT", "/rft/external-runs/{run_id}/status", update_status),
    *platform_routes("POST", "/rft/finalize", finalize),
    *platform_routes("POST", "/rft/metrics", post_metrics),
]
