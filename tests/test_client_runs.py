"""TracesClient's run calls and ping, over real HTTP to the local service (contract §6, §9)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import orjson
import pytest
import requests
from _upload_helpers import make_trace

import prime_traces
from prime_traces import (
    APIError,
    LineFormatConflictError,
    NotFoundError,
    PrimeTracesError,
    ResponseFormatError,
    RunFinishedError,
    TracesClient,
    UploadError,
)
from prime_traces._http.transport import error_from_response
from prime_traces.server import LocalTracesService

pytestmark = pytest.mark.timeout(60)

KEY = "test-key"


@pytest.fixture
def make_client() -> Iterator[Callable[..., TracesClient]]:
    """``make_client(base_url)`` -> a client with an explicit key and no team; closed after."""
    clients: list[TracesClient] = []

    def make(base_url: str, api_key: str = KEY) -> TracesClient:
        client = TracesClient(api_key, base_url, "", max_in_flight=1)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def client(service: LocalTracesService, make_client: Callable[..., TracesClient]) -> TracesClient:
    return make_client(service.url)


def _requests(service: LocalTracesService) -> int:
    return service.stats()["requests"]


# -- create_run -------------------------------------------------------------------------


def test_create_run_creates_and_is_idempotent_with_an_id(client: TracesClient) -> None:
    made = client.create_run("grpo", kind="eval", config={"lr": 1e-6}, tags=["a"], run_id="run-x")
    assert (made["id"], made["name"], made["status"], made["created"]) == ("run-x", "grpo", "running", True)
    assert made["url"]
    # The same id again returns the run as it is, whatever the second call says.
    again = client.create_run("other", kind="train", config={"lr": 1.0}, run_id="run-x")
    assert (again["id"], again["name"], again["created"]) == ("run-x", "grpo", False)
    run = client.get_run("run-x")
    assert (run.name, run.kind, run.status, run.config) == ("grpo", "eval", "running", {"lr": 1e-6})
    assert run.trace_count == 0


def test_create_run_without_an_id_gets_one(client: TracesClient) -> None:
    made = client.create_run()
    assert made["id"] and client.get_run(made["id"]).kind == "train"


def test_create_run_refuses_an_unknown_kind_before_any_request(
    service: LocalTracesService, client: TracesClient
) -> None:
    before = _requests(service)
    with pytest.raises(ValueError, match="kind must be one of train, eval, not 'rl'"):
        client.create_run("r", kind="rl")
    assert _requests(service) == before


# -- update_run -------------------------------------------------------------------------


def test_update_run_merges_config_and_summary_then_finishes(client: TracesClient) -> None:
    client.create_run("r", config={"lr": 1, "seed": 0}, run_id="run-u")
    client.update_run("run-u", config={"lr": 2}, summary={"loss": 0.5})
    answer = client.update_run(
        "run-u", config={"batch": 8}, summary={"acc": 0.9}, status="failed", error="CUDA out of memory"
    )
    assert answer["status"] == "failed"
    run = client.get_run("run-u")
    assert run.config == {"lr": 2, "seed": 0, "batch": 8}
    assert run.summary == {"loss": 0.5, "acc": 0.9}
    assert (run.status, run.error) == ("failed", "CUDA out of memory")
    assert run.finished_at is not None


def test_finishing_again_with_the_same_status_is_harmless(client: TracesClient) -> None:
    client.create_run("r", run_id="run-same")
    client.update_run("run-same", status="completed")
    client.update_run("run-same", summary={"late": 1}, status="completed")
    run = client.get_run("run-same")
    assert (run.status, run.summary) == ("completed", {"late": 1})


def test_another_status_for_a_finished_run_is_run_finished_error(client: TracesClient) -> None:
    client.create_run("r", run_id="run-done")
    client.update_run("run-done", status="completed")
    with pytest.raises(RunFinishedError) as info:
        client.update_run("run-done", status="crashed", error="died")
    err = info.value
    assert isinstance(err, APIError) and isinstance(err, PrimeTracesError)
    assert not isinstance(err, LineFormatConflictError)
    assert (err.status_code, err.code) == (409, "run_finished")
    assert "already finished as completed" in err.message
    assert client.get_run("run-done").status == "completed"
    assert prime_traces.RunFinishedError is RunFinishedError and "RunFinishedError" in prime_traces.__all__


def test_update_run_sends_numpy_scalars_int_keys_and_other_objects(client: TracesClient) -> None:
    client.create_run("r", run_id="run-np")
    config = {"lr": np.float32(0.25), "layers": np.int64(12), 3: "three", "shape": np.arange(3), "tags": {"only"}}
    client.update_run("run-np", config=config, summary={"best": np.float64(0.5)}, status="completed")
    run = client.get_run("run-np")
    assert run.config == {"lr": 0.25, "layers": 12, "3": "three", "shape": [0, 1, 2], "tags": "{'only'}"}
    assert (run.summary, run.status) == ({"best": 0.5}, "completed")


def test_update_run_refuses_a_bad_status_before_any_request(service: LocalTracesService, client: TracesClient) -> None:
    client.create_run("r", run_id="run-v")
    before = _requests(service)
    with pytest.raises(ValueError, match="status must be one of completed, failed, cancelled, crashed, not 'done'"):
        client.update_run("run-v", config={"x": 1}, status="done")
    with pytest.raises(ValueError, match="error can only be given with a terminal status"):
        client.update_run("run-v", error="boom")
    with pytest.raises(ValueError, match="timeout_s must be greater than 0"):
        client.update_run("run-v", status="completed", timeout_s=0)
    assert _requests(service) == before
    run = client.get_run("run-v")
    assert (run.status, run.config) == ("running", {})


def test_update_run_of_an_unknown_run_is_not_found(client: TracesClient) -> None:
    with pytest.raises(NotFoundError):
        client.update_run("run-nobody", status="completed")


# -- post_metrics -----------------------------------------------------------------------


def test_post_metrics_stores_rows_that_list_metrics_reads(client: TracesClient) -> None:
    client.create_run("r", run_id="run-m")
    now = time.time()
    rows = [
        {"step": step, "time": now + step, "metrics": {"loss": 1.0 / (step + 1), "train/acc": step / 10}}
        for step in range(5)
    ]
    rows[4]["metrics"]["loss"] = "NaN"
    assert client.post_metrics("run-m", rows) == {"accepted": 5}
    assert client.post_metrics("run-m", rows[:2]) == {"accepted": 2}  # a replay changes nothing
    page = client.list_metrics("run-m", names=["loss"])
    assert [(row.step, row.metrics) for row in page.rows] == [
        (0, {"loss": 1.0}),
        (1, {"loss": 0.5}),
        (2, {"loss": 1 / 3}),
        (3, {"loss": 0.25}),
        (4, {"loss": "NaN"}),
    ]
    assert [row.step for row in client.iter_metrics("run-m", names="train/acc", limit=2)] == [0, 1, 2, 3, 4]
    assert client.get_run("run-m").metrics["train/acc"]["last"] == 0.4


def test_post_metrics_to_an_unknown_run_is_not_found(client: TracesClient) -> None:
    with pytest.raises(NotFoundError):
        client.post_metrics("run-nobody", [{"step": 0, "time": time.time(), "metrics": {"x": 1}}])


def test_post_metrics_refuses_a_single_row_given_as_rows(client: TracesClient) -> None:
    with pytest.raises(TypeError, match="rows must be a sequence of row mappings"):
        client.post_metrics("run-m", {"step": 0, "time": 0.0, "metrics": {}})  # type: ignore[arg-type]


# -- ping -------------------------------------------------------------------------------


def test_ping_a_live_service_and_a_stopped_one(tmp_path, make_client: Callable[..., TracesClient]) -> None:
    service = LocalTracesService(tmp_path / "traces.db").start()
    try:
        client = make_client(service.url)
        before = _requests(service)
        assert client.ping(timeout_s=5.0) is True
        assert _requests(service) == before + 1  # one request, not retried
    finally:
        service.stop()
    started = time.monotonic()
    assert client.ping(timeout_s=2.0) is False
    assert time.monotonic() - started < 2.0 + 1.0


def test_ping_counts_a_refused_key_as_an_answer(tmp_path, make_client: Callable[..., TracesClient]) -> None:
    with LocalTracesService(tmp_path / "traces.db", api_key="the-right-key") as service:
        client = make_client(service.url, api_key="a-wrong-key")
        assert client.ping(timeout_s=5.0) is True  # up, and says something about us
        with pytest.raises(APIError) as info:
            client.get_run("run-1")
        assert info.value.status_code == 401


def test_ping_refuses_a_timeout_that_is_not_positive(client: TracesClient) -> None:
    with pytest.raises(ValueError, match="timeout_s must be greater than 0"):
        client.ping(timeout_s=0)


# -- which 409 is which -----------------------------------------------------------------


def test_a_409_from_the_trace_endpoints_stays_a_line_format_conflict(
    service: LocalTracesService, client: TracesClient
) -> None:
    line = orjson.dumps(make_trace("t-1", run_id="run-c"))
    client.upload_lines([line])
    with pytest.raises(UploadError) as info:
        client.upload_lines([line], line_format="episode")
    assert type(info.value.error) is LineFormatConflictError


def _answer(method: str, url: str, status: int, body: Any) -> requests.Response:
    resp = requests.Response()
    resp.status_code = status
    resp._content = orjson.dumps(body)
    resp.request = requests.Request(method, url).prepare()
    return resp


def test_a_409_from_the_run_endpoints_without_a_code_is_run_finished_error() -> None:
    # The local service always sends the code; the contract makes a run endpoint's bare 409 this error.
    bare = _answer("PATCH", "https://example.test/prefix/api/v1/runs/r-1", 409, {"detail": "conflict"})
    assert type(error_from_response(bare)) is RunFinishedError
    coded = _answer(
        "POST", "https://example.test/api/v1/traces", 409, {"error": {"code": "run_finished", "message": "m"}}
    )
    assert type(error_from_response(coded)) is RunFinishedError
    conflict = _answer("POST", "https://example.test/api/v1/traces", 409, {"error": {"code": "line_format_conflict"}})
    assert type(error_from_response(conflict)) is LineFormatConflictError
    unindexed = _answer(
        "GET", "https://example.test/api/v1/runs/r-1/search", 409, {"error": {"code": "trace_not_indexed"}}
    )
    assert type(error_from_response(unindexed)) is APIError
    # A run endpoint's 409 that names another code is that conflict, not a finished run.
    other = _answer("PATCH", "https://example.test/api/v1/runs/r-1", 409, {"error": {"code": "line_format_conflict"}})
    assert type(error_from_response(other)) is LineFormatConflictError


def test_response_format_error_lives_with_the_other_errors() -> None:
    from prime_traces import errors

    assert errors.ResponseFormatError is ResponseFormatError and "ResponseFormatError" in prime_traces.__all__
    assert issubclass(ResponseFormatError, PrimeTracesError) and issubclass(ResponseFormatError, ValueError)
