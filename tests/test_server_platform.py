"""The platform's eval run routes and environments hub (contract §10) on the local service, over HTTP.

Requests are shaped as the published prime-runs 0.1.4 sends them; the runs
they make are read back through ``GET /api/v1/runs/{id}`` like any other.
"""

from __future__ import annotations

import sqlite3
import time

import pytest
from _platform_helpers import answer, call, create_eval, create_train, error_of, resolve_env, run_summary
from _upload_helpers import committed, make_episode, make_trace, upload

from prime_traces.server import LocalTracesService

# -- environments hub ------------------------------------------------------------


def test_a_name_resolves_to_one_id_per_team(service) -> None:
    first = resolve_env(service, "gsm8k", team_id="team-1")
    assert first.startswith("env-")
    assert resolve_env(service, "gsm8k", team_id="team-1") == first  # a replay creates nothing
    assert resolve_env(service, "gsm8k", team_id="team-2") != first
    no_team = resolve_env(service, "gsm8k")
    assert no_team not in (first, resolve_env(service, "gsm8k", team_id="team-2"))
    assert resolve_env(service, "gsm8k", team_id="") == no_team


def test_a_published_slug_resolves_through_latest(service) -> None:
    latest = answer(call(service, "GET", "/environmentshub/alice/gsm8k/@latest"))["data"]
    assert latest["id"].startswith("env-") and latest["owner"] == "alice" and latest["name"] == "gsm8k"
    assert answer(call(service, "GET", "/environmentshub/alice/gsm8k/@latest"))["data"]["id"] == latest["id"]
    # The same slug by name, whichever team asks, is the same environment; a bare name is another.
    assert resolve_env(service, "alice/gsm8k", team_id="team-1") == latest["id"]
    assert resolve_env(service, "gsm8k") != latest["id"]
    assert answer(call(service, "GET", "/environmentshub/bob/gsm8k/@latest"))["data"]["id"] != latest["id"]


# -- evaluations -----------------------------------------------------------------


def test_an_evaluation_runs_from_its_environment_name_to_completion(service) -> None:
    env_id = resolve_env(service, "gsm8k", team_id="team-1")
    created = create_eval(
        service,
        "gsm8k-1a2b3c4d",
        [env_id],
        tags=["nightly"],
        model_name="qwen/qwen3-8b",
        dataset="gsm8k",
        framework="verifiers",
        metadata={"lr": 1e-6, "old": True},
        team_id="team-1",
    )
    eval_id = created["evaluation_id"]
    assert created["status"] == "RUNNING" and created["name"] == "gsm8k-1a2b3c4d"
    assert created["viewer_url"] == f"{service.url}/#/run/{eval_id}"
    assert created["environments"] == [{"id": env_id}] and created["metadata"] == {"lr": 1e-6, "old": True}

    episodes = [
        make_episode(f"ep-{i}", [make_trace(f"t-{i}", run_id=eval_id)], run_id=eval_id, env=env_id) for i in range(3)
    ]
    committed(upload(service.url, episodes, episode=True, context={"source": "prime-runs", "run_type": "eval"}))
    run = run_summary(service, eval_id)
    assert (run["episode_count"], run["trace_count"]) == (3, 3)
    assert (run["kind"], run["run_type"], run["status"], run["name"]) == ("eval", "eval", "running", "gsm8k-1a2b3c4d")
    assert run["tags"] == ["nightly"] and run["environment_ids"] == [env_id]
    assert run["platform"]["model_name"] == "qwen/qwen3-8b" and run["platform"]["team_id"] == "team-1"

    # The metadata is the whole config document (replaced); the metrics merge into the summary.
    answer(call(service, "PUT", f"/evaluations/{eval_id}", {"metadata": {"lr": 2e-6}, "metrics": {"a": 1}}))
    updated = answer(call(service, "PUT", f"/evaluations/{eval_id}", {"metrics": {"b": 2}}))
    assert updated["metadata"] == {"lr": 2e-6} and updated["metrics"] == {"a": 1, "b": 2}
    assert updated["status"] == "RUNNING"

    final = answer(call(service, "POST", f"/evaluations/{eval_id}/finalize", {"metrics": {"avg_reward": 0.75}}))
    assert final["status"] == "COMPLETED" and final["finished_at"] is not None
    run = run_summary(service, eval_id)
    assert run["status"] == "completed" and run["error"] is None
    assert run["summary"] == {"a": 1, "b": 2, "avg_reward": 0.75} and run["config"] == {"lr": 2e-6}
    assert run["episode_count"] == 3

    again = answer(call(service, "POST", f"/evaluations/{eval_id}/finalize", {"metrics": {"avg_reward": 0.1}}))
    assert again["status"] == "COMPLETED" and again["metrics"]["avg_reward"] == 0.75  # changes nothing
    refused = error_of(call(service, "PUT", f"/evaluations/{eval_id}", {"status": "FAILED", "metrics": {"x": 1}}), 409)
    assert refused["code"] == "run_finished" and "already closed" in refused["message"]
    run = run_summary(service, eval_id)
    assert run["status"] == "completed" and "x" not in run["summary"]
    listed = answer(call(service, "GET", "/runs"))
    assert [item["run_id"] for item in listed["items"]] == [eval_id]


