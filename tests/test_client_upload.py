"""TracesClient uploads against the local service on loopback."""

from __future__ import annotations

import gzip
import hashlib
import os
import subprocess
import sys
import textwrap
import threading
import time

import orjson
import pytest
from _client_helpers import NOW, TOKEN, client_for, lines_of, producer, stored_trace_ids
from _wire import trace
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prime_traces import APITimeoutError, TracesClient, UploadError
from prime_traces._api.reads import ReadAPI
from prime_traces._lines.encoder import encode_record
from prime_traces._upload.batching import iter_batches
from prime_traces._upload.compress import compress
from prime_traces.report import BatchStatus, LineStatus
from prime_traces.server import LocalTracesService


def test_upload_lines_commits_every_line_and_returns_receipts_in_order(service):
    lines = lines_of(40, pad=2000)
    with client_for(service) as client:
        receipts = client.upload_lines(lines, target_batch_bytes=20_000)
    batches = list(iter_batches(lines, target_batch_bytes=20_000))
    assert len(batches) > 3
    assert [r.upload_id for r in receipts] == [b.key.removeprefix("sha256:") for b in batches]
    assert all(r.status == "committed" for r in receipts)
    assert stored_trace_ids(service) == {f"t-{i}" for i in range(40)}


def test_second_upload_of_the_same_lines_is_all_replays(service):
    lines = lines_of(20, pad=1000)
    with client_for(service) as client:
        first = client.upload_lines(lines, target_batch_bytes=8_000)
        second = client.upload_lines(lines, target_batch_bytes=8_000)
    stats = service.stats()
    assert first == second
    assert stats["uploads"] == len(first)
    assert stats["replays"] == len(first)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    docs=st.lists(
        st.dictionaries(st.text(min_size=1, max_size=5), st.text(max_size=300), max_size=4),
        min_size=1,
        max_size=25,
    ),
    target=st.integers(min_value=50, max_value=3000),
)
def test_same_records_give_same_batches_and_keys(service, docs, target):
    # Prefixed keys never collide with the fields the service validates.
    records = [
        {**{f"x_{k}": v for k, v in doc.items()}, "id": f"h-{i}", "timing": {"start": NOW}}
        for i, doc in enumerate(docs)
    ]
    expected = [
        b.key.removeprefix("sha256:")
        for b in iter_batches([encode_record(r, i) for i, r in enumerate(records)], target_batch_bytes=target)
    ]
    with client_for(service) as client:
        first = client.upload_records(records, target_batch_bytes=target)
        replays = service.stats()["replays"]
        again = client.upload_records([dict(r) for r in records], target_batch_bytes=target)
    assert [r.upload_id for r in first] == expected
    assert [r.upload_id for r in again] == expected
    # The second upload stored nothing: every batch was a replay.
    assert service.stats()["replays"] - replays == len(again)


def test_upload_records_encodes_mappings_objects_and_self_encoding_records(service):
    class ToRecord:
        def to_record(self):
            return trace("obj-1")

    class ToJson:
        def to_json(self):
            return orjson.dumps(trace("json-1"))

    with client_for(service) as client:
        receipts = client.upload_records([trace("map-1"), ToRecord(), ToJson()])
    assert len(receipts) == 1
    assert stored_trace_ids(service) == {"map-1", "obj-1", "json-1"}


def test_upload_records_picks_episode_format_from_the_first_record(service):
    episode = {"id": "ep-1", "traces": [trace("m-1"), trace("m-2")], "env": {"id": "env"}}
    with client_for(service) as client:
        client.upload_records([episode])
    with service.state.store.reader() as conn:
        assert conn.execute("SELECT episode_id FROM episodes").fetchall()[0][0] == "ep-1"
    assert stored_trace_ids(service) == {"m-1", "m-2"}


def warm(client: TracesClient) -> None:
    """Take the client's window out of slow start: it grows by one with each success."""
    client.upload_lines(lines_of(client.max_in_flight, prefix="warm"), target_batch_bytes=1)
    assert client.upload_stats()["window"] == client.max_in_flight


def test_at_least_three_uploads_are_in_flight_at_once(tmp_path):
    barrier = threading.Barrier(3)
    gated = threading.Event()
    with LocalTracesService(tmp_path / "db", before_upload=lambda: gated.is_set() and barrier.wait(timeout=20)) as svc:
        with client_for(svc, max_in_flight=4, compression="gzip") as client:
            warm(client)
            gated.set()
            receipts = client.upload_lines(lines_of(6, pad=900), target_batch_bytes=2_000)
        assert len(receipts) == 6
        assert svc.stats()["max_in_flight"][producer()] >= 3


