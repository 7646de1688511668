"""Refusals are backpressure: the client's in-flight window and refusal waits, against the local service."""

from __future__ import annotations

import threading
import time

import orjson
import pytest
from _wire import trace

from prime_traces import TracesClient, UploadError
from prime_traces._upload.window import MAX_PROBE_PENALTY, OK, OTHER, REFUSED, InFlightWindow
from prime_traces.report import BatchStatus
from prime_traces.server import LocalTracesService

TOKEN = "backpressure-token"
NOW = time.time()


def lines_of(n: int, pad: int = 0) -> list[bytes]:
    timing = {"start": NOW}
    return [orjson.dumps(trace(f"t-{i}", info={"pad": "x" * pad}, timing=timing, calls=[])) for i in range(n)]


def client_for(svc: LocalTracesService, **kwargs) -> TracesClient:
    return TracesClient(api_key=TOKEN, base_url=svc.url, **kwargs)


# --- the window alone -------------------------------------------------------


def warmed(max_in_flight: int) -> InFlightWindow:
    """A window out of slow start: it grew by one per success up to its maximum."""
    window = InFlightWindow(max_in_flight)
    assert window.limit == 1
    for expected in range(2, max_in_flight + 1):
        window.release(window.acquire(), OK)
        assert window.limit == expected
    return window


def test_a_refusal_halves_the_window_once_per_round():
    window = warmed(8)
    tickets = [window.acquire() for _ in range(8)]
    assert window.snapshot()["in_flight"] == 8
    for ticket in tickets:  # eight refusals of one round: one decrease
        window.release(ticket, REFUSED)
    snap = window.snapshot()
    assert (snap["window"], snap["refusals"], snap["window_decreases"], snap["in_flight"]) == (4, 8, 1, 0)
    # A request of the new round refused: halved again, never below 1.
    for expected in (2, 1, 1):
        window.release(window.acquire(), REFUSED)
        assert window.limit == expected


def test_slow_start_ends_at_the_first_refusal():
    window = InFlightWindow(8)
    window.release(window.acquire(), OK)
    window.release(window.acquire(), OK)
    assert window.limit == 3
    window.release(window.acquire(), REFUSED)
    assert window.limit == 1
    window.release(window.acquire(), OK)  # additive now: one success at 1 makes 2
    window.release(window.acquire(), OK)  # two at 2 make 3, the size refused: a probe, slowed
    assert window.limit == 2


def test_a_window_of_successes_grows_it_by_one_up_to_the_maximum():
    window = warmed(4)
    window.release(window.acquire(), REFUSED)  # 4 -> 2
    window.release(window.acquire(), REFUSED)  # 2 -> 1, refused at 2
    assert window.limit == 1
    window.release(window.acquire(), OK)  # one success at 1: probe 2 (the size refused)
    assert window.limit == 2
    window.release(window.acquire(), REFUSED)  # refused again at 2: the next probe waits longer
    assert window.limit == 1
    window.release(window.acquire(), OK)
    assert window.limit == 1
    window.release(window.acquire(), OK)
    assert window.limit == 2
    for _ in range(2):
        window.release(window.acquire(), OK)
    assert window.limit == 3  # past the refused size: growth is plain again
    for _ in range(3):
        window.release(window.acquire(), OK)
    assert window.limit == 4
    for _ in range(100):
        window.release(window.acquire(), OK)
    assert window.limit == 4
    window.release(window.acquire(), OTHER)  # a failure that is not a refusal changes nothing
    assert window.limit == 4 and window.refusals == 3


def test_the_probe_penalty_is_capped():
    window = warmed(2)
    for _ in range(20):
        window.release(window.acquire(), REFUSED)
        while window.limit < 2:
            window.release(window.acquire(), OK)
    assert window._penalty == MAX_PROBE_PENALTY


def test_acquire_waits_for_a_slot_and_gives_up_on_cancel():
    window = warmed(1)
    held = window.acquire()
    cancel = threading.Event()
    got: list[int | None] = []
    waiter = threading.Thread(target=lambda: got.append(window.acquire(cancel)))
    waiter.start()
    cancel.set()
    waiter.join(10)
    assert got == [None] and window.waiting == 0
    waiter = threading.Thread(target=lambda: got.append(window.acquire()))
    waiter.start()
    window.release(held, OK)
    waiter.join(10)
    assert got[1] is not None and window.active == 1


