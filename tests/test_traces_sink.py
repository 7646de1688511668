"""TracesSink against the real local service: every record is stored or failed for its own reason."""

from __future__ import annotations

import collections
import copy
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson
import pytest
from _wire import episode, trace

from prime_runs._local.spool import RecordFiles, Spool
from prime_runs._records.accounting import Accounting
from prime_runs._records.ledger import Ledger
from prime_runs._records.lines import RunStamp
from prime_runs._records.sink import SinkStatus
from prime_runs._records.size_meter import SizeMeter
from prime_runs._sinks.traces import TracesSink
from prime_traces import TracesClient
from prime_traces.server import LocalTracesService

MARKER = "POISON-5b1c"
CONTEXT = {"source": "prime-runs", "run_type": "train", "framework": "verifiers"}
STAMP = RunStamp("run-77", "train")
SMALL_BATCH_BYTES = 48 * 1024


@contextmanager
def serving(tmp_path, **options: Any) -> Iterator[tuple[LocalTracesService, TracesClient]]:
    """A local service with ``options`` and a client for it; the client closes first."""
    client_options = {
        k: options.pop(k) for k in ("max_in_flight", "abandon_after_s", "_sleep", "compression") if k in options
    }
    with LocalTracesService(tmp_path / "db", **options) as svc:
        with TracesClient(api_key="k", base_url=svc.url, **client_options) as client:
            yield svc, client


def sink_for(client: TracesClient, **knobs: Any) -> TracesSink:
    return TracesSink(client, STAMP, CONTEXT, SizeMeter(), **knobs)


def ledger_for(records: int) -> tuple[Accounting, Ledger]:
    accounting = Accounting(["traces"])
    accounting.count_submit(records, 0.0)
    return accounting, Ledger(accounting, "traces", records)


def episodes(count: int, poisoned: tuple[int, ...] = ()) -> list[dict[str, Any]]:
    """Small episodes (about 2.5 KB each, two member traces); ``poisoned`` ones carry the marker."""
    out = []
    for i in range(count):
        members = [trace(f"e{i}-t{k}", run={"name": "mine"}) for k in range(2)]
        extra = {"info": {"note": MARKER}} if i in poisoned else {}
        out.append(episode(f"e{i}", members, **extra))
    return out


def stored_ids(svc: LocalTracesService, table: str = "episodes") -> list[str]:
    column = "episode_id" if table == "episodes" else "trace_id"
    where = "" if table == "episodes" else " WHERE episode_id IS NULL"
    with svc.state.store.reader() as conn:
        return [row[0] for row in conn.execute(f"SELECT {column} FROM {table}{where}")]


def sink_counts(accounting: Accounting) -> dict[str, Any]:
    return accounting.snapshot()["sinks"]["traces"]


def undelivered(ledger: Ledger) -> dict[tuple[str, bool], int]:
    """Records left for the spool, by (reason, sent as one batch)."""
    tally: collections.Counter[tuple[str, bool]] = collections.Counter()
    for group in ledger.take_undelivered("never-sent"):
        tally[(group.reason, group.batch)] += len(group.indexes)
    return dict(tally)


def assert_identity(accounting: Accounting, ledger: Ledger) -> None:
    counts = sink_counts(accounting)
    assert counts["stored"] + sum(counts["failed"].values()) == accounting.submitted
    assert accounting.unaccounted("traces") == 0
    assert ledger.remaining == 0


def test_every_record_is_stored(tmp_path):
    records = episodes(40)
    accounting, ledger = ledger_for(len(records))
    with serving(tmp_path) as (svc, client):
        sink = sink_for(client, target_batch_bytes=SMALL_BATCH_BYTES)
        status = sink.write(records, "episode", ledger, threading.Event())
        ids = stored_ids(svc)
        uploads = svc.stats()["uploads"]
    assert status is SinkStatus.OK
    assert sorted(ids) == sorted(r["id"] for r in records)
    counts = sink_counts(accounting)
    assert counts["stored"] == 40 and counts["failed"] == {}
    assert counts["bytes_sent"] > 40 * 1000
    assert uploads > 1  # several batches, each counted as it committed
    assert_identity(accounting, ledger)


