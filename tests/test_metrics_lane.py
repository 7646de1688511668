"""The metrics lane at close(): what a send still in flight holds is on disk by the deadline, counted once."""

from __future__ import annotations

import glob
import threading
import time
from typing import Any

import orjson

from prime_runs._history.lane import MetricsLane
from prime_runs._local.segment_reader import iter_entry_lines, scan
from prime_runs._local.spool import RecordFiles


def rows_on_disk(directory: str) -> list[dict[str, Any]]:
    rows = []
    for path in sorted(glob.glob(f"{directory}/metrics-*")):
        for _entry, lines in iter_entry_lines(path, scan(path).entries):
            rows.extend(orjson.loads(line) for line in lines)
    return rows


class HeldSend:
    """A service that takes a batch only when told to: ``started`` once a send began, ``release`` ends it."""

    def __init__(self, *, fail: bool) -> None:
        self.fail = fail
        self.started = threading.Event()
        self.release = threading.Event()
        self.sent: list[list[dict[str, Any]]] = []
        self.done = threading.Event()

    def __call__(self, rows: list[dict[str, Any]], timeout_s: float | None) -> None:
        self.started.set()
        self.release.wait(30)
        try:
            if self.fail:
                raise ConnectionError("the service is gone")
            self.sent.append(rows)
        finally:
            self.done.set()


def add_rows(lane: MetricsLane, steps: range) -> None:
    for step in steps:
        lane.add({"step": step, "time": 0.0, "metrics": {"reward": step}})


def lane_over(tmp_path, send: HeldSend) -> tuple[MetricsLane, RecordFiles]:
    files = RecordFiles(str(tmp_path))
    return MetricsLane(send=send, writer=lambda: files.writer("metrics"), flush_interval_s=0.01), files


def test_a_send_in_flight_at_the_deadline_is_written_to_disk_and_counted_once(tmp_path):
    send = HeldSend(fail=True)
    lane, files = lane_over(tmp_path, send)
    add_rows(lane, range(50))
    assert send.started.wait(10)
    lane.close(time.monotonic() + 0.05)  # the send outlives the deadline
    counts = lane.stats()
    assert (counts["queued"], counts["spooled"], counts["stored"], counts["failed"]) == (0, 50, 0, 0)
    send.release.set()
    assert send.done.wait(10)
    lane._thread.join(10)  # the thread ends without counting the batch again or writing it twice
    assert not lane._thread.is_alive()
    assert lane.stats()["spooled"] == 50 and lane.stats()["queued"] == 0
    files.close()
    assert [row["step"] for row in rows_on_disk(str(tmp_path))] == list(range(50))


def test_a_send_that_lands_after_the_deadline_is_a_replay_the_sync_may_repeat(tmp_path):
    send = HeldSend(fail=False)
    lane, files = lane_over(tmp_path, send)
    add_rows(lane, range(3))
    assert send.started.wait(10)
    lane.close(time.monotonic() + 0.05)
    send.release.set()
    lane._thread.join(10)
    assert [[row["step"] for row in batch] for batch in send.sent] == [[0, 1, 2]]
    assert (lane.stats()["spooled"], lane.stats()["stored"], lane.stats()["queued"]) == (3, 0, 0)
    files.close()
    assert [row["step"] for row in rows_on_disk(str(tmp_path))] == [0, 1, 2]


def test_rows_logged_while_a_send_is_in_flight_go_to_disk_after_it(tmp_path):
    send = HeldSend(fail=True)
    lane, files = lane_over(tmp_path, send)
    add_rows(lane, range(1))
    assert send.started.wait(10)
    add_rows(lane, range(1, 5))
    lane.close(time.monotonic() + 0.05)
    assert (lane.stats()["spooled"], lane.stats()["queued"]) == (5, 0)
    send.release.set()
    lane._thread.join(10)
    files.close()
    assert [row["step"] for row in rows_on_disk(str(tmp_path))] == [0, 1, 2, 3, 4]


def test_offline_close_waits_for_the_batch_the_thread_is_writing(tmp_path):
    files = RecordFiles(str(tmp_path))
    lane = MetricsLane(send=None, writer=lambda: files.writer("metrics"), flush_interval_s=0.01)
    add_rows(lane, range(20))
    lane.close(time.monotonic())  # the deadline has passed already: what is on the way to disk still lands
    assert (lane.stats()["stored"], lane.stats()["queued"]) == (20, 0)
    files.close()
    assert [row["step"] for row in rows_on_disk(str(tmp_path))] == list(range(20))
