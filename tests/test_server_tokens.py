"""A trace's ``total_tokens`` column: the last call's ``total_tokens``, else its prompt plus completion tokens."""

from __future__ import annotations

from typing import Any

import pytest
from _upload_helpers import committed, make_episode, make_trace, ok, upload

from prime_traces.server._extract import total_tokens_of


def with_usages(trace_id: str, *usages: dict[str, Any]) -> dict[str, Any]:
    """A trace whose calls carry ``usages``, in order."""
    trace = make_trace(trace_id, run_id="r-1")
    call = trace["calls"][0]
    trace["calls"] = [{**call, "usage": usage} for usage in usages]
    return trace


@pytest.mark.parametrize(
    ("usages", "expected"),
    [
        # verifiers 0.4.0's Usage: prompt_tokens and completion_tokens only.
        (({"prompt_tokens": 100, "completion_tokens": 20}, {"prompt_tokens": 150, "completion_tokens": 30}), 180),
        (({"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 999},), 999),
        (({"input_tokens": 40, "completion_tokens": 2},), 42),
        (({"completion_tokens": 5},), 5),
        (({"prompt_tokens": 9, "completion_tokens": 1}, {"prompt_tokens": None}), 10),
        (({"prompt_tokens": 9.0, "completion_tokens": 1.0},), 10),
        (({"cached": 3},), 0),
        ((None,), 0),
    ],
)
def test_total_tokens_of_a_trace(usages: tuple[Any, ...], expected: int) -> None:
    assert total_tokens_of(with_usages("t", *usages)) == expected


def test_tokens_without_a_total_reach_the_summaries(service) -> None:
    members = [
        with_usages("m-1", {"prompt_tokens": 100, "completion_tokens": 20}),
        with_usages("m-2", {"prompt_tokens": 50, "completion_tokens": 5, "total_tokens": 60}),
    ]
    committed(upload(service.url, [make_episode("ep-1", members, run_id="r-1")], episode=True))
    assert ok(service, "/traces/m-1")["total_tokens"] == 120
    assert ok(service, "/traces/m-2")["total_tokens"] == 60
    assert ok(service, "/episodes/ep-1")["traces"]["total_tokens"] == 180
