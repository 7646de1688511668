"""A 500 is the service's fault until a bisection locates one record while its neighbours are stored."""

from __future__ import annotations

import glob
from typing import Any

import pytest
from _run_helpers import KEY, episodes, isolated, local_records, online, stored_episodes  # noqa: F401

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
    import prime_traces.server._upload as upload_route

    original = upload_route._process
    answers: list[int] = []

    def fails_on_marker(req: Any, wire: list[bytearray], digest: str, raw_format: Any) -> Any:
        if marker in wire[0]:
            answers.append(500)
            raise RuntimeError("the service cannot handle this record")
        return original(req, wire, digest, raw_format)

    monkeypatch.setattr(upload_route, "_process", fails_on_marker)
    return answers


def test_a_service_that_500s_on_one_record_sets_only_it_aside(isolated, service, monkeypatch):
    answers = _fail_on(monkeypatch, b'"id":"e13"')
    run = online(service, dir=isolated / "runs", console="off", compression="none")
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

    original = upload_route._process
    answers = _fail_on(monkeypatch, b'"id":"e13"')
    run = online(service, dir=isolated / "runs", console="off", compression="none")
    batch = episodes("e", 30)
    local = episodes("bad", 1)[0]
    local["info"] = {"not json": {1, 2}}  # this package's own rule refuses it: resending cannot help
    run.log_episodes([*batch, local])
    run.finish(timeout_s=30)
    assert answers and run.stats()["sinks"]["traces"]["failed"] == {"rejected:http_500": 1, "invalid_record": 1}
    by = {r["id"]: r["by"] for r in local_records(run.dir, "rejected")}
    assert by == {"e13": "service", "bad0": "local"}
    monkeypatch.setattr(upload_route, "_process", original)  # the service is fixed
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
