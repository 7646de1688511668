"""The platform's training run routes (contract §10) on the local service, over HTTP.

External runs, their metrics (kept in the run's metrics history), finalize
and status updates, the internal root with ``x-api-key``, and the legacy
sample files (presign, a PUT to the presigned URL, confirm).
"""

from __future__ import annotations

import hashlib

import requests
from _platform_helpers import INTERNAL_ROOT, answer, call, create_train, error_of, run_summary

from prime_traces.server import LocalTracesService


def history(svc, run_id: str) -> list[dict]:
    page = answer(call(svc, "GET", f"/runs/{run_id}/metrics"))
    assert page["next_cursor"] is None
    return page["rows"]


def post_metrics(svc, run_id: str, metrics: dict, root: str = "/api/v1") -> None:
    resp = call(svc, "POST", "/rft/metrics", {"run_id": run_id, "metrics": metrics}, root=root)
    assert answer(resp) == {"data": {"status": "success"}}


def test_a_training_run_is_created_with_what_it_was_given(service) -> None:
    run = create_train(
        service, name="grpo-math", batch_size=64, seq_len=4096, run_config={"lr": 1e-6}, wandb_project="p"
    )
    assert run["id"].startswith("train-") and (run["name"], run["status"]) == ("grpo-math", "RUNNING")
    assert run["viewer_url"] == f"{service.url}/#/run/{run['id']}"
    summary = run_summary(service, run["id"])
    assert (summary["kind"], summary["status"], summary["name"]) == ("train", "running", "grpo-math")
    assert summary["config"] == {"lr": 1e-6} and summary["tags"] == []
    assert summary["platform"] == {
        "api": "rft",
        "base_model": "qwen/qwen3-8b",
        "max_steps": 100,
        "environments": [{"id": "env-1"}],
        "team_id": "team-1",
        "batch_size": 64,
        "seq_len": 4096,
        "wandb_project": "p",
    }


def test_metrics_keep_one_row_per_step_through_replays_and_a_failure_closes_the_run(service) -> None:
    run_id = create_train(service)["id"]
    for _ in range(2):  # the second round is the SDK replaying each request
        for step in range(3):
            post_metrics(service, run_id, {"loss": 1.0 / (step + 1), "step": step, "_timestamp": 1000.0 + step})
    rows = history(service, run_id)
    assert [row["step"] for row in rows] == [0, 1, 2]
    assert [row["metrics"] for row in rows] == [{"loss": 1.0}, {"loss": 0.5}, {"loss": 1.0 / 3}]
    assert [row["time"] for row in rows] == [1000.0, 1001.0, 1002.0]
    assert run_summary(service, run_id)["metrics"]["loss"]["count"] == 3

    failed = call(service, "PUT", f"/rft/external-runs/{run_id}/status", {"status": "failed", "error_message": "boom"})
    assert answer(failed)["run"]["status"] == "FAILED"
    run = run_summary(service, run_id)
    assert (run["status"], run["error"]) == ("failed", "boom") and run["finished_at"] is not None

    again = call(service, "PUT", f"/rft/external-runs/{run_id}/status", {"status": "failed", "error_message": "2nd"})
    assert error_of(again, 409)["code"] == "run_finished"
    assert error_of(call(service, "POST", "/rft/finalize", {"run_id": run_id, "exit_code": 0}), 409)["code"] == (
        "run_finished"
    )
    assert run_summary(service, run_id)["error"] == "boom"


def test_metrics_flatten_nested_values_and_a_row_without_a_step_is_replay_safe(service) -> None:
    run_id = create_train(service)["id"]
    nested = {"train": {"loss": 0.5, "lr": {"group0": 1e-6}}, "quantiles": [0.1, 0.9], "step": 7}
    post_metrics(service, run_id, {**nested, "_timestamp": 5.0})
    post_metrics(service, run_id, {"reward": 1.0, "step": 7, "_timestamp": 6.0})  # merges into step 7
    for _ in range(2):
        post_metrics(service, run_id, {"eval/acc": 0.25, "_timestamp": 9.0})
    post_metrics(service, run_id, {"eval/acc": 0.5, "_timestamp": 10.0})
    assert history(service, run_id) == [
        {
            "step": 7,
            "time": 6.0,
            "metrics": {"train/loss": 0.5, "train/lr/group0": 1e-6, "quantiles": "[0.1,0.9]", "reward": 1.0},
        },
        {"step": None, "time": 9.0, "metrics": {"eval/acc": 0.25}},
        {"step": None, "time": 10.0, "metrics": {"eval/acc": 0.5}},
    ]


def test_finalize_completes_the_run_and_is_replay_safe(service) -> None:
    run_id = create_train(service)["id"]
    for _ in range(2):
        done = answer(call(service, "POST", "/rft/finalize", {"run_id": run_id, "exit_code": 0}))
        assert done["data"] == {"status": "success"} and done["run"]["status"] == "COMPLETED"
    run = run_summary(service, run_id)
    assert (run["status"], run["error"], run["platform"]["exit_code"]) == ("completed", None, 0)
    late = call(service, "PUT", f"/rft/external-runs/{run_id}/status", {"status": "completed"})
    assert error_of(late, 409)["code"] == "run_finished"  # the SDK's fallback: already closed is success


