"""Our runs against a platform that answers only its own routes (contract §10), records on the Traces service.

The fake platform answers 404 to anything else and records every request, so
each test checks that no request went to a route the hosted platform lacks;
the Traces service (the local one) must see record uploads only.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from _episode_fakes import Episode, make_trace
from _fake_platform import FakePlatform
from _run_helpers import GATE_TIMEOUT_S, KEY, episodes, gate, isolated, stored_episodes  # noqa: F401
from _wire import episode as wire_episode
from _wire import trace as wire_trace

import prime_runs
from prime_runs import RunStatus
from prime_traces.server import LocalTracesService

HOSTED = {
    "/environmentshub/",
    "/evaluations/",
    "/rft/external-runs",
    "/rft/metrics",
    "/rft/finalize",
    "/rft/samples/",
}


@pytest.fixture
def platform() -> Iterator[FakePlatform]:
    with FakePlatform() as fake:
        yield fake


def start(platform: FakePlatform, service: LocalTracesService | None, **options: Any) -> prime_runs.Run:
    options.setdefault("environments", ["gsm8k"])
    options.setdefault("handle_signals", False)
    options.setdefault("console", "off")
    traces = service.url if service is not None else platform.url
    return prime_runs.init(api_key=KEY, base_url=platform.url, traces_url=traces, **options)


def assert_only_hosted_routes(platform: FakePlatform, service: LocalTracesService | None = None) -> None:
    paths = platform.paths()
    assert all(any(route in path for route in HOSTED) or path.startswith("PUT /storage/") for path in paths), paths
    assert all(not p.endswith(" 404") for p in paths)
    if service is not None:
        stats = service.stats()
        assert stats["requests"] == stats["upload_attempts"]  # the Traces service saw record uploads only


def test_an_evaluation_is_created_through_the_hub_and_finalized_with_its_summary(platform, service):
    run = start(platform, service, name="gsm8k-eval", model="m", framework="verifiers", config={"k": 1})
    logged = episodes("e", 6)
    assert run.log_episodes(logged)
    run.update_summary({"avg_reward": 0.5})
    run.finish({"avg_reward": 0.75})
    assert run.status is RunStatus.COMPLETED and run.finished and not run.attached
    assert stored_episodes(service) == {e["id"]: 1 for e in logged}
    created = platform.runs[run.id]
    assert created.body["environments"] == [{"id": "env-1"}]
    assert created.body["model_name"] == "m" and created.body["framework"] == "verifiers"
    assert created.body["metadata"] == {"k": 1} and created.body["dataset"] == "gsm8k"
    assert created.status == "COMPLETED"
    summary = platform.bodies("POST", r".*/finalize")[0]["metrics"]
    assert summary["avg_reward"] == 0.75 and summary["prime_runs"] == {"traces_episodes_written": 6}
    assert run.url == f"{platform.frontend}/dashboard/evaluations/{run.id}"
    assert_only_hosted_routes(platform, service)


def test_a_training_run_sends_every_step_and_is_finalized(platform, service):
    spec = prime_runs.TrainingSpec(max_steps=5, batch_size=4, rollouts_per_example=2, wandb_project="p")
    run = start(platform, service, kind="train", model="Qwen/Qwen3-4B", team_id="team-1", training=spec)
    for step in range(5):
        assert run.log_episodes(episodes(f"s{step}-", 4))
        run.log_metrics({"loss": 1 / (step + 1), "nested": {"kl": 0.1}}, step=step)
    run.finish()
    body = platform.runs[run.id].body
    assert (body["base_model"], body["team_id"], body["max_steps"], body["batch_size"]) == (
        "Qwen/Qwen3-4B",
        "team-1",
        5,
        4,
    )
    assert body["environments"] == [{"id": "gsm8k"}]  # passed on as given: a training run resolves nothing
    steps = platform.runs[run.id].steps
    assert sorted(steps) == [0, 1, 2, 3, 4]
    assert steps[3]["loss"] == 0.25 and steps[3]["nested/kl"] == 0.1 and isinstance(steps[3]["_timestamp"], float)
    assert len(stored_episodes(service)) == 20
    assert platform.runs[run.id].status == "COMPLETED"
    assert platform.paths()[-1] == "POST /api/v1/rft/finalize"
    assert_only_hosted_routes(platform, service)


@pytest.mark.parametrize(
    ("status", "error", "sent"),
    [
        (RunStatus.FAILED, "boom", ("FAILED", "boom")),
        (RunStatus.CANCELLED, "interrupted", ("CANCELLED", "interrupted")),
        (RunStatus.CRASHED, "process exited", ("FAILED", "crashed: process exited")),
    ],
)
def test_an_evaluation_that_did_not_complete_is_closed_with_why(platform, service, status, error, sent):
    run = start(platform, service, config={"lr": 1})
    run.finish(status=status, error=error)
    assert run.status is status
    update, close = platform.bodies("PUT", r".*/evaluations/[^/]+")
    assert update["metadata"] == {"lr": 1}
    assert close == {"status": sent[0], "error_message": sent[1]}
    assert platform.runs[run.id].status == sent[0]
    assert_only_hosted_routes(platform, service)


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (RunStatus.FAILED, "ValueError: loss is NaN"),
        (RunStatus.CANCELLED, "cancelled: interrupted"),
        (RunStatus.CRASHED, "crashed: process exited"),
    ],
)
def test_a_training_run_that_did_not_complete_is_marked_failed_with_why(platform, service, status, message):
    run = start(platform, service, kind="train", model="m", team_id="t")
    error = {RunStatus.FAILED: ValueError("loss is NaN")}.get(status, message.partition(": ")[2])
    run.finish(status=status, error=error)
    assert platform.bodies("PUT", r".*/status") == [{"status": "failed", "error_message": message}]
    assert not platform.bodies("POST", r".*/rft/finalize")


def test_a_run_closed_on_the_platform_already_is_no_error(platform, service):
    run = start(platform, service)
    platform.runs[run.id].status = "CANCELLED"  # the launcher, or a user, closed it
    run.finish(status="failed", error="late")  # a 409: the platform keeps its status
    assert run.errors == [] and run.finished


def test_finish_is_idempotent_and_the_first_status_wins(platform, service):
    run = start(platform, service)
    run.finish()
    run.finish(status="failed", error="second")
    run.fail("third")
    assert run.status is RunStatus.COMPLETED
    assert len(platform.bodies("POST", r".*/finalize")) == 1
    assert not platform.bodies("PUT", r".*/evaluations/[^/]+") or all(
        "status" not in b for b in platform.bodies("PUT", r".*/evaluations/[^/]+")
    )


def test_the_status_is_terminal_as_soon_as_finish_starts(platform, service, gate):
    run = start(platform, service)
    assert run.status is RunStatus.RUNNING
    assert run.log_episodes(episodes("e", 1))
    assert gate.entered.wait(GATE_TIMEOUT_S)  # the upload is held: finish() waits for it
    finishing = threading.Thread(target=run.finish, kwargs={"status": "cancelled", "error": "stop"})
    finishing.start()
    try:
        assert run._finisher.finished.wait(0.2) is False
        assert run.status is RunStatus.CANCELLED and not run.finished
    finally:
        gate.open()
        finishing.join(GATE_TIMEOUT_S)
    assert run.finished and platform.runs[run.id].status == "CANCELLED"


@pytest.mark.parametrize("bad", ["running", RunStatus.RUNNING, "bogus"])
def test_finish_refuses_a_status_that_is_not_terminal_and_the_run_goes_on(platform, service, bad):
    run = start(platform, service)
    with pytest.raises(ValueError):
        run.finish(status=bad)
    assert not run.finished and run.status is RunStatus.RUNNING
    run.finish()
    assert platform.runs[run.id].status == "COMPLETED"


def test_an_attached_run_makes_no_request_to_start_and_leaves_a_failure_to_its_launcher(platform, service):
    created = start(platform, service)  # the launcher's run
    created_id = created.id
    before = len(platform.seen)
    attached = start(platform, service, id=created_id)
    assert attached.attached and attached.id == created_id and len(platform.seen) == before
    assert attached.url == f"{platform.url}/dashboard/evaluations/{created_id}"  # not the hosted platform's
    assert attached.log_episodes(episodes("a", 2))
    attached.fail("boom")
    assert attached.status is RunStatus.FAILED
    assert all("status" not in b for b in platform.bodies("PUT", r".*/evaluations/[^/]+"))  # not marked failed
    assert platform.runs[created_id].status == "RUNNING"
    created.finish()  # the launcher's own finish completes it
    assert platform.runs[created_id].status == "COMPLETED"


def test_an_attached_run_that_completes_is_finalized(platform, service):
    owner = start(platform, service)
    attached = start(platform, service, id=owner.id)
    attached.finish({"score": 1.0})
    assert platform.runs[owner.id].status == "COMPLETED"
    assert platform.bodies("POST", r".*/finalize")[-1]["metrics"]["score"] == 1.0
    assert "metadata" not in platform.bodies("PUT", r".*/evaluations/[^/]+")[-1]  # the launcher's config stays
    owner.finish()  # closed already: no error


class _VerifiersEpisode(Episode):
    """An episode object with a v1 record: what verifiers logs."""

    def to_record(self) -> dict[str, Any]:
        return wire_episode(self.id, [wire_trace(trace.id) for trace in self.traces])


def _objects(count: int, prefix: str = "ep") -> list[_VerifiersEpisode]:
    return [_VerifiersEpisode(f"{prefix}-{i}", [make_trace(f"{prefix}-{i}-t", idx=i)]) for i in range(count)]


def test_an_account_without_prime_traces_sends_episodes_to_the_legacy_samples(platform):
    platform.traces_refusal = (403, "service_not_enabled")
    run = start(platform, None)
    assert run.log_episodes(_objects(3))
    assert run.log_episodes([wire_episode("as-dict", [wire_trace("d-t")])])  # a dict has no sample row
    run.finish()
    samples = [row for body in platform.bodies("POST", r".*/samples") for row in body["samples"]]
    assert sorted(row["sample_id"] for row in samples) == ["ep-0", "ep-1", "ep-2"]
    assert [p for p in platform.paths() if p.endswith("/api/v1/traces")] == ["POST /api/v1/traces"]  # one, refused
    traces = run.stats()["sinks"]["traces"]
    assert traces["stored"] == 3 and traces["failed"] == {"no_sample_row": 1} and traces["routed"] == "legacy_samples"
    assert run.errors and "no_sample_row" in run.errors[0]
    assert platform.runs[run.id].status == "COMPLETED"


def test_opting_out_of_prime_traces_never_contacts_it(platform):
    run = start(platform, None, traces_opt_out=True)
    assert run.log_episodes(_objects(2))
    run.finish()
    assert not [p for p in platform.paths() if p.endswith("/api/v1/traces")]
    assert len([row for body in platform.bodies("POST", r".*/samples") for row in body["samples"]]) == 2


def test_opting_out_by_the_environment_is_read_and_checked(platform, monkeypatch):
    monkeypatch.setenv("PRIME_TRACES_OPT_OUT", "maybe")
    with pytest.raises(prime_runs.ConfigurationError, match="PRIME_TRACES_OPT_OUT"):
        start(platform, None)
    assert platform.paths() == []  # refused before any request


@pytest.mark.parametrize(
    "status, code, failed, spooled",
    [
        (403, "forbidden", {}, 3),  # a key without the traces scope: kept on disk for a sync
        (401, "unauthenticated", {}, 3),  # a key refused: kept on disk for a sync with another
        (400, "invalid_trace", {"rejected:invalid_trace": 3}, 0),  # records refused for their own fault
    ],
)
def test_a_refusal_other_than_no_prime_traces_never_goes_to_the_legacy_samples(platform, status, code, failed, spooled):
    platform.traces_refusal = (status, code)
    run = start(platform, None)
    assert run.log_episodes(_objects(3))
    run.finish()
    assert platform.bodies("POST", r".*/samples") == []
    traces = run.stats()["sinks"]["traces"]
    assert traces.get("routed") != "legacy_samples"
    assert (traces["stored"], traces["failed"], traces["spooled"]) == (0, failed, spooled)


def test_prime_traces_refused_after_a_commit_does_not_split_the_run(platform, service):
    platform.traces_upstream = service.url
    platform.traces_refusal, platform.traces_refuse_after = (403, "service_not_enabled"), 1
    run = start(platform, None)
    assert run.log_episodes(_objects(1))
    assert run.flush(GATE_TIMEOUT_S)  # committed on Prime Traces
    assert run.log_episodes(_objects(2, prefix="late"))
    run.finish()
    assert platform.bodies("POST", r".*/samples") == []  # no episode of this run goes to the legacy table
    assert stored_episodes(service) == {"ep-0": 1}
    traces = run.stats()["sinks"]["traces"]
    assert (traces["stored"], sum(traces["failed"].values()) + traces["spooled"]) == (1, 2)
    assert platform.runs[run.id].metrics["prime_runs"] == {"traces_episodes_written": 1}
