"""Trace and episode reads and deletes of the local service, over real HTTP (contract §3–§5)."""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import requests
from _upload_helpers import api, auth, committed, error_code, make_episode, make_trace, ok, upload

from prime_traces.server import LocalTracesService

ISO_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
TRACE_FIELDS = {
    "trace_id",
    "upload_id",
    "episode_id",
    "created_at",
    "ingested_at",
    "run_id",
    "environment_id",
    "model",
    "task_id",
    "agent_name",
    "score",
    "execution",
    "duration_ms",
    "total_tokens",
    "size_bytes",
    "context",
}
EPISODE_FIELDS = {
    "episode_id",
    "upload_id",
    "schema_version",
    "created_at",
    "ingested_at",
    "run_id",
    "environment_id",
    "outcome",
    "has_error",
    "error",
}


@pytest.fixture
def svc(tmp_path) -> Iterator[LocalTracesService]:
    with LocalTracesService(tmp_path / "traces.db") as service:
        yield service


def ids(page: dict[str, Any], key: str = "trace_id") -> list[str]:
    return [item[key] for item in page["items"]]


def iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(int(epoch))) + ".000Z"


@pytest.fixture
def seeded(svc: LocalTracesService) -> dict[str, Any]:
    """Eight traces over three uploads; created_at grows with the name's position."""
    base = int(time.time()) - 3600
    up_a = committed(
        upload(
            svc.url,
            [
                make_trace("a1", start=base + 1, run_id="r-1", step=1, model="m-alpha", task_key="k1"),
                make_trace(
                    "a2",
                    start=base + 2,
                    run_id="r-1",
                    step=2,
                    reward=0.0,
                    model="m-beta",
                    base_url="https://api.openai.com/v1",
                    ok=False,
                    errors=[{"type": "ToolError", "message": "bad tool"}],
                ),
                make_trace("a3", start=base + 3, run_id="r-2", reward=None, stop_condition="max_turns"),
            ],
            context={"team": "red", "stage": "a"},
        )
    )
    up_b = committed(
        upload(
            svc.url,
            [
                make_trace("b1", start=base + 4, run_id="r-2", step=5, reward=0.5, task_key="k2"),
                make_trace("b2", start=base + 5, reward=2.0),
            ],
            context={"team": "blue"},
            coding="zstd",
        )
    )
    up_c = committed(
        upload(
            svc.url,
            [
                make_episode(
                    "e-1",
                    [
                        make_trace("e1m1", start=base + 6, run_id="r-1", step=3),
                        make_trace("e1m2", start=base + 7, run_id="r-1", step=3, agent="critic", ok=False),
                    ],
                    env="env-x",
                    run_id="r-1",
                )
            ],
            episode=True,
            context={"team": "red"},
            coding=None,
        )
    )
    return {"base": base, "a": up_a, "b": up_b, "c": up_c}


ALL = ["e1m2", "e1m1", "b2", "b1", "a3", "a2", "a1"]
FILTER_CASES = [
    ({}, ALL),
    ({"run_id": "r-1"}, ["e1m2", "e1m1", "a2", "a1"]),
    ({"environment_id": "env-x"}, ["e1m2", "e1m1"]),
    ({"model_id": "m-beta"}, ["a2"]),
    ({"model_provider": "openai"}, ["a2"]),
    ({"task_id": "k2"}, ["b1"]),
    ({"outcome": "max_turns"}, ["a3"]),
    ({"reward_min": "0.5"}, ["e1m2", "e1m1", "b2", "b1", "a1"]),
    ({"reward_min": "0.5", "reward_max": "1.0"}, ["e1m2", "e1m1", "b1", "a1"]),
    ({"reward_max": "1e-07"}, ["a2"]),
    ({"has_error": "true"}, ["e1m2", "a2"]),
    ({"has_error": "false"}, ["e1m1", "b2", "b1", "a3", "a1"]),
    ({"is_truncated": "true"}, ["a3"]),
    ({"is_truncated": "false", "run_id": "r-2"}, ["b1"]),
    ({"context.team": "red"}, ["e1m2", "e1m1", "a3", "a2", "a1"]),
    ({"context.team": "red", "context.stage": "a"}, ["a3", "a2", "a1"]),
    ({"context.team": "green"}, []),
    ({"run_id": "r-1", "has_error": "false"}, ["e1m1", "a1"]),
    ({"run_id": "nope"}, []),
]