def test_a_nonzero_exit_code_fails_the_run(service) -> None:
    run_id = create_train(service)["id"]
    answer(call(service, "POST", "/rft/finalize", {"run_id": run_id, "exit_code": 3}))
    run = run_summary(service, run_id)
    assert (run["status"], run["error"], run["platform"]["exit_code"]) == ("failed", "exit code 3", 3)


def test_the_internal_root_takes_the_token_in_x_api_key(tmp_path) -> None:
    with LocalTracesService(tmp_path / "traces.db", api_key="run-token") as svc:
        run_id = answer(
            call(
                svc,
                "POST",
                "/rft/external-runs",
                {"base_model": "m", "max_steps": 1, "environments": [], "team_id": "t"},
                token="run-token",
            ),
            201,
        )["run"]["id"]
        # The presigned URL needs no credential, even from a service with a key: its token is one.
        slot = answer(call(svc, "POST", "/rft/samples/presign", {"run_id": run_id, "step": 0}, token="run-token"))
        assert requests.put(slot["data"]["presignedUrl"], data=b"PAR1", timeout=30).status_code == 200
        url = f"{svc.url}{INTERNAL_ROOT}/rft/finalize"
        body = {"run_id": run_id, "exit_code": 0}
        refused = requests.post(url, json=body, headers={"x-api-key": "not-it"}, timeout=30)
        assert error_of(refused, 401)["code"] == "unauthenticated"
        # x-api-key alone is enough on the internal root, and is no credential on /api/v1.
        public = requests.post(
            f"{svc.url}/api/v1/rft/finalize", json=body, headers={"x-api-key": "run-token"}, timeout=30
        )
        assert error_of(public, 401)["code"] == "unauthenticated"
        done = requests.post(url, json=body, headers={"x-api-key": "run-token"}, timeout=30)
        assert answer(done)["run"]["status"] == "COMPLETED"
        # What the SDK sends there: both headers; a replay is a success.
        answer(call(svc, "POST", "/rft/finalize", body, token="run-token", root=INTERNAL_ROOT))
        post_metrics_denied = call(svc, "POST", "/rft/metrics", {"run_id": run_id, "metrics": {}}, token=None)
        assert error_of(post_metrics_denied, 401)["code"] == "unauthenticated"
        assert answer(call(svc, "GET", f"/runs/{run_id}", token="run-token"))["status"] == "completed"


# -- legacy sample files ---------------------------------------------------------------


def presign(svc, run_id: str, step: int) -> dict:
    return answer(call(svc, "POST", "/rft/samples/presign", {"run_id": run_id, "step": step}))["data"]


def test_a_sample_file_is_presigned_uploaded_and_confirmed(service) -> None:
    run_id = create_train(service)["id"]
    slot = presign(service, run_id, 10)
    assert slot["presignedUrl"].startswith(f"{service.url}/_storage/train-samples/") and slot["expiresIn"] == 900
    assert slot["s3Key"].startswith(f"runs/{run_id}/step-10/") and slot["s3Key"].endswith(".parquet")
    data = b"PAR1" + bytes(range(256)) * 40 + b"PAR1"
    stored = requests.put(
        slot["presignedUrl"], data=data, headers={"Content-Type": "application/parquet"}, timeout=30
    )  # no credential: the URL carries it
    assert stored.status_code == 200 and stored.content == b""
    confirm = {"run_id": run_id, "step": 10, "s3_key": slot["s3Key"]}
    for _ in range(2):  # a replayed confirm is a success
        assert answer(call(service, "POST", "/rft/samples/confirm", confirm))["data"]["status"] == "success"
    files = answer(call(service, "GET", f"/runs/{run_id}/sample-files"))["items"]
    assert len(files) == 1
    (file,) = files
    assert (file["s3_key"], file["step"], file["size_bytes"]) == (slot["s3Key"], 10, len(data))
    assert file["sha256"] == hashlib.sha256(data).hexdigest() and file["confirmed_at"] is not None


def test_sample_files_refuse_what_was_not_presigned_or_uploaded(service) -> None:
    run_id = create_train(service)["id"]
    other_run = create_train(service)["id"]
    slot = presign(service, run_id, 20)
    confirm = {"run_id": run_id, "step": 20, "s3_key": slot["s3Key"]}
    error = error_of(call(service, "POST", "/rft/samples/confirm", confirm), 400)
    assert error["code"] == "invalid_run" and "nothing was uploaded" in error["message"]
    bogus = slot["presignedUrl"].rsplit("/", 1)[0] + "/not-a-token"
    assert error_of(requests.put(bogus, data=b"x", timeout=30), 403)["code"] == "forbidden"
    assert requests.put(slot["presignedUrl"], data=b"x", timeout=30).status_code == 200
    error = error_of(call(service, "POST", "/rft/samples/confirm", {**confirm, "step": 21}), 400)
    assert "step 20" in error["message"]
    missing = call(service, "POST", "/rft/samples/confirm", {**confirm, "run_id": other_run})
    assert error_of(missing, 404)["code"] == "not_found"
    files = answer(call(service, "GET", f"/runs/{run_id}/sample-files"))["items"]
    assert [(f["size_bytes"], f["confirmed_at"]) for f in files] == [(1, None)]
    assert answer(call(service, "GET", f"/runs/{other_run}/sample-files"))["items"] == []