def test_an_upload_waits_for_a_slot_another_uploads_request_holds(tmp_path):
    """Two threads share one client's window: the one that finds it full waits; it never returns early."""
    held, release = threading.Event(), threading.Event()

    def hold_the_first_request() -> None:
        if not held.is_set():
            held.set()
            release.wait(timeout=20)

    with LocalTracesService(tmp_path / "db", before_upload=hold_the_first_request) as svc:
        with client_for(svc, max_in_flight=1, compression="gzip") as client:
            found_full = threading.Event()
            try_reserve = client._window.try_reserve

            def watched_try_reserve() -> bool:
                reserved = try_reserve()
                if not reserved and threading.current_thread().name == "second":
                    found_full.set()
                return reserved

            client._window.try_reserve = watched_try_reserve
            receipts: dict[str, list] = {}

            def upload(prefix: str) -> None:
                receipts[prefix] = client.upload_lines(lines_of(5, prefix=prefix), target_batch_bytes=1)

            first = threading.Thread(target=upload, args=("a",), name="first")
            first.start()
            assert held.wait(timeout=20)  # the first upload's request holds the only slot
            second = threading.Thread(target=upload, args=("b",), name="second")
            second.start()
            assert found_full.wait(timeout=20)
            release.set()
            first.join(timeout=30)
            second.join(timeout=30)
            assert not first.is_alive() and not second.is_alive()
        assert [len(receipts["a"]), len(receipts["b"])] == [5, 5]
        assert stored_trace_ids(svc) == {f"{p}-{i}" for p in "ab" for i in range(5)}


class Interrupted(BaseException):
    """As a KeyboardInterrupt raised inside the caller's line generator."""


@pytest.mark.parametrize("after", [0, 2])
def test_an_interrupt_in_the_lines_gives_the_slot_back(tmp_path, after):
    """Raised before any batch went (no slot reserved), or with one in flight (a slot reserved for the next).

    A batch closes when the line after it arrives: two lines send the first batch.
    """
    armed, arrived = threading.Event(), threading.Event()

    def lines():
        yield from lines_of(after, prefix="first")
        raise Interrupted

    with LocalTracesService(tmp_path / "db", before_upload=lambda: armed.is_set() and arrived.set()) as svc:
        with client_for(svc, max_in_flight=2, compression="gzip") as client:
            warm(client)
            armed.set()
            with pytest.raises(Interrupted):
                client.upload_lines(lines(), target_batch_bytes=1)
            if after:
                assert arrived.wait(timeout=20)  # the first batch holds its slot: its reservation is spent
            assert client._window.waiting == 0
            assert len(client.upload_lines(lines_of(3, prefix="after"), target_batch_bytes=1)) == 3


def test_an_upload_whose_lines_all_went_returns_while_another_holds_every_slot(service):
    """Its batch committed, it learns that no line is left without waiting for a slot.

    Before, it learnt so only once it had a slot: it waited here, unless it took
    the freed slot before another upload did (about 1 run in 10 at a 1 µs switch
    interval, never in 20 at the default).
    """
    with client_for(service, max_in_flight=1, compression="gzip") as client:

        def take_the_freed_slot(batch, _receipt) -> None:
            # Runs on the uploading thread once its batch committed and gave its slot back:
            # another upload of the client takes that slot, the only one, and keeps it.
            assert client._window.try_reserve()

        done: dict[str, list] = {}
        upload = threading.Thread(
            target=lambda: done.setdefault(
                "receipts", client.upload_lines(lines_of(1), target_batch_bytes=1, on_batch=take_the_freed_slot)
            )
        )
        upload.start()
        upload.join(timeout=20)
        returned_while_held = not upload.is_alive()
        client._window.unreserve()
        upload.join(timeout=20)
        assert returned_while_held
        assert len(done["receipts"]) == 1


def test_the_service_never_sees_more_than_max_in_flight(tmp_path):
    # Uploads pass the gate in pairs, so two are open at once whatever the load on the
    # machine; a third one sent early would be counted by the service.
    gate = threading.Barrier(2)
    gated = threading.Event()
    with LocalTracesService(
        tmp_path / "db", latency_ms=30, before_upload=lambda: gated.is_set() and gate.wait(timeout=20)
    ) as svc:
        with client_for(svc, max_in_flight=2, compression="gzip") as client:
            warm(client)
            gated.set()
            client.upload_lines(lines_of(12, pad=900), target_batch_bytes=2_000)
        stats = svc.stats()
    assert stats["uploads"] == 12 + 2
    assert stats["max_in_flight"][producer()] == 2


