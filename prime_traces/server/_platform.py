"""What the platform's run routes (contract §10) share: bodies, runs of a kind, closing a run.

The local service plays the hosted platform's run routes, so that the
published prime-runs SDK, and any client built for the platform, runs
against it unchanged: the environments hub (``_platform_hub``), evaluations
(``_platform_evals``), external training runs (``_platform_rft``) and their
legacy training samples (``_platform_files``). Each route answers under
``/api/v1`` and under the internal root ``/api/internal``, where the token
may also come in ``x-api-key`` (``_listener``).

The runs these routes create are rows of ``runs``, like those of ``POST
/runs`` (§9): ``GET /runs``, ``GET /runs/{id}``, the metrics history and
the viewer show them alike, and traces whose ``run.id`` is their id attach
to them. The column ``platform`` keeps what the routes were told that has
no column of its own (environments, model, team, ...).

Choices where the contract leaves room:

- Every error is the envelope ``{"error": {"code", "message"}}``: a body
  that is not what the route takes is 400 ``invalid_run`` naming the field;
  an unknown run is 404 ``run_not_found``; closing a run that is already
  closed is 409 ``run_finished`` (the platform's "already closed").
- The evaluation routes serve runs of kind ``eval``, the training routes
  runs of kind ``train``; a run of the other kind is 404 there, as on the
  platform, which keeps the two apart. A run whose kind is unknown is served
  by both, and takes the kind of the first route that updates it.
- A run known only from its traces (attached with an id nobody created
  here) gets its lifecycle row on its first update, as with ``PATCH /runs``;
  routes that only add data to it (metrics, samples) do not create one.
- Statuses are stored as the §9 lifecycle spells them (``running``,
  ``completed``, ...) and answered in the platform's capitals (``RUNNING``).
"""

from __future__ import annotations

import logging
import sqlite3
import time
from typing import Any
from urllib.parse import quote

import orjson

from prime_traces.errors import ErrorCode
from prime_traces.server._http import HTTPError, Request
from prime_traces.server._runs import RUN_KINDS, TERMINAL_STATUSES, adopt_traced_run, insert_run_row

logger = logging.getLogger(__name__)

MAX_NAME_CHARS = 256
_ROUTES_OF_KIND = {"eval": "/evaluations", "train": "/rft"}


# -- bodies --------------------------------------------------------------------


def invalid(message: str) -> HTTPError:
    return HTTPError(400, ErrorCode.INVALID_RUN, message)


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def json_object(req: Request, max_bytes: int | None = None) -> dict[str, Any]:
    """The request's JSON object body; 400 ``invalid_run`` for anything else."""
    body = req.json_body() if max_bytes is None else req.json_body(max_bytes=max_bytes)
    if not isinstance(body, dict):
        raise invalid(f"the body must be a JSON object, not {_type_name(body)}")
    return body


def string(body: dict[str, Any], name: str, *, max_chars: int | None = None, where: str = "") -> str | None:
    """``body[name]`` as a string, or None when absent or null; ``where`` prefixes the name in errors."""
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise invalid(f"{where}{name} must be a string, not {_type_name(value)}")
    if max_chars is not None and len(value) > max_chars:
        raise invalid(f"{where}{name} is {len(value):,} characters; at most {max_chars:,} are accepted")
    return value


def required_string(body: dict[str, Any], name: str, *, max_chars: int | None = None, where: str = "") -> str:
    """``body[name]`` as a non-empty string; 400 when absent, null or empty."""
    value = string(body, name, max_chars=max_chars, where=where)
    if not value:
        raise invalid(f"{where}{name} is required: a non-empty string")
    return value


def integer(body: dict[str, Any], name: str, *, required: bool = False, minimum: int = 0) -> int | None:
    """``body[name]`` as an integer of at least ``minimum`` (not a boolean), or None when absent."""
    value = body.get(name)
    if value is None:
        if required:
            raise invalid(f"{name} is required")
        return None
    if type(value) is not int or value < minimum or value >= 2**63:
        raise invalid(f"{name} must be an integer of at least {minimum}, not {value!r}")
    return value


def json_field(body: dict[str, Any], name: str) -> dict[str, Any] | None:
    """``body[name]`` as a JSON object, or None when absent or null."""
    value = body.get(name)
    if value is not None and not isinstance(value, dict):
        raise invalid(f"{name} must be a JSON object, not {_type_name(value)}")
    return value


def string_list(body: dict[str, Any], name: str) -> list[str]:
    value = body.get(name)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise invalid(f"{name} must be a list of strings")
    return value


def environment_refs(body: dict[str, Any]) -> list[dict[str, str]]:
    """``environments``: a list of ``{"id", "version_id"?}`` (other keys are left out)."""
    value = body.get("environments")
    if not isinstance(value, list):
        raise invalid(f'environments must be a list of {{"id": ...}} objects, not {_type_name(value)}')
    refs = []
    for index, entry in enumerate(value):
        if not isinstance(entry, dict):
            raise invalid(f"environments[{index}] must be an object, not {_type_name(entry)}")
        where = f"environments[{index}]."
        ref = {"id": required_string(entry, "id", max_chars=MAX_NAME_CHARS, where=where)}
        version = string(entry, "version_id", max_chars=MAX_NAME_CHARS, where=where)
        if version is not None:
            ref["version_id"] = version
        refs.append(ref)
    return refs