@pytest.mark.parametrize("omit_line", [False, True], ids=["located", "bisected"])
@pytest.mark.parametrize("batch_bytes", [SMALL_BATCH_BYTES, None], ids=["many-batches", "one-batch"])
def test_a_bad_record_loses_only_itself(tmp_path, omit_line, batch_bytes):
    records = episodes(500, poisoned=(321,))
    knobs = {"target_batch_bytes": batch_bytes} if batch_bytes else {}
    accounting, ledger = ledger_for(len(records))
    with serving(tmp_path, reject_marker=MARKER, reject_omit_line=omit_line) as (svc, client):
        status = sink_for(client, **knobs).write(records, "episode", ledger, threading.Event())
        ids = stored_ids(svc)
        stats = svc.stats()
    assert status is SinkStatus.OK  # a record's own fault is no strike
    assert len(ids) == 499 == len(set(ids))  # nothing committed was sent twice
    assert "e321" not in ids
    counts = sink_counts(accounting)
    assert counts["stored"] == 499
    assert counts["failed"] == {"rejected:invalid_trace": 1}
    assert_identity(accounting, ledger)
    if omit_line:
        # Bisection costs about two requests per halving, not one per record.
        assert stats["rejections"]["invalid_trace"] <= 12
        assert stats["upload_attempts"] <= 40


@pytest.mark.parametrize("omit_line", [False, True], ids=["located", "bisected"])
def test_two_bad_records_in_one_batch(tmp_path, omit_line):
    records = episodes(60, poisoned=(4, 7))
    accounting, ledger = ledger_for(len(records))
    with serving(tmp_path, reject_marker=MARKER, reject_omit_line=omit_line) as (svc, client):
        status = sink_for(client, target_batch_bytes=SMALL_BATCH_BYTES).write(
            records, "episode", ledger, threading.Event()
        )
        ids = stored_ids(svc)
    assert status is SinkStatus.OK
    assert sorted(ids) == sorted(f"e{i}" for i in range(60) if i not in (4, 7))
    assert sink_counts(accounting)["failed"] == {"rejected:invalid_trace": 2}
    assert_identity(accounting, ledger)


def test_every_record_of_a_batch_bad(tmp_path):
    records = [trace(f"t{i}", info={"note": MARKER}) for i in range(5)]
    accounting, ledger = ledger_for(5)
    with serving(tmp_path, reject_marker=MARKER, reject_omit_line=True) as (svc, client):
        status = sink_for(client).write(records, "trace", ledger, threading.Event())
        assert stored_ids(svc, "traces") == []
    assert status is SinkStatus.OK
    assert sink_counts(accounting)["failed"] == {"rejected:invalid_trace": 5}
    assert_identity(accounting, ledger)


def test_an_invalid_record_fails_alone_and_the_rest_is_stored(tmp_path):
    records = [trace(f"t{i}") for i in range(30)]
    records[11] = trace("t11", metrics={"loss": float("nan")})
    accounting, ledger = ledger_for(len(records))
    with serving(tmp_path) as (svc, client):
        status = sink_for(client).write(records, "trace", ledger, threading.Event())
        ids = stored_ids(svc, "traces")
    assert status is SinkStatus.OK
    assert sorted(ids) == sorted(f"t{i}" for i in range(30) if i != 11)
    assert sink_counts(accounting)["failed"] == {"invalid_record": 1}
    assert_identity(accounting, ledger)


def test_a_record_whose_to_record_raises_fails_alone(tmp_path):
    class Broken:
        def to_record(self) -> dict[str, Any]:
            raise KeyError("reward")

    records: list[Any] = [trace(f"t{i}") for i in range(12)]
    records[5] = Broken()
    accounting, ledger = ledger_for(len(records))
    with serving(tmp_path) as (svc, client):
        status = sink_for(client, target_batch_bytes=4096).write(records, "trace", ledger, threading.Event())
        ids = stored_ids(svc, "traces")
    assert status is SinkStatus.OK
    assert sorted(ids) == sorted(f"t{i}" for i in range(12) if i != 5)
    assert sink_counts(accounting)["failed"] == {"invalid_record": 1}
    assert_identity(accounting, ledger)


