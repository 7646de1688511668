"""A record the caller no longer holds is freed once it is stored or on disk, not when its whole write is done.

The caller's objects are several times larger than their JSON; a write of many
records that waits for a slow link or for the disk must not keep the ones it
has already settled. Each test watches records with ``weakref.finalize`` and
holds a write in the middle (an upload held by the service, or a record whose
``to_record()`` waits), so the old behaviour, freeing everything at the end of
the write, fails them.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from _run_helpers import GATE_TIMEOUT_S
from _wire import episode, trace
from test_traces_sink import CONTEXT, SMALL_BATCH_BYTES, STAMP, ledger_for, serving, stored_ids

import prime_runs
from prime_runs._local.spool import RecordFiles, Spool
from prime_runs._records.lines import EncodedWrite
from prime_runs._records.size_meter import SizeMeter
from prime_runs._sinks.disk import DiskSink
from prime_runs._sinks.traces import TracesSink

#: How long a record that should already be freed is waited for (it is freed within milliseconds).
FREED_WAIT_S = 10.0


class Record(dict):  # type: ignore[type-arg]
    """A record that can be watched (a plain dict cannot have weak references)."""


class Waiting:
    """A record whose ``to_record()`` waits (bounded) for ``go``: it holds its write in the middle."""

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record
        self.reached = threading.Event()
        self.go = threading.Event()

    def to_record(self) -> dict[str, Any]:
        self.reached.set()
        self.go.wait(GATE_TIMEOUT_S)
        return self.record


@contextlib.contextmanager
def held_at(waiting: Waiting, write: Callable[[], object]) -> Iterator[None]:
    """``write()`` on a thread, held at ``waiting``'s ``to_record()`` for the body of the block."""
    writer = threading.Thread(target=write)
    writer.start()
    try:
        assert waiting.reached.wait(GATE_TIMEOUT_S)
        yield
    finally:
        waiting.go.set()
        writer.join(GATE_TIMEOUT_S)


def episodes(count: int, prefix: str = "e") -> list[Record]:
    return [Record(episode(f"{prefix}{i}", [trace(f"{prefix}{i}-t{k}") for k in range(2)])) for i in range(count)]


def watch(record: object) -> threading.Event:
    """An event set when ``record`` is freed."""
    freed = threading.Event()
    weakref.finalize(record, freed.set)
    return freed


def test_an_encoded_write_lets_go_of_each_record_it_has_turned_into_a_line():
    records: list[Any] = episodes(3)
    freed = [watch(r) for r in records]
    released: list[int] = []
    _, ledger = ledger_for(3)

    def release(position: int) -> None:
        released.append(position)
        records[position] = None

    lines = iter(EncodedWrite(list(records), "episode", STAMP, None, ledger, release=release))
    next(lines)
    assert freed[0].is_set() and not freed[1].is_set() and not freed[2].is_set()
    assert released == [0]
    assert len(list(lines)) == 2
    assert all(f.is_set() for f in freed) and released == [0, 1, 2]


def test_a_rejected_record_is_kept_for_setting_aside():
    bad = Record(episode("bad", [trace("bad-t0")], info={"not json": {1, 2}}))
    records: list[Any] = [*episodes(1), bad]
    _, ledger = ledger_for(2)
    encoded = EncodedWrite(records, "episode", STAMP, None, ledger, release=lambda p: records.__setitem__(p, None))
    assert len(list(encoded)) == 1
    assert records[0] is None and records[1] is bad  # kept aside whole, from this list
    assert [position for position, _ in encoded.errors] == [1]