def test_receipts_and_on_batch_come_in_batch_order_when_later_batches_finish_first(tmp_path, monkeypatch):
    import prime_traces.server._upload as upload_route

    lines = lines_of(8, pad=900)
    batches = list(iter_batches(lines, target_batch_bytes=2_000))
    first_key = batches[0].key
    keys = {b.key for b in batches}
    others_committed = threading.Event()
    committed: list[str] = []
    lock = threading.Lock()
    original = upload_route._process

    def process(req, body, digest, raw_format):
        response = original(req, body, digest, raw_format)
        if f"sha256:{digest}" not in keys:  # the warm-up
            return response
        with lock:
            committed.append(f"sha256:{digest}")
            if len(committed) == len(batches) - 1:
                others_committed.set()
        return response

    def on_upload(key: str) -> None:
        # Batch 0 is held until every later batch is committed, so it commits last.
        if key == first_key:
            assert others_committed.wait(timeout=20)

    monkeypatch.setattr(upload_route, "_process", process)
    calls = []
    with LocalTracesService(tmp_path / "db", on_upload=on_upload) as svc:
        with client_for(svc, max_in_flight=8, compression="gzip") as client:
            warm(client)
            receipts = client.upload_lines(
                lines,
                target_batch_bytes=2_000,
                on_batch=lambda b, r: calls.append((b.index, r.upload_id, threading.current_thread())),
            )
    assert [c[0] for c in calls] == list(range(len(batches)))
    assert [c[1] for c in calls] == [r.upload_id for r in receipts]
    assert {c[2] for c in calls} == {threading.current_thread()}
    assert committed[-1] == first_key and len(committed) == len(batches)


@pytest.mark.parametrize("max_in_flight", [1, 4])
def test_fail_stop_reports_every_line_as_the_service_stored_it(tmp_path, max_in_flight):
    lines = lines_of(16, pad=900)
    lines[9] = orjson.dumps(trace("t-9", info={"pad": "POISON"}))
    with LocalTracesService(tmp_path / "db", reject_marker="POISON") as svc:
        with client_for(svc, max_in_flight=max_in_flight) as client:
            with pytest.raises(UploadError) as caught:
                client.upload_lines(lines, target_batch_bytes=2_000)
        stored = stored_trace_ids(svc)
        attempts = svc.stats()["upload_attempts"]
    report = caught.value.report
    rejected = next(b for b in report.batches if b.status is BatchStatus.REJECTED)
    assert rejected.rejected_line == 9
    assert rejected.code == "invalid_trace"
    assert report.status_of(9) is LineStatus.REJECTED
    for index in range(16):
        status = report.status_of(index)
        assert (status is LineStatus.COMMITTED) == (f"t-{index}" in stored), (index, status)
    sent = sum(len(b.line_indexes) for b in report.batches)
    if max_in_flight == 1:
        # Nothing starts after the failure is seen.
        assert attempts == rejected.index + 1
        assert report.unsent_from_line == rejected.line_indexes[-1] + 1
        assert report.status_of(15) is LineStatus.UNSENT
    assert attempts == len(report.batches)
    assert sent + (16 - report.unsent_from_line if report.unsent_from_line is not None else 0) == 16


def test_retry_after_is_honoured_with_the_same_bytes_and_key(tmp_path):
    waits: list[float] = []
    keys: list[str] = []
    (batch,) = iter_batches(lines_of(3))
    with LocalTracesService(
        tmp_path / "db", fail_count=2, fail_status=429, fail_retry_after_s=7, on_upload=keys.append
    ) as svc:
        with client_for(svc, _sleep=waits.append) as client:
            receipts = client.upload_lines(lines_of(3))
        stats = svc.stats()
    # Every attempt carried the same key; the service checked the committed one against its bytes.
    assert keys == [batch.key] * 3
    assert receipts[0].upload_id == batch.key.removeprefix("sha256:")
    # A refusal's Retry-After is honoured, with up to +50 % of jitter.
    assert len(waits) == 2 and all(7.0 <= w <= 10.5 for w in waits), waits
    assert len(receipts) == 1
    assert stats["uploads"] == 1
    assert stats["upload_attempts"] == 3
    assert stats["rejections"]["rate_limited"] == 2


