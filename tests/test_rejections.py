"""Rejections cost O(N): the ``errors`` list, checks before sending, bounded isolation, 500s."""

from __future__ import annotations

import threading
import time
from typing import Any

import orjson
import pytest
import requests
from _wire import episode, trace
from test_traces_sink import (
    MARKER,
    assert_identity,
    episodes,
    ledger_for,
    serving,
    sink_counts,
    sink_for,
    stored_ids,
)

from prime_runs._records.sink import SinkStatus
from prime_traces import TracesClient, UploadError
from prime_traces.report import LineStatus
from prime_traces.server import LocalTracesService

TOKEN = "rejections-token"


def _post(svc: LocalTracesService, lines: list[bytes], line_format: str = "trace") -> requests.Response:
    """One upload of ``lines`` as the client sends it, answered as it is."""
    with TracesClient(api_key=TOKEN, base_url=svc.url, compression="none") as client:
        try:
            client.upload_lines(lines, line_format=line_format)
        except UploadError as err:
            return err.report.first_failure.error  # type: ignore[return-value,union-attr]
    return None  # type: ignore[return-value]


# --- the service -------------------------------------------------------------


def test_a_400_lists_every_rejected_line(tmp_path):
    lines = [orjson.dumps(trace(f"t{i}")) for i in range(10)]
    for bad in (2, 5, 9):
        lines[bad] = orjson.dumps({"id": f"t{bad}", "timing": {"start": "soon"}})
    with LocalTracesService(tmp_path / "db") as svc:
        error = _post(svc, lines)
    assert error.status_code == 400 and error.code == "created_at_out_of_window"
    assert (error.line, error.record_id) == (3, "t2")  # the first, as before
    assert [(e.line, e.record_id, e.code) for e in error.errors] == [
        (3, "t2", "created_at_out_of_window"),
        (6, "t5", "created_at_out_of_window"),
        (10, "t9", "created_at_out_of_window"),
    ]
    assert all(e.message.startswith(f"line {e.line}: ") for e in error.errors)


def test_light_validation_lists_every_marked_line(tmp_path):
    lines = [orjson.dumps(trace(f"t{i}", info={"note": MARKER if i % 3 == 0 else ""})) for i in range(7)]
    with LocalTracesService(tmp_path / "db", store="none", validate="light", reject_marker=MARKER) as svc:
        error = _post(svc, lines)
    assert [e.line for e in error.errors] == [1, 4, 7]


@pytest.mark.parametrize("flag", ["reject_first_only", "reject_omit_line"])
def test_the_list_can_be_withheld(tmp_path, flag):
    lines = [orjson.dumps(trace(f"t{i}", info={"note": MARKER})) for i in range(3)]
    with LocalTracesService(tmp_path / "db", reject_marker=MARKER, **{flag: True}) as svc:
        error = _post(svc, lines)
    assert error.errors == ()
    assert (error.line is None) == (flag == "reject_omit_line")


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("step", 2**63, "run.work.step is 9223372036854775808"),
        ("step", -1e19, "run.work.step is -1e+19"),
        ("step", 1e300, "run.work.step is 1e+300"),
        ("end", 1e300, "timing.scoring.end 1e+300"),
        ("tokens", 2**64 - 1, "calls[0].usage.total_tokens is 18446744073709551615"),
    ],
)
def test_numbers_no_column_can_hold_are_a_400_naming_the_field(tmp_path, field, value, named):
    now = time.time()
    record = trace("big", timing={"start": now})
    if field == "step":
        record["run"] = {"id": "r", "work": {"step": value}}
    elif field == "end":
        record["timing"]["scoring"] = {"end": value}
    else:
        record["calls"] = [{"usage": {"total_tokens": value}}]
    with LocalTracesService(tmp_path / "db") as svc:
        error = _post(svc, [orjson.dumps(trace("fine")), orjson.dumps(record)])
        episode_error = _post(svc, [orjson.dumps(episode("ep", [trace("m0"), record]))], "episode")
    assert (error.status_code, error.code, error.line, error.record_id) == (400, "invalid_trace", 2, "big")
    assert named in error.message, error.message
    assert episode_error.status_code == 400 and f"traces[1].{named}" in episode_error.message


# --- the sink ----------------------------------------------------------------


def _all_marked(count: int) -> list[dict[str, Any]]:
    return episodes(count, poisoned=tuple(range(count)))


def _write_bytes(records: list[dict[str, Any]]) -> int:
    """What the write's records weigh as the sink sends them (stamped, one line each)."""
    from test_traces_sink import STAMP

    from prime_runs._records.lines import EncodedWrite

    lines = EncodedWrite(records, "episode", STAMP, None, ledger_for(len(records))[1])
    return sum(len(line) + 1 if isinstance(line, bytes) else line.size + 1 for line in lines)


def test_a_thousand_records_all_rejected_cost_a_few_requests_with_the_errors_list(tmp_path):
    records = _all_marked(1000)
    accounting, ledger = ledger_for(len(records))
    with serving(tmp_path, reject_marker=MARKER, compression="none") as (svc, client):
        status = sink_for(client).write(records, "episode", ledger, threading.Event())
        stats = svc.stats()
        assert stored_ids(svc) == []
    write_bytes = _write_bytes(records)
    assert status is SinkStatus.OK  # the records' fault: no strike
    assert sink_counts(accounting)["failed"] == {"rejected:invalid_trace": 1000}
    assert stats["upload_attempts"] <= 10, stats
    assert stats["uncompressed_bytes"] == 0
    sent = stats["wire_bytes"]
    assert sent <= 3 * write_bytes, (sent, write_bytes)
    assert_identity(accounting, ledger)


