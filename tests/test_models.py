"""The §5 response models: required fields, extra fields, numbers and datetimes."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from prime_traces._api.models import (
    EpisodeDetail,
    RunSummary,
    TraceListPage,
    TraceSummary,
    UploadReceipt,
)
from prime_traces.errors import PrimeTracesError, ResponseFormatError


def trace_summary(**overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "trace_id": "t-1",
        "upload_id": "ab" * 32,
        "episode_id": None,
        "created_at": "2026-07-20T18:02:11.482Z",
        "ingested_at": "2026-07-20T18:02:12.000Z",
        "run_id": "run-1",
        "environment_id": None,
        "model": {"provider": "prime", "id": "qwen/qwen3-8b"},
        "task_id": "task-0",
        "agent_name": "solver",
        "score": {"reward": None, "outcome": "completed"},
        "execution": {"has_error": False, "is_truncated": True},
        "duration_ms": 2500,
        "total_tokens": 120,
        "size_bytes": 1005,
        "context": {},
    }
    doc.update(overrides)
    return doc


def run_summary(**overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "run_id": "run-1",
        "first_trace_created_at": "2026-07-20T18:00:00Z",
        "last_trace_created_at": "2026-07-20T18:05:00Z",
        "last_trace_ingested_at": "2026-07-20T18:06:00Z",
        "trace_count": 5,
        "episode_count": 0,
        "avg_reward": 0.5,
        "step_min": 0,
        "step_max": 3,
        "step_count": 4,
        "has_error": False,
        "first_user_id": None,
        "environment_ids": ["env-a"],
        "model_ids": [],
        "context": {"k": "v"},
    }
    doc.update(overrides)
    return doc


def test_extra_fields_are_kept() -> None:
    receipt = UploadReceipt.from_dict({"upload_id": "u", "status": "committed", "lines": 3})
    assert receipt == UploadReceipt("u", "committed", extra={"lines": 3})
    summary = TraceSummary.from_dict(trace_summary(run_step=7, model={"provider": None, "id": "m", "x": 1}))
    assert summary.extra == {"run_step": 7}
    assert summary.model.extra == {"x": 1}
    assert summary.score.reward is None
    assert summary.execution.is_truncated is True


@pytest.mark.parametrize("missing", ["trace_id", "created_at", "episode_id", "context", "model"])
def test_missing_required_field_is_named(missing: str) -> None:
    doc = trace_summary()
    del doc[missing]  # nullable fields too: they must be present as null
    with pytest.raises(ResponseFormatError, match=f"TraceSummary: missing required field '{missing}'") as info:
        TraceSummary.from_dict(doc)
    assert isinstance(info.value, PrimeTracesError)
    assert isinstance(info.value, ValueError)


def test_nested_errors_say_where() -> None:
    bad = trace_summary()
    del bad["execution"]["has_error"]
    with pytest.raises(ResponseFormatError) as info:
        TraceListPage.from_dict({"items": [trace_summary(), bad], "next_cursor": None})
    assert str(info.value) == "TraceListPage.items[1].execution (Execution): missing required field 'has_error'"
    with pytest.raises(ResponseFormatError, match=r"TraceListPage: expected a JSON object, got list"):
        TraceListPage.from_dict([])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "ok"),
    [(2, True), (2.0, True), (1.5, False), (True, False), ("2", False), (None, False)],
)
def test_integers_are_json_integers(value: Any, ok: bool) -> None:
    doc = trace_summary(duration_ms=value)
    if ok:
        assert TraceSummary.from_dict(doc).duration_ms == 2
        assert type(TraceSummary.from_dict(doc).duration_ms) is int
    else:
        with pytest.raises(ResponseFormatError, match=r"TraceSummary\.duration_ms"):
            TraceSummary.from_dict(doc)


def test_wrong_types_are_refused() -> None:
    with pytest.raises(ResponseFormatError, match=r"TraceSummary\.trace_id: expected a string, got int"):
        TraceSummary.from_dict(trace_summary(trace_id=5))
    with pytest.raises(ResponseFormatError, match=r"TraceSummary\.context\['k'\]: expected a string"):
        TraceSummary.from_dict(trace_summary(context={"k": 1}))
    with pytest.raises(ResponseFormatError, match=r"execution\.has_error: expected a boolean"):
        TraceSummary.from_dict(trace_summary(execution={"has_error": "yes", "is_truncated": False}))


UTC = timezone.utc


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-07-20T18:02:11.482Z", datetime(2026, 7, 20, 18, 2, 11, 482000, tzinfo=UTC)),
        ("2026-07-20T18:02:11z", datetime(2026, 7, 20, 18, 2, 11, tzinfo=UTC)),
        ("2026-07-20T18:02:11+00:00", datetime(2026, 7, 20, 18, 2, 11, tzinfo=UTC)),
        ("2026-07-20T20:02:11.5+02:00", datetime(2026, 7, 20, 18, 2, 11, 500000, tzinfo=UTC)),
        ("2026-07-20T13:02:11-0500", datetime(2026, 7, 20, 18, 2, 11, tzinfo=UTC)),
        ("2026-07-20T18:02:11.123456789Z", datetime(2026, 7, 20, 18, 2, 11, 123456, tzinfo=UTC)),
        ("2026-07-20 18:02Z", datetime(2026, 7, 20, 18, 2, tzinfo=UTC)),
        (1784570531, datetime(2026, 7, 20, 18, 2, 11, tzinfo=UTC)),
        (1784570531482, datetime(2026, 7, 20, 18, 2, 11, 482000, tzinfo=UTC)),
        (1784570531.5, datetime(2026, 7, 20, 18, 2, 11, 500000, tzinfo=UTC)),
        ("1784570531", datetime(2026, 7, 20, 18, 2, 11, tzinfo=UTC)),
    ],
)
def test_datetimes_with_zone_or_numbers_are_aware(text: Any, expected: datetime) -> None:
    parsed = TraceSummary.from_dict(trace_summary(created_at=text)).created_at
    assert parsed.tzinfo is not None
    assert parsed == expected


def test_offset_is_kept() -> None:
    parsed = TraceSummary.from_dict(trace_summary(created_at="2026-07-20T20:02:11+02:00")).created_at
    assert parsed.utcoffset() == timedelta(hours=2)


def test_naive_strings_stay_naive_as_in_pydantic() -> None:
    parsed = TraceSummary.from_dict(trace_summary(created_at="2026-07-20T18:02:11")).created_at
    assert parsed == datetime(2026, 7, 20, 18, 2, 11)
    assert parsed.tzinfo is None


@pytest.mark.parametrize("bad", ["yesterday", "2026-13-01T00:00:00Z", "2026-07-20T25:00:00Z", "", None, True])
def test_bad_datetimes_are_refused(bad: Any) -> None:
    with pytest.raises(ResponseFormatError, match=r"TraceSummary\.created_at"):
        TraceSummary.from_dict(trace_summary(created_at=bad))


def test_run_summary_lifecycle_fields_are_optional() -> None:
    bare = RunSummary.from_dict(run_summary(run_type="eval"))
    assert (bare.name, bare.kind, bare.status, bare.config, bare.created_at) == (None,) * 5
    assert bare.environment_ids == ("env-a",)
    assert bare.extra == {"run_type": "eval"}
    full = RunSummary.from_dict(
        run_summary(
            name="sweep",
            kind="train",
            status="completed",
            config={"lr": 0.1},
            summary={"acc": 1},
            error=None,
            created_at="2026-07-20T17:59:00Z",
            finished_at="2026-07-20T18:07:00Z",
        )
    )
    assert full.status == "completed" and full.config == {"lr": 0.1}
    assert full.finished_at == datetime(2026, 7, 20, 18, 7, tzinfo=UTC)
    with pytest.raises(ResponseFormatError, match="missing required field 'step_count'"):
        RunSummary.from_dict({k: v for k, v in run_summary().items() if k != "step_count"})


def test_episode_detail_needs_its_aggregate() -> None:
    summary = {
        "episode_id": "e-1",
        "upload_id": "u",
        "schema_version": 1,
        "created_at": "2026-07-20T18:02:11Z",
        "ingested_at": "2026-07-20T18:02:12Z",
        "run_id": None,
        "environment_id": "env",
        "outcome": None,
        "has_error": True,
        "error": {"type": "Timeout", "message": "took too long"},
    }
    with pytest.raises(ResponseFormatError, match="EpisodeDetail: missing required field 'traces'"):
        EpisodeDetail.from_dict(summary)
    detail = EpisodeDetail.from_dict(
        {
            **summary,
            "traces": {
                "trace_count": 0,
                "total_tokens": 0,
                "total_duration_ms": 0,
                "any_trace_error": False,
                "agent_names": [],
            },
        }
    )
    assert detail.error.type == "Timeout"
    assert detail.traces.agent_names == ()


def test_to_dict_round_trips_and_models_are_frozen() -> None:
    doc = trace_summary(run_step=3)
    summary = TraceSummary.from_dict(doc)
    assert summary.to_dict() == doc
    assert TraceSummary.from_dict(summary.to_dict()) == summary
    with pytest.raises(dataclasses.FrozenInstanceError):
        summary.trace_id = "other"  # type: ignore[misc]
