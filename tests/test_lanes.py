"""Two writes at once: the next write is encoded while the last one's final batches upload."""

from __future__ import annotations

import threading
from typing import Any

from _run_helpers import KEY, episodes

from prime_runs._records.lines import RunStamp
from prime_runs._records.sink import Sink, SinkStatus
from prime_runs._sinks.traces import TracesSink
from prime_runs._upload.lanes import Lane, Lanes
from prime_runs._upload.queue import Write
from prime_runs._upload.settings import WorkerSettings
from prime_runs._upload.worker import UploadWorker
from prime_traces import TracesClient
from prime_traces.server import LocalTracesService

WAIT_S = 30.0
# How long a lane that must wait is given to show that it does not: a wrong lane ends at once.
NOT_BEFORE_S = 0.3


def _write(seq: int) -> Write:
    return Write(seq, [{"id": f"r{seq}"}], "trace", 1.0, 1)


class Script:
    """What each write's work does: say it is encoded, then wait for its gate."""

    def __init__(self, lanes: Lanes) -> None:
        self.lanes = lanes
        self.gates: dict[int, threading.Event] = {}
        self.started: dict[int, threading.Event] = {}

    def work(self, seq: int, *, encoded_early: bool = True) -> Any:
        gate, started = threading.Event(), threading.Event()
        self.gates[seq], self.started[seq] = gate, started

        def run(lane: Lane) -> None:
            started.set()
            if encoded_early:
                lane.encoded.set()
            assert gate.wait(WAIT_S)

        return run

    def run(self, seq: int, **options: Any) -> Lane:
        self.lanes.run([_write(seq)], self.work(seq, **options))
        assert self.lanes._last is not None
        return self.lanes._last


def test_the_next_write_starts_once_the_last_is_encoded_and_writes_are_done_in_order():
    done: list[int] = []
    lanes = Lanes("test-lanes", lambda writes: done.extend(w.seq for w in writes), lambda: None)
    script = Script(lanes)
    first = script.run(1)  # returns while write 1 still waits for its gate
    second = script.run(2)
    assert script.started[2].is_set() and lanes.busy()
    script.gates[2].set()  # write 2 ends first...
    assert not second.finished.wait(NOT_BEFORE_S)  # ...but is not done before write 1
    assert done == []
    script.gates[1].set()
    assert second.finished.wait(WAIT_S) and first.finished.is_set()
    assert done == [1, 2]
    assert not lanes.busy()
    assert first.previous is None and second.previous is None  # no chain of finished lanes is kept


def test_at_most_two_writes_are_in_progress():
    done: list[int] = []
    lanes = Lanes("test-lanes", lambda writes: done.extend(w.seq for w in writes), lambda: None)
    script = Script(lanes)
    script.run(1)
    script.run(2)
    third = threading.Thread(target=lanes.run, args=([_write(3)], script.work(3)), daemon=True)
    third.start()
    assert not script.started[3].wait(NOT_BEFORE_S)
    script.gates[1].set()  # write 1 finished: write 3 may start
    third.join(WAIT_S)
    assert not third.is_alive() and script.started[3].is_set()
    script.gates[2].set()
    script.gates[3].set()
    assert lanes._last is not None and lanes._last.finished.wait(WAIT_S)
    assert done == [1, 2, 3]


def test_a_write_that_never_says_it_is_encoded_holds_the_next_until_it_ends():
    lanes = Lanes("test-lanes", lambda writes: None, lambda: None)
    script = Script(lanes)
    runner = threading.Thread(target=lanes.run, args=([_write(1)], script.work(1, encoded_early=False)), daemon=True)
    runner.start()
    assert script.started[1].wait(WAIT_S)
    runner.join(NOT_BEFORE_S)
    assert runner.is_alive()  # run() waits for the write to be encoded or to end
    script.gates[1].set()
    runner.join(WAIT_S)
    assert not runner.is_alive()


def test_writes_no_lane_ran_are_done_after_every_write_before_them():
    done: list[int] = []
    lanes = Lanes("test-lanes", lambda writes: done.extend(w.seq for w in writes), lambda: None)
    script = Script(lanes)
    script.run(1)
    marking = threading.Thread(target=lanes.done_in_order, args=([_write(2)],), daemon=True)
    marking.start()
    marking.join(NOT_BEFORE_S)
    assert marking.is_alive() and done == []
    script.gates[1].set()
    marking.join(WAIT_S)
    assert done == [1, 2]


