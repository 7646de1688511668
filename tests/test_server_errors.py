"""A 500 is the service's fault until a bisection locates one record while its neighbours are stored."""

from __future__ import annotations

import glob
from typing import Any

import pytest
from _run_helpers import KEY, episodes, isolated, local_records, online, stored_episodes  # noqa: F401

import prime_runs
from prime_runs import cli
from prime_runs._sinks.server_errors import ServerErrors, Verdict

pytestmark = pytest.mark.timeout(120)


def test_a_batch_is_replayed_once_then_split():
    errors = ServerErrors()
    assert errors.verdict((0, 1, 2, 3)) is Verdict.REPLAY
    assert errors.verdict((0, 1, 2, 3)) is Verdict.SPLIT
    assert errors.halves((0, 1, 2, 3)) == ((0, 1), (2, 3))


def test_a_half_waits_for_its_sibling_and_both_failing_is_an_outage():
    errors = ServerErrors()
    errors.halves((0, 1, 2, 3))
    assert errors.verdict((0, 1)) is Verdict.BEHIND_SIBLING
    assert errors.verdict((2, 3)) is Verdict.OUTAGE
    # After the outage the two start afresh: no longer halves of anything.
    assert errors.sibling((0, 1)) is None and errors.verdict((0, 1)) is Verdict.REPLAY


def test_a_half_whose_sibling_was_stored_is_located_down_to_one_record():
    errors = ServerErrors()
    first, second = errors.halves((0, 1))
    assert errors.verdict(first) is Verdict.BEHIND_SIBLING
    errors.stored(second)
    assert errors.verdict(first) is Verdict.REJECT


def test_one_record_alone_answered_500_twice_is_an_outage_not_a_rejection():
    errors = ServerErrors()
    assert errors.verdict((5,)) is Verdict.REPLAY
    assert errors.verdict((5,)) is Verdict.OUTAGE


def test_a_service_failing_every_upload_with_500_rejects_nothing_and_a_sync_stores_all_once(isolated, service, capsys):
    service.faults.fail_status = 500
    service.faults.fail_fraction = 1.0
    run = online(service, dir=isolated / "runs", console="off")
    batch = episodes("e", 20)
    run.log_episodes(batch)
    run.finish(timeout_s=3)
    counts = run.stats()["sinks"]["traces"]
    assert not any(reason.startswith("rejected") for reason in counts["failed"]), counts
    assert (counts["stored"], counts["spooled"]) == (0, 20), counts
    assert local_records(run.dir, "rejected") == []
    service.faults.fail_fraction = 0.0
    capsys.readouterr()
    code = cli.main(["sync", "--api-key", KEY, "--base-url", service.url, str(run.dir)])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "refused" not in out
    assert stored_episodes(service) == {e["id"]: 1 for e in batch}


def _fail_on(monkeypatch: Any, marker: bytes) -> list[int]:
    """The service answers 500 to every upload whose decoded lines hold ``marker`` (a crash on one record)."""
    import prime_traces.server._upload as upload_route

    original = upload_route.decode_body
    answers: list[int] = []

    def fails_on_marker(*args: Any, **kwargs: Any) -> Any:
        metadata, data = original(*args, **kwargs)
        if marker in data:
            answers.append(500)
            raise RuntimeError("the service cannot handle this record")
        return metadata, data

    monkeypatch.setattr(upload_route, "decode_body", fails_on_marker)
    return answers


def test_a_service_that_500s_on_one_record_sets_only_it_aside(isolated, service, monkeypatch):
    answers = _fail_on(monkeypatch, b'"id":"e13"')
    run = online(service, dir=isolated / "runs", console="off")
    batch = episodes("e", 30)
    run.log_episodes(batch)
    run.finish(timeout_s=30)
    counts = run.stats()["sinks"]["traces"]
    assert counts["failed"] == {"rejected:http_500": 1} and counts["stored"] == 29, counts
    assert stored_episodes(service) == {e["id"]: 1 for e in batch if e["id"] != "e13"}
    assert [r["record"]["id"] for r in local_records(run.dir, "rejected")] == ["e13"]
    assert 4 <= len(answers) <= 2 * 6, answers
    assert glob.glob(f"{run.dir}/rejected-*")


