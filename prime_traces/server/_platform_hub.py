"""The platform's environments hub, played locally (contract §10): slugs and names to ids.

- ``GET /environmentshub/{owner}/{name}/@latest`` resolves a published
  ``owner/name`` slug;
- ``POST /environmentshub/resolve`` with ``{"name", "team_id"?}`` resolves
  an environment by name for a team.

Both answer 200 ``{"data": {"id", "owner", "name", "team_id",
"created_at"}}``. There is no hub here to look anything up in, so both get
or create a row of ``environments``: the same slug, or the same name for the
same team, always gets the same id (``env-`` and 12 hex digits), and a
replayed request changes nothing.

Choices where the contract leaves room:

- A slug is one environment whichever team asks for it; a name given to
  ``resolve`` belongs to its team (an absent, null or empty ``team_id`` is
  no team). A name that is itself a slug (``owner/name``, one ``/``, both
  parts non-empty) resolves to that slug's environment.
- Owners and names are 1..256 characters; ``owner`` and ``team_id`` are
  null in the answer when there is none.
"""

from __future__ import annotations

import logging
import secrets
import sqlite3
import time
from typing import Any

from prime_traces.server import _models as m
from prime_traces.server._http import Request, Response, json_response, platform_routes
from prime_traces.server._platform import MAX_NAME_CHARS, invalid, json_object, required_string, string

logger = logging.getLogger(__name__)


def _check(value: str, what: str) -> str:
    if not value or len(value) > MAX_NAME_CHARS:
        raise invalid(f"{what} must be 1..{MAX_NAME_CHARS} characters, not {value[:40]!r}")
    return value


def _view(row: sqlite3.Row) -> dict[str, Any]:
    return {
        "data": {
            "id": row["env_id"],
            "owner": row["owner"] or None,
            "name": row["name"],
            "team_id": row["team_id"] or None,
            "created_at": m.iso(row["created_at"]),
        }
    }


def get_or_create(req: Request, owner: str, name: str, team_id: str) -> dict[str, Any]:
    """The environment ``(owner, name, team_id)`` (``''`` for none), created if new, as answered."""
    key = (owner, name, team_id)
    with req.state.store.writer() as conn:
        row = conn.execute("SELECT * FROM environments WHERE owner = ? AND name = ? AND team_id = ?", key).fetchone()
        if row is None:
            while True:
                env_id = f"env-{secrets.token_hex(6)}"
                if conn.execute("SELECT 1 FROM environments WHERE env_id = ?", (env_id,)).fetchone() is None:
                    break
            conn.execute(
                "INSERT INTO environments (env_id, owner, name, team_id, created_at, created_by) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (env_id, *key, time.time(), req.producer),
            )
            logger.info("environment %r (owner %r, team %r) is %s", name, owner, team_id, env_id)
            row = conn.execute("SELECT * FROM environments WHERE env_id = ?", (env_id,)).fetchone()
    return _view(row)


def get_latest(req: Request) -> Response:
    owner = _check(req.params["owner"], "the owner")
    name = _check(req.params["name"], "the environment name")
    return json_response(200, get_or_create(req, owner, name, ""))


def resolve(req: Request) -> Response:
    body = json_object(req)
    name = required_string(body, "name", max_chars=2 * MAX_NAME_CHARS + 1)
    team_id = string(body, "team_id", max_chars=MAX_NAME_CHARS) or ""
    owner, slash, rest = name.partition("/")
    if slash and owner and rest and "/" not in rest:
        return json_response(200, get_or_create(req, _check(owner, "the owner"), _check(rest, "name"), ""))
    return json_response(200, get_or_create(req, "", _check(name, "name"), team_id))


ROUTES = [
    *platform_routes("GET", "/environmentshub/{owner}/{name}/@latest", get_latest),
    *platform_routes("POST", "/environmentshub/resolve", resolve),
]