def test_the_worker_uploads_the_next_write_while_the_last_ones_final_batch_is_in_flight(tmp_path):
    arrivals: list[str] = []
    arrived = threading.Condition()
    hold_first_of = threading.Event()  # armed: the next upload to arrive is held until released
    release = threading.Event()
    held: list[str] = []

    def on_upload(key: str) -> None:
        with arrived:
            arrivals.append(key)
            hold = hold_first_of.is_set() and not held
            if hold:
                held.append(key)
            arrived.notify_all()
        if hold:
            release.wait(WAIT_S)

    def wait_for_arrivals(n: int) -> bool:
        with arrived:
            return arrived.wait_for(lambda: len(arrivals) >= n, WAIT_S)

    with LocalTracesService(tmp_path / "db", on_upload=on_upload) as svc:
        client = TracesClient(KEY, svc.url, max_in_flight=2)
        run_id = client.create_run(name="lanes", kind="eval")["id"]
        sink = TracesSink(client, RunStamp(run_id, "eval"), {"source": "test"}, owns_client=True)
        # One write per take: each log_episodes() call is a write of its own.
        worker = UploadWorker([sink], WorkerSettings(write_cap_bytes=1))
        try:
            assert worker.submit(episodes("w", 1), line_format="episode")
            assert worker.flush(timeout_s=WAIT_S)  # the window has grown to two slots
            hold_first_of.set()
            assert worker.submit(episodes("a", 1), line_format="episode")
            assert wait_for_arrivals(2)  # write a's only batch is held at the service
            assert worker.submit(episodes("b", 1), line_format="episode")
            # Write b is taken, encoded and sent while write a still waits for its answer.
            assert wait_for_arrivals(3)
            assert not worker.flush(timeout_s=0)  # write a, and so b, is not done yet
            release.set()
            assert worker.close(timeout_s=WAIT_S)
        finally:
            release.set()
            worker.close(timeout_s=0)
        stats = worker.stats()["sinks"]["traces"]
        assert stats["stored"] == 3 and stats["failed"] == {}
        assert len(held) == 1


class HeldSink(Sink):
    """Says each write is encoded (unless told not to), then holds it until its gate opens."""

    def __init__(self, name: str = "held", *, says_encoded: bool = True, holds: bool = True) -> None:
        self.name = name
        self.says_encoded = says_encoded
        self.holds = holds
        self.gate = threading.Event()
        self.arrived = threading.Condition()
        self.writes: list[str] = []

    def write(self, records: Any, line_format: str, ledger: Any, cancel: threading.Event) -> Any:
        with self.arrived:
            self.writes.append(records[0]["id"])
            self.arrived.notify_all()
        if self.says_encoded:
            ledger.encoded()
        if self.holds:
            self.gate.wait(WAIT_S)
        ledger.stored(range(len(records)))
        return SinkStatus.OK

    def wait_for(self, record_id: str, timeout_s: float = WAIT_S) -> bool:
        with self.arrived:
            return self.arrived.wait_for(lambda: record_id in self.writes, timeout_s)

    def close(self) -> None:
        pass


def test_a_tick_during_a_writes_tail_does_not_hold_up_the_next_write():
    sink = HeldSink()
    ticked = threading.Event()
    worker = UploadWorker([sink], WorkerSettings(tick_interval_s=0.05, write_cap_bytes=1), tick=ticked.set)
    try:
        assert worker.submit([{"id": "a"}], line_format="trace")
        assert sink.wait_for("a")
        ticked.clear()
        assert ticked.wait(WAIT_S)  # the worker woke with nothing to take while write a is held
        assert worker.submit([{"id": "b"}], line_format="trace")
        assert sink.wait_for("b")  # taken and written while write a still waits
        sink.gate.set()
        assert worker.close(timeout_s=WAIT_S)
    finally:
        sink.gate.set()
        worker.close(timeout_s=0)
    assert sink.writes == ["a", "b"]
    assert worker.stats()["sinks"]["held"]["stored"] == 2


def test_only_the_last_sink_lets_the_next_write_start_early():
    first = HeldSink("first", holds=False)  # says encoded and is done at once
    last = HeldSink("last", says_encoded=False)  # holds every write: the next one must wait for it
    worker = UploadWorker([first, last], WorkerSettings(write_cap_bytes=1))
    try:
        assert worker.submit([{"id": "a"}], line_format="trace")
        assert last.wait_for("a")
        assert worker.submit([{"id": "b"}], line_format="trace")
        assert not first.wait_for("b", NOT_BEFORE_S)  # the sinks before the last write in order, one write at a time
        last.gate.set()
        assert worker.close(timeout_s=WAIT_S)
    finally:
        last.gate.set()
        worker.close(timeout_s=0)
    assert first.writes == last.writes == ["a", "b"]
    assert worker.stats()["sinks"]["first"]["stored"] == worker.stats()["sinks"]["last"]["stored"] == 2


def test_the_worker_takes_no_third_write_while_two_are_in_progress():
    sink = HeldSink()
    worker = UploadWorker([sink], WorkerSettings(write_cap_bytes=1))
    try:
        for record_id in ("a", "b"):
            assert worker.submit([{"id": record_id}], line_format="trace")
            assert sink.wait_for(record_id)
        assert worker.submit([{"id": "c"}], line_format="trace")
        assert not sink.wait_for("c", NOT_BEFORE_S)
        # Still queued, not taken: a taken write's records would be held beside the two in progress.
        assert worker.stats()["queued_records"] == 1
        sink.gate.set()
        assert worker.close(timeout_s=WAIT_S)
    finally:
        sink.gate.set()
        worker.close(timeout_s=0)
    assert sink.writes == ["a", "b", "c"]
