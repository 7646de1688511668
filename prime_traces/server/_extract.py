"""Summary columns extracted from a trace or an episode at ingest (contract §7).

Documents are only loosely typed: every lookup tolerates a missing key or a
value of the wrong type, which yields a null column rather than a rejection.
The columns every row of one upload shares come from its :class:`UploadMeta`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from prime_traces.server._store import TraceRow

TRUNCATING_STOP_CONDITIONS = frozenset(
    {"max_turns", "max_input_tokens", "max_output_tokens", "max_total_tokens", "compaction_failed"}
)
_PROVIDERS = (
    ("pinference", "prime"),
    ("primeintellect", "prime"),
    ("openai", "openai"),
    ("anthropic", "anthropic"),
    ("openrouter", "openrouter"),
    ("googleapis", "google"),
)


@dataclass
class UploadMeta:
    """What every row of one upload shares."""

    upload_id: str
    line_format: str
    context: dict[str, str]
    schema_version: int
    producer: str
    now: float
    reject_marker: bytes | None = None
    reject_omit_line: bool = False
    reject_first_only: bool = False
    #: The context as stored in every row, encoded once.
    context_json: str = field(init=False)

    def __post_init__(self) -> None:
        self.context_json = orjson.dumps(self.context).decode()


def dig(obj: Any, *path: str) -> Any:
    """``obj[path[0]][path[1]]...``, or None where a step is missing or not a mapping."""
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _calls(trace: Mapping[str, Any]) -> list[dict[str, Any]]:
    calls = trace.get("calls")
    return [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []


def model_of(trace: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """``(provider, model id)``: the agent's configured model, else the calls' model."""
    model = _str(dig(trace, "agent", "config", "model"))
    if model is None:
        model = next((c["model"] for c in _calls(trace) if isinstance(c.get("model"), str)), None)
    base_url = _str(dig(trace, "agent", "config", "client", "base_url")) or ""
    provider = next((name for marker, name in _PROVIDERS if marker in base_url), None)
    return provider, model


def task_id_of(trace: Mapping[str, Any]) -> str | None:
    key = dig(trace, "task", "key")
    if isinstance(key, str):
        return key
    data = dig(trace, "task", "data")
    for name in ("id", "name", "idx"):
        value = dig(data, name)
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            return str(value)
    return None


def reward_of(trace: Mapping[str, Any]) -> float | None:
    """Σ score × weight over the non-null rewards; None when there are none."""
    rewards = trace.get("rewards")
    if not isinstance(rewards, dict):
        return None
    total, any_reward = 0.0, False
    for entry in rewards.values():
        score = _number(dig(entry, "score"))
        if score is None:
            continue
        weight = _number(dig(entry, "weight"))
        total += score * (1.0 if weight is None else weight)
        any_reward = True
    return total if any_reward else None


def has_error_of(record: Mapping[str, Any]) -> bool:
    errors = record.get("errors")
    return record.get("ok") is False or (isinstance(errors, list) and len(errors) > 0)


def is_truncated_of(trace: Mapping[str, Any]) -> bool:
    if trace.get("stop_condition") in TRUNCATING_STOP_CONDITIONS:
        return True
    clean = [c for c in _calls(trace) if not c.get("error")]
    return bool(clean) and clean[-1].get("finish_reason") == "length"


def _call_tokens(usage: Any) -> int | None:
    """A call's ``total_tokens``, else its prompt (or input) plus completion tokens; None without any."""
    total = _int(dig(usage, "total_tokens"))
    if total is not None:
        return total
    prompt = _int(dig(usage, "prompt_tokens"))
    if prompt is None:
        prompt = _int(dig(usage, "input_tokens"))
    completion = _int(dig(usage, "completion_tokens"))
    if prompt is None and completion is None:
        return None
    return (prompt or 0) + (completion or 0)


def total_tokens_of(trace: Mapping[str, Any]) -> int:
    """The last call's total, so context re-sent on every turn is counted once.

    A usage without ``total_tokens`` (verifiers 0.4 serialises only
    ``prompt_tokens`` and ``completion_tokens``) counts their sum.
    """
    for call in reversed(_calls(trace)):
        total = _call_tokens(call.get("usage"))
        if total is not None:
            return total
    return 0


def duration_ms_of(trace: Mapping[str, Any], created_at: float) -> int:
    end = _number(dig(trace, "timing", "scoring", "end"))
    return max(0, int((end - created_at) * 1000)) if end is not None else 0


def trace_columns(
    trace: Mapping[str, Any],
    created_at: float,
    size_bytes: int,
    meta: UploadMeta,
    episode: tuple[str, str | None] | None,
) -> dict[str, Any]:
    """The ``traces`` row of one trace; ``episode`` is ``(id, env id)`` for members."""
    provider, model = model_of(trace)
    run_type = _str(dig(trace, "run", "type"))
    return {
        "trace_id": trace["id"],
        "upload_id": meta.upload_id,
        "episode_id": episode[0] if episode else None,
        "created_at": created_at,
        "ingested_at": meta.now,
        "run_id": _str(dig(trace, "run", "id")),
        "run_type": run_type,
        "run_step": _int(dig(trace, "run", "work", "step")),
        "environment_id": episode[1] if episode else None,
        "model_provider": provider,
        "model_id": model,
        "task_id": task_id_of(trace),
        "agent_name": _str(dig(trace, "agent", "name")),
        "reward": reward_of(trace),
        "outcome": _str(trace.get("stop_condition")),
        "has_error": int(has_error_of(trace)),
        "is_truncated": int(is_truncated_of(trace)),
        "duration_ms": duration_ms_of(trace, created_at),
        "total_tokens": total_tokens_of(trace),
        "size_bytes": size_bytes,
        "context": meta.context_json,
        "producer": meta.producer,
    }


def episode_columns(
    envelope: Mapping[str, Any],
    env_id: str | None,
    created_at: float,
    meta: UploadMeta,
    members: list[TraceRow],
) -> dict[str, Any]:
    """The ``episodes`` row of one envelope."""
    run_id = _str(dig(envelope, "run", "id"))
    if run_id is None:
        run_id = next((m.columns["run_id"] for m in members if m.columns["run_id"]), None)
    errors = envelope.get("errors")
    last_error = errors[-1] if isinstance(errors, list) and errors else None
    return {
        "episode_id": envelope["id"],
        "upload_id": meta.upload_id,
        "schema_version": meta.schema_version,
        "created_at": created_at,
        "ingested_at": meta.now,
        "run_id": run_id,
        "environment_id": env_id,
        "outcome": _str(envelope.get("outcome")),
        "has_error": int(has_error_of(envelope)),
        "error_type": _str(dig(last_error, "type")),
        "error_message": _str(dig(last_error, "message")),
        "context": meta.context_json,
        "producer": meta.producer,
    }
