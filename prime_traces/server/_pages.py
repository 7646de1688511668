"""Keyset pagination of the read API: page sizes, cursors, one page of a query.

A cursor is the urlsafe base64 of ``{"v": 1, "f": <filter hash>, "k": <key>}``
where the key is the sort key of the last item served and the hash covers the
endpoint's scope and its normalised filters (the page size is not a filter:
it may change from page to page). A cursor that is not one of ours, or that
was issued for other filters, is 400 ``invalid_cursor``; a page size outside
1..100 is 400 ``invalid_filter``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import sqlite3
from collections.abc import Sequence
from typing import Any

import orjson

from prime_traces.errors import ErrorCode
from prime_traces.server import _models as m
from prime_traces.server._http import HTTPError

DEFAULT_PAGE_LIMIT = 20
MAX_PAGE_LIMIT = 100
_CURSOR_VERSION = 1


def page_limit(query: dict[str, list[str]], default: int = DEFAULT_PAGE_LIMIT, maximum: int = MAX_PAGE_LIMIT) -> int:
    """``limit``: ``default`` when absent; anything but an integer in 1..``maximum`` is refused, not clamped."""
    limit = m.as_int(query, "limit")
    if limit is None:
        return default
    if not 1 <= limit <= maximum:
        raise m.bad_filter(f"limit must be between 1 and {maximum:,}, not {limit}")
    return limit


def keyset_page(
    conn: sqlite3.Connection,
    query: dict[str, list[str]],
    *,
    select: str,
    where: list[str],
    args: list[Any],
    scope: str,
    filters: dict[str, Any],
    keys: tuple[str, str] = ("created_at", "seq"),
    key_types: Sequence[type] = (float, int),
    descending: bool = True,
) -> tuple[list[sqlite3.Row], str | None]:
    """One page of ``select`` ordered by ``keys``, and the cursor of the next one.

    One row more than the page is fetched, so the last page has no cursor.
    """
    limit = page_limit(query)
    token = m.one(query, "cursor")
    where, args = list(where), list(args)
    first, second = keys
    op, direction = ("<", "DESC") if descending else (">", "ASC")
    if token:
        after, tie = decode_cursor(token, scope, filters, key_types)
        where.append(f"({first} {op} ? OR ({first} = ? AND {second} {op} ?))")
        args += [after, after, tie]
    sql = f"{select} WHERE {' AND '.join(where) or '1'} ORDER BY {first} {direction}, {second} {direction} LIMIT ?"
    rows = conn.execute(sql, [*args, limit + 1]).fetchall()
    if len(rows) <= limit:
        return rows, None
    rows = rows[:limit]
    return rows, encode_cursor(scope, filters, [rows[-1][first], rows[-1][second]])


def _filter_hash(scope: str, filters: dict[str, Any]) -> str:
    normalised = orjson.dumps([scope, filters], option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(normalised).hexdigest()[:32]


def encode_cursor(scope: str, filters: dict[str, Any], key: Sequence[Any]) -> str:
    payload = {"v": _CURSOR_VERSION, "f": _filter_hash(scope, filters), "k": list(key)}
    return base64.urlsafe_b64encode(orjson.dumps(payload)).decode("ascii").rstrip("=")


def decode_cursor(token: str, scope: str, filters: dict[str, Any], types: Sequence[type]) -> list[Any]:
    """The sort key inside ``token``; 400 ``invalid_cursor`` unless it fits these filters."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        payload = orjson.loads(raw)
    except (binascii.Error, ValueError):
        raise HTTPError(400, ErrorCode.INVALID_CURSOR, "cursor is not one this service issued") from None
    if not isinstance(payload, dict):
        raise HTTPError(400, ErrorCode.INVALID_CURSOR, "cursor is not one this service issued")
    key = payload.get("k")
    if (
        payload.get("v") != _CURSOR_VERSION
        or not isinstance(key, list)
        or len(key) != len(types)
        or not all(_fits(value, kind) for value, kind in zip(key, types))
    ):
        raise HTTPError(400, ErrorCode.INVALID_CURSOR, "cursor is not one this service issued")
    if payload.get("f") != _filter_hash(scope, filters):
        raise HTTPError(
            400, ErrorCode.INVALID_CURSOR, "cursor was issued for other filters; send the same filters with it"
        )
    return key


def _fits(value: Any, kind: type) -> bool:
    if isinstance(value, bool):
        return False
    if kind is float:
        return isinstance(value, (int, float))
    return isinstance(value, kind)