def test_the_traces_sink_frees_a_stored_batch_while_a_later_one_waits(tmp_path):
    records: list[Any] = episodes(60)
    first, last = watch(records[0]), watch(records[-1])
    release_rest = threading.Event()
    first_arrived = threading.Event()

    def hold_after_first() -> None:
        # The first upload goes through; every later one waits until the test lets it.
        if first_arrived.is_set():
            release_rest.wait(GATE_TIMEOUT_S)
        first_arrived.set()

    accounting, ledger = ledger_for(len(records))
    ledger.last_reader = True
    with serving(tmp_path, max_in_flight=1, compression="zstd") as (svc, client):
        svc.faults.before_upload = hold_after_first
        sink = TracesSink(client, STAMP, CONTEXT, SizeMeter(), target_batch_bytes=SMALL_BATCH_BYTES)
        done = threading.Event()

        def write() -> None:
            sink.write(records, "episode", ledger, threading.Event())
            done.set()

        writer = threading.Thread(target=write)
        writer.start()
        try:
            assert first.wait(FREED_WAIT_S), "the first batch's records were not freed once stored"
            assert not last.is_set() and not done.is_set()  # the write still holds what is not stored
        finally:
            release_rest.set()
            writer.join(GATE_TIMEOUT_S)
        ids = stored_ids(svc)
    assert done.is_set() and last.is_set()
    assert sorted(ids) == sorted(f"e{i}" for i in range(60))
    assert accounting.snapshot()["sinks"]["traces"]["stored"] == 60
    assert all(r is None for r in records)


def test_a_sink_that_is_not_the_last_reader_keeps_the_records(tmp_path):
    records: list[Any] = episodes(5)
    _, ledger = ledger_for(len(records))
    with serving(tmp_path, compression="zstd") as (_svc, client):
        sink = TracesSink(client, STAMP, CONTEXT, SizeMeter(), target_batch_bytes=SMALL_BATCH_BYTES)
        sink.write(records, "episode", ledger, threading.Event())
    assert [r["id"] for r in records] == [f"e{i}" for i in range(5)]  # the next sink reads them whole


def test_the_disk_sink_frees_a_record_once_it_is_encoded(tmp_path):
    waiting = Waiting(episode("w", [trace("w-t0")]))
    records: list[Any] = [*episodes(2), waiting]
    freed = [watch(r) for r in records[:2]]
    _, ledger = ledger_for(3)
    ledger.last_reader = True
    sink = DiskSink(RecordFiles(str(tmp_path)), STAMP)
    try:
        with held_at(waiting, lambda: sink.write(records, "episode", ledger, threading.Event())):
            assert freed[0].wait(FREED_WAIT_S) and freed[1].wait(FREED_WAIT_S)
    finally:
        sink.close()
    assert ledger.remaining == 0


def test_an_offline_run_frees_what_it_has_written_while_the_rest_of_the_write_is_encoded(tmp_path):
    # The whole path: the worker marks the run's last sink, which lets go of each record as it is written.
    run = prime_runs.init("release", mode="offline", dir=str(tmp_path), environments=["e"], handle_signals=False)
    waiting = Waiting(episode("w", [trace("w-t0")]))
    batch: list[Any] = [*episodes(3), waiting]
    freed = [watch(r) for r in batch[:3]]
    assert run.log_episodes(batch)
    del batch
    try:
        assert waiting.reached.wait(GATE_TIMEOUT_S)
        assert all(f.wait(FREED_WAIT_S) for f in freed), "records written to disk are still held by their write"
    finally:
        waiting.go.set()
        run.finish()
    assert run.stats()["sinks"]["offline"]["stored"] == 4


def test_a_spill_frees_each_record_once_it_is_encoded_onto_disk(tmp_path):
    # What a slow link or an outage leaves undelivered is spooled; the records go as their lines are written.
    waiting = Waiting(episode("w", [trace("w-t0")]))
    records: list[Any] = [*episodes(2), waiting]
    freed = [watch(r) for r in records[:2]]
    accounting, ledger = ledger_for(3)
    ledger.last_reader = True
    ledger.undelivered(range(3), "outage")
    files = RecordFiles(str(tmp_path))
    spool = Spool(files, STAMP)
    spooled: list[int] = []
    try:
        spill = lambda: spooled.append(spool.spill(records, "episode", ledger, ledger.take_undelivered("x"), None))  # noqa: E731
        with held_at(waiting, spill):
            assert freed[0].wait(FREED_WAIT_S) and freed[1].wait(FREED_WAIT_S)
    finally:
        files.close()
    assert spooled == [3] and records == [None, None, None]
    assert accounting.snapshot()["sinks"]["traces"]["spooled"] == 3