def test_a_thousand_records_all_rejected_one_at_a_time_stay_within_twice_the_bytes(tmp_path):
    records = _all_marked(1000)
    accounting, ledger = ledger_for(len(records))
    with serving(tmp_path, reject_marker=MARKER, reject_first_only=True, compression="none") as (svc, client):
        status = sink_for(client).write(records, "episode", ledger, threading.Event())
        stats = svc.stats()
    assert status is SinkStatus.OK
    assert sink_counts(accounting)["failed"] == {"rejected:invalid_trace": 1000}
    # After the first refusal, one small request per record (each is bad), never the rest of
    # the batch again: re-sent, the write's bytes once more, plus each request's framing.
    assert stats["upload_attempts"] <= 1000 + 5
    write_bytes = _write_bytes(records)
    assert stats["wire_bytes"] <= 3 * write_bytes, (stats["wire_bytes"], write_bytes)
    assert_identity(accounting, ledger)


def test_a_few_bad_records_among_many_are_isolated_in_few_requests_without_the_list(tmp_path):
    bad = (17, 400, 401, 950)
    records = episodes(1000, poisoned=bad)
    accounting, ledger = ledger_for(len(records))
    with serving(tmp_path, reject_marker=MARKER, reject_first_only=True) as (svc, client):
        sink_for(client).write(records, "episode", ledger, threading.Event())
        stats = svc.stats()
        stored = stored_ids(svc)
    assert sorted(stored, key=lambda i: int(i[1:])) == [f"e{i}" for i in range(1000) if i not in bad]
    assert sink_counts(accounting)["failed"] == {"rejected:invalid_trace": 4}
    assert stats["upload_attempts"] <= 80, stats
    assert_identity(accounting, ledger)


def test_a_record_breaking_a_line_rule_is_rejected_before_sending(tmp_path):
    records = episodes(100)
    records[42]["traces"][1]["run"] = {"work": {"step": 2**63}}
    accounting, ledger = ledger_for(len(records))
    with serving(tmp_path) as (svc, client):
        status = sink_for(client).write(records, "episode", ledger, threading.Event())
        stats = svc.stats()
        stored = stored_ids(svc)
    assert status is SinkStatus.OK
    assert len(stored) == 99 and "e42" not in stored
    assert stats["rejections"] == {} and stats["upload_attempts"] == stats["uploads"]
    [rejection] = ledger.take_rejections()
    assert rejection.index == 42 and rejection.reason == "rejected:invalid_trace"
    assert "traces[1].run.work.step is 9223372036854775808" in rejection.message
    ledger.close("unused")
    assert_identity(accounting, ledger)


def test_a_500_on_a_batch_is_sent_again_then_isolated_never_a_strike(tmp_path, monkeypatch):
    import prime_traces.server._upload as upload_route

    original = upload_route._process
    answers: list[int] = []

    def fails_on_e7(req: Any, wire: list[bytearray], digest: str, raw_format: Any) -> Any:
        # The service hands the body over in a list, to free it as it decodes.
        if b'"id":"e7"' in wire[0] or b'"id": "e7"' in wire[0]:
            answers.append(500)
            raise RuntimeError("the service cannot handle this record")
        return original(req, wire, digest, raw_format)

    monkeypatch.setattr(upload_route, "_process", fails_on_e7)
    records = episodes(40)
    accounting, ledger = ledger_for(len(records))
    with serving(tmp_path, compression="none") as (svc, client):
        status = sink_for(client).write(records, "episode", ledger, threading.Event())
        stored = stored_ids(svc)
    assert status is SinkStatus.OK
    assert sorted(stored, key=lambda i: int(i[1:])) == [f"e{i}" for i in range(40) if i != 7]
    assert sink_counts(accounting)["failed"] == {"rejected:http_500": 1}
    # Sent as it was once more (a replay, had it been stored), then halved down to the record.
    assert 2 + 2 <= len(answers) <= 2 + 2 * 6, answers
    assert_identity(accounting, ledger)


def test_a_500_after_the_batch_was_stored_stores_it_once(tmp_path, monkeypatch):
    import prime_traces.server._upload as upload_route

    original = upload_route._process
    lost: list[str] = []

    def loses_the_first_answer(req: Any, wire: list[bytearray], digest: str, raw_format: Any) -> Any:
        answer = original(req, wire, digest, raw_format)
        if not lost:
            lost.append(digest)
            raise RuntimeError("stored, but the answer is a 500")
        return answer

    monkeypatch.setattr(upload_route, "_process", loses_the_first_answer)
    records = episodes(40)
    accounting, ledger = ledger_for(len(records))
    with serving(tmp_path) as (svc, client):
        sink_for(client).write(records, "episode", ledger, threading.Event())
        stored = stored_ids(svc)
        replays = svc.stats()["replays"]
    assert sorted(stored) == sorted(r["id"] for r in records)  # each once
    assert replays == 1 and sink_counts(accounting)["stored"] == 40
    assert_identity(accounting, ledger)


def test_the_report_marks_each_listed_line_rejected(tmp_path):
    lines = [orjson.dumps(trace(f"t{i}", info={"note": MARKER if i in (1, 3) else ""})) for i in range(5)]
    with LocalTracesService(tmp_path / "db", reject_marker=MARKER) as svc:
        with TracesClient(api_key=TOKEN, base_url=svc.url) as client:
            with pytest.raises(UploadError) as caught:
                client.upload_lines(lines)
    report = caught.value.report
    assert [report.status_of(i) for i in range(5)] == [
        LineStatus.NOT_STORED,
        LineStatus.REJECTED,
        LineStatus.NOT_STORED,
        LineStatus.REJECTED,
        LineStatus.NOT_STORED,
    ]