def test_a_502_storm_past_max_attempts_fails_the_batch_transiently(tmp_path):
    waits: list[float] = []
    with LocalTracesService(tmp_path / "db", fail_fraction=1.0, fail_status=502, fail_retry_after_s=None) as svc:
        with client_for(svc, _sleep=waits.append) as client:
            with pytest.raises(UploadError) as caught:
                client.upload_lines(lines_of(3), max_attempts=3)
        assert svc.stats()["upload_attempts"] == 3
    assert len(waits) == 2
    assert all(0.5 <= w <= 1.5 * 4 for w in waits)
    (batch,) = caught.value.report.batches
    assert batch.status is BatchStatus.FAILED
    assert caught.value.report.status_of(0) is LineStatus.FAILED


def test_a_connection_dropped_after_the_body_is_retried_and_stored_once(tmp_path):
    with LocalTracesService(tmp_path / "db", drop_after_body=1, drop_after_commit=True) as svc:
        with client_for(svc, _sleep=lambda s: None) as client:
            receipts = client.upload_lines(lines_of(5))
        stats = svc.stats()
    assert len(receipts) == 1
    assert stats["uploads"] == 1
    assert stats["replays"] == 1


def test_cancel_stops_new_requests_and_reports_what_committed(tmp_path):
    cancel = threading.Event()
    lines = lines_of(10, pad=900)
    batches = list(iter_batches(lines, target_batch_bytes=2_000))

    def on_upload(key: str) -> None:
        if key == batches[1].key:
            cancel.set()
            svc.state.stopping.wait(10)

    with LocalTracesService(tmp_path / "db", on_upload=on_upload) as svc:
        with client_for(svc, max_in_flight=1, abandon_after_s=0.2) as client:
            started = time.monotonic()
            with pytest.raises(UploadError) as caught:
                client.upload_lines(lines, target_batch_bytes=2_000, cancel=cancel)
            elapsed = time.monotonic() - started
    report = caught.value.report
    assert [b.status for b in report.batches] == [BatchStatus.COMMITTED, BatchStatus.ABANDONED]
    assert report.status_of(0) is LineStatus.COMMITTED
    assert report.status_of(1) is LineStatus.ABANDONED
    assert report.status_of(2) is LineStatus.UNSENT
    assert elapsed < 5


def test_stop_sends_no_new_batch_abandons_the_one_in_flight_with_its_key_and_fails_nothing(tmp_path):
    stop = threading.Event()
    lines = lines_of(10, pad=900)
    batches = list(iter_batches(lines, target_batch_bytes=2_000))
    released = threading.Event()

    def on_upload(key: str) -> None:
        if key == batches[1].key:
            stop.set()  # the uploads fell behind while this batch was on the wire
            released.wait(10)

    with LocalTracesService(tmp_path / "db", on_upload=on_upload) as svc:
        with client_for(svc, max_in_flight=1, abandon_after_s=0.2, compression="none") as client:
            with pytest.raises(UploadError, match="stopped at the caller's request") as caught:
                client.upload_lines(lines, target_batch_bytes=2_000, stop=stop, learn_coding=False)
            released.set()
            report = caught.value.report
            assert report.stopped
            assert [b.status for b in report.batches] == [BatchStatus.COMMITTED, BatchStatus.ABANDONED]
            assert report.batches[1].key == batches[1].key  # sent again as these bytes, it replays
            assert [report.status_of(i) for i in range(3)] == [
                LineStatus.COMMITTED,
                LineStatus.ABANDONED,
                LineStatus.UNSENT,
            ]
            assert report.unsent_from_line == batches[2].line_indexes[0]
            stop.clear()
            rest = lines[batches[1].line_indexes[0] :]
            resumed = client.upload_lines(rest, target_batch_bytes=2_000, learn_coding=False)
        assert len(resumed) == len(batches) - 1
        with svc.state.store.reader() as conn:
            rows = conn.execute("SELECT trace_id, COUNT(*) FROM traces GROUP BY trace_id").fetchall()
        assert dict(rows) == {orjson.loads(line)["id"]: 1 for line in lines}  # the abandoned batch stored once


