"""Run metrics history of the local service over real HTTP (contract §9)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import requests
from _upload_helpers import api, auth, committed, error_code, make_trace, ok, upload

from prime_traces.server import LocalTracesService

RUN = "m-1"


def new_run(svc: LocalTracesService, run_id: str = RUN) -> None:
    resp = api(svc, "POST", "/runs", json={"name": "n", "kind": "train", "id": run_id})
    assert resp.status_code == 201, resp.text


def post(svc: LocalTracesService, rows: list[Any], run_id: str = RUN) -> requests.Response:
    return api(svc, "POST", f"/runs/{run_id}/metrics", json={"rows": rows})


def accepted(svc: LocalTracesService, rows: list[Any], run_id: str = RUN) -> None:
    resp = post(svc, rows, run_id)
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"accepted": len(rows)}


def history(svc: LocalTracesService, run_id: str = RUN, **params: Any) -> list[dict[str, Any]]:
    """Every row of the run's history, following the cursor."""
    rows: list[dict[str, Any]] = []
    while True:
        page = ok(svc, f"/runs/{run_id}/metrics", params)
        assert set(page) == {"rows", "next_cursor"}
        rows += page["rows"]
        if page["next_cursor"] is None:
            return rows
        params = {**params, "cursor": page["next_cursor"]}


def row(step: int | None, at: float, **metrics: Any) -> dict[str, Any]:
    return {"step": step, "time": at, "metrics": metrics}


@pytest.fixture
def run(service: LocalTracesService) -> LocalTracesService:
    new_run(service)
    return service


# -- writes and reads --------------------------------------------------------


def test_rows_come_back_in_step_order_then_unstepped_by_time(run) -> None:
    accepted(
        run,
        [
            row(5, 50.0, loss=0.5),
            row(None, 9.0, note="late"),
            row(1, 10.0, loss=1.0),
            row(None, 3.0, note="early"),
            row(3, 30.0, loss=0.7, acc=0.1),
        ],
    )
    assert history(run) == [
        row(1, 10.0, loss=1.0),
        row(3, 30.0, loss=0.7, acc=0.1),
        row(5, 50.0, loss=0.5),
        row(None, 3.0, note="early"),
        row(None, 9.0, note="late"),
    ]


def test_names_filter_keeps_those_names_and_skips_rows_without_them(run) -> None:
    accepted(
        run,
        [
            row(1, 1.0, **{"train/loss": 1.0, "lr": 0.1}),
            row(2, 2.0, lr=0.2),
            row(3, 3.0, **{"train/loss": 0.5, "eval/acc": 0.9}),
            row(None, 4.0, other=1),
        ],
    )
    assert history(run, names="train/loss") == [row(1, 1.0, **{"train/loss": 1.0}), row(3, 3.0, **{"train/loss": 0.5})]
    both = [row(1, 1.0, **{"train/loss": 1.0}), row(3, 3.0, **{"train/loss": 0.5, "eval/acc": 0.9})]
    assert history(run, names="train/loss,eval/acc") == both
    assert history(run, names=["train/loss", "eval/acc"]) == both
    assert history(run, names="absent") == []


def test_step_bounds_are_inclusive_and_leave_out_unstepped_rows(run) -> None:
    accepted(run, [row(step, float(step), x=step) for step in range(10)] + [row(None, 99.0, x=-1)])
    assert [r["step"] for r in history(run, min_step=3, max_step=5)] == [3, 4, 5]
    assert [r["step"] for r in history(run, min_step=8)] == [8, 9]
    assert [r["step"] for r in history(run, max_step=1)] == [0, 1]
    assert [r["step"] for r in history(run, min_step=4, max_step=4)] == [4]


def test_cursor_pages_cover_the_history_once(run) -> None:
    rows = [row(step, 1000.0 - step, x=step, **({"odd": True} if step % 2 else {})) for step in range(23)]
    rows += [row(None, 5.0, u=i) for i in range(6)]  # equal times: storage order breaks the tie
    accepted(run, rows)
    everything = history(run)
    assert everything == history(run, limit=10_000)
    assert len(everything) == 29
    for limit in (1, 4, 7, 23, 24, 28, 29):
        assert history(run, limit=limit) == everything, limit
    page = ok(run, f"/runs/{RUN}/metrics", {"limit": 7})
    assert len(page["rows"]) == 7 and page["next_cursor"]
    assert [r["metrics"]["u"] for r in everything[23:]] == list(range(6))
    odd = history(run, names="odd", limit=3)
    assert [r["step"] for r in odd] == list(range(1, 23, 2))
    assert history(run, min_step=10, max_step=20, limit=4) == everything[10:21]
    cursor = ok(run, f"/runs/{RUN}/metrics", {"limit": 2, "names": "x"})["next_cursor"]
    resp = api(run, "GET", f"/runs/{RUN}/metrics", {"cursor": cursor, "names": "odd"})
    assert resp.status_code == 400 and error_code(resp) == "invalid_cursor"