def test_a_502_storm_past_max_attempts_is_a_strike_and_leaves_every_record_undelivered(tmp_path):
    records = episodes(100)  # six batches
    accounting, ledger = ledger_for(len(records))
    waits: list[float] = []
    with serving(tmp_path, fail_fraction=1.0, fail_status=502, max_in_flight=1, _sleep=waits.append) as (svc, client):
        sink = sink_for(client, max_attempts=2, target_batch_bytes=SMALL_BATCH_BYTES, max_transient_failures=3)
        status = sink.write(records, "episode", ledger, threading.Event())
        stats = svc.stats()
        assert stored_ids(svc) == []
    assert status is SinkStatus.TRANSIENT
    # The three batches that went out are kept as batches (the service may have stored them); the rest was never sent.
    left = undelivered(ledger)
    sent = left[("transient", True)]
    assert left == {("transient", True): sent, ("transient", False): 100 - sent}
    assert 3 <= sent < 100
    assert sink_counts(accounting)["failed"] == {} and sink_counts(accounting)["stored"] == 0
    assert ledger.close("unused") == 100
    assert sink_counts(accounting)["failed"] == {"transient": 100}
    assert_identity(accounting, ledger)
    # One batch in flight, two attempts each, three failed uploads in a row: then the rest is given up.
    assert stats["upload_attempts"] == 6
    assert waits == [1.0, 1.0, 1.0]


def test_the_first_pass_marks_what_it_measured_and_a_spill_measures_only_the_rest(tmp_path):
    # The size meter follows the newest records: one the upload measured and the spool encodes again must not
    # count twice (a run whose records grew would see its estimate decay back to the old size).
    records = episodes(100)
    _, ledger = ledger_for(len(records))
    meter = SizeMeter()
    with serving(tmp_path, fail_fraction=1.0, fail_status=502, max_in_flight=1, _sleep=lambda _s: None) as (_s, client):
        sink = TracesSink(client, STAMP, CONTEXT, meter, max_attempts=1, target_batch_bytes=SMALL_BATCH_BYTES)
        sink.write(records, "episode", ledger, threading.Event())
    assert 0 < meter.observed < 100 and ledger.measured == meter.observed  # the first pass stopped at a failure
    groups = ledger.take_undelivered("never-sent")
    ledger.measured = 90  # as if the first pass had encoded 90 before the upload stopped pulling
    before = meter.observed
    files = RecordFiles(str(tmp_path / "spool"))
    try:
        spooled = Spool(files, STAMP, meter).spill(records, "episode", ledger, groups, None)
    finally:
        files.close()
    assert spooled == 100
    # Sent batches are not measured again; of what was never sent, only the 10 the first pass did not reach.
    assert meter.observed == before + 10


def test_a_transient_failure_leaves_only_its_batch_undelivered(tmp_path):
    records = episodes(50)
    accounting, ledger = ledger_for(len(records))
    with serving(tmp_path, fail_count=2, fail_status=502, max_in_flight=1, _sleep=lambda _s: None) as (svc, client):
        sink = sink_for(client, max_attempts=2, target_batch_bytes=SMALL_BATCH_BYTES)
        status = sink.write(records, "episode", ledger, threading.Event())
        ids = stored_ids(svc)
    assert status is SinkStatus.TRANSIENT  # a strike, though the service recovered
    groups = ledger.take_undelivered("never-sent")
    assert [(g.reason, g.batch) for g in groups] == [("transient", True)]
    lost = len(groups[0].indexes)
    assert 0 < lost < 50 and groups[0].indexes == tuple(range(lost))
    # The first batch failed; everything behind it was still uploaded.
    assert sorted(ids, key=lambda i: int(i[1:])) == [f"e{i}" for i in range(lost, 50)]
    assert sink_counts(accounting)["stored"] == 50 - lost
    assert ledger.close("unused") == lost
    assert_identity(accounting, ledger)


