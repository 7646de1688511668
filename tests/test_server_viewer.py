"""The web viewer's files and read endpoints over real HTTP (the local section).

The page itself is tested in a real browser in ``test_viewer_browser.py``;
here: what the service answers, its headers, ``ui=False``, and the two
``/_viewer`` lists with their filters, order, pages and errors.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import requests
from _upload_helpers import api, committed, error_code, make_episode, make_trace, ok, upload

from prime_traces.server import LocalTracesService
from prime_traces.server._http import producer_of
from prime_traces.server._ui import CONTENT_SECURITY_POLICY


def pages(svc: LocalTracesService, path: str, **params: Any) -> list[list[dict[str, Any]]]:
    """Every page of a ``/_viewer`` list, following the cursor."""
    out = []
    while True:
        page = ok(svc, path, params)
        out.append(page["items"])
        if page["next_cursor"] is None:
            return out
        params = {**params, "cursor": page["next_cursor"]}


def new_run(svc: LocalTracesService, run_id: str, kind: str = "train", token: str = "test-token") -> None:
    resp = api(svc, "POST", "/runs", json={"name": f"name of {run_id}", "kind": kind, "id": run_id}, token=token)
    assert resp.status_code == 201, resp.text


# -- the files -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "content_type"),
    [
        ("/", "text/html; charset=utf-8"),
        ("/ui/app.js", "text/javascript; charset=utf-8"),
        ("/ui/viewer.css", "text/css; charset=utf-8"),
        ("/ui/vendor/uPlot.iife.min.js", "text/javascript; charset=utf-8"),
        ("/ui/vendor/uPlot-LICENSE.txt", "text/plain; charset=utf-8"),
    ],
)
def test_viewer_files_are_served_without_credentials_under_a_strict_policy(service, path, content_type) -> None:
    resp = requests.get(service.url + path, timeout=10)
    assert resp.status_code == 200
    assert resp.headers["Content-Type"] == content_type
    assert resp.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    assert resp.headers["X-Content-Type-Options"] == "nosniff"
    assert resp.content


def test_the_policy_admits_this_origin_only_and_no_inline_script() -> None:
    directives = dict(d.strip().split(" ", 1) for d in CONTENT_SECURITY_POLICY.split(";"))
    assert directives["default-src"] == "'none'"
    for name in ("script-src", "style-src", "connect-src"):
        assert directives[name] == "'self'", name
    assert "unsafe" not in CONTENT_SECURITY_POLICY
    assert directives["frame-ancestors"] == "'none'"


def test_the_page_loads_only_its_own_files(service) -> None:
    html = requests.get(service.url + "/", timeout=10).text
    assert "<script>" not in html and "style=" not in html
    for ref in ("/ui/app.js", "/ui/viewer.css", "/ui/vendor/uPlot.iife.min.js", "/ui/vendor/uPlot.min.css"):
        assert f'"{ref}"' in html
        assert requests.get(service.url + ref, timeout=10).status_code == 200
    assert "http://" not in html and "https://" not in html


@pytest.mark.parametrize(
    "name", ["nope.js", "..%2F_http.py", ".hidden.js", "app.py", "vendor/%2E%2E/app.js", "a/b/c.js"]
)
def test_only_packaged_viewer_files_are_served(service, name) -> None:
    resp = requests.get(f"{service.url}/ui/{name}", timeout=10)
    assert resp.status_code in (401, 404), (name, resp.status_code)
    assert b"import" not in resp.content


def test_without_ui_the_service_serves_no_page(tmp_path) -> None:
    with LocalTracesService(tmp_path / "traces.db", ui=False) as svc:
        assert svc.viewer_url is None
        assert requests.get(svc.url + "/", timeout=10).status_code == 401
        resp = requests.get(svc.url + "/ui/app.js", headers={"Authorization": "Bearer t"}, timeout=10)
        assert resp.status_code == 404
        assert ok(svc, "/_viewer/runs") == {"items": [], "next_cursor": None}


def test_viewer_url_is_the_service_root(service) -> None:
    assert service.viewer_url == service.url + "/"


@pytest.mark.parametrize("path", ["/_viewer/runs", "/_viewer/runs/r-1/episodes"])
def test_viewer_data_needs_the_key(tmp_path, path) -> None:
    with LocalTracesService(tmp_path / "traces.db", api_key="the-key") as svc:
        new_run(svc, "r-1", token="the-key")
        assert requests.get(f"{svc.url}/api/v1{path}", timeout=10).status_code == 401
        assert api(svc, "GET", path, token="another").status_code == 401
        assert api(svc, "GET", path, token="the-key").status_code == 200
        # The page is served without it: it holds no data, and it asks for the key.
        assert requests.get(svc.url + "/", timeout=10).status_code == 200


# -- GET /_viewer/runs -------------------------------------------------------------


def test_runs_of_every_producer_newest_first_with_what_the_table_shows(service) -> None:
    base = time.time() - 3600
    new_run(service, "older", token="alice")
    committed(
        upload(
            service.url,
            [make_trace("t1", start=base, run_id="traced"), make_trace("t2", start=base + 1, run_id="traced")],
            token="bob",
        )
    )
    new_run(service, "newest", kind="eval", token="carol")
    api(service, "PATCH", "/runs/older", json={"status": "completed"})
    items = ok(service, "/_viewer/runs")["items"]
    assert [r["run_id"] for r in items] == ["newest", "older", "traced"]
    newest, older, traced = items
    assert newest["kind"] == "eval" and newest["status"] == "running" and newest["finished_at"] is None
    assert newest["producer"] == producer_of("carol")
    assert older["status"] == "completed" and older["finished_at"] is not None
    assert older["producer"] == producer_of("alice")
    assert traced["status"] == "unknown" and traced["name"] is None and traced["kind"] == "eval"
    assert traced["records"] == 2 and traced["episodes"] == 0 and traced["bytes"] > 500
    assert traced["producer"] == producer_of("bob")
    assert "bob" not in str(items) and "alice" not in str(items)
    assert all(r["sparkline"] is None for r in items)


def test_runs_filter_by_status_and_kind(service) -> None:
    for run_id, kind in (("a", "train"), ("b", "eval"), ("c", "train")):
        new_run(service, run_id, kind)
    api(service, "PATCH", "/runs/c", json={"status": "failed", "error": "boom"})
    ids = lambda **q: [r["run_id"] for r in ok(service, "/_viewer/runs", q)["items"]]  # noqa: E731
    assert ids(kind="train") == ["c", "a"]
    assert ids(status="running") == ["b", "a"]
    assert ids(status=["failed", "running"], kind="train") == ["c", "a"]
    assert ids(status="unknown") == []
    resp = api(service, "GET", "/_viewer/runs", {"status": "finished"})
    assert resp.status_code == 400 and error_code(resp) == "invalid_filter"


def test_runs_pages_neither_skip_nor_repeat(service) -> None:
    for i in range(7):
        new_run(service, f"run-{i}")
    got = pages(service, "/_viewer/runs", limit=3, kind="train")
    assert [len(p) for p in got] == [3, 3, 1]
    assert [r["run_id"] for p in got for r in p] == [f"run-{i}" for i in reversed(range(7))]
    cursor = ok(service, "/_viewer/runs", {"limit": 3, "kind": "train"})["next_cursor"]
    resp = api(service, "GET", "/_viewer/runs", {"limit": 3, "kind": "eval", "cursor": cursor})
    assert resp.status_code == 400 and error_code(resp) == "invalid_cursor"


def test_sparkline_samples_the_first_metric_in_step_order_with_nan_as_null(service) -> None:
    new_run(service, "m")
    rows = [{"step": s, "time": 1.0 + s, "metrics": {"loss": 100 - s, "acc": s}} for s in range(200)]
    rows[0]["metrics"]["loss"] = "NaN"
    rows.reverse()  # stored out of order; sampled in step order
    assert api(service, "POST", "/runs/m/metrics", json={"rows": rows}).status_code == 200
    (run,) = ok(service, "/_viewer/runs")["items"]
    spark = run["sparkline"]
    assert spark["name"] == "loss"  # the first name of the first stepped row
    assert 50 <= len(spark["values"]) <= 64
    assert spark["values"][0] is None  # NaN: a gap, not dropped
    assert spark["values"][1:] == sorted(spark["values"][1:], reverse=True)
    api(service, "POST", "/runs/m/metrics", json={"rows": [{"step": -1, "time": 0.0, "metrics": {"acc": -1}}]})
    spark = ok(service, "/_viewer/runs")["items"][0]["sparkline"]
    assert spark["name"] == "acc" and spark["values"][0] == -1
    assert spark["values"] == sorted(spark["values"])


# -- GET /_viewer/runs/{id}/episodes ------------------------------------------


def upload_episodes(svc: LocalTracesService, run_id: str, rewards: list[float | None]) -> None:
    base = time.time() - 600
    lines = [
        make_episode(
            f"e-{i}",
            [make_trace(f"t-{i}-{j}", start=base + i, run_id=run_id, reward=reward) for j in range(2)],
            run_id=run_id,
        )
        for i, reward in enumerate(rewards)
    ]
    committed(upload(svc.url, lines, episode=True))


def test_episodes_of_a_run_with_reward_tokens_and_bytes(service) -> None:
    upload_episodes(service, "r", [0.5, None, 1.0])
    upload_episodes(service, "other", [0.1])
    items = ok(service, "/_viewer/runs/r/episodes")["items"]
    assert [e["episode_id"] for e in items] == ["e-2", "e-1", "e-0"]
    assert items[0]["reward"] == 1.0 and items[1]["reward"] is None
    assert items[0]["trace_count"] == 2 and items[0]["total_tokens"] == 240 and items[0]["bytes"] > 500
    assert items[0]["outcome"] == "solved" and items[0]["has_error"] is False


@pytest.mark.parametrize(
    ("sort", "expected"),
    [
        ("newest", ["e-3", "e-2", "e-1", "e-0"]),
        ("oldest", ["e-0", "e-1", "e-2", "e-3"]),
        ("reward_desc", ["e-2", "e-0", "e-3", "e-1"]),
        ("reward_asc", ["e-1", "e-3", "e-0", "e-2"]),
    ],
)
def test_episodes_sort_and_page_by_reward_or_time(service, sort, expected) -> None:
    upload_episodes(service, "r", [0.5, None, 1.0, 0.25])
    got = pages(service, "/_viewer/runs/r/episodes", sort=sort, limit=1)
    assert [e["episode_id"] for p in got for e in p] == expected


def test_episodes_refuse_an_unknown_sort_or_run(service) -> None:
    upload_episodes(service, "r", [0.5])
    resp = api(service, "GET", "/_viewer/runs/r/episodes", {"sort": "best"})
    assert resp.status_code == 400 and error_code(resp) == "invalid_filter"
    resp = api(service, "GET", "/_viewer/runs/nope/episodes")
    assert resp.status_code == 404 and error_code(resp) == "run_not_found"