def test_replaying_a_request_changes_nothing(run) -> None:
    rows = [row(step, 100.0 + step, loss=1.0 / (step + 1), tag="a") for step in range(50)]
    accepted(run, rows)
    before, summary = history(run), ok(run, f"/runs/{RUN}")["metrics"]
    accepted(run, rows)
    assert history(run) == before
    assert ok(run, f"/runs/{RUN}")["metrics"] == summary


def test_the_same_step_again_merges_names_and_keeps_the_later_time(run) -> None:
    accepted(run, [row(1, 10.0, a=1, b=2)])
    accepted(run, [row(1, 5.0, b=3, c=4)])
    assert history(run) == [row(1, 10.0, a=1, b=3, c=4)]
    accepted(run, [row(1, 20.0, a=True)])
    assert history(run) == [row(1, 20.0, a=True, b=3, c=4)]
    accepted(run, [row(2, 1.0, a=1), row(2, 3.0, a=2.0, z=None), row(2, 2.0, y="s")])
    assert history(run, min_step=2) == [row(2, 3.0, a=2.0, z=None, y="s")]


def test_unstepped_rows_are_appended(run) -> None:
    accepted(run, [row(None, 1.0, a=1)])
    accepted(run, [row(None, 1.0, a=1), {"time": 2.0, "metrics": {"a": 2}}])
    assert history(run) == [row(None, 1.0, a=1), row(None, 1.0, a=1), row(None, 2.0, a=2)]


def test_values_round_trip(run) -> None:
    metrics = {
        "nan": "NaN",
        "inf": "Infinity",
        "-inf": "-Infinity",
        "flag": False,
        "none": None,
        "int": 2**63,
        "neg": -(2**63),
        "float": 1.0,
        "tiny": 1e-300,
        "text": "ok/ß",
        "": "any string is a name",
        "a,b": 1,
    }
    accepted(run, [row(-3, 1.5, **metrics), row(2**63 - 1, 2, a=1)])
    assert history(run) == [row(-3, 1.5, **metrics), row(2**63 - 1, 2.0, a=1)]


# -- refusals ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("rows", "named"),
    [
        ([row(1, 1.0, ok=1), row(2, 1.0, bad=[1, 2])], ["rows[1]", "'bad'", "list"]),
        ([row(1, 1.0, bad={"x": 1})], ["rows[0]", "'bad'", "object"]),
        ([row(True, 1.0, a=1)], ["rows[0].step", "boolean"]),
        ([row(1, 1.0), {"step": "x", "time": 1.0, "metrics": {}}], ["rows[1].step", "'x'"]),
        ([row(1.5, 1.0, a=1)], ["rows[0].step", "1.5"]),
        ([row(2**63, 1.0, a=1)], ["rows[0].step", "int64"]),
        ([{"step": 1, "metrics": {"a": 1}}], ["rows[0].time", "missing"]),
        ([row(1, "now", a=1)], ["rows[0].time", "'now'"]),
        ([row(1, False, a=1)], ["rows[0].time", "boolean"]),
        ([{"step": 1, "time": 1.0}], ["rows[0].metrics", "missing"]),
        ([{"step": 1, "time": 1.0, "metrics": [1]}], ["rows[0].metrics", "list"]),
        ([[1, 2]], ["rows[0]", "list"]),
    ],
)
def test_bad_rows_are_refused_by_index_and_name(run, rows, named) -> None:
    resp = post(run, rows)
    assert resp.status_code == 400 and error_code(resp) == "invalid_run"
    message = resp.json()["error"]["message"]
    assert all(part in message for part in named), message
    assert history(run) == []  # nothing of a refused request is stored


@pytest.mark.parametrize("body", [[], {"rows": {"a": 1}}, {}, {"rows": None}])
def test_bad_bodies_are_refused(run, body) -> None:
    resp = api(run, "POST", f"/runs/{RUN}/metrics", json=body)
    assert resp.status_code == 400 and error_code(resp) == "invalid_run"


def test_a_literal_nan_is_not_json(run) -> None:
    body = b'{"rows": [{"step": 1, "time": 1.0, "metrics": {"loss": NaN}}]}'
    resp = requests.post(f"{run.url}/api/v1/runs/{RUN}/metrics", data=body, headers=auth(), timeout=30)
    assert resp.status_code == 400 and error_code(resp) == "invalid_run"