def test_bad_records_get_clear_errors_naming_the_record(service):
    class BadToRecord:
        def to_record(self):
            return ["not", "a", "mapping"]

    with client_for(service) as client:
        with pytest.raises(ValueError, match="record 1"):
            client.upload_records([trace("ok"), {"id": "nan", "x": float("nan")}])
        with pytest.raises(TypeError, match=r"record 2.*set"):
            client.upload_records([trace("a"), trace("b"), {"id": "s", "x": {1, 2}}])
        with pytest.raises(TypeError, match="record 0"):
            client.upload_records([BadToRecord()])
    assert service.stats()["upload_attempts"] == 0


@pytest.mark.slow
def test_a_line_over_64_mib_is_refused_before_any_request(service):
    from prime_traces import TraceTooLargeError

    big = b'{"id": "big", "pad": "' + b"x" * (65 * 1024 * 1024) + b'"}'
    with client_for(service) as client:
        with pytest.raises(TraceTooLargeError, match="line 1"):
            client.upload_lines([big])
    assert service.stats()["upload_attempts"] == 0


def test_numpy_arrays_encode_like_lists(service):
    np = pytest.importorskip("numpy")
    with client_for(service) as client:
        client.upload_records([trace("np", info={"a": np.arange(3), "f": np.float32(0.5)})])
    with service.state.store.reader() as conn:
        (raw,) = conn.execute("SELECT raw FROM trace_docs").fetchone()
    assert orjson.loads(raw)["info"] == {"a": [0, 1, 2], "f": 0.5}


def test_wire_format_is_the_contracts(tmp_path):
    """Capture one upload as the service received it and check it against §2."""
    captured = {}

    import prime_traces.server._upload as upload_route

    original = upload_route._process

    def capture(req, wire, digest, raw_format):
        # The service frees the body as it decodes it: keep a copy.
        captured.update(headers=dict(req.headers), body=bytes(wire[0]), digest=digest, fmt=raw_format)
        return original(req, wire, digest, raw_format)

    upload_route._process = capture
    try:
        with LocalTracesService(tmp_path / "db") as svc:
            with client_for(svc, compression="gzip") as client:
                client.upload_lines(lines_of(3), line_format="trace", context={"k": "v"})
    finally:
        upload_route._process = original
    headers, body = captured["headers"], captured["body"]
    assert headers["User-Agent"].startswith("prime-traces/0.0.10 python/")
    assert headers["Authorization"] == f"Bearer {TOKEN}"
    assert "X-Prime-Line-Format" not in headers
    assert headers["Content-Length"] == str(len(body))
    assert "Transfer-Encoding" not in headers
    boundary = headers["Content-Type"].split("boundary=")[1].encode()
    parts = body.split(b"--" + boundary)
    meta_head, meta_body = parts[1].split(b"\r\n\r\n", 1)
    assert b'name="metadata"' in meta_head and b"Content-Type: application/json" in meta_head
    assert orjson.loads(meta_body) == {"schema_version": 1, "context": {"k": "v"}}
    traces_head, traces_body = parts[2].split(b"\r\n\r\n", 1)
    assert b'name="traces"; filename="traces.jsonl"' in traces_head
    assert b"Content-Type: application/x-ndjson" in traces_head
    assert b"Content-Encoding: gzip" in traces_head
    payload = traces_body[: -len(b"\r\n")]
    assert payload[3] == 0 and payload[4:8] == b"\0\0\0\0"  # no flags, mtime 0
    raw = gzip.decompress(payload)
    assert raw == b"".join(line + b"\n" for line in lines_of(3))
    assert headers["Idempotency-Key"] == "sha256:" + hashlib.sha256(raw).hexdigest()
    assert payload == compress(raw, "gzip")


def test_a_process_whose_uploads_hang_exits_promptly_when_main_returns(tmp_path):
    with LocalTracesService(tmp_path / "db", hang_uploads=True) as svc:
        script = textwrap.dedent(
            f"""
            import threading, orjson, requests, sys
            from prime_traces import TracesClient
            client = TracesClient(api_key="k", base_url={svc.url!r})
            line = orjson.dumps({{"id": "x", "timing": {{"start": 1.7e9}}}})
            threading.Thread(target=client.upload_lines, args=([line],), daemon=True).start()
            while not requests.get({svc.url!r} + "/api/v1/_stats",
                                   headers={{"Authorization": "Bearer k"}}).json().get("upload_attempts"):
                threading.Event().wait(0.01)
            print("main returns", flush=True)
            """
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", script],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": os.getcwd()},
        )
        try:
            assert proc.stdout.readline().strip() == "main returns"
            started = time.monotonic()
            assert proc.wait(timeout=10) == 0
            assert time.monotonic() - started < 2.0
        finally:
            proc.kill()


