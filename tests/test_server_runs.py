"""Runs of the local service over real HTTP: summaries (contract §3, §5) and lifecycle (§9)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from _upload_helpers import api, auth, committed, error_code, make_episode, make_trace, ok, upload

from prime_traces.server import LocalTracesService
from prime_traces.server._http import producer_of

ISO_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
RUN_FIELDS = {
    "run_id",
    "first_trace_created_at",
    "last_trace_created_at",
    "last_trace_ingested_at",
    "trace_count",
    "episode_count",
    "avg_reward",
    "step_min",
    "step_max",
    "step_count",
    "has_error",
    "first_user_id",
    "environment_ids",
    "model_ids",
    "context",
}
LIFECYCLE_FIELDS = {"name", "kind", "status", "config", "summary", "error", "created_at", "finished_at"}


@pytest.fixture
def svc(tmp_path) -> Iterator[LocalTracesService]:
    with LocalTracesService(tmp_path / "traces.db") as service:
        yield service


def iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(int(epoch))) + ".000Z"


def run_ids(page: dict[str, Any]) -> list[str]:
    return [item["run_id"] for item in page["items"]]


# -- summaries from traces ---------------------------------------------------


def test_run_summary_from_traces(svc) -> None:
    base = int(time.time()) - 3600
    committed(
        upload(
            svc.url,
            [
                make_trace("t1", start=base + 10, run_id="r-1", step=1, reward=1.0, model="m-b"),
                make_trace("t2", start=base + 20, run_id="r-1", step=1, reward=None, model="m-a"),
                make_trace("other", start=base + 5, run_id="r-2"),
            ],
            context={"source": "prime-runs", "run_type": "eval"},
            token="alice",
        )
    )
    committed(
        upload(
            svc.url,
            [
                make_episode(
                    "e-1",
                    [
                        make_trace("t3", start=base + 30, run_id="r-1", step=4, reward=0.0, model="m-a", ok=False),
                        make_trace("t4", start=base + 2, run_id="r-1", step=2, reward=0.5, model="m-b"),
                    ],
                    env="env-z",
                    run_id="r-1",
                )
            ],
            episode=True,
            context={"source": "other"},
            token="bob",
        )
    )
    summary = ok(svc, "/runs/r-1")
    assert RUN_FIELDS | LIFECYCLE_FIELDS <= set(summary)
    assert summary["run_id"] == "r-1"
    assert summary["first_trace_created_at"] == iso(base + 2)
    assert summary["last_trace_created_at"] == iso(base + 30)
    assert ISO_RE.match(summary["last_trace_ingested_at"])
    assert summary["trace_count"] == 4 and summary["episode_count"] == 1
    assert summary["avg_reward"] == pytest.approx(0.5)
    assert (summary["step_min"], summary["step_max"], summary["step_count"]) == (1, 4, 3)
    assert summary["has_error"] is True
    assert summary["first_user_id"] == producer_of("alice")
    assert summary["environment_ids"] == ["env-z"]
    assert summary["model_ids"] == ["m-a", "m-b"]
    assert summary["context"] == {"source": "prime-runs", "run_type": "eval"}
    assert all(summary[name] is None for name in LIFECYCLE_FIELDS)
    other = ok(svc, "/runs/r-2")
    assert other["avg_reward"] == 1.0 and other["has_error"] is False
    assert (other["step_min"], other["step_max"], other["step_count"]) == (None, None, 0)
    assert other["environment_ids"] == [] and other["episode_count"] == 0


def test_unknown_run_is_404(svc) -> None:
    resp = api(svc, "GET", "/runs/absent")
    assert resp.status_code == 404 and error_code(resp) == "run_not_found"


def test_run_steps(svc) -> None:
    base = int(time.time()) - 600
    committed(
        upload(
            svc.url,
            [
                make_trace("s1", start=base, run_id="r", step=1, reward=1.0),
                make_trace("s2", start=base, run_id="r", step=1, reward=0.0),
                make_trace("s5", start=base, run_id="r", step=5, reward=None),
                make_trace("none", start=base, run_id="r"),
                make_trace("elsewhere", start=base, run_id="q", step=3),
            ],
        )
    )
    committed(
        upload(
            svc.url,
            [
                make_episode(
                    "ep",
                    [
                        make_trace("s2b", start=base, run_id="r", step=2, reward=0.5),
                        make_trace("s2c", start=base, run_id="r", step=2, reward=1.5),
                    ],
                    run_id="r",
                )
            ],
            episode=True,
        )
    )
    steps = ok(svc, "/runs/r/steps")
    assert steps == {
        "step_min": 1,
        "step_max": 5,
        "step_count": 3,
        "items": [
            {"step": 1, "trace_count": 2, "episode_count": 0, "avg_reward": 0.5},
            {"step": 2, "trace_count": 2, "episode_count": 1, "avg_reward": 1.0},
            {"step": 5, "trace_count": 1, "episode_count": 0, "avg_reward": None},
        ],
    }
    assert ok(svc, "/runs/unknown/steps") == {"step_min": None, "step_max": None, "step_count": 0, "items": []}


# -- lifecycle ---------------------------------------------------------------


def test_create_run_without_traces(svc) -> None:
    resp = api(svc, "POST", "/runs", json={"name": "sweep", "kind": "train", "config": {"lr": 0.1}, "tags": ["a", "b"]})
    assert resp.status_code == 201, resp.text
    run = resp.json()
    assert re.match(r"^run-[0-9a-f]{12}$", run["id"])
    assert run["url"] == f"{svc.url}/api/v1/runs/{run['id']}"
    assert (run["name"], run["kind"], run["status"]) == ("sweep", "train", "running")
    assert run["config"] == {"lr": 0.1} and run["tags"] == ["a", "b"]
    assert ISO_RE.match(run["created_at"]) and run["finished_at"] is None
    summary = ok(svc, f"/runs/{run['id']}")
    assert RUN_FIELDS | LIFECYCLE_FIELDS <= set(summary)
    for name in ("first_trace_created_at", "last_trace_created_at", "last_trace_ingested_at"):
        assert summary[name] == run["created_at"]
    assert (summary["trace_count"], summary["episode_count"], summary["step_count"]) == (0, 0, 0)
    assert summary["avg_reward"] is None and summary["has_error"] is False
    assert summary["environment_ids"] == [] and summary["model_ids"] == [] and summary["context"] == {}
    assert summary["first_user_id"] == producer_of("test-token")
    assert (summary["name"], summary["kind"], summary["status"]) == ("sweep", "train", "running")
    assert summary["config"] == {"lr": 0.1} and summary["summary"] == {}
    assert summary["error"] is None and summary["finished_at"] is None
    assert summary["created_at"] == run["created_at"]
    assert ok(svc, f"/runs/{run['id']}/steps")["items"] == []


def test_create_with_existing_id_returns_it_unchanged(svc) -> None:
    first = api(
        svc, "POST", "/runs", json={"name": "one", "kind": "eval", "config": {"k": 1}, "tags": [], "id": "my-run"}
    )
    assert first.status_code == 201 and first.json()["id"] == "my-run"
    again = api(
        svc, "POST", "/runs", json={"name": "two", "kind": "train", "config": {"k": 2}, "tags": ["x"], "id": "my-run"}
    )
    assert again.status_code in (200, 201)
    body = again.json()
    assert (body["name"], body["kind"], body["config"], body["tags"]) == ("one", "eval", {"k": 1}, [])
    assert body["created_at"] == first.json()["created_at"]


def test_lifecycle_run_gathers_its_traces(svc) -> None:
    run = api(svc, "POST", "/runs", json={"name": "n", "kind": "eval", "config": {}, "tags": []}).json()
    base = int(time.time()) - 60
    committed(upload(svc.url, [make_trace("t", start=base, run_id=run["id"], step=7, reward=0.25)]))
    summary = ok(svc, f"/runs/{run['id']}")
    assert summary["trace_count"] == 1 and summary["first_trace_created_at"] == iso(base)
    assert summary["step_min"] == 7 and summary["avg_reward"] == 0.25
    assert summary["status"] == "running" and summary["created_at"] == run["created_at"]


@pytest.mark.parametrize(
    "body",
    [
        {"name": "x"},
        {"name": "x", "kind": "rl"},
        {"name": 3, "kind": "eval"},
        {"name": "x", "kind": "eval", "config": [1]},
        {"name": "x", "kind": "eval", "tags": "a"},
        {"name": "x", "kind": "eval", "id": "a/b"},
        {"name": "x", "kind": "eval", "id": ""},
        {"name": "x", "kind": "eval", "id": 5},
        [1, 2],
    ],
)
def test_create_run_bad_body(svc, body) -> None:
    resp = api(svc, "POST", "/runs", json=body)
    assert resp.status_code == 400 and error_code(resp) == "invalid_run"


def test_create_run_body_not_json(svc) -> None:
    resp = requests.post(f"{svc.url}/api/v1/runs", data=b"{nope", headers=auth(), timeout=30)
    assert resp.status_code == 400 and error_code(resp) == "invalid_run"


def test_patch_merges_and_finishes(svc) -> None:
    run = api(
        svc, "POST", "/runs", json={"name": "n", "kind": "train", "config": {"a": 1, "b": 2}, "tags": [], "id": "p-1"}
    ).json()
    resp = api(svc, "PATCH", "/runs/p-1", json={"config": {"b": 3, "c": 4}, "summary": {"loss": 0.5}})
    assert resp.status_code == 200, resp.text
    assert resp.json()["config"] == {"a": 1, "b": 3, "c": 4}
    assert resp.json()["status"] == "running" and resp.json()["finished_at"] is None
    api(svc, "PATCH", "/runs/p-1", json={"summary": {"acc": 0.9}})
    done = api(svc, "PATCH", "/runs/p-1", json={"status": "failed", "error": "OOM"})
    assert done.status_code == 200
    finished = done.json()
    assert finished["status"] == "failed" and finished["error"] == "OOM"
    assert ISO_RE.match(finished["finished_at"]) and finished["finished_at"] >= run["created_at"]
    summary = ok(svc, "/runs/p-1")
    assert summary["summary"] == {"loss": 0.5, "acc": 0.9}
    assert (summary["status"], summary["error"]) == ("failed", "OOM")
    assert summary["finished_at"] == finished["finished_at"]


def test_terminal_status_is_final(svc) -> None:
    api(svc, "POST", "/runs", json={"name": "n", "kind": "eval", "config": {}, "tags": [], "id": "f-1"})
    first = api(svc, "PATCH", "/runs/f-1", json={"status": "completed"}).json()
    same = api(svc, "PATCH", "/runs/f-1", json={"status": "completed", "summary": {"late": True}})
    assert same.status_code == 200
    assert same.json()["finished_at"] == first["finished_at"] and same.json()["status"] == "completed"
    assert same.json()["summary"] == {"late": True}
    for status in ("failed", "cancelled", "crashed", "running"):
        resp = api(svc, "PATCH", "/runs/f-1", json={"status": status, "summary": {"lost": 1}})
        assert resp.status_code == 409 and error_code(resp) == "run_finished", status
    summary = ok(svc, "/runs/f-1")
    assert summary["status"] == "completed" and summary["summary"] == {"late": True}


def test_patch_unknown_run_is_404(svc) -> None:
    resp = api(svc, "PATCH", "/runs/absent", json={"status": "completed"})
    assert resp.status_code == 404 and error_code(resp) == "run_not_found"


@pytest.mark.parametrize(
    "body",
    [
        {"status": "done"},
        {"config": "x"},
        {"summary": [1]},
        {"error": "no status"},
        {"status": 1},
        ["x"],
    ],
)
def test_patch_bad_body(svc, body) -> None:
    api(svc, "POST", "/runs", json={"name": "n", "kind": "eval", "config": {}, "tags": [], "id": "b-1"})
    resp = api(svc, "PATCH", "/runs/b-1", json=body)
    assert resp.status_code == 400 and error_code(resp) == "invalid_run"


def test_patch_adopts_a_run_known_from_traces(svc) -> None:
    committed(upload(svc.url, [make_trace("t", run_id="traced", run_type="train")], token="carol"))
    assert ok(svc, "/runs/traced")["status"] is None
    resp = api(svc, "PATCH", "/runs/traced", json={"summary": {"x": 1}, "status": "completed"})
    assert resp.status_code == 200, resp.text
    summary = ok(svc, "/runs/traced")
    assert (summary["status"], summary["kind"], summary["summary"]) == ("completed", "train", {"x": 1})
    assert summary["trace_count"] == 1 and summary["first_user_id"] == producer_of("carol")


# -- the runs list -----------------------------------------------------------


@pytest.fixture
def runs(svc: LocalTracesService) -> dict[str, Any]:
    """Five runs; listed newest-ingested first as: r-a, life, r-c, r-b, r-d."""
    base = int(time.time()) - 3600
    committed(upload(svc.url, [make_trace("d1", start=base + 1, run_id="r-d", run_type="weird")], token="bob"))
    committed(upload(svc.url, [make_trace("a1", start=base + 10, run_id="r-a")], token="alice"))
    committed(upload(svc.url, [make_trace("b1", start=base + 20, run_id="r-b", run_type="train")], token="bob"))
    committed(upload(svc.url, [make_trace("c1", start=base + 30, run_id="r-c")], token="alice"))
    life = api(svc, "POST", "/runs", json={"name": "l", "kind": "train", "config": {}, "tags": [], "id": "life"})
    assert life.status_code == 201
    committed(upload(svc.url, [make_trace("a2", start=base + 40, run_id="r-a")], token="bob"))
    return {"base": base}


def test_runs_list_order(svc, runs) -> None:
    page = ok(svc, "/runs")
    assert run_ids(page) == ["r-a", "life", "r-c", "r-b", "r-d"]
    assert page["next_cursor"] is None
    for item in page["items"]:
        assert RUN_FIELDS | LIFECYCLE_FIELDS <= set(item)
    assert page["items"][0]["trace_count"] == 2 and page["items"][1]["trace_count"] == 0


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"run_type": "train"}, ["life", "r-b"]),
        ({"run_type": "eval"}, ["r-a", "r-c"]),
        ({"run_type": "unknown"}, ["r-d"]),
        ({"run_type": ["unknown", "train"]}, ["life", "r-b", "r-d"]),
        ({"created_by": producer_of("alice")}, ["r-a", "r-c"]),
        ({"created_by": [producer_of("bob"), producer_of("test-token")]}, ["life", "r-b", "r-d"]),
        ({"created_by": "nobody"}, []),
    ],
)
def test_runs_list_filters(svc, runs, params, expected) -> None:
    assert run_ids(ok(svc, "/runs", params)) == expected


def test_runs_list_time_filters(svc, runs) -> None:
    base = runs["base"]
    assert run_ids(ok(svc, "/runs", {"created_before": iso(base + 20)})) == ["r-a", "r-d"]
    assert run_ids(ok(svc, "/runs", {"created_after": iso(base + 20), "created_before": iso(base + 31)})) == [
        "r-c",
        "r-b",
    ]
    assert "life" in run_ids(ok(svc, "/runs", {"created_after": iso(time.time() - 60)}))


def test_runs_list_pages(svc, runs) -> None:
    seen, cursor = [], None
    while True:
        page = ok(svc, "/runs", {"limit": 2, **({"cursor": cursor} if cursor else {})})
        seen.append(run_ids(page))
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [["r-a", "life"], ["r-c", "r-b"], ["r-d"]]
    cursor = ok(svc, "/runs", {"limit": 2})["next_cursor"]
    resp = api(svc, "GET", "/runs", {"limit": 2, "cursor": cursor, "run_type": "eval"})
    assert resp.status_code == 400 and error_code(resp) == "invalid_cursor"


@pytest.mark.parametrize(
    "params",
    [
        {"run_type": "rl"},
        {"created_after": "soon"},
        {"limit": "0"},
        {"limit": "1000"},
    ],
)
def test_runs_list_bad_filters(svc, params) -> None:
    resp = api(svc, "GET", "/runs", params)
    assert resp.status_code == 400 and error_code(resp) == "invalid_filter"


def test_runs_list_drops_runs_whose_traces_are_deleted(svc, runs) -> None:
    assert api(svc, "DELETE", "/traces", {"run_id": "r-b"}).status_code == 202
    assert api(svc, "DELETE", "/traces", {"run_id": "life"}).status_code == 404
    assert run_ids(ok(svc, "/runs")) == ["r-a", "life", "r-c", "r-d"]
    assert api(svc, "GET", "/runs/r-b").status_code == 404