def test_a_refused_key_leaves_the_write_undelivered_without_retrying_record_by_record(tmp_path):
    records = episodes(20)
    accounting, ledger = ledger_for(len(records))
    with serving(tmp_path, api_key="the-real-key") as (svc, client):
        sink = sink_for(client, target_batch_bytes=SMALL_BATCH_BYTES)
        status = sink.write(records, "episode", ledger, threading.Event())
        stats = svc.stats()
    assert status is SinkStatus.PERMANENT  # a 401: the sink retires at once, its records kept
    # Kept for a sync with the right key: no record is to blame.
    assert undelivered(ledger) == {("refused:unauthenticated", False): 20}
    assert sink_counts(accounting)["failed"] == {}
    ledger.close("unused")
    assert_identity(accounting, ledger)
    assert stats["upload_attempts"] == 0 and stats["requests"] <= 8  # one window, no bisection


def test_an_upload_too_large_for_the_service_is_halved_until_it_fits(tmp_path):
    records = episodes(100)  # about 250 KB, one batch at the default target
    accounting, ledger = ledger_for(len(records))
    with serving(tmp_path) as (svc, client):
        svc.state.max_uncompressed_bytes = 80_000  # a service with a lower limit than ours
        status = sink_for(client).write(records, "episode", ledger, threading.Event())
        ids = stored_ids(svc)
        rejections = svc.stats()["rejections"]
    assert status is SinkStatus.OK
    assert sorted(ids) == sorted(r["id"] for r in records)
    assert sink_counts(accounting)["failed"] == {}
    assert rejections["upload_too_large"] == 3  # 250 KB -> 125 KB halves -> 62 KB quarters
    assert_identity(accounting, ledger)


def test_a_client_that_cannot_send_leaves_the_write_undelivered_as_a_sink_error(tmp_path):
    records = [trace("t0"), trace("t1", metrics={"x": float("nan")}), trace("t2")]
    accounting, ledger = ledger_for(len(records))
    with serving(tmp_path) as (_svc, client):
        sink = sink_for(client)
        client.close()
        assert sink.write(records, "trace", ledger, threading.Event()) is SinkStatus.TRANSIENT
    # The NaN record is not pulled before the client refuses: it is left with the others.
    assert undelivered(ledger) == {("sink_error:RuntimeError", False): 3}
    ledger.close("unused")
    assert sink_counts(accounting)["failed"] == {"sink_error:RuntimeError": 3}
    assert_identity(accounting, ledger)


def test_cancel_while_the_service_hangs_returns_promptly_and_leaves_the_rest_to_the_ledger(tmp_path):
    records = episodes(30)
    accounting, ledger = ledger_for(len(records))
    cancel = threading.Event()
    with serving(tmp_path, hang_uploads=True, before_upload=cancel.set, abandon_after_s=0.2) as (svc, client):
        sink = sink_for(client, target_batch_bytes=SMALL_BATCH_BYTES)
        started = time.monotonic()
        status = sink.write(records, "episode", ledger, cancel)
        elapsed = time.monotonic() - started
        assert cancel.is_set()
        assert elapsed < 3.0
        # Nothing is known about the abandoned records: they are left, as the batches they went in.
        assert ledger.remaining == 30
        groups = ledger.take_undelivered("never-sent")
        assert {(g.reason, g.batch) for g in groups} == {("deadline", True), ("never-sent", False)}
        assert sum(len(g.indexes) for g in groups) == 30
        assert sink_counts(accounting)["failed"] == {} and sink_counts(accounting)["stored"] == 0
        assert svc.stats()["upload_attempts"] <= client.max_in_flight
        # A write that starts cancelled neither encodes nor sends anything.
        pulled: list[int] = []

        class Counted:
            def to_record(self) -> dict[str, Any]:
                pulled.append(1)
                return trace("late")

        _, late = ledger_for(2)
        assert sink.write([Counted(), Counted()], "trace", late, cancel) is SinkStatus.OK
        assert pulled == [] and late.remaining == 2
    assert status is SinkStatus.OK
    assert ledger.close("deadline") == 30
    assert sink_counts(accounting)["failed"] == {"deadline": 30}
    assert_identity(accounting, ledger)


def test_retries_cut_short_by_cancel_are_left_to_the_ledger(tmp_path):
    records = episodes(10)
    accounting, ledger = ledger_for(len(records))
    cancel = threading.Event()
    # Every upload is refused with Retry-After 30 s; the cancel ends the wait at once.
    with serving(tmp_path, fail_fraction=1.0, fail_retry_after_s=30, before_upload=cancel.set) as (svc, client):
        started = time.monotonic()
        status = sink_for(client).write(records, "episode", ledger, cancel)
        assert time.monotonic() - started < 3.0
        assert svc.stats()["upload_attempts"] == 1
    assert status is SinkStatus.OK
    assert ledger.remaining == 10 and sink_counts(accounting)["failed"] == {}
    ledger.close("deadline")
    assert sink_counts(accounting)["failed"] == {"deadline": 10}


