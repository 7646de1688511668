"""UploadWorker: never blocks, bounded queue, accounting, strikes, bounded close."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
from _run_helpers import MARKER, episodes, stored_episodes

import prime_runs
from prime_runs._records.ledger import Ledger
from prime_runs._records.lines import RunStamp
from prime_runs._records.reasons import DEADLINE, SINK_RETIRED, WORKER_ERROR
from prime_runs._records.sink import Sink, SinkStatus
from prime_runs._records.size_meter import SizeMeter
from prime_runs._sinks.traces import TracesSink
from prime_runs._upload.queue import TAKE_WRITES_PER_HOLD, RecordQueue, write_cap_bytes
from prime_runs._upload.settings import DEFAULT_WRITE_CAP_BYTES, WorkerSettings
from prime_runs._upload.worker import UploadWorker
from prime_runs.errors import SinkError
from prime_traces import TracesClient

GATE_TIMEOUT_S = 30.0


class GatedSink(Sink):
    """Stores records once its gate opens; ``entered`` is set when a write arrives."""

    def __init__(
        self, name: str = "test", *, status: SinkStatus = SinkStatus.OK, fail: int = 0, honour_cancel: bool = True
    ) -> None:
        self.name = name
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.status = status
        self.fail = fail
        self.honour_cancel = honour_cancel
        self.writes: list[int] = []
        self.received: list[Any] = []
        self.closed = False

    def write(self, records: Sequence[Any], line_format: str, ledger: Ledger, cancel: threading.Event) -> SinkStatus:
        self.entered.set()
        if self.honour_cancel:
            while not self.gate.wait(0.01):
                if cancel.is_set():
                    return SinkStatus.OK
        else:
            self.gate.wait(GATE_TIMEOUT_S)
        self.writes.append(len(records))
        self.received.extend(records)
        for index in range(self.fail):
            ledger.rejected(index, "rejected:invalid_trace", f"record {index} is bad")
        ledger.stored(range(self.fail, len(records)))
        return self.status

    def close(self) -> None:
        self.closed = True


def identity_holds(worker: UploadWorker, sink: str) -> bool:
    return worker.accounting.unaccounted(sink) == 0


def assert_buckets(
    worker: UploadWorker,
    *,
    submitted: int,
    stored: int,
    dropped: dict[str, int] | None = None,
    failed: dict[str, int] | None = None,
    spooled: dict[str, int] | None = None,
    sink: str = "test",
) -> None:
    """Each bucket of ``sink`` holds what the scenario implies (empty unless given); the identity closes."""
    snap = worker.accounting.snapshot()
    counts = snap["sinks"][sink]
    actual = {
        "submitted": snap["submitted"],
        "stored": counts["stored"],
        "dropped": snap["dropped"],
        "failed": counts["failed"],
        "spooled": counts["spooled_reasons"],
    }
    expected = {
        "submitted": submitted,
        "stored": stored,
        "dropped": dropped or {},
        "failed": failed or {},
        "spooled": spooled or {},
    }
    assert actual == expected
    assert identity_holds(worker, sink)


def test_submit_never_waits_on_a_blocked_sink_and_counts_every_drop():
    sink = GatedSink()
    worker = UploadWorker([sink], WorkerSettings(max_queued_records=100))
    assert worker.submit([{"id": "first"}], line_format="trace")
    assert sink.entered.wait(GATE_TIMEOUT_S)  # the worker holds one write; the queue is empty
    slowest = 0.0
    accepted = dropped = 0
    for i in range(10_000):
        started = time.perf_counter()
        ok = worker.submit([{"id": f"r{i}"}], line_format="trace")
        slowest = max(slowest, time.perf_counter() - started)
        accepted += ok
        dropped += not ok
    assert slowest < 0.5, slowest  # never waits on the gate
    assert accepted == 100
    assert dropped == 9_900
    assert worker.dropped_records == 9_900
    assert worker.accounting.snapshot()["dropped"] == {"queue_full_records": 9_900}
    sink.gate.set()
    assert worker.close(timeout_s=GATE_TIMEOUT_S)
    assert_buckets(worker, submitted=10_001, stored=101, dropped={"queue_full_records": 9_900})


def test_a_write_larger_than_the_bound_fits_an_empty_queue():
    sink = GatedSink()
    sink.gate.set()
    worker = UploadWorker([sink], WorkerSettings(max_queued_records=10))
    assert worker.submit([{"id": str(i)} for i in range(50)], line_format="trace")
    assert worker.close(timeout_s=GATE_TIMEOUT_S)
    assert sink.writes == [50]
    assert_buckets(worker, submitted=50, stored=50)


def test_the_queue_refuses_by_bytes_before_it_refuses_by_records():
    sink = GatedSink()
    meter = SizeMeter()
    meter.observe(1_000)  # the worker has measured records of 1 kB
    worker = UploadWorker([sink], WorkerSettings(max_queued_records=1_000, max_queued_bytes=10_000), size_meter=meter)
    assert worker.submit([{"id": "holder"}], line_format="trace")
    assert sink.entered.wait(GATE_TIMEOUT_S)
    results = [worker.submit([{"id": f"r{i}"}], line_format="trace") for i in range(20)]
    assert results == [True] * 9 + [False] * 11  # the record in flight is held too: 1 + 9 records of 1 kB
    assert worker.accounting.snapshot()["dropped"] == {"queue_full_bytes": 11}
    sink.gate.set()
    assert worker.close(timeout_s=GATE_TIMEOUT_S)
    assert_buckets(worker, submitted=21, stored=10, dropped={"queue_full_bytes": 11})


def test_flush_waits_for_everything_submitted_before_it():
    sink = GatedSink()
    worker = UploadWorker([sink])
    worker.submit([{"id": "a"}, {"id": "b"}], line_format="trace")
    assert not worker.flush(timeout_s=0.05)
    sink.gate.set()
    assert worker.flush(timeout_s=GATE_TIMEOUT_S)
    assert worker.accounting.sinks["test"].stored == 2
    worker.close(timeout_s=1)


def test_three_transient_failures_in_a_row_retire_the_sink():
    sink = GatedSink(status=SinkStatus.TRANSIENT, fail=1)
    sink.gate.set()
    errors: list[SinkError] = []
    worker = UploadWorker([sink], on_error=errors.append)
    for i in range(5):
        worker.submit([{"id": f"{i}-a"}, {"id": f"{i}-b"}], line_format="trace")
        assert worker.flush(timeout_s=GATE_TIMEOUT_S)
    worker.close(timeout_s=1)
    assert sink.writes == [2, 2, 2]
    assert worker.retired == {"test"}
    failed = worker.accounting.sinks["test"].failed
    assert failed == {"rejected:invalid_trace": 3, SINK_RETIRED: 4}
    assert worker.failed_records == {"test": 7}
    assert [e.failures for e in errors][:3] == [{"rejected:invalid_trace": 1}] * 3
    # Each write of 2: one rejected, one stored, until the third strike; the last 2 writes are not sent.
    assert_buckets(worker, submitted=10, stored=3, failed={"rejected:invalid_trace": 3, SINK_RETIRED: 4})


def test_close_returns_at_its_deadline_even_when_a_sink_never_returns():
    sink = GatedSink(honour_cancel=False)
    worker = UploadWorker([sink])
    worker.submit([{"id": "stuck"}] * 3, line_format="trace")
    assert sink.entered.wait(GATE_TIMEOUT_S)
    worker.submit([{"id": "queued"}] * 2, line_format="trace")
    started = time.monotonic()
    assert worker.close(timeout_s=0.5) is False
    elapsed = time.monotonic() - started
    assert elapsed < 0.5 + 1.0, elapsed
    assert_buckets(worker, submitted=5, stored=0, failed={DEADLINE: 5})
    sink.gate.set()  # the abandoned write finishing late changes nothing
    assert worker.flush(timeout_s=1)
    assert_buckets(worker, submitted=5, stored=0, failed={DEADLINE: 5})


def test_submit_after_close_is_dropped_and_counted():
    sink = GatedSink()
    sink.gate.set()
    worker = UploadWorker([sink])
    worker.close(timeout_s=1)
    assert worker.submit([{"id": "late"}], line_format="trace") is False
    assert worker.accounting.snapshot()["dropped"] == {"closed": 1}


def test_a_sink_that_raises_loses_its_write_not_the_worker():
    class Broken(GatedSink):
        def write(self, records, line_format, ledger, cancel):
            raise RuntimeError("boom")

    worker = UploadWorker([Broken()])
    worker.submit([{"id": "a"}], line_format="trace")
    assert worker.flush(timeout_s=GATE_TIMEOUT_S)
    worker.submit([{"id": "b"}], line_format="trace")
    assert worker.close(timeout_s=GATE_TIMEOUT_S)
    assert_buckets(worker, submitted=2, stored=0, failed={"sink_error:RuntimeError": 2})


@pytest.mark.parametrize("bad", [0, -1])
def test_bad_limits_are_refused(bad):
    with pytest.raises(ValueError, match="max_queued_records"):
        UploadWorker([GatedSink()], WorkerSettings(max_queued_records=bad))


def test_writes_waiting_together_reach_the_sink_as_one_per_line_format():
    sink = GatedSink()
    formats: list[str] = []
    original = sink.write

    def write(records, line_format, ledger, cancel):
        formats.append(line_format)
        return original(records, line_format, ledger, cancel)

    sink.write = write
    worker = UploadWorker([sink])
    worker.submit([{"id": "first"}], line_format="trace")
    assert sink.entered.wait(GATE_TIMEOUT_S)
    for i in range(5):
        worker.submit([{"id": f"e{i}", "traces": []}] * 2, line_format="episode")
    worker.submit([{"id": "t"}] * 3, line_format="trace")
    worker.submit([{"id": "e", "traces": []}], line_format="episode")
    sink.gate.set()
    assert worker.close(timeout_s=GATE_TIMEOUT_S)
    assert sink.writes == [1, 10, 3, 1]
    assert formats == ["trace", "episode", "trace", "episode"]
    assert_buckets(worker, submitted=15, stored=15)


def _held_worker(sink: GatedSink, **options: Any) -> UploadWorker:
    """A worker whose thread is inside the sink with one record, so later writes wait in the queue."""
    worker = UploadWorker([sink], **options)
    assert worker.submit([{"id": "holder"}], line_format="trace")
    assert sink.entered.wait(GATE_TIMEOUT_S)
    return worker


@pytest.mark.parametrize(
    "reuse",
    [list.clear, lambda buf: buf.extend({"id": f"late{i}"} for i in range(5))],
    ids=["cleared", "appended"],
)
def test_a_caller_reusing_its_list_after_submit_loses_and_gains_nothing(reuse):
    sink = GatedSink()
    worker = _held_worker(sink)
    buf = [{"id": f"ep{i}"} for i in range(64)]
    expected = list(buf)
    assert worker.submit(buf, line_format="trace")
    reuse(buf)  # the training-loop pattern: log the buffer, then clear or keep filling it
    assert worker.stats()["queued_records"] == 64
    sink.gate.set()
    assert worker.flush(timeout_s=GATE_TIMEOUT_S)
    assert sink.received[1:] == expected
    assert_buckets(worker, submitted=65, stored=65)
    assert worker.stats()["queued_records"] == 0
    assert worker.close(timeout_s=GATE_TIMEOUT_S)


def test_the_queue_counts_a_write_as_it_was_put_whatever_happens_to_the_list_later():
    queue = RecordQueue(100, 10**9, SizeMeter())
    shrunk, grown = [{"id": "a"}, {"id": "b"}, {"id": "c"}], [{"id": "d"}]
    assert queue.put(shrunk, "trace") == (True, None, 1)
    assert queue.put(grown, "trace") == (True, None, 2)  # the second call of this method
    shrunk.clear()
    grown.extend([{"id": "e"}] * 10)
    taken = queue.take(float("inf"), 0)
    assert [w.count for w in taken] == [3, 1]
    assert queue.queued_records == 0
    assert queue.queued_bytes == 0
    # Drift would refuse this write although the queue is empty of records.
    assert queue.put([{"id": "f"}] * 100, "trace")[:2] == (True, None)
    assert queue.put([{"id": "g"}], "trace")[:2] == (False, "queue_full_records")


def test_the_worker_takes_writes_a_few_per_hold_of_the_queue_lock():
    # A caller's put() waits for the lock; taking hundreds of writes in one hold made it wait over a millisecond.
    queue = RecordQueue(10_000, 10**12, SizeMeter())
    for i in range(200):
        assert queue.put([{"id": f"t{i}"}], "trace")[0]
    parts: list[list[int]] = []
    taken = queue.take(float("inf"), 0, on_take=lambda part: parts.append([w.seq for w in part]))
    assert [len(p) for p in parts] == [TAKE_WRITES_PER_HOLD] * 3 + [200 - 3 * TAKE_WRITES_PER_HOLD]
    assert [seq for p in parts for seq in p] == [w.seq for w in taken] == list(range(1, 201))
    assert (queue.queued_records, queue.taken_records) == (0, 200)
    worker = UploadWorker([GatedSink()])  # its thread never starts: the test takes as it would
    for i in range(200):
        assert worker._queue.put([{"id": f"t{i}"}], "trace")[0]
    writes = worker._queue.take(float("inf"), 0, on_take=worker._in_flight.claim)
    assert len(worker._in_flight) == 4  # one claim per hold, so close() sees each part as soon as it is taken
    groups = worker._in_flight.regroup(writes)
    assert [g.count for g in groups] == [200] and worker._in_flight.keys() == [groups[0].key]


def test_an_unexpected_error_in_the_worker_fails_its_write_and_the_worker_goes_on(caplog):
    sink = GatedSink()
    sink.gate.set()
    errors: list[SinkError] = []
    worker = UploadWorker([sink], on_error=errors.append)
    report_drops = worker._report_drops
    calls = 0

    def broken_once() -> None:  # stands in for any bug between taking a write and handing it on
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("bug")
        report_drops()

    worker._report_drops = broken_once
    reason = f"{WORKER_ERROR}:RuntimeError"
    with caplog.at_level(logging.WARNING, logger="prime_runs"):
        assert worker.submit([{"id": "a"}, {"id": "b"}], line_format="trace")
        assert worker.flush(timeout_s=GATE_TIMEOUT_S)
    assert [r.exc_info is not None for r in caplog.records] == [True]
    assert worker.accounting.sinks["test"].failed == {reason: 2}
    assert [e.failures for e in errors] == [{reason: 2}]
    assert_buckets(worker, submitted=2, stored=0, failed={reason: 2})
    assert worker.submit([{"id": "c"}], line_format="trace")
    assert worker.close(timeout_s=GATE_TIMEOUT_S)
    assert sink.received == [{"id": "c"}]
    assert_buckets(worker, submitted=3, stored=1, failed={reason: 2})


def test_the_byte_bound_holds_when_records_grow_tenfold_and_covers_records_in_flight():
    sink = GatedSink()
    sink.gate.set()
    meter = SizeMeter()
    worker = UploadWorker(
        [sink], WorkerSettings(max_queued_records=10_000, max_queued_bytes=1_000_000), size_meter=meter
    )
    for _ in range(500):  # a long run of small records: the estimate learns 1 kB
        meter.observe(1_000)
    assert worker.submit([{"id": f"small-{i}"} for i in range(100)], line_format="trace") and worker.flush(
        timeout_s=GATE_TIMEOUT_S
    )
    sink.gate.clear()
    sink.entered.clear()
    assert worker.submit([{"id": "big-0"}], line_format="trace")  # taken by the worker, held in flight
    assert sink.entered.wait(GATE_TIMEOUT_S)
    meter.observe(10_000)  # the worker measured the first grown record: 10 kB
    results = [worker.submit([{"id": f"big-{i}"}], line_format="trace") for i in range(1, 300)]
    held = 1 + results.count(True)
    assert held * 10_000 <= 1_000_000 and held == 100  # 1 in flight + 99 queued; a mean would have let 300 in
    assert meter.mean_bytes < 1_100 and meter.estimate_bytes == 10_000
    sink.gate.set()
    assert worker.close(timeout_s=GATE_TIMEOUT_S)
    # 100 small, the big one in flight and 99 queued beside it are stored; 200 big ones refused.
    assert_buckets(worker, submitted=400, stored=200, dropped={"queue_full_bytes": 200})


def test_an_on_error_that_raises_is_logged_and_every_later_failure_still_reaches_it(service, caplog):
    service.faults.reject_marker = MARKER
    heard: list[dict[str, int]] = []

    def on_error(error: SinkError) -> None:
        heard.append(error.failures)
        raise RuntimeError("callback bug")

    client = TracesClient(api_key="k", base_url=service.url)
    worker = UploadWorker([TracesSink(client, RunStamp("run-cb", "train"), None, owns_client=True)], on_error=on_error)
    with caplog.at_level(logging.WARNING, logger="prime_runs"):
        for prefix, poisoned in (("a", (1,)), ("b", ()), ("c", (0,))):
            assert worker.submit(episodes(prefix, 3, poisoned=poisoned), line_format="episode")
            assert worker.flush(timeout_s=GATE_TIMEOUT_S)
        assert worker.close(timeout_s=GATE_TIMEOUT_S)
    assert heard == [{"rejected:invalid_trace": 1}] * 2  # raising did not silence it
    logged = [r for r in caplog.records if r.getMessage() == "on_error callback failed"]
    assert [str(r.exc_info[1]) for r in logged] == ["callback bug"] * 2  # with its traceback, not swallowed
    assert sorted(stored_episodes(service)) == ["a0", "a2", "b0", "b1", "b2", "c1", "c2"]
    assert_buckets(worker, sink="traces", submitted=9, stored=7, failed={"rejected:invalid_trace": 2})


def test_a_write_holds_up_to_four_batches_per_slot_within_a_quarter_of_the_queue(tmp_path):
    mib = 1024**2
    assert write_cap_bytes(4, 2048 * mib, 30 * mib) == 480 * mib  # four batches per slot bind
    assert write_cap_bytes(8, 2048 * mib, 30 * mib) == 512 * mib  # a quarter of the queue binds
    assert write_cap_bytes(8, 100 * mib, 30 * mib) == 240 * mib  # never under one batch per slot
    assert DEFAULT_WRITE_CAP_BYTES == 512 * mib
    run = prime_runs.init("cap", mode="offline", dir=str(tmp_path), max_in_flight=2, max_queued_bytes=1024 * mib)
    try:
        assert run._worker is not None and run._worker.settings.write_cap_bytes == 240 * mib
    finally:
        run.finish()