def test_more_than_ten_thousand_rows_are_refused(run) -> None:
    resp = post(run, [row(step, 1.0, a=1) for step in range(10_001)])
    assert resp.status_code == 400 and error_code(resp) == "invalid_run"
    assert "10,000" in resp.json()["error"]["message"]
    assert history(run) == []


@pytest.mark.parametrize(
    "params",
    [
        {"limit": 0},
        {"limit": 10_001},
        {"limit": "x"},
        {"min_step": "x"},
        {"max_step": "1.5"},
        {"min_step": 5, "max_step": 4},
        {"min_step": 2**63},
        {"names": ""},
        {"names": ","},
        {"limit": [1, 2]},
    ],
)
def test_bad_query_values_are_invalid_filter(run, params) -> None:
    resp = api(run, "GET", f"/runs/{RUN}/metrics", params)
    assert resp.status_code == 400 and error_code(resp) == "invalid_filter", resp.text


def test_a_foreign_cursor_is_refused(run) -> None:
    new_run(run, "other")
    accepted(run, [row(step, 1.0, a=1) for step in range(3)], "other")
    cursor = ok(run, "/runs/other/metrics", {"limit": 1})["next_cursor"]
    for token in (cursor, "not-a-cursor"):
        resp = api(run, "GET", f"/runs/{RUN}/metrics", {"cursor": token})
        assert resp.status_code == 400 and error_code(resp) == "invalid_cursor"


def test_unknown_run_is_404(service) -> None:
    for resp in (post(service, [row(1, 1.0, a=1)], "absent"), api(service, "GET", "/runs/absent/metrics")):
        assert resp.status_code == 404 and error_code(resp) == "run_not_found"


def test_a_run_known_from_traces_takes_metrics(service) -> None:
    committed(upload(service.url, [make_trace("t", run_id="traced")]))
    accepted(service, [row(1, 1.0, a=1)], "traced")
    assert history(service, "traced") == [row(1, 1.0, a=1)]
    assert ok(service, "/runs/traced")["status"] is None  # posting made no lifecycle row


def test_metrics_need_a_bearer_token(run) -> None:
    resp = requests.get(f"{run.url}/api/v1/runs/{RUN}/metrics", timeout=30)
    assert resp.status_code == 401 and error_code(resp) == "unauthenticated"


# -- the summary on GET /runs/{id} ------------------------------------------------


def test_run_summary_carries_the_metrics(run) -> None:
    assert ok(run, f"/runs/{RUN}")["metrics"] == {}
    accepted(
        run,
        [
            row(3, 30.0, loss=0.5, phase="warm", lr=1e-3),
            row(1, 10.0, loss=2.0, phase="cold", ok=True),
            row(2, 20.0, loss="NaN", ok=False),
            row(4, 40.0, loss=1.0, lr=None, phase="Infinity"),
        ],
    )
    assert ok(run, f"/runs/{RUN}")["metrics"] == {
        "loss": {"last": 1.0, "min": 0.5, "max": 2.0, "count": 4, "last_step": 4},
        "phase": {"last": "Infinity", "min": None, "max": None, "count": 3, "last_step": 4},
        "lr": {"last": None, "min": 1e-3, "max": 1e-3, "count": 2, "last_step": 4},
        "ok": {"last": False, "min": None, "max": None, "count": 2, "last_step": 2},
    }
    accepted(run, [row(None, 1.0, loss="NaN")])  # unstepped rows sort last, so it is the last value
    loss = ok(run, f"/runs/{RUN}")["metrics"]["loss"]
    assert loss == {"last": "NaN", "min": 0.5, "max": 2.0, "count": 5, "last_step": None}
    assert all("metrics" not in item for item in ok(run, "/runs")["items"])


def test_ten_thousand_rows_in_one_request(run) -> None:
    rows = [
        row(step, 1_700_000_000.0 + step, **{f"train/m{i}": step * 0.5 + i for i in range(10)})
        for step in range(10_000)
    ]
    started = time.monotonic()
    accepted(run, rows)
    assert time.monotonic() - started < 10
    started = time.monotonic()
    accepted(run, rows)  # the replay reads and compares every row
    summary = ok(run, f"/runs/{RUN}")["metrics"]
    assert time.monotonic() - started < 10
    assert summary["train/m9"] == {
        "last": 9999 * 0.5 + 9,
        "min": 9.0,
        "max": 9999 * 0.5 + 9,
        "count": 10_000,
        "last_step": 9999,
    }
    page = ok(run, f"/runs/{RUN}/metrics")
    assert len(page["rows"]) == 1_000 and page["rows"][-1]["step"] == 999