# -- runs ----------------------------------------------------------------------


def _not_found(run_id: str) -> HTTPError:
    return HTTPError(404, ErrorCode.RUN_NOT_FOUND, f"run {run_id!r} not found")


def _other_kind(run_id: str, kind: str, wanted: str) -> HTTPError:
    return HTTPError(
        404,
        ErrorCode.RUN_NOT_FOUND,
        f"run {run_id!r} is a {kind} run; {_ROUTES_OF_KIND[wanted]} serves {wanted} runs only "
        f"(use {_ROUTES_OF_KIND[kind]})",
    )


def select_run(conn: sqlite3.Connection, run_id: str) -> sqlite3.Row | None:
    return conn.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()


def run_of_kind(conn: sqlite3.Connection, run_id: str, kind: str, *, adopt: bool) -> sqlite3.Row | None:
    """The lifecycle row of ``run_id``, a run of ``kind`` or of no known kind; else 404.

    A run known only from its traces gets its lifecycle row now when
    ``adopt`` (the caller is about to update it), else the answer is None.
    A run of no known kind that is adopted takes ``kind``.
    """
    row = select_run(conn, run_id)
    if row is None:
        first = conn.execute("SELECT run_type FROM traces WHERE run_id = ? ORDER BY seq LIMIT 1", (run_id,)).fetchone()
        if first is None:
            raise _not_found(run_id)
        if first["run_type"] in RUN_KINDS and first["run_type"] != kind:
            raise _other_kind(run_id, first["run_type"], kind)
        if not adopt:
            return None
        row = adopt_traced_run(conn, run_id)
        assert row is not None  # it has a trace, checked above
    elif row["kind"] in RUN_KINDS and row["kind"] != kind:
        raise _other_kind(run_id, row["kind"], kind)
    if adopt and row["kind"] is None:
        row = update_run(conn, run_id, kind=kind)
    return row


def insert_run(
    conn: sqlite3.Connection,
    run_id: str,
    *,
    name: str | None,
    kind: str,
    config: dict[str, Any],
    tags: list[str],
    producer: str,
    platform: dict[str, Any],
) -> sqlite3.Row:
    """A new running run's lifecycle row, with what the platform's routes were told of it."""
    insert_run_row(conn, run_id, name=name, kind=kind, config=config, tags=tags, producer=producer, platform=platform)
    logger.info("created %s run %r (%s) through the platform routes", kind, run_id, name)
    row = select_run(conn, run_id)
    assert row is not None
    return row


def update_run(conn: sqlite3.Connection, run_id: str, **changes: Any) -> sqlite3.Row:
    """Set ``changes`` (column: value) on the run's row and read it back."""
    if changes:
        assignments = ", ".join(f"{column} = ?" for column in changes)
        conn.execute(f"UPDATE runs SET {assignments} WHERE run_id = ?", (*changes.values(), run_id))
    row = select_run(conn, run_id)
    assert row is not None
    return row


def merged(text: str | None, values: dict[str, Any]) -> str:
    """The JSON object ``text`` with ``values`` merged in (top-level keys replace)."""
    return orjson.dumps({**orjson.loads(text or "{}"), **values}).decode()


def close_run(
    conn: sqlite3.Connection,
    row: sqlite3.Row,
    status: str,
    error: str | None,
    *,
    again_is_ok: bool,
    **changes: Any,
) -> sqlite3.Row:
    """Give a run its terminal ``status`` (and ``changes``), or 409 ``run_finished`` if it has one.

    With ``again_is_ok`` the status it already has is a success that changes
    nothing (a replayed finalize); any other terminal status is refused.
    """
    current = row["status"]
    if current in TERMINAL_STATUSES:
        if again_is_ok and current == status:
            return row
        raise HTTPError(
            409,
            ErrorCode.RUN_FINISHED,
            f"run {row['run_id']!r} is already closed ({current}); it cannot become {status}",
        )
    logger.info("run %r finished as %s", row["run_id"], status)
    return update_run(conn, row["run_id"], status=status, error=error, finished_at=time.time(), **changes)


# -- answers -------------------------------------------------------------------


def recorded_status(status: str, error: str | None) -> str:
    """The status to keep for a closing: the platform knows only failed, but its messages say more.

    A client marks a crash ``failed`` with ``crashed: ...`` (and, for a
    training run, a cancel with ``cancelled: ...``): kept here as what it was.
    """
    if status == "failed" and error:
        for kind in ("crashed", "cancelled"):
            if error == kind or error.startswith(kind + ":"):
                return kind
    return status


def platform_status(status: str) -> str:
    """A lifecycle status as the platform spells it: ``RUNNING``, ``COMPLETED``, ..."""
    return status.upper()


def viewer_url(req: Request, run_id: str) -> str:
    """The viewer's page of the run, or its ``GET /runs/{id}`` when the viewer is not served."""
    segment = quote(run_id, safe="")
    if req.state.ui:
        return f"{req.base_url()}/#/run/{segment}"
    return f"{req.base_url()}/api/v1/runs/{segment}"