def test_an_evaluation_fails_through_a_status_update(service) -> None:
    eval_id = create_eval(service, "e", ["env-given"], metadata={"k": 1})["evaluation_id"]
    # The SDK's failing finish: the same config/summary PUT twice, then the status.
    for _ in range(2):
        answer(call(service, "PUT", f"/evaluations/{eval_id}", {"metadata": {"k": 1}, "metrics": {"n": 1}}))
    failed = answer(call(service, "PUT", f"/evaluations/{eval_id}", {"status": "FAILED", "error_message": "boom"}))
    assert (failed["status"], failed["error_message"]) == ("FAILED", "boom")
    run = run_summary(service, eval_id)
    assert (run["status"], run["error"], run["summary"]) == ("failed", "boom", {"n": 1})
    assert run["finished_at"] is not None

    assert error_of(call(service, "PUT", f"/evaluations/{eval_id}", {"status": "CANCELLED"}), 409)["code"] == (
        "run_finished"
    )
    assert error_of(call(service, "POST", f"/evaluations/{eval_id}/finalize", {"metrics": {}}), 409)["code"] == (
        "run_finished"
    )
    # A closed run's record may still be completed.
    answer(call(service, "PUT", f"/evaluations/{eval_id}", {"metrics": {"late": True}}))
    run = run_summary(service, eval_id)
    assert (run["status"], run["error"], run["summary"]) == ("failed", "boom", {"n": 1, "late": True})


def test_an_evaluation_can_be_cancelled_and_created_without_the_trailing_slash(service) -> None:
    body = {"name": "no-slash", "environments": [{"id": "env-1", "version_id": "v7"}], "tags": ["a"]}
    eval_id = answer(call(service, "POST", "/evaluations", body), 201)["evaluation_id"]
    cancelled = call(service, "PUT", f"/evaluations/{eval_id}", {"status": "cancelled", "error_message": "interrupted"})
    assert answer(cancelled)["status"] == "CANCELLED"
    run = run_summary(service, eval_id)
    assert (run["status"], run["error"]) == ("cancelled", "interrupted")
    assert run["platform"]["environments"] == [{"id": "env-1", "version_id": "v7"}]