# -- what the README promises of the uploader, end to end ----------------------------


def test_upload_file_streams_a_file_in_the_batches_of_its_lines_and_a_second_run_replays(service, tmp_path):
    lines = lines_of(12, pad=900, prefix="f")
    path = tmp_path / "traces.jsonl"
    # A blank line is skipped, and the last line may lack its newline.
    path.write_bytes(b"\n".join(lines[:6]) + b"\n\n" + b"\n".join(lines[6:]))
    keys = [b.key.removeprefix("sha256:") for b in iter_batches(lines, target_batch_bytes=4_000)]
    with client_for(service) as client:
        receipts = client.upload_file(path, target_batch_bytes=4_000, context={"source": "file"})
        again = client.upload_file(str(path), target_batch_bytes=4_000, context={"source": "file"})
        tagged = {t.trace_id for t in client.iter(context={"source": "file"})}
    assert len(keys) > 3
    assert [r.upload_id for r in receipts] == keys
    assert [r.upload_id for r in again] == keys
    assert stored_trace_ids(service) == tagged == {f"f-{i}" for i in range(12)}
    assert service.stats()["uploads"] == len(keys) and service.stats()["replays"] == len(keys)


def test_the_client_gives_up_on_a_silent_service_within_its_timeout(service):
    service.faults.latency_ms = 60_000  # every answer a minute late (cut short when the service stops)
    waits: list[float] = []
    with client_for(service, timeout_s=0.5) as client:
        started = time.monotonic()
        with pytest.raises(UploadError) as caught:
            client.upload_lines(lines_of(1), max_attempts=1)
        upload_s = time.monotonic() - started
        # The client's reads, on its own transport; the waits between attempts are recorded, not slept.
        reads = ReadAPI(client._transport, sleep=waits.append)
        started = time.monotonic()
        with pytest.raises(APITimeoutError, match=r"no answer within 0\.5 s"):
            reads.list()
        read_s = time.monotonic() - started
    assert isinstance(caught.value.error, APITimeoutError)
    assert caught.value.report.status_of(0) is LineStatus.FAILED
    assert 0.5 <= upload_s < 0.5 + 1.0, upload_s  # the timeout, not the minute; slack for a loaded machine
    assert len(waits) == 2  # three attempts, each ending at the timeout
    assert 3 * 0.5 <= read_s < 3 * 0.5 + 1.0, read_s


def test_an_on_batch_that_raises_stops_the_upload_and_is_reported_with_every_line(service):
    lines = lines_of(8, pad=900)
    keys = [b.key.removeprefix("sha256:") for b in iter_batches(lines, target_batch_bytes=2_000)]
    calls: list[int] = []

    def on_batch(batch, receipt) -> None:
        calls.append(batch.index)
        if batch.index == 2:
            raise RuntimeError("bookkeeping failed")

    with client_for(service, max_in_flight=1) as client:
        with pytest.raises(UploadError, match="bookkeeping failed") as caught:
            client.upload_lines(lines, target_batch_bytes=2_000, on_batch=on_batch)
        stored = stored_trace_ids(service)
        rerun = client.upload_lines(lines, target_batch_bytes=2_000)  # re-running sends what is missing
    error = caught.value
    assert isinstance(error.error, RuntimeError) and error.__cause__ is error.error
    assert calls == [0, 1, 2]  # never called again once it raised
    # Fail-stop: no batch starts after the failure; the one in flight, if any, ends and is reported.
    statuses = [error.report.status_of(i) for i in range(8)]
    assert statuses[:3] == [LineStatus.COMMITTED] * 3
    assert set(statuses[3:]) <= {LineStatus.COMMITTED, LineStatus.UNSENT}
    committed = [i for i, s in enumerate(statuses) if s is LineStatus.COMMITTED]
    assert committed == list(range(len(committed)))  # in order, no gap
    assert stored == {f"t-{i}" for i in committed}  # what the report says is stored, and nothing else
    assert [r.upload_id for r in error.receipts] == keys[: len(committed)]
    assert [r.upload_id for r in rerun] == keys
    assert stored_trace_ids(service) == {f"t-{i}" for i in range(8)}
    assert service.stats()["replays"] == len(committed)
