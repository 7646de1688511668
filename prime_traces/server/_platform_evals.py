"""Evaluations: the platform's eval run routes (contract §10), played by the local service.

- ``POST /evaluations/`` (the trailing slash is optional) with ``{"name",
  "environments": [{"id", "version_id"?}], "tags", "model_name"?,
  "dataset"?, "framework"?, "description"?, "metadata"?, "team_id"?}``
  creates a running ``eval`` run (``eval-`` and 12 hex digits; ``metadata``
  is its config) and answers 201 with the evaluation.
- ``PUT /evaluations/{id}`` with ``{"metadata"?, "metrics"?}`` replaces the
  config with ``metadata`` (the whole config document) and merges
  ``metrics`` into the summary (top-level keys replace), whatever the run's
  status; with ``{"status": "FAILED"|"CANCELLED", "error_message"?}`` it
  closes the run as ``failed``/``cancelled``. A status on a run that is
  already closed is 409 ``run_finished`` and changes nothing, the rest of
  that body included.
- ``POST /evaluations/{id}/finalize`` with ``{"metrics"}`` completes the run
  and merges ``metrics`` into its summary. Finalizing a completed run again
  is 200 and changes nothing; a run closed otherwise is 409.
- ``POST /evaluations/{id}/samples`` with ``{"samples": [...]}`` (a body of
  at most 25 MiB) stores the legacy sample rows and answers
  ``{"evaluation_id", "samples_pushed", "status"}``.
- ``GET /api/v1/runs/{id}/samples?limit=&cursor=`` (a local addition, not
  on the internal root) pages them back, oldest first, as ``{"items":
  [{"sample_id", "pushed_at", "sample"}], "next_cursor"}``.

The evaluation as answered: ``evaluation_id`` (also ``id``), ``name``,
``status`` in capitals, ``viewer_url`` (the viewer's page of the run),
what the run was created with, ``metadata`` (its config), ``metrics`` (its
summary), ``error_message``, ``created_at`` and ``finished_at``.

Choices where the contract leaves room: statuses are read without regard
to case; ``error_message`` is at most 4,096 characters (what the SDK
sends), and needs a status. A sample row that has a ``sample_id`` (a string
or an integer) replaces the stored row of the same run and id, so a batch
sent again stores nothing twice; rows without one are appended. Each sample
must be a JSON object.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from typing import Any

import orjson

from prime_traces.server import _models as m
from prime_traces.server._http import Request, Response, json_response, platform_routes, route
from prime_traces.server._metrics import require_run
from prime_traces.server._pages import keyset_page
from prime_traces.server._platform import (
    MAX_NAME_CHARS,
    close_run,
    environment_refs,
    insert_run,
    invalid,
    json_field,
    json_object,
    merged,
    platform_status,
    recorded_status,
    required_string,
    run_of_kind,
    string,
    string_list,
    update_run,
    viewer_url,
)
from prime_traces.server._runs import new_run_id

logger = logging.getLogger(__name__)

MAX_ERROR_MESSAGE_CHARS = 4096
MAX_SAMPLES_BODY_BYTES = 25 * 1024 * 1024
#: The platform's status of a closed evaluation, and the lifecycle status it sets.
CLOSING_STATUSES = {"FAILED": "failed", "CANCELLED": "cancelled"}
_OPTIONAL_FIELDS = ("model_name", "dataset", "framework", "description", "team_id")
_UPSERT_SAMPLE = (
    "INSERT INTO eval_samples (run_id, sample_id, sample, pushed_at, producer) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (run_id, sample_id) DO UPDATE SET "
    "sample = excluded.sample, pushed_at = excluded.pushed_at, producer = excluded.producer"
)


def _view(req: Request, row: sqlite3.Row) -> dict[str, Any]:
    platform = orjson.loads(row["platform"] or "{}")
    return {
        "evaluation_id": row["run_id"],
        "id": row["run_id"],
        "name": row["name"],
        "status": platform_status(row["status"]),
        "eval_type": "environment",
        "viewer_url": viewer_url(req, row["run_id"]),
        "environments": platform.get("environments", []),
        **{name: platform.get(name) for name in _OPTIONAL_FIELDS},
        "tags": orjson.loads(row["tags"]),
        "metadata": orjson.loads(row["config"]),
        "metrics": orjson.loads(row["summary"]),
        "error_message": row["error"],
        "created_at": m.iso(row["created_at"]),
        "finished_at": m.iso(row["finished_at"]) if row["finished_at"] is not None else None,
    }


def create_evaluation(req: Request) -> Response:
    body = json_object(req)
    name = required_string(body, "name", max_chars=MAX_NAME_CHARS)
    platform: dict[str, Any] = {"api": "evaluations", "environments": environment_refs(body)}
    for field in _OPTIONAL_FIELDS:
        value = string(body, field)
        if value is not None:
            platform[field] = value
    tags = string_list(body, "tags")
    config = json_field(body, "metadata") or {}
    with req.state.store.writer() as conn:
        row = insert_run(
            conn,
            new_run_id(conn, "eval"),
            name=name,
            kind="eval",
            config=config,
            tags=tags,
            producer=req.producer,
            platform=platform,
        )
    return json_response(201, _view(req, row))


def _closing_status(body: dict[str, Any]) -> tuple[str | None, str | None]:
    status = string(body, "status")
    error = string(body, "error_message", max_chars=MAX_ERROR_MESSAGE_CHARS)
    if status is None:
        if error is not None:
            raise invalid("error_message needs a status: FAILED or CANCELLED")
        return None, None
    closing = CLOSING_STATUSES.get(status.upper())
    if closing is None:
        raise invalid(
            f"status must be one of {', '.join(CLOSING_STATUSES)}, not {status!r} "
            "(a completed evaluation is finished with POST /evaluations/{id}/finalize)"
        )
    return closing, error


def update_evaluation(req: Request) -> Response:
    run_id = req.params["run_id"]
    body = json_object(req)
    config = json_field(body, "metadata")
    summary = json_field(body, "metrics")
    status, error = _closing_status(body)
    with req.state.store.writer() as conn:
        row = run_of_kind(conn, run_id, "eval", adopt=True)
        assert row is not None  # adopt=True
        changes: dict[str, Any] = {}
        if config is not None:
            changes["config"] = orjson.dumps(config).decode()
        if summary:
            changes["summary"] = merged(row["summary"], summary)
        if status is not None:
            row = close_run(conn, row, recorded_status(status, error), error, again_is_ok=False, **changes)
        else:
            row = update_run(conn, run_id, **changes)
    return json_response(200, _view(req, row))


def finalize_evaluation(req: Request) -> Response:
    run_id = req.params["run_id"]
    metrics = json_field(json_object(req), "metrics") or {}
    with req.state.store.writer() as conn:
        row = run_of_kind(conn, run_id, "eval", adopt=True)
        assert row is not None  # adopt=True
        row = close_run(conn, row, "completed", None, again_is_ok=True, summary=merged(row["summary"], metrics))
    return json_response(200, _view(req, row))


def _sample_id(sample: dict[str, Any]) -> str | None:
    value = sample.get("sample_id")
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return None
    return str(value)


def push_samples(req: Request) -> Response:
    run_id = req.params["run_id"]
    samples = json_object(req, max_bytes=MAX_SAMPLES_BODY_BYTES).get("samples")
    if not isinstance(samples, list):
        raise invalid('the body must be {"samples": [...]}, a list of sample objects')
    for index, sample in enumerate(samples):
        if not isinstance(sample, dict):
            raise invalid(f"samples[{index}] must be an object, not {type(sample).__name__}")
    now = time.time()
    rows = [(run_id, _sample_id(s), orjson.dumps(s).decode(), now, req.producer) for s in samples]
    with req.state.store.writer() as conn:
        row = run_of_kind(conn, run_id, "eval", adopt=False)
        conn.executemany(_UPSERT_SAMPLE, rows)
    logger.debug("evaluation %r: %d samples pushed", run_id, len(rows))
    return json_response(
        200,
        {
            "evaluation_id": run_id,
            "samples_pushed": len(rows),
            "status": platform_status(row["status"]) if row is not None else None,
        },
    )


def list_samples(req: Request) -> Response:
    run_id = req.params["run_id"]
    with req.state.store.reader() as conn:
        conn.execute("BEGIN")
        require_run(conn, run_id)
        rows, cursor = keyset_page(
            conn,
            req.query,
            select="SELECT seq, sample_id, sample, pushed_at FROM eval_samples",
            where=["run_id = ?"],
            args=[run_id],
            scope=f"eval-samples:{run_id}",
            filters={},
            keys=("seq", "seq"),
            key_types=(int, int),
            descending=False,
        )
    items = [
        {"sample_id": r["sample_id"], "pushed_at": m.iso(r["pushed_at"]), "sample": orjson.loads(r["sample"])}
        for r in rows
    ]
    return json_response(200, {"items": items, "next_cursor": cursor})


ROUTES = [
    *platform_routes("POST", "/evaluations/?", create_evaluation),
    *platform_routes("PUT", "/evaluations/{run_id}", update_evaluation),
    *platform_routes("POST", "/evaluations/{run_id}/finalize", finalize_evaluation),
    *platform_routes("POST", "/evaluations/{run_id}/samples", push_samples),
    route("GET", "/runs/{run_id}/samples", list_samples),
]