def test_eval_samples_are_stored_and_counted(service) -> None:
    eval_id = create_eval(service, "samples", ["env-1"])["evaluation_id"]
    samples = [{"sample_id": "ep-1", "reward": 1.0}, {"sample_id": 2, "reward": 0.0}, {"reward": 0.5}]
    pushed = answer(call(service, "POST", f"/evaluations/{eval_id}/samples", {"samples": samples}))
    assert pushed == {"evaluation_id": eval_id, "samples_pushed": 3, "status": "RUNNING"}
    # Sent again, the rows with a sample id replace theirs; the one without is appended.
    resent = [{"sample_id": "ep-1", "reward": 0.25}, {"reward": 0.5}]
    assert answer(call(service, "POST", f"/evaluations/{eval_id}/samples", {"samples": resent}))["samples_pushed"] == 2
    page = answer(call(service, "GET", f"/runs/{eval_id}/samples"))
    stored = [(item["sample_id"], item["sample"]["reward"]) for item in page["items"]]
    assert sorted(stored, key=str) == sorted([("ep-1", 0.25), ("2", 0.0), (None, 0.5), (None, 0.5)], key=str)
    assert page["next_cursor"] is None
    first = answer(call(service, "GET", f"/runs/{eval_id}/samples?limit=3"))
    rest = answer(call(service, "GET", f"/runs/{eval_id}/samples?limit=3&cursor={first['next_cursor']}"))
    assert (len(first["items"]), len(rest["items"]), rest["next_cursor"]) == (3, 1, None)

    for bad, where in (({"samples": {"a": 1}}, "samples"), ({"samples": [1]}, "samples[0]")):
        error = error_of(call(service, "POST", f"/evaluations/{eval_id}/samples", bad), 400)
        assert error["code"] == "invalid_run" and where in error["message"]


# -- errors shared by every route ------------------------------------------------

UNKNOWN = "eval-000000000000"
ROUTES_OF_A_RUN = [
    ("PUT", f"/evaluations/{UNKNOWN}", {"metrics": {"a": 1}}),
    ("PUT", f"/evaluations/{UNKNOWN}", {"status": "FAILED"}),
    ("POST", f"/evaluations/{UNKNOWN}/finalize", {"metrics": {}}),
    ("POST", f"/evaluations/{UNKNOWN}/samples", {"samples": []}),
    ("PUT", f"/rft/external-runs/{UNKNOWN}/status", {"status": "failed"}),
    ("POST", "/rft/finalize", {"run_id": UNKNOWN, "exit_code": 0}),
    ("POST", "/rft/metrics", {"run_id": UNKNOWN, "metrics": {"loss": 1.0, "step": 0}}),
    ("POST", "/rft/samples/presign", {"run_id": UNKNOWN, "step": 0}),
    ("POST", "/rft/samples/confirm", {"run_id": UNKNOWN, "step": 0, "s3_key": "k"}),
]


@pytest.mark.parametrize(("method", "path", "body"), ROUTES_OF_A_RUN)
def test_an_unknown_run_is_404(service, method: str, path: str, body: dict) -> None:
    for root in ("/api/v1", "/api/internal"):
        error = error_of(call(service, method, path, body, root=root), 404)
        assert error["code"] == "run_not_found" and UNKNOWN in error["message"]


def test_a_run_of_the_other_kind_is_not_found(service) -> None:
    eval_id = create_eval(service, "e", ["env-1"])["evaluation_id"]
    train_id = create_train(service)["id"]
    error = error_of(call(service, "POST", "/rft/finalize", {"run_id": eval_id, "exit_code": 0}), 404)
    assert error["code"] == "run_not_found" and "eval run" in error["message"]
    error = error_of(call(service, "POST", f"/evaluations/{train_id}/finalize", {"metrics": {}}), 404)
    assert error["code"] == "run_not_found" and "train run" in error["message"]
    assert run_summary(service, eval_id)["status"] == run_summary(service, train_id)["status"] == "running"


def test_a_run_known_only_from_its_traces_is_finalized(service) -> None:
    # An attached run: its id came from elsewhere, and its traces arrived first.
    committed(upload(service.url, [make_trace("t-1", run_id="attached-1")]))
    answer(call(service, "POST", "/evaluations/attached-1/finalize", {"metrics": {"avg_reward": 1.0}}))
    run = run_summary(service, "attached-1")
    assert (run["status"], run["kind"], run["summary"]) == ("completed", "eval", {"avg_reward": 1.0})


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/environmentshub/resolve", {"name": "gsm8k"}),
        ("GET", "/environmentshub/alice/gsm8k/@latest", None),
        ("POST", "/evaluations/", {"name": "e", "environments": [], "tags": []}),
        *ROUTES_OF_A_RUN,
        ("GET", f"/runs/{UNKNOWN}/samples", None),
        ("GET", f"/runs/{UNKNOWN}/sample-files", None),
    ],
)
def test_the_routes_need_a_credential(tmp_path, method: str, path: str, body: dict | None) -> None:
    with LocalTracesService(tmp_path / "traces.db", api_key="the-key") as svc:
        for token in (None, "wrong-key"):
            error = error_of(call(svc, method, path, body, token=token), 401)
            assert error["code"] == "unauthenticated"
        assert call(svc, method, path, body, token="the-key").status_code != 401