@pytest.mark.parametrize(("params", "expected"), FILTER_CASES)
def test_trace_list_filters(svc, seeded, params, expected) -> None:
    assert ids(ok(svc, "/traces", params)) == expected


def test_trace_list_filters_by_upload_ids_and_time(svc, seeded) -> None:
    base = seeded["base"]
    assert ids(ok(svc, "/traces", {"upload_id": [seeded["a"], seeded["b"]]})) == ALL[2:]
    assert ids(ok(svc, "/traces", {"upload_id": seeded["c"]})) == ["e1m2", "e1m1"]
    assert ids(ok(svc, "/traces", {"created_after": iso(base + 4)})) == ["e1m2", "e1m1", "b2", "b1"]
    assert ids(ok(svc, "/traces", {"created_before": iso(base + 3)})) == ["a2", "a1"]
    offset = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(base + 6))
    assert ids(ok(svc, "/traces", {"created_after": offset})) == ["e1m2", "e1m1"]
    naive = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(base + 2))
    assert ids(ok(svc, "/traces", {"created_before": naive})) == ["a1"]
    # An unencoded "+" arrives as a space; the offset is still understood.
    plus = f"{svc.url}/api/v1/traces?created_before={naive}+00:00"
    assert ids(requests.get(plus, headers=auth(), timeout=30).json()) == ["a1"]
    assert ids(ok(svc, "/traces", {"created_after": str(base + 6)})) == ["e1m2", "e1m1"]


def test_trace_list_sort(svc, seeded) -> None:
    assert ids(ok(svc, "/traces", {"sort": "oldest"})) == ALL[::-1]
    assert ids(ok(svc, "/traces", {"sort": "-created_at"})) == ALL


@pytest.mark.parametrize(
    "params",
    [
        {"has_error": "yes"},
        {"is_truncated": "1"},
        {"reward_min": "abc"},
        {"reward_max": "nan"},
        {"created_after": "yesterday"},
        {"created_before": "2026-13-45"},
        {"limit": "0"},
        {"limit": "101"},
        {"limit": "ten"},
        {"sort": "random"},
        {"run_id": ["a", "b"]},
        {"context.": "x"},
    ],
)
def test_trace_list_bad_filters(svc, params) -> None:
    resp = api(svc, "GET", "/traces", params)
    assert resp.status_code == 400
    assert error_code(resp) == "invalid_filter"


def _walk(svc: LocalTracesService, path: str, params: dict[str, Any], key: str = "trace_id") -> list[list[str]]:
    pages, cursor = [], None
    while True:
        page = ok(svc, path, {**params, **({"cursor": cursor} if cursor else {})})
        pages.append(ids(page, key))
        cursor = page["next_cursor"]
        if cursor is None:
            return pages
        assert len(pages) < 50