def test_retry_rejected_sends_the_services_refusals_again_once_and_never_a_local_one(
    isolated, service, capsys, monkeypatch
):
    import prime_traces.server._upload as upload_route

    original = upload_route.decode_body
    answers = _fail_on(monkeypatch, b'"id":"e13"')
    run = online(service, dir=isolated / "runs", console="off")
    batch = episodes("e", 30)
    local = episodes("bad", 1)[0]
    local["info"] = {"not json": {1, 2}}  # this package's own rule refuses it: resending cannot help
    run.log_episodes([*batch, local])
    run.finish(timeout_s=30)
    assert answers and run.stats()["sinks"]["traces"]["failed"] == {"rejected:http_500": 1, "invalid_record": 1}
    by = {r["id"]: r["by"] for r in local_records(run.dir, "rejected")}
    assert by == {"e13": "service", "bad0": "local"}
    monkeypatch.setattr(upload_route, "decode_body", original)  # the service is fixed
    args = ["sync", "--api-key", KEY, "--base-url", service.url, "--retry-rejected", str(run.dir)]
    capsys.readouterr()
    code = cli.main(args)
    out, err = capsys.readouterr()
    assert code == 3, out + err  # the local refusal stays refused
    assert "retried 1 record the service had refused: 1 stored, 0 still refused" in out
    assert stored_episodes(service) == {e["id"]: 1 for e in batch}
    code = cli.main(args)
    out, _err = capsys.readouterr()
    assert code == 3 and "0 stored, 0 still refused (1 stored by an earlier retry)" in out
    assert stored_episodes(service) == {e["id"]: 1 for e in batch}


def _offline(root: Any, records: list[dict[str, Any]]) -> Any:
    run = prime_runs.init(
        "offline-500", mode="offline", dir=root, handle_signals=False, console="off",
        environments=["e"], model="m", team_id="t",
    )  # fmt: skip
    run.log_episodes(records)
    run.finish()
    return run


def _sync(capsys: Any, service: Any, *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = cli.main(["sync", "--api-key", KEY, "--base-url", service.url, *args])
    out, err = capsys.readouterr()
    return code, out + err


def test_a_sync_against_a_service_that_500s_on_one_record_sets_only_it_aside(isolated, service, capsys, monkeypatch):
    import prime_traces.server._upload as upload_route

    original = upload_route.decode_body
    batch = episodes("e", 30)
    run = _offline(isolated / "runs", batch)
    answers = _fail_on(monkeypatch, b'"id":"e13"')
    code, text = _sync(capsys, service, str(run.dir))
    assert code == 3, text
    assert stored_episodes(service) == {e["id"]: 1 for e in batch if e["id"] != "e13"}
    [kept] = local_records(run.dir, "rejected")
    assert (kept["id"], kept["reason"], kept["by"]) == ("e13", "rejected:http_500", "service")
    assert 4 <= len(answers) <= 2 * 6, answers
    monkeypatch.setattr(upload_route, "decode_body", original)
    code, text = _sync(capsys, service, "--retry-rejected", str(run.dir))
    assert code == 0 and "1 stored, 0 still refused" in text, text
    assert stored_episodes(service) == {e["id"]: 1 for e in batch}


def test_a_sync_against_a_service_failing_every_upload_with_500_rejects_nothing(isolated, service, capsys):
    batch = episodes("e", 20)
    run = _offline(isolated / "runs", batch)
    service.faults.fail_status = 500
    service.faults.fail_fraction = 1.0
    code, text = _sync(capsys, service, str(run.dir))
    assert code == 1 and "the service is failing" in text, text
    assert local_records(run.dir, "rejected") == [] and stored_episodes(service) == {}
    service.faults.fail_fraction = 0.0
    code, text = _sync(capsys, service, str(run.dir))
    assert code == 0, text
    assert stored_episodes(service) == {e["id"]: 1 for e in batch}