def test_records_are_stamped_on_copies(tmp_path):
    records = episodes(3)
    records[0]["run"] = {"id": "callers-run", "type": "eval", "name": "keep-me"}
    before = copy.deepcopy(records)
    accounting, ledger = ledger_for(3)
    with serving(tmp_path) as (svc, client):
        sink_for(client).write(records, "episode", ledger, threading.Event())
        member = orjson.loads(client.get_raw("e0-t1"))
        with svc.state.store.reader() as conn:
            envelopes = {
                doc["id"]: doc for doc in (orjson.loads(raw) for (raw,) in conn.execute("SELECT raw FROM episode_docs"))
            }
            rows = [tuple(row) for row in conn.execute("SELECT run_id, run_type FROM traces")]
            docs = [orjson.loads(raw) for (raw,) in conn.execute("SELECT raw FROM trace_docs")]
            contexts = {
                json.dumps(json.loads(c), sort_keys=True) for (c,) in conn.execute("SELECT context FROM episodes")
            }
    assert records == before  # the caller's dicts are untouched
    assert envelopes["e0"]["run"] == {"id": "run-77", "type": "eval", "name": "keep-me"}  # its own type is kept
    assert envelopes["e1"]["run"] == {"id": "run-77", "type": "eval"}
    # A member's run without a type of its own gets the sink's.
    assert member["run"] == {"id": "run-77", "type": "train", "name": "mine"}
    assert rows == [("run-77", "train")] * 6
    assert len(docs) == 6
    for doc in docs:
        assert doc["run"] == {"id": "run-77", "type": "train", "name": "mine"}
    assert contexts == {json.dumps(CONTEXT, sort_keys=True)}
    assert_identity(accounting, ledger)


def test_knobs_are_validated():
    client = TracesClient(api_key="k", base_url="http://127.0.0.1:9")
    try:
        with pytest.raises(ValueError, match="max_attempts"):
            TracesSink(client, None, None, max_attempts=0)
        with pytest.raises(ValueError, match="target_batch_bytes"):
            TracesSink(client, None, None, target_batch_bytes=0)
        with pytest.raises(ValueError, match="context"):
            TracesSink(client, None, {"step": 3})  # type: ignore[dict-item]
    finally:
        client.close()


def test_close_closes_only_an_owned_client(tmp_path):
    with serving(tmp_path) as (_svc, client):
        TracesSink(client, None, None).close()
        accounting, ledger = ledger_for(1)
        sink = TracesSink(client, None, None, owns_client=True)
        assert sink.write([trace("t0")], "trace", ledger, threading.Event()) is SinkStatus.OK
        sink.close()
        with pytest.raises(RuntimeError, match="closed"):
            client.upload_lines([b'{"id": "x"}'])


def test_a_write_says_it_is_encoded_once_its_last_record_is_encoded_and_not_before(tmp_path):
    encoded = threading.Event()
    seen: list[bool] = []

    class Logged:
        """A record encoded through its own to_record(): it notes whether the write was said encoded yet."""

        def __init__(self, record: dict[str, Any]) -> None:
            self.record = record

        def to_record(self) -> dict[str, Any]:
            seen.append(encoded.is_set())
            return self.record

    records = [Logged(r) for r in episodes(40)]
    with serving(tmp_path, max_in_flight=2) as (svc, client):
        accounting, ledger = ledger_for(len(records))
        ledger.on_encoded = encoded.set
        # Small batches: the first ones upload while the later records are still being encoded.
        status = sink_for(client, target_batch_bytes=SMALL_BATCH_BYTES).write(
            records, "episode", ledger, threading.Event()
        )
        assert status is SinkStatus.OK
        assert seen == [False] * 40 and encoded.is_set()
        assert sorted(stored_ids(svc)) == sorted(f"e{i}" for i in range(40))
        assert sink_counts(accounting)["stored"] == 40
