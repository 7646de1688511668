"""PlatformClient: the hosted run routes (contract §10), their replay rules, and where requests go."""

from __future__ import annotations

import json

import pytest
from _fake_platform import FakePlatform

from prime_traces.errors import (
    NotFoundError,
    PaymentRequiredError,
    RetryableAPIError,
    TransportError,
    UnauthorizedError,
)
from prime_traces.platform import PlatformClient, resolve_platform, split_api_root

KEY = "platform-test-key"


@pytest.fixture
def platform():
    with FakePlatform() as fake:
        yield fake


def client_for(platform: FakePlatform, slept: list[float] | None = None, **kwargs) -> PlatformClient:
    sleep = slept.append if slept is not None else (lambda _s: None)
    return PlatformClient(KEY, platform.url, sleep=sleep, **kwargs)


def test_an_evaluation_goes_through_the_hub_then_the_evaluation_routes(platform):
    client = client_for(platform)
    try:
        by_name = client.resolve_environment("gsm8k", team_id="team-1")
        by_slug = client.latest_environment("alice/math")
        run = client.create_evaluation({"name": "n", "environments": [{"id": by_name}, {"id": by_slug}], "tags": []})
        run_id = run["evaluation_id"]
        client.update_evaluation(run_id, metadata={"lr": 1e-6}, metrics={"avg_reward": 0.5})
        client.update_evaluation(run_id)  # nothing to send: no request
        client.finalize_evaluation(run_id, {"avg_reward": 0.75})
    finally:
        client.close()
    assert platform.paths() == [
        "POST /api/v1/environmentshub/resolve",
        "GET /api/v1/environmentshub/alice/math/@latest",
        "POST /api/v1/evaluations/",
        f"PUT /api/v1/evaluations/{run_id}",
        f"POST /api/v1/evaluations/{run_id}/finalize",
    ]
    assert platform.bodies("POST", r".*/resolve") == [{"name": "gsm8k", "team_id": "team-1"}]
    assert platform.bodies("PUT", r".*/evaluations/.*") == [{"metadata": {"lr": 1e-6}, "metrics": {"avg_reward": 0.5}}]
    assert platform.bodies("POST", r".*/finalize") == [{"metrics": {"avg_reward": 0.75}}]
    assert platform.runs[run_id].status == "COMPLETED"
    # Not the hosted platform: its run pages are on its own origin.
    assert client.evaluation_url(run_id) == f"{platform.url}/dashboard/evaluations/{run_id}"


def test_closing_a_closed_run_is_no_error_and_the_message_is_capped(platform):
    client = client_for(platform)
    try:
        run_id = client.create_evaluation({"name": "n", "environments": [], "tags": []})["evaluation_id"]
        assert client.close_evaluation(run_id, "FAILED", "x" * 5000) is True
        assert client.close_evaluation(run_id, "CANCELLED", "again") is False  # 409: closed already
    finally:
        client.close()
    first, second = platform.bodies("PUT", r".*/evaluations/.*")
    assert first == {"status": "FAILED", "error_message": "x" * 4096}
    assert second == {"status": "CANCELLED", "error_message": "again"}
    assert platform.runs[run_id].status == "FAILED"


def test_a_training_run_sends_its_metrics_once_per_step_and_finalizes(platform):
    slept: list[float] = []
    client = client_for(platform, slept)
    try:
        answer = client.create_training_run({"base_model": "m", "max_steps": 3, "environments": [], "team_id": "t"})
        run_id = answer["run"]["id"]
        platform.fail["POST /api/v1/rft/metrics"] = [502]  # ambiguous, but one row per step: resent
        client.post_training_metrics(run_id, {"loss": 0.5, "step": 0})
        client.post_training_metrics(run_id, {"loss": 0.4, "step": 1})
        client.finalize_training_run(run_id)
        client.finalize_training_run(run_id)  # safe to repeat
        assert client.close_training_run(run_id, "failed", "late") is False
    finally:
        client.close()
    assert len(platform.bodies("POST", r".*/rft/metrics")) == 3
    assert len(slept) == 1
    assert platform.runs[run_id].steps == {0: {"loss": 0.5, "step": 0}, 1: {"loss": 0.4, "step": 1}}
    assert platform.bodies("POST", r".*/rft/finalize") == [{"run_id": run_id, "exit_code": 0}] * 2
    assert client.training_url(run_id).endswith(f"/dashboard/training/{run_id}")