def test_a_reservation_counts_against_the_window():
    window = warmed(2)
    assert window.try_reserve() and window.try_reserve()
    assert not window.try_reserve()
    window.unreserve()
    ticket = window.acquire(reserved=True)
    assert (window.active, window.waiting) == (1, 0) and ticket == 0


# --- the client against the service -----------------------------------------


def test_refusals_spend_no_attempt(tmp_path):
    waits: list[float] = []
    with LocalTracesService(tmp_path / "db", fail_count=12, fail_status=429, fail_retry_after_s=1) as svc:
        with client_for(svc, _sleep=waits.append, max_in_flight=1) as client:
            receipts = client.upload_lines(lines_of(3), max_attempts=2)
            stats = client.upload_stats()
        assert svc.stats()["upload_attempts"] == 13
    assert len(receipts) == 1
    assert len(waits) == 12 and all(1.0 <= w <= 1.5 for w in waits)
    assert stats["refusals"] == 12 and stats["window"] == 1


def test_a_batch_refused_past_max_refused_s_fails(tmp_path):
    with LocalTracesService(tmp_path / "db", fail_fraction=1.0, fail_status=503, fail_retry_after_s=0) as svc:
        with client_for(svc, _sleep=lambda _s: None, max_in_flight=1) as client:
            with pytest.raises(UploadError) as caught:
                client.upload_lines(lines_of(3), max_attempts=2, max_refused_s=0)
    (batch,) = caught.value.report.batches
    assert batch.status is BatchStatus.FAILED and batch.code == "ingest_capacity_exceeded"


def test_cancel_ends_a_refusal_wait(tmp_path):
    cancel = threading.Event()
    with LocalTracesService(
        tmp_path / "db", fail_fraction=1.0, fail_status=429, fail_retry_after_s=30, before_upload=cancel.set
    ) as svc:
        with client_for(svc, max_in_flight=1) as client:
            started = time.monotonic()
            with pytest.raises(UploadError):
                client.upload_lines(lines_of(3), max_refused_s=None, cancel=cancel)
            assert time.monotonic() - started < 10  # not the 30 s Retry-After


def _timed_upload(svc: LocalTracesService, max_in_flight: int, lines: list[bytes]) -> tuple[float, dict]:
    with client_for(svc, max_in_flight=max_in_flight, compression="none") as client:
        started = time.monotonic()
        receipts = client.upload_lines(lines, target_batch_bytes=BATCH_BYTES)
        elapsed = time.monotonic() - started
        stats = client.upload_stats()
    assert len(receipts) == len(lines)
    return elapsed, stats


# One line per batch; the service reads each body at a capped rate while it
# holds its in-flight slot, so concurrency is what sets the pace.
BATCH_BYTES = 300_000
BANDWIDTH_MB_S = 5.0


@pytest.mark.slow
@pytest.mark.parametrize("limit", [1, 2, 4])
def test_a_client_at_eight_against_a_smaller_service_limit_stores_everything(tmp_path, limit):
    lines = lines_of(100 * limit, pad=BATCH_BYTES - 400)
    with LocalTracesService(
        tmp_path / "a.db", store="none", validate="light", max_uploads_in_flight=limit, bandwidth_mb_s=BANDWIDTH_MB_S
    ) as svc:
        at_limit, _ = _timed_upload(svc, limit, lines)
    with LocalTracesService(
        tmp_path / "b.db", store="none", validate="light", max_uploads_in_flight=limit, bandwidth_mb_s=BANDWIDTH_MB_S
    ) as svc:
        at_eight, stats = _timed_upload(svc, 8, lines)
        served = svc.stats()
    assert served["uploads"] == len(lines)
    attempts = served["upload_attempts"] + stats["refusals"]
    assert stats["refusals"] <= 0.10 * attempts, (stats, attempts)
    assert stats["window"] <= limit + 1
    assert at_eight <= 1.3 * at_limit, (at_eight, at_limit, stats)
