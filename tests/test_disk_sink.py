"""DiskSink: stamped lines in fsynced segment entries, the service's line rules checked first,
refused records set aside with why, every record accounted for."""

from __future__ import annotations

import copy
import errno
import os
import threading
import time
from typing import Any

import orjson
import pytest
from _run_helpers import local_records
from _wire import episode, jsonl, post_upload, trace

from prime_runs._local.segment_reader import scan
from prime_runs._local.segments import segment_files
from prime_runs._local.spool import RecordFiles
from prime_runs._records.accounting import Accounting
from prime_runs._records.ledger import Ledger
from prime_runs._records.lines import RunStamp
from prime_runs._records.sink import SinkStatus
from prime_runs._records.size_meter import SizeMeter
from prime_runs._sinks.disk import DiskSink
from prime_traces.server import LocalTracesService

STAMP = RunStamp("run-9", "eval")
DAY_S = 24 * 3600


def ledger_for(accounting: Accounting, records: int) -> Ledger:
    accounting.count_submit(records, 0.0)
    return Ledger(accounting, "offline", records)


def counts(accounting: Accounting) -> dict[str, Any]:
    return accounting.snapshot()["sinks"]["offline"]


def sink_at(directory, **options: Any) -> DiskSink:
    return DiskSink(RecordFiles(str(directory)), STAMP, **options)


def test_writes_are_appended_stamped_and_accounted(tmp_path):
    run_dir = tmp_path / "runs" / "run-9"  # parents are created
    meter = SizeMeter()
    sink = sink_at(run_dir, meter=meter)
    accounting = Accounting(["offline"])
    first = [episode(f"e{i}", [trace(f"e{i}-t0", run={"name": "n"})]) for i in range(3)]
    second = [episode(f"e{i}", [trace(f"e{i}-t0")]) for i in range(3, 5)]
    bare = [trace("t0"), trace("t1")]
    before = copy.deepcopy(first)
    cancel = threading.Event()
    assert sink.write(first, "episode", ledger_for(accounting, 3), cancel) is SinkStatus.OK
    assert sink.write(second, "episode", ledger_for(accounting, 2), cancel) is SinkStatus.OK
    assert sink.write(bare, "trace", ledger_for(accounting, 2), cancel) is SinkStatus.OK
    sink.close()

    names = sorted(os.listdir(run_dir))
    pid = os.getpid()
    assert [n.split("-")[0] for n in names] == ["episode", "trace"]
    assert all(n.endswith(f"-{pid}-000001.jsonl.zst") for n in names)
    envelopes = local_records(run_dir, "episode")
    assert [e["id"] for e in envelopes] == ["e0", "e1", "e2", "e3", "e4"]
    for envelope in envelopes:
        assert envelope["run"] == {"id": "run-9", "type": "eval"}
        assert envelope["traces"][0]["run"]["id"] == "run-9"
        assert envelope["traces"][0]["run"]["type"] == "eval"
    assert envelopes[0]["traces"][0]["run"]["name"] == "n"
    assert [t["id"] for t in local_records(run_dir, "trace")] == ["t0", "t1"]
    assert first == before  # stamped on copies
    # One entry per write.
    assert [e.lines for e in scan(segment_files(str(run_dir), ["episode"])[0]).entries] == [3, 2]

    snap = counts(accounting)
    assert snap["stored"] == 7 and snap["failed"] == {}
    assert snap["bytes_sent"] == sum(len(orjson.dumps(r)) + 1 for r in envelopes + local_records(run_dir, "trace"))
    assert accounting.unaccounted("offline") == 0
    assert meter.mean_bytes > 0


def _rejected(run_dir) -> list[dict[str, Any]]:
    return local_records(run_dir, "rejected")