@pytest.mark.parametrize(("status", "requests"), [(502, 1), (504, 1), (429, 2)])
def test_creating_a_run_is_resent_only_when_the_platform_certainly_did_nothing(platform, status, requests):
    platform.fail["POST /api/v1/evaluations/"] = [status]
    client = client_for(platform)
    try:
        if status == 429:
            assert client.create_evaluation({"name": "n", "environments": [], "tags": []})["evaluation_id"]
        else:
            with pytest.raises(RetryableAPIError):
                client.create_evaluation({"name": "n", "environments": [], "tags": []})
    finally:
        client.close()
    assert platform.paths().count("POST /api/v1/evaluations/") == requests
    assert len(platform.runs) == (1 if status == 429 else 0)


def test_a_connection_never_made_is_resent_even_for_a_create():
    with FakePlatform() as gone:
        url = gone.url
    slept: list[float] = []
    client = PlatformClient(KEY, url, sleep=slept.append, max_attempts=3)
    try:
        with pytest.raises(TransportError):
            client.create_training_run({"base_model": "m"})
    finally:
        client.close()
    assert len(slept) == 2  # three attempts: nothing reached a service


def test_a_hosted_runs_internal_root_carries_the_key_twice(platform):
    client = PlatformClient("run-token", platform.url + "/api/internal/rft", sleep=lambda _s: None)
    try:
        answer = client.create_training_run({"base_model": "m", "max_steps": 0, "environments": [], "team_id": "t"})
        client.finalize_training_run(answer["run"]["id"])
    finally:
        client.close()
    finalize = [s for s in platform.seen if s.path.endswith("/finalize")][0]
    assert finalize.path == "/api/internal/rft/finalize"
    assert finalize.headers["x-api-key"] == "run-token"
    assert finalize.headers["Authorization"] == "Bearer run-token"


@pytest.mark.parametrize(("status", "error"), [(402, PaymentRequiredError), (401, UnauthorizedError)])
def test_refusals_are_typed(platform, status, error):
    platform.fail["POST /api/v1/environmentshub/resolve"] = [status]
    client = client_for(platform)
    try:
        with pytest.raises(error) as raised:
            client.resolve_environment("gsm8k")
    finally:
        client.close()
    assert raised.value.status_code == status
    assert KEY not in str(raised.value)


def test_a_route_the_platform_lacks_is_not_found(platform):
    client = client_for(platform)
    try:
        with pytest.raises(NotFoundError):
            client.finalize_evaluation("no-such-eval", {})
    finally:
        client.close()


@pytest.mark.parametrize(
    ("base", "expected"),
    [
        ("https://api.x.ai", ("https://api.x.ai", "/api/v1")),
        ("https://api.x.ai/", ("https://api.x.ai", "/api/v1")),
        ("https://api.x.ai/api/v1", ("https://api.x.ai", "/api/v1")),
        ("https://api.x.ai/api/v1/rft", ("https://api.x.ai", "/api/v1")),
        ("https://api.x.ai/api/internal", ("https://api.x.ai", "/api/internal")),
        ("https://api.x.ai/api/internal/rft/", ("https://api.x.ai", "/api/internal")),
        ("http://h/rft", ("http://h/rft", "/api/v1")),
        ("https://x/prefix/api/v1/?q=1", ("https://x/prefix", "/api/v1")),
    ],
)
def test_the_api_root_is_read_from_the_path(base, expected):
    assert split_api_root(base) == expected


def test_where_platform_requests_go(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"base_url": "https://file-base", "traces_url": "https://file-traces"}))
    env = {"PRIME_API_KEY": "k", "PRIME_TRACES_URL": "http://127.0.0.1:8765"}

    def origin(**kw) -> str:
        return resolve_platform(environ=kw.pop("environ", env), config_path=kw.pop("path", config), **kw).origin

    assert origin(base_url="https://arg") == "https://arg"
    assert origin(environ={**env, "PRIME_API_BASE_URL": "https://api-base", "PRIME_BASE_URL": "https://b"}) == (
        "https://api-base"
    )
    assert origin(environ={**env, "PRIME_BASE_URL": "https://b"}) == "https://b"
    assert origin() == "https://file-base"
    # Without a platform URL, the Traces service's URL: one setting points both at a local service.
    assert origin(path=tmp_path / "none.json") == "http://127.0.0.1:8765"
    assert origin(environ={"PRIME_API_KEY": "k"}, path=tmp_path / "none.json") == "https://api.primeintellect.ai"
    resolved = resolve_platform(api_key="secret-key", environ={"PRIME_FRONTEND_URL": "https://front/"})
    assert resolved.frontend_url == "https://front"
    hosted = resolve_platform(api_key="k", environ={}, config_path=tmp_path / "none.json")
    assert hosted.frontend_url == "https://app.primeintellect.ai"
    assert "secret-key" not in repr(resolved)