def test_pagination_is_stable_across_ties(svc) -> None:
    base = int(time.time()) - 600
    # Four traces per timestamp, over two uploads: order must fall back to storage order.
    first = [make_trace(f"p{i:02d}", start=base + i // 4) for i in range(0, 24)]
    second = [make_trace(f"p{i:02d}", start=base + i // 4) for i in range(24, 45)]
    committed(upload(svc.url, first))
    committed(upload(svc.url, second))
    pages = _walk(svc, "/traces", {"limit": 9})
    assert [len(p) for p in pages] == [9, 9, 9, 9, 9]
    flat = [t for p in pages for t in p]
    assert flat == [f"p{i:02d}" for i in range(44, -1, -1)]
    assert flat == ids(ok(svc, "/traces", {"limit": 100}))
    oldest = [t for p in _walk(svc, "/traces", {"limit": 7, "sort": "oldest"}) for t in p]
    assert oldest == flat[::-1]


def test_default_limit_is_20(svc) -> None:
    base = int(time.time()) - 600
    committed(upload(svc.url, [make_trace(f"d{i}", start=base + i) for i in range(25)]))
    page = ok(svc, "/traces")
    assert len(page["items"]) == 20
    assert page["next_cursor"] is not None
    rest = ok(svc, "/traces", {"cursor": page["next_cursor"]})
    assert len(rest["items"]) == 5 and rest["next_cursor"] is None


def test_cursor_is_bound_to_its_filters(svc, seeded) -> None:
    page = ok(svc, "/traces", {"run_id": "r-1", "limit": 2})
    cursor = page["next_cursor"]
    assert cursor is not None
    # Same filters, another page size: still valid.
    assert ids(ok(svc, "/traces", {"run_id": "r-1", "limit": 5, "cursor": cursor})) == ["a2", "a1"]
    for params in ({"run_id": "r-2"}, {}, {"run_id": "r-1", "has_error": "false"}, {"run_id": "r-1", "sort": "oldest"}):
        resp = api(svc, "GET", "/traces", {**params, "cursor": cursor})
        assert resp.status_code == 400, params
        assert error_code(resp) == "invalid_cursor"
    resp = api(svc, "GET", "/episodes/e-1/traces", {"run_id": "r-1", "cursor": cursor})
    assert error_code(resp) == "invalid_cursor"


@pytest.mark.parametrize(
    "cursor",
    [
        "garbage!",
        "eyJub3QiOiAiYSBjdXJzb3IifQ",
        base64.urlsafe_b64encode(b"[1, 2]").decode(),
        base64.urlsafe_b64encode(b'{"v": 1, "f": "x", "k": ["a", "b"]}').decode(),
        "\u00e9t\u00e9",
        base64.urlsafe_b64encode(b'{"v": 1, "k": [1.5, 2]}').decode(),
    ],
)
def test_garbage_cursor(svc, seeded, cursor) -> None:
    resp = api(svc, "GET", "/traces", {"cursor": cursor})
    assert resp.status_code == 400
    assert error_code(resp) == "invalid_cursor"


def test_trace_summary_shape(svc, seeded) -> None:
    base = seeded["base"]
    summary = ok(svc, "/traces/a2")
    assert TRACE_FIELDS <= set(summary)
    assert summary["trace_id"] == "a2" and summary["upload_id"] == seeded["a"]
    assert summary["episode_id"] is None and summary["environment_id"] is None
    assert summary["created_at"] == iso(base + 2)
    assert ISO_RE.match(summary["ingested_at"])
    assert summary["run_id"] == "r-1"
    assert summary["model"] == {"provider": "openai", "id": "m-beta"}
    assert summary["task_id"] == "task-0" and summary["agent_name"] == "solver"
    assert summary["score"] == {"reward": 0.0, "outcome": "completed"}
    assert summary["execution"] == {"has_error": True, "is_truncated": False}
    assert summary["duration_ms"] == 2500 and type(summary["duration_ms"]) is int
    assert summary["total_tokens"] == 120 and type(summary["total_tokens"]) is int
    assert type(summary["size_bytes"]) is int and summary["size_bytes"] > 0
    assert summary["context"] == {"team": "red", "stage": "a"}
    unscored = ok(svc, "/traces/a3")
    assert unscored["score"] == {"reward": None, "outcome": "max_turns"}
    assert unscored["execution"] == {"has_error": False, "is_truncated": True}
    member = ok(svc, "/traces/e1m2")
    assert member["episode_id"] == "e-1" and member["environment_id"] == "env-x"
    assert member["context"] == {"team": "red"}
    for item in ok(svc, "/traces")["items"]:
        assert TRACE_FIELDS <= set(item)


def test_context_is_empty_object_without_one(svc) -> None:
    committed(upload(svc.url, [make_trace("plain")]))
    assert ok(svc, "/traces/plain")["context"] == {}


def test_trace_ids_are_percent_decoded(svc) -> None:
    committed(upload(svc.url, [make_trace("odd id/é?#.."), make_trace("..")]))
    assert ok(svc, "/traces/odd%20id%2F%C3%A9%3F%23..")["trace_id"] == "odd id/é?#.."
    assert ok(svc, "/traces/%2E%2E")["trace_id"] == ".."


def test_raw_is_the_stored_bytes(svc) -> None:
    start = time.time() - 30
    line = (
        '{"id": "raw-1",  "text": "h\u00e9llo \u2713 \U0001f600", "escaped": "\\u00e9",'
        f' "timing": {{"start": {start!r}}}, "pad": "{"x" * 700_000}"}}'
    ).encode()
    committed(upload(svc.url, [line]))
    resp = api(svc, "GET", "/traces/raw-1", {"raw": "true"})
    assert resp.status_code == 200
    assert resp.content == line
    assert int(resp.headers["Content-Length"]) == len(line)
    assert resp.headers["Content-Type"] == "application/json"
    assert ok(svc, "/traces/raw-1")["size_bytes"] == len(line)
    missing = api(svc, "GET", "/traces/nope", {"raw": "true"})
    assert missing.status_code == 404 and error_code(missing) == "trace_not_found"
    assert api(svc, "GET", "/traces/raw-1", {"raw": "maybe"}).status_code == 400


def test_newest_copy_wins(svc) -> None:
    start = time.time() - 100
    committed(upload(svc.url, [make_trace("dup", start=start, reward=0.25)]))
    second = committed(upload(svc.url, [make_trace("dup", start=start + 1, reward=0.75)]))
    summary = ok(svc, "/traces/dup")
    assert summary["upload_id"] == second and summary["score"]["reward"] == 0.75
    raw = orjson.loads(api(svc, "GET", "/traces/dup", {"raw": "true"}).content)
    assert raw["rewards"]["correct"]["score"] == 0.75
    assert ids(ok(svc, "/traces")) == ["dup", "dup"]


def test_missing_trace_is_404(svc) -> None:
    resp = api(svc, "GET", "/traces/absent")
    assert resp.status_code == 404
    assert error_code(resp) == "trace_not_found"


# -- episodes ----------------------------------------------------------------


@pytest.fixture
def episodes(svc: LocalTracesService) -> dict[str, Any]:
    base = int(time.time()) - 3600
    up_1 = committed(
        upload(
            svc.url,
            [
                make_episode(
                    "e-1",
                    [
                        make_trace("e1a", start=base + 10, run_id="r-1", step=3, total_tokens=100),
                        make_trace("e1b", start=base + 11, run_id="r-1", step=3, total_tokens=40),
                    ],
                    env="env-x",
                    run_id="r-1",
                )
            ],
            episode=True,
            context={"team": "red"},
        )
    )
    up_2 = committed(
        upload(
            svc.url,
            [
                make_episode(
                    "e-2",
                    [
                        make_trace("e2a", start=base + 20, run_id="r-2", step=7, total_tokens=100, duration_s=2.5),
                        make_trace(
                            "e2b",
                            start=base + 21,
                            run_id="r-2",
                            step=9,
                            total_tokens=50,
                            duration_s=1.0,
                            agent="critic",
                            ok=False,
                        ),
                        make_trace("e2c", start=base + 22, run_id="r-2", step=9, total_tokens=1, duration_s=0.25),
                    ],
                    env="env-y",
                    run_id="r-2",
                    outcome="failed",
                    ok=False,
                    errors=[{"type": "Boot", "message": "first"}, {"type": "Timeout", "message": "too slow"}],
                ),
                make_episode("e-3", [], env="env-x", run_id="r-1", outcome=None),
            ],
            episode=True,
            context={"team": "blue"},
            coding="zstd",
        )
    )
    return {"base": base, "1": up_1, "2": up_2}


EPISODE_CASES = [
    ({}, ["e-3", "e-2", "e-1"]),
    ({"run_id": "r-1"}, ["e-3", "e-1"]),
    ({"environment_id": "env-y"}, ["e-2"]),
    ({"outcome": "failed"}, ["e-2"]),
    ({"has_error": "true"}, ["e-2"]),
    ({"has_error": "false"}, ["e-3", "e-1"]),
    ({"run_step": "7"}, ["e-2"]),
    ({"run_step": "3"}, ["e-1"]),
    ({"step_min": "8"}, ["e-2"]),
    ({"step_max": "3"}, ["e-1"]),
    ({"step_min": "4", "step_max": "8"}, ["e-2"]),
    ({"run_step": "3", "step_min": "4"}, []),
    ({"context.team": "blue"}, ["e-2"]),
    ({"context.team": "red", "run_step": "3"}, ["e-1"]),
    ({"context.team": "red", "run_step": "7"}, []),
]


@pytest.mark.parametrize(("params", "expected"), EPISODE_CASES)
def test_episode_list_filters(svc, episodes, params, expected) -> None:
    assert ids(ok(svc, "/episodes", params), "episode_id") == expected


def test_episode_list_upload_time_and_pages(svc, episodes) -> None:
    base = episodes["base"]
    assert ids(ok(svc, "/episodes", {"upload_id": episodes["1"]}), "episode_id") == ["e-1"]
    both = {"upload_id": [episodes["1"], episodes["2"]]}
    assert ids(ok(svc, "/episodes", both), "episode_id") == ["e-3", "e-2", "e-1"]
    after = {"created_after": iso(base + 15), "created_before": iso(base + 30)}
    assert ids(ok(svc, "/episodes", after), "episode_id") == ["e-2"]
    assert _walk(svc, "/episodes", {"limit": 1}, "episode_id") == [["e-3"], ["e-2"], ["e-1"]]
    for params in ({"run_step": "x"}, {"step_min": "1.5"}, {"has_error": "no"}, {"limit": "500"}):
        resp = api(svc, "GET", "/episodes", params)
        assert resp.status_code == 400 and error_code(resp) == "invalid_filter", params
    cursor = ok(svc, "/episodes", {"limit": 1})["next_cursor"]
    resp = api(svc, "GET", "/episodes", {"cursor": cursor, "run_id": "r-1"})
    assert resp.status_code == 400 and error_code(resp) == "invalid_cursor"


def test_episode_summary_shape(svc, episodes) -> None:
    for item in ok(svc, "/episodes")["items"]:
        assert EPISODE_FIELDS <= set(item)
        assert type(item["schema_version"]) is int and item["schema_version"] == 1
        assert ISO_RE.match(item["created_at"]) and ISO_RE.match(item["ingested_at"])
    e1 = ok(svc, "/episodes/e-1")
    assert e1["error"] == {"type": None, "message": None} and e1["has_error"] is False
    assert e1["created_at"] == iso(episodes["base"] + 10)
    assert e1["run_id"] == "r-1" and e1["environment_id"] == "env-x" and e1["outcome"] == "solved"


def test_episode_detail_aggregates(svc, episodes) -> None:
    e2 = ok(svc, "/episodes/e-2")
    assert e2["upload_id"] == episodes["2"]
    assert e2["has_error"] is True
    assert e2["error"] == {"type": "Timeout", "message": "too slow"}
    assert e2["traces"] == {
        "trace_count": 3,
        "total_tokens": 151,
        "total_duration_ms": 3750,
        "any_trace_error": True,
        "agent_names": ["critic", "solver"],
    }
    e1 = ok(svc, "/episodes/e-1")["traces"]
    assert e1 == {
        "trace_count": 2,
        "total_tokens": 140,
        "total_duration_ms": 5000,
        "any_trace_error": False,
        "agent_names": ["solver"],
    }
    empty = ok(svc, "/episodes/e-3")
    assert empty["traces"] == {
        "trace_count": 0,
        "total_tokens": 0,
        "total_duration_ms": 0,
        "any_trace_error": False,
        "agent_names": [],
    }


def test_episode_raw_has_member_ids(svc) -> None:
    members = [make_trace("m1", text="caf\u00e9 \u2615"), make_trace("m2")]
    envelope = make_episode("e-raw", members, run_id="r-9")
    committed(upload(svc.url, [envelope], episode=True))
    resp = api(svc, "GET", "/episodes/e-raw", {"raw": "true"})
    assert resp.status_code == 200
    assert int(resp.headers["Content-Length"]) == len(resp.content)
    assert orjson.loads(resp.content) == {**envelope, "traces": ["m1", "m2"]}
    member = api(svc, "GET", "/traces/m1", {"raw": "true"}).content
    assert orjson.loads(member) == members[0]
    assert ok(svc, "/traces/m1")["size_bytes"] == len(member)


def test_episode_member_traces(svc, episodes) -> None:
    assert ids(ok(svc, "/episodes/e-2/traces")) == ["e2c", "e2b", "e2a"]
    assert ids(ok(svc, "/episodes/e-2/traces", {"has_error": "true"})) == ["e2b"]
    assert ids(ok(svc, "/episodes/e-2/traces", {"run_id": "r-1"})) == []
    assert _walk(svc, "/episodes/e-2/traces", {"limit": 2}) == [["e2c", "e2b"], ["e2a"]]
    assert ok(svc, "/episodes/e-3/traces") == {"items": [], "next_cursor": None}
    resp = api(svc, "GET", "/episodes/e-2/traces", {"reward_min": "high"})
    assert resp.status_code == 400 and error_code(resp) == "invalid_filter"


def test_missing_episode_is_404(svc) -> None:
    for params in (None, {"raw": "true"}):
        resp = api(svc, "GET", "/episodes/absent", params)
        assert resp.status_code == 404 and error_code(resp) == "episode_not_found"
    resp = api(svc, "GET", "/episodes/absent/traces")
    assert resp.status_code == 404 and error_code(resp) == "episode_not_found"


def test_newest_episode_copy_wins(svc) -> None:
    start = time.time() - 100
    committed(upload(svc.url, [make_episode("again", [make_trace("x1", start=start)], outcome="one")], episode=True))
    second = committed(
        upload(
            svc.url,
            [
                make_episode(
                    "again",
                    [make_trace("y1", start=start), make_trace("y2", start=start + 1)],
                    outcome="two",
                )
            ],
            episode=True,
        )
    )
    detail = ok(svc, "/episodes/again")
    assert detail["upload_id"] == second and detail["outcome"] == "two"
    assert detail["traces"]["trace_count"] == 2
    assert ids(ok(svc, "/episodes/again/traces")) == ["y2", "y1"]
    assert orjson.loads(api(svc, "GET", "/episodes/again", {"raw": "true"}).content)["traces"] == ["y1", "y2"]


# -- deletes -----------------------------------------------------------------


def test_delete_trace_then_404(svc, seeded) -> None:
    resp = api(svc, "DELETE", "/traces/a1")
    assert resp.status_code == 202 and resp.content == b""
    assert api(svc, "GET", "/traces/a1").status_code == 404
    assert api(svc, "GET", "/traces/a1", {"raw": "true"}).status_code == 404
    again = api(svc, "DELETE", "/traces/a1")
    assert again.status_code == 404 and error_code(again) == "trace_not_found"
    assert "a1" not in ids(ok(svc, "/traces"))


def test_delete_trace_every_copy(svc) -> None:
    start = time.time() - 100
    committed(upload(svc.url, [make_trace("twice", start=start)]))
    committed(upload(svc.url, [make_trace("twice", start=start + 5)]))
    assert api(svc, "DELETE", "/traces/twice").status_code == 202
    assert ids(ok(svc, "/traces")) == []


def test_delete_trace_with_created_at_hint(svc) -> None:
    start = int(time.time()) - 100
    committed(upload(svc.url, [make_trace("hinted", start=start + 0.25)]))
    committed(upload(svc.url, [make_trace("hinted", start=start + 5)]))
    older = ok(svc, "/traces", {"sort": "oldest"})["items"][0]["created_at"]
    miss = api(svc, "DELETE", "/traces/hinted", {"created_at": iso(start + 60)})
    assert miss.status_code == 404 and error_code(miss) == "trace_not_found"
    bad = api(svc, "DELETE", "/traces/hinted", {"created_at": "last tuesday"})
    assert bad.status_code == 400 and error_code(bad) == "invalid_filter"
    assert api(svc, "DELETE", "/traces/hinted", {"created_at": older}).status_code == 202
    left = ok(svc, "/traces")["items"]
    assert [item["created_at"] for item in left] == [iso(start + 5)]
    assert api(svc, "DELETE", "/traces/hinted", {"created_at": older}).status_code == 404


def test_delete_by_run_leaves_episodes(svc, seeded) -> None:
    resp = api(svc, "DELETE", "/traces", {"run_id": "r-1"})
    assert resp.status_code == 202 and resp.content == b""
    assert ids(ok(svc, "/traces", {"run_id": "r-1"})) == []
    assert ids(ok(svc, "/traces")) == ["b2", "b1", "a3"]
    episode = ok(svc, "/episodes/e-1")
    assert episode["traces"]["trace_count"] == 0
    again = api(svc, "DELETE", "/traces", {"run_id": "r-1"})
    assert again.status_code == 404 and error_code(again) == "run_not_found"


def test_delete_by_run_needs_only_run_id(svc, seeded) -> None:
    for params in (None, {"environment_id": "env-x"}, {"run_id": "r-2", "has_error": "true"}):
        resp = api(svc, "DELETE", "/traces", params)
        assert resp.status_code == 400 and error_code(resp) == "invalid_filter", params
    assert len(ok(svc, "/traces")["items"]) == len(ALL)


def test_stats_route(svc, seeded) -> None:
    stats = ok(svc, "/_stats")
    assert stats["uploads"] == 3
    assert stats["lines"] == svc.stats()["lines"] == 6


def test_reads_need_a_token(svc) -> None:
    resp = requests.get(f"{svc.url}/api/v1/traces", timeout=30)
    assert resp.status_code == 401