def test_a_record_that_cannot_be_encoded_is_set_aside_with_why(tmp_path):
    sink = sink_at(tmp_path)
    accounting = Accounting(["offline"])
    records = [trace("t0"), trace("t1", metrics={"x": float("inf")}), trace("t2")]
    ledger = ledger_for(accounting, 3)
    assert sink.write(records, "trace", ledger, threading.Event()) is SinkStatus.OK
    assert [t["id"] for t in local_records(tmp_path, "trace")] == ["t0", "t2"]
    assert counts(accounting)["stored"] == 2
    assert counts(accounting)["failed"] == {"invalid_record": 1}
    assert accounting.unaccounted("offline") == 0 and ledger.remaining == 0
    [kept] = _rejected(tmp_path)
    assert kept["id"] == "t1" and kept["reason"] == "invalid_record" and kept["line_format"] == "trace"
    assert "metrics.x is Infinity; NaN and Infinity are not JSON" in kept["message"]
    assert kept["record"]["id"] == "t1" and kept["record"]["metrics"] == {"x": None}  # readable, if lossy


def test_a_record_whose_to_record_raises_fails_alone(tmp_path):
    class Broken:
        def to_record(self) -> dict[str, Any]:
            raise KeyError("reward")

    sink = sink_at(tmp_path)
    accounting = Accounting(["offline"])
    records = [trace("t0"), Broken(), trace("t2", metrics={"x": float("nan")}), Broken(), trace("t4")]
    ledger = ledger_for(accounting, 5)
    assert sink.write(records, "trace", ledger, threading.Event()) is SinkStatus.OK
    assert [t["id"] for t in local_records(tmp_path, "trace")] == ["t0", "t4"]
    assert counts(accounting)["stored"] == 2
    assert counts(accounting)["failed"] == {"invalid_record": 3}
    assert accounting.unaccounted("offline") == 0 and ledger.remaining == 0
    kept = _rejected(tmp_path)
    assert [k["id"] for k in kept] == [None, "t2", None]
    assert "KeyError" in kept[0]["message"] and "unreadable" in kept[0]["record"]


# Records the service refuses, each with the rule it breaks.
_REFUSED = {
    "no-start": lambda: episode("e-no-start", [trace("t-no-start", timing={})]),
    "too-old": lambda: episode("e-old", [trace("t-old", timing={"start": time.time() - 400 * DAY_S})]),
    "in-the-future": lambda: episode("e-future", [trace("t-future", timing={"start": time.time() + 3600})]),
    "no-id": lambda: {k: v for k, v in episode("e-x", [trace("t-x")]).items() if k != "id"},
    "member-no-id": lambda: episode("e-member", [{k: v for k, v in trace("t-y").items() if k != "id"}]),
    "member-not-object": lambda: episode("e-member2", ["just text"]),
    "long-id": lambda: episode("e" * 300, [trace("t-long")]),
    "long-env": lambda: episode("e-env", [trace("t-env")], env={"id": "v" * 300}),
}


@pytest.mark.parametrize("case", sorted(_REFUSED))
def test_a_record_the_service_would_refuse_is_set_aside_with_the_services_own_words(tmp_path, case):
    record = _REFUSED[case]()
    sink = sink_at(tmp_path / "run")
    accounting = Accounting(["offline"])
    ledger = ledger_for(accounting, 3)
    good = [episode("g0", [trace("g0-t")]), episode("g1", [trace("g1-t")])]
    assert sink.write([good[0], record, good[1]], "episode", ledger, threading.Event()) is SinkStatus.OK
    assert [e["id"] for e in local_records(tmp_path / "run", "episode")] == ["g0", "g1"]
    [kept] = _rejected(tmp_path / "run")
    # The same record, stamped as the sink stamps it, sent to the local service alone.
    stamped = STAMP.apply(record, "episode")
    with LocalTracesService(tmp_path / "db") as svc:
        answer = post_upload(svc.url, jsonl([stamped]), line_format="episode").json()["error"]
    assert (kept["code"], kept["reason"]) == (answer["code"], f"rejected:{answer['code']}")
    assert counts(accounting)["failed"] == {kept["reason"]: 1}
    named = (
        f"record {record['id']!r} (item 1 of the write)" if record.get("id") else "the record at item 1 of the write"
    )
    assert kept["message"] == f"{named}: {answer['message'].removeprefix('line 1: ')}"
    assert accounting.unaccounted("offline") == 0


