"""OfflineSink: stamped JSONL appended and fsync'd per write, every record accounted for."""

from __future__ import annotations

import copy
import os
import threading
from typing import Any

import orjson
import pytest

from _wire import episode, trace
from prime_runs._accounting import Accounting
from prime_runs._encoding import RunStamp
from prime_runs._offline_sink import OfflineSink
from prime_runs._queue import SizeMeter
from prime_runs._sink import Ledger, SinkStatus

STAMP = RunStamp("run-9", "eval")


def ledger_for(accounting: Accounting, records: int) -> Ledger:
    accounting.count_submit(records, 0.0)
    return Ledger(accounting, "offline", records)


def read_jsonl(path: os.PathLike[str] | str) -> list[dict[str, Any]]:
    with open(path, "rb") as handle:
        data = handle.read()
    assert data.endswith(b"\n")
    return [orjson.loads(line) for line in data.split(b"\n")[:-1]]


def counts(accounting: Accounting) -> dict[str, Any]:
    return accounting.snapshot()["sinks"]["offline"]


def test_writes_are_appended_stamped_and_accounted(tmp_path):
    run_dir = tmp_path / "runs" / "run-9"  # parents are created
    meter = SizeMeter()
    sink = OfflineSink(run_dir, STAMP, meter)
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

    assert sorted(os.listdir(run_dir)) == ["episodes.jsonl", "traces.jsonl"]
    envelopes = read_jsonl(run_dir / "episodes.jsonl")
    assert [e["id"] for e in envelopes] == ["e0", "e1", "e2", "e3", "e4"]
    for envelope in envelopes:
        assert envelope["run"] == {"id": "run-9", "type": "eval"}
        assert envelope["traces"][0]["run"]["id"] == "run-9"
        assert envelope["traces"][0]["run"]["type"] == "eval"
    assert envelopes[0]["traces"][0]["run"]["name"] == "n"
    assert [t["id"] for t in read_jsonl(run_dir / "traces.jsonl")] == ["t0", "t1"]
    assert first == before  # stamped on copies

    snap = counts(accounting)
    assert snap["stored"] == 7 and snap["failed"] == {}
    total = os.path.getsize(run_dir / "episodes.jsonl") + os.path.getsize(run_dir / "traces.jsonl")
    assert snap["bytes_sent"] == total
    assert accounting.unaccounted("offline") == 0
    assert meter.mean_bytes > 0


def test_an_invalid_record_fails_alone(tmp_path):
    sink = OfflineSink(tmp_path, STAMP)
    accounting = Accounting(["offline"])
    records = [trace("t0"), trace("t1", metrics={"x": float("inf")}), trace("t2")]
    ledger = ledger_for(accounting, 3)
    assert sink.write(records, "trace", ledger, threading.Event()) is SinkStatus.OK
    assert [t["id"] for t in read_jsonl(tmp_path / "traces.jsonl")] == ["t0", "t2"]
    assert counts(accounting)["stored"] == 2
    assert counts(accounting)["failed"] == {"invalid_record": 1}
    assert accounting.unaccounted("offline") == 0 and ledger.remaining == 0


def test_a_record_whose_to_record_raises_fails_alone(tmp_path):
    class Broken:
        def to_record(self) -> dict[str, Any]:
            raise KeyError("reward")

    sink = OfflineSink(tmp_path, STAMP)
    accounting = Accounting(["offline"])
    records = [trace("t0"), Broken(), trace("t2", metrics={"x": float("nan")}), Broken(), trace("t4")]
    ledger = ledger_for(accounting, 5)
    assert sink.write(records, "trace", ledger, threading.Event()) is SinkStatus.OK
    assert [t["id"] for t in read_jsonl(tmp_path / "traces.jsonl")] == ["t0", "t4"]
    assert counts(accounting)["stored"] == 2
    assert counts(accounting)["failed"] == {"invalid_record": 3}
    assert accounting.unaccounted("offline") == 0 and ledger.remaining == 0


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
    if how == "disk-full":
        if not os.path.exists("/dev/full"):
            pytest.skip("no /dev/full here")
        run_dir = tmp_path / "full"
        run_dir.mkdir()
        os.symlink("/dev/full", run_dir / "episodes.jsonl")
        return run_dir
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["read-only", "not-a-directory", "disk-full"])
def test_a_disk_error_fails_the_write_and_is_a_strike(tmp_path, how):
    run_dir = _unwritable(tmp_path, how)
    try:
        sink = OfflineSink(run_dir, STAMP)
        accounting = Accounting(["offline"])
        records = [episode(f"e{i}", [trace(f"e{i}-t0")]) for i in range(4)]
        records.append(episode("bad", [trace("bad-t0", metrics={"x": float("nan")})]))
        ledger = ledger_for(accounting, 5)
        assert sink.write(records, "episode", ledger, threading.Event()) is SinkStatus.TRANSIENT
        assert counts(accounting)["stored"] == 0
        if how == "disk-full":  # the disk filled as the records were written: the invalid one was seen
            assert counts(accounting)["failed"] == {"disk_error": 4, "invalid_record": 1}
        else:  # nothing could be opened: no record was even encoded
            assert counts(accounting)["failed"] == {"disk_error": 5}
        assert accounting.unaccounted("offline") == 0 and ledger.remaining == 0
    finally:
        if how == "read-only":
            run_dir.chmod(0o700)


def test_a_failed_write_is_cut_off_so_the_file_stays_whole(tmp_path, monkeypatch):
    sink = OfflineSink(tmp_path, STAMP)
    accounting = Accounting(["offline"])
    assert sink.write([trace("t0")], "trace", ledger_for(accounting, 1), threading.Event()) is SinkStatus.OK
    size = os.path.getsize(tmp_path / "traces.jsonl")

    def full(_fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    ledger = ledger_for(accounting, 2)
    assert sink.write([trace("t1"), trace("t2")], "trace", ledger, threading.Event()) is SinkStatus.TRANSIENT
    monkeypatch.undo()
    assert os.path.getsize(tmp_path / "traces.jsonl") == size
    assert sink.write([trace("t3")], "trace", ledger_for(accounting, 1), threading.Event()) is SinkStatus.OK
    assert [t["id"] for t in read_jsonl(tmp_path / "traces.jsonl")] == ["t0", "t3"]
    snap = counts(accounting)
    assert snap["stored"] == 2 and snap["failed"] == {"disk_error": 2}
    assert accounting.unaccounted("offline") == 0


def test_cancel_stops_between_records_and_keeps_what_was_written(tmp_path):
    cancel = threading.Event()

    class Cancelling:
        """The second record sets the cancel as it is encoded (the deadline arrives mid-write)."""

        def to_record(self) -> dict[str, Any]:
            cancel.set()
            return trace("t1")

    sink = OfflineSink(tmp_path, STAMP)
    accounting = Accounting(["offline"])
    ledger = ledger_for(accounting, 4)
    assert sink.write([trace("t0"), Cancelling(), trace("t2"), trace("t3")], "trace", ledger, cancel) is SinkStatus.OK
    assert [t["id"] for t in read_jsonl(tmp_path / "traces.jsonl")] == ["t0", "t1"]
    assert counts(accounting)["stored"] == 2
    assert ledger.remaining == 2  # left for the worker to close with "deadline"


def test_unknown_line_format_is_refused(tmp_path):
    with pytest.raises(ValueError, match="line_format"):
        OfflineSink(tmp_path, None).path_for("parquet")