@pytest.mark.parametrize(
    ("path", "body", "named"),
    [
        ("/evaluations/", {"environments": [], "tags": []}, "name"),
        ("/evaluations/", {"name": "e", "environments": {"id": "x"}, "tags": []}, "environments"),
        ("/evaluations/", {"name": "e", "environments": [{"version_id": "v"}]}, "environments[0].id"),
        ("/evaluations/", {"name": "e", "environments": [], "tags": "a"}, "tags"),
        ("/evaluations/", {"name": "e", "environments": [], "metadata": [1]}, "metadata"),
        ("/environmentshub/resolve", {"team_id": "t"}, "name"),
        ("/rft/external-runs", {"base_model": "m", "max_steps": 1, "environments": []}, "team_id"),
        ("/rft/external-runs", {"base_model": "m", "max_steps": "1", "environments": [], "team_id": "t"}, "max_steps"),
        ("/rft/metrics", {"run_id": "r", "metrics": {"step": "one"}}, "step"),
        ("/rft/metrics", {"run_id": "r"}, "metrics"),
        ("/rft/finalize", {"exit_code": 0}, "run_id"),
    ],
)
def test_a_bad_body_is_400_naming_what_is_wrong(service, path: str, body: dict, named: str) -> None:
    error = error_of(call(service, "POST", path, body), 400)
    assert error["code"] == "invalid_run" and named in error["message"]


def test_a_bad_status_update_is_400(service) -> None:
    eval_id = create_eval(service, "e", ["env-1"])["evaluation_id"]
    for body, named in (
        ({"status": "COMPLETED"}, "finalize"),
        ({"error_message": "boom"}, "needs a status"),
        ({"status": "FAILED", "error_message": "x" * 4097}, "4,096"),
    ):
        error = error_of(call(service, "PUT", f"/evaluations/{eval_id}", body), 400)
        assert error["code"] == "invalid_run" and named in error["message"]
    resp = call(service, "POST", "/evaluations/", headers={"Content-Type": "application/json"})
    assert error_of(resp, 400)["code"] == "invalid_run"  # no body at all: no name
    assert run_summary(service, eval_id)["status"] == "running"


# -- the database --------------------------------------------------------------------

OLD_RUNS_TABLE = """
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY, name TEXT, kind TEXT, config TEXT NOT NULL, summary TEXT NOT NULL,
    tags TEXT NOT NULL, status TEXT NOT NULL, error TEXT, created_at REAL NOT NULL,
    finished_at REAL, created_by TEXT
)"""


def test_a_database_made_before_the_platform_routes_opens_and_takes_them(tmp_path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.execute(OLD_RUNS_TABLE)
        conn.execute(
            "INSERT INTO runs VALUES ('run-old', 'old', 'train', ?, '{}', '[]', 'completed', NULL, ?, ?, 'k')",
            ('{"lr": 1}', time.time() - 60, time.time() - 30),
        )
    conn.close()
    with LocalTracesService(path) as svc:
        old = run_summary(svc, "run-old")
        assert (old["name"], old["status"], old["config"], old["platform"]) == ("old", "completed", {"lr": 1}, None)
        eval_id = create_eval(svc, "new", [resolve_env(svc, "gsm8k")])["evaluation_id"]
        assert run_summary(svc, eval_id)["platform"]["api"] == "evaluations"
    with LocalTracesService(path) as svc:  # opened again: nothing left to add
        assert run_summary(svc, eval_id)["name"] == "new"