def test_offline_validation_can_be_turned_off_for_a_local_copy(tmp_path):
    sink = sink_at(tmp_path, validate=False)
    accounting = Accounting(["offline"])
    record = _REFUSED["too-old"]()
    assert sink.write([record], "episode", ledger_for(accounting, 1), threading.Event()) is SinkStatus.OK
    assert [e["id"] for e in local_records(tmp_path, "episode")] == ["e-old"]


def _unwritable(tmp_path, how: str):
    if how == "read-only":
        if os.geteuid() == 0:
            pytest.skip("root writes into read-only directories")
        run_dir = tmp_path / "ro"
        run_dir.mkdir()
        run_dir.chmod(0o500)
        return run_dir
    if how == "not-a-directory":
        (tmp_path / "file").write_bytes(b"")
        return tmp_path / "file" / "run"
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["read-only", "not-a-directory"])
def test_a_disk_error_fails_the_write_and_is_a_strike(tmp_path, how):
    run_dir = _unwritable(tmp_path, how)
    try:
        sink = sink_at(run_dir)
        accounting = Accounting(["offline"])
        records = [episode(f"e{i}", [trace(f"e{i}-t0")]) for i in range(4)]
        records.append(episode("bad", [trace("bad-t0", metrics={"x": float("nan")})]))
        ledger = ledger_for(accounting, 5)
        assert sink.write(records, "episode", ledger, threading.Event()) is SinkStatus.TRANSIENT
        assert counts(accounting)["stored"] == 0
        # The first entry is written once it is full or the records run out: all were encoded.
        assert counts(accounting)["failed"] == {"disk_error": 4, "invalid_record": 1}
        assert accounting.unaccounted("offline") == 0 and ledger.remaining == 0
    finally:
        if how == "read-only":
            run_dir.chmod(0o700)


def test_a_full_disk_fails_the_write_and_leaves_the_file_whole(tmp_path, monkeypatch):
    sink = sink_at(tmp_path)
    accounting = Accounting(["offline"])
    assert sink.write([trace("t0")], "trace", ledger_for(accounting, 1), threading.Event()) is SinkStatus.OK
    [path] = segment_files(str(tmp_path), ["trace"])
    size = os.path.getsize(path)
    real_writev = os.writev

    def full(fd: int, buffers: Any) -> int:
        real_writev(fd, [bytes(buffers[0])[:5]])  # part of the entry reaches the file first
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "writev", full)
    ledger = ledger_for(accounting, 2)
    assert sink.write([trace("t1"), trace("t2")], "trace", ledger, threading.Event()) is SinkStatus.TRANSIENT
    monkeypatch.undo()
    assert os.path.getsize(path) == size
    assert sink.write([trace("t3")], "trace", ledger_for(accounting, 1), threading.Event()) is SinkStatus.OK
    assert [t["id"] for t in local_records(tmp_path, "trace")] == ["t0", "t3"]
    snap = counts(accounting)
    assert snap["stored"] == 2 and snap["failed"] == {"disk_error": 2}
    assert accounting.unaccounted("offline") == 0


def test_cancel_stops_the_write_and_leaves_the_rest_open(tmp_path):
    cancel = threading.Event()

    class Cancelling:
        """The second record sets the cancel as it is encoded (the deadline arrives mid-write)."""

        def to_record(self) -> dict[str, Any]:
            cancel.set()
            return trace("t1")

    sink = sink_at(tmp_path)
    accounting = Accounting(["offline"])
    ledger = ledger_for(accounting, 4)
    assert sink.write([trace("t0"), Cancelling(), trace("t2"), trace("t3")], "trace", ledger, cancel) is SinkStatus.OK
    assert [t["id"] for t in local_records(tmp_path, "trace")] == ["t0", "t1"]
    assert counts(accounting)["stored"] == 2
    groups = ledger.take_undelivered("deadline")
    assert [(g.indexes, g.reason) for g in groups] == [((2, 3), "deadline")]  # for the worker to spool


def test_nothing_is_created_for_a_run_that_writes_nothing(tmp_path):
    sink = sink_at(tmp_path / "run")
    sink.close()
    assert not (tmp_path / "run").exists()
