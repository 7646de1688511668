"""The wire side of the read API: rows out as contract §5 models, queries in.

Rendering: every function here turns one SQLite row into the JSON object of
one model, with every listed field present (nullable ones as ``null``),
integers as JSON integers, booleans as JSON booleans and datetimes as
ISO-8601 UTC with millisecond precision and a ``Z``.

Parsing: query values (contract §1 encoding: booleans ``true``/``false``,
numbers in Python ``str()`` form, ISO-8601 datetimes). Every bad value is
400 ``invalid_filter``. Page sizes and cursors are read in ``_pages``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any, cast

import orjson

from prime_traces.errors import ErrorCode
from prime_traces.server._http import HTTPError

CONTEXT_PREFIX = "context."
# parse_qs turns an unencoded "+" into a space; "...T18:02:11 00:00" meant "+00:00".
_SPACED_OFFSET = re.compile(r"^(.*:\d\d(?:\.\d+)?) (\d\d(?::?\d\d)?)$")


# -- rendering ---------------------------------------------------------------


def iso(epoch: float) -> str:
    """``2026-07-20T18:02:11.482Z``: UTC, milliseconds, rounded to the nearest."""
    millis = round(epoch * 1000)
    moment = datetime.fromtimestamp(millis // 1000, timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + f".{millis % 1000:03d}Z"


def _iso_or_none(epoch: float | None) -> str | None:
    return iso(epoch) if epoch is not None else None


def _float_or_none(value: Any) -> float | None:
    return float(value) if value is not None else None


def _int_or_none(value: Any) -> int | None:
    return int(value) if value is not None else None


def _json_object(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    value = orjson.loads(text)
    return value if isinstance(value, dict) else {}


def _json_or_none(text: str | None) -> Any:
    return orjson.loads(text) if text is not None else None


def trace_summary(row: Any) -> dict[str, Any]:
    """TraceSummary (plus ``run_step``, an extra field the contract allows)."""
    return {
        "trace_id": row["trace_id"],
        "upload_id": row["upload_id"],
        "episode_id": row["episode_id"],
        "created_at": iso(row["created_at"]),
        "ingested_at": iso(row["ingested_at"]),
        "run_id": row["run_id"],
        "environment_id": row["environment_id"],
        "model": {"provider": row["model_provider"], "id": row["model_id"]},
        "task_id": row["task_id"],
        "agent_name": row["agent_name"],
        "score": {"reward": _float_or_none(row["reward"]), "outcome": row["outcome"]},
        "execution": {"has_error": bool(row["has_error"]), "is_truncated": bool(row["is_truncated"])},
        "duration_ms": int(row["duration_ms"]),
        "total_tokens": int(row["total_tokens"]),
        "size_bytes": int(row["size_bytes"]),
        "context": _json_object(row["context"]),
        "run_step": _int_or_none(row["run_step"]),
    }


def episode_summary(row: Any) -> dict[str, Any]:
    """EpisodeSummary (plus the upload's ``context``)."""
    return {
        "episode_id": row["episode_id"],
        "upload_id": row["upload_id"],
        "schema_version": int(row["schema_version"]),
        "created_at": iso(row["created_at"]),
        "ingested_at": iso(row["ingested_at"]),
        "run_id": row["run_id"],
        "environment_id": row["environment_id"],
        "outcome": row["outcome"],
        "has_error": bool(row["has_error"]),
        "error": {"type": row["error_type"], "message": row["error_message"]},
        "context": _json_object(row["context"]),
    }


def trace_aggregate(row: Any, agent_names: Sequence[str]) -> dict[str, Any]:
    """EpisodeTraceAggregate from ``count, tokens, duration_ms, any_error`` columns."""
    return {
        "trace_count": int(row["trace_count"] or 0),
        "total_tokens": int(row["total_tokens"] or 0),
        "total_duration_ms": int(row["total_duration_ms"] or 0),
        "any_trace_error": bool(row["any_trace_error"]),
        "agent_names": list(agent_names),
    }


def episode_detail(row: Any, aggregate: dict[str, Any]) -> dict[str, Any]:
    """EpisodeDetail: the summary plus its ``traces`` aggregate."""
    return {**episode_summary(row), "traces": aggregate}


def _distinct_ids(text: str | None) -> list[str]:
    values = orjson.loads(text) if text else []
    return sorted({v for v in values if isinstance(v, str) and v})


def run_summary(row: Any) -> dict[str, Any]:
    """RunSummary with the §9 lifecycle fields (null for a run known only from traces).

    ``platform`` is what the platform's run routes (§10) were told about the
    run, null for a run created otherwise.
    """
    lifecycle = bool(row["lc_exists"])
    return {
        "run_id": row["run_id"],
        "first_trace_created_at": iso(row["first_trace_created_at"]),
        "last_trace_created_at": iso(row["last_trace_created_at"]),
        "last_trace_ingested_at": iso(row["last_trace_ingested_at"]),
        "trace_count": int(row["trace_count"]),
        "episode_count": int(row["episode_count"]),
        "avg_reward": _float_or_none(row["avg_reward"]),
        "step_min": _int_or_none(row["step_min"]),
        "step_max": _int_or_none(row["step_max"]),
        "step_count": int(row["step_count"]),
        "has_error": bool(row["has_error"]),
        "first_user_id": row["first_user_id"],
        "environment_ids": _distinct_ids(row["environment_ids"]),
        "model_ids": _distinct_ids(row["model_ids"]),
        "context": _json_object(row["context"]),
        "run_type": row["run_type"],
        "name": row["lc_name"],
        "kind": row["lc_kind"],
        "status": row["lc_status"],
        "config": _json_or_none(row["lc_config"]) if lifecycle else None,
        "summary": _json_or_none(row["lc_summary"]) if lifecycle else None,
        "tags": _json_or_none(row["lc_tags"]) if lifecycle else None,
        "error": row["lc_error"],
        "created_at": _iso_or_none(row["lc_created_at"]),
        "finished_at": _iso_or_none(row["lc_finished_at"]),
        "platform": _json_or_none(row["lc_platform"]),
    }


def run_step(row: Any) -> dict[str, Any]:
    """RunStep."""
    return {
        "step": int(row["step"]),
        "trace_count": int(row["trace_count"]),
        "episode_count": int(row["episode_count"]),
        "avg_reward": _float_or_none(row["avg_reward"]),
    }


def lifecycle_view(row: Any, url: str) -> dict[str, Any]:
    """The answer to ``POST``/``PATCH /runs``: a ``runs`` row as the platform shows it."""
    return {
        "id": row["run_id"],
        "run_id": row["run_id"],
        "name": row["name"],
        "url": url,
        "status": row["status"],
        "kind": row["kind"],
        "config": orjson.loads(row["config"]),
        "summary": orjson.loads(row["summary"]),
        "tags": orjson.loads(row["tags"]),
        "error": row["error"],
        "created_at": iso(row["created_at"]),
        "finished_at": _iso_or_none(row["finished_at"]),
        "created_by": row["created_by"],
        "platform": _json_or_none(row["platform"]),
    }


# -- query values ------------------------------------------------------------


def bad_filter(message: str) -> HTTPError:
    return HTTPError(400, ErrorCode.INVALID_FILTER, message)


def one(query: dict[str, list[str]], name: str) -> str | None:
    """The single value of ``name``, or None; a filter given twice is refused."""
    values = query.get(name)
    if not values:
        return None
    if len(values) > 1:
        raise bad_filter(f"{name} is given {len(values)} times; it takes one value")
    return values[0]


def many(query: dict[str, list[str]], name: str) -> list[str]:
    """Every value of a repeatable filter, deduplicated and sorted (OR semantics)."""
    return sorted(set(query.get(name, [])))


def as_bool(query: dict[str, list[str]], name: str) -> bool | None:
    value = one(query, name)
    if value is None:
        return None
    lowered = value.strip().lower()
    if lowered not in ("true", "false"):
        raise bad_filter(f"{name} must be true or false, not {value!r}")
    return lowered == "true"


def as_float(query: dict[str, list[str]], name: str) -> float | None:
    value = one(query, name)
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        raise bad_filter(f"{name} must be a number, not {value!r}") from None
    if math.isnan(number):
        raise bad_filter(f"{name} must be a number, not NaN")
    return number


def as_int(query: dict[str, list[str]], name: str) -> int | None:
    value = one(query, name)
    if value is None:
        return None
    try:
        return int(value.strip())
    except ValueError:
        raise bad_filter(f"{name} must be an integer, not {value!r}") from None


def as_time(query: dict[str, list[str]], name: str) -> float | None:
    value = one(query, name)
    return parse_time_filter(value, name) if value is not None else None


def parse_time_filter(value: str, name: str = "created_at") -> float:
    """Epoch seconds of an ISO-8601 datetime (``Z`` or an offset; naive means UTC).

    Plain numbers are read as epoch seconds. Anything else is 400 ``invalid_filter``.
    """
    text = value.strip()
    try:
        number = float(text)
    except ValueError:
        pass
    else:
        if math.isfinite(number):
            return number
        raise bad_filter(f"{name} must be an ISO-8601 datetime, not {value!r}")
    text = _SPACED_OFFSET.sub(r"\1+\2", text)
    if text[-1:] in ("Z", "z"):
        text = text[:-1] + "+00:00"
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise bad_filter(f"{name} must be an ISO-8601 datetime, not {value!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def context_filters(query: dict[str, list[str]]) -> dict[str, str]:
    """The ``context.<key>=<value>`` filters, ANDed."""
    filters: dict[str, str] = {}
    for name in query:
        if name.startswith(CONTEXT_PREFIX):
            key = name[len(CONTEXT_PREFIX) :]
            if not key:
                raise bad_filter("a context filter needs a key: context.<key>=<value>")
            # A name parse_qs yields has at least one value, so one() returns it.
            filters[key] = cast(str, one(query, name))
    return filters
