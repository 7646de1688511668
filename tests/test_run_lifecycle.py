"""``Run`` lifecycle, errors, asyncio and fork, end to end over real HTTP to the local service."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
import sys
import threading
import time
from typing import Any

import pytest
from _fork import in_child
from _run_helpers import (  # noqa: F401  (fixtures are used by name)
    ENV_NAMES,
    FLUSH_TIMEOUT_S,
    GATE_TIMEOUT_S,
    KEY,
    MARKER,
    REPO,
    Gate,
    assert_buckets,
    episodes,
    gate,
    get_run,
    identity_holds,
    isolated,
    list_runs,
    online,
    sink_counts,
    stored_episodes,
)
from _sync import NotedWaitEvent

import prime_runs
from prime_runs import Run
from prime_traces.platform import PlatformClient
from prime_traces.server import LocalTracesService

pytestmark = pytest.mark.timeout(60)

# What a finish() bound allows for scheduling: a deadline stretched by 40 % would not fit (see test_run.py).
FINISH_MARGIN_S = 0.25


# -- lifecycle -------------------------------------------------------------------------


class _TricklingServer:
    """Answers one request with headers, then a body byte every 0.1 s (for 10 s, or until stopped).

    Each byte comes well inside a socket read timeout, so only a deadline on the
    whole answer ends the wait.
    """

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.received = threading.Event()
        self.request = b""
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="trickle", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn, self.listener, contextlib.suppress(OSError):  # the client may give up and close
            while b"\r\n\r\n" not in self.request:
                self.request += conn.recv(65536)
            self.received.set()
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
            ends = time.monotonic() + 10  # a client without a deadline gets its answer after 10 s
            while not self.stop.wait(0.1) and time.monotonic() < ends:
                conn.sendall(b" ")


def test_a_stalled_update_does_not_keep_the_status_from_being_recorded(service):
    run = online(service)
    stalled, release = threading.Event(), threading.Event()

    def update(run_id, config, summary, deadline_s):  # the periodic update: its answer never comes
        stalled.set()
        release.wait(GATE_TIMEOUT_S)
        raise TimeoutError("no answer")

    run._updates.runs.send_changes = update
    run.log({"loss": 0.5})
    ticker = threading.Thread(target=run.send_updates)
    ticker.start()
    try:
        assert stalled.wait(GATE_TIMEOUT_S)
        started = time.monotonic()
        run.finish(timeout_s=2.0)
        elapsed = time.monotonic() - started
    finally:
        release.set()
        ticker.join(GATE_TIMEOUT_S)
    # The status waits for the stalled update half the time left, then goes alone and is answered at once.
    assert 1.0 <= elapsed < 1.0 + FINISH_MARGIN_S, elapsed
    assert get_run(service, run.id)["status"] == "completed"


def test_finish_returns_on_time_when_the_service_trickles_its_answer(service):
    run = online(service)
    assert run.log_episodes(episodes("e", 2)) and run.flush(FLUSH_TIMEOUT_S)
    trickle = _TricklingServer()
    run._updates.runs.client = PlatformClient(KEY, trickle.url)  # only the status requests go there
    try:
        started = time.monotonic()
        run.finish(timeout_s=2.0)
        elapsed = time.monotonic() - started
        assert trickle.received.wait(GATE_TIMEOUT_S)
    finally:
        trickle.stop.set()
        trickle.thread.join(GATE_TIMEOUT_S)
        run._updates.runs.client.close()
    # The status request is given the time left, for its whole answer: it gives up at the deadline
    # (a read timeout alone would wait for the whole 10 s trickle).
    assert 2.0 <= elapsed < 2.0 + FINISH_MARGIN_S, elapsed
    assert trickle.request.startswith(f"PUT /api/v1/evaluations/{run.id} ".encode())
    assert run.status == "completed"
    assert_buckets(run, submitted=2, stored=2)


def test_log_and_update_config_reach_the_run_at_finish(service):
    run = online(service, config={"lr": 1, "seed": 0})
    run.log({"loss": 1.0, "acc": 0.1}, step=1)
    run.log({"loss": 0.5}, step=2)
    run.update_config({"lr": 2})
    run.update_config({"batch": 8})
    run.finish({"final": True}, timeout_s=FLUSH_TIMEOUT_S)
    remote = get_run(service, run.id)
    counts = {f"_records/{k}": 0 for k in ("logged", "stored", "dropped", "failed", "spooled")}
    written = {"prime_runs": {"traces_episodes_written": 0}}  # what Prime Traces holds of an evaluation
    assert remote["summary"] == {"loss": 0.5, "acc": 0.1, "step": 2, "final": True, **counts, **written}
    assert remote["config"] == {"lr": 2, "seed": 0, "batch": 8}
    assert remote["status"] == "completed"
    assert remote["error"] is None and remote["finished_at"] is not None
    assert run.status == "completed"


def test_fail_records_failed_with_the_error(service):
    run = online(service)
    run.fail(ValueError("reward model diverged"), timeout_s=FLUSH_TIMEOUT_S)
    remote = get_run(service, run.id)
    assert remote["status"] == "failed"
    assert "reward model diverged" in remote["error"]
    assert run.status == "failed"


@pytest.mark.parametrize(
    ("exc", "status", "error"),
    [
        (None, "completed", None),
        (RuntimeError("bad step"), "failed", "RuntimeError: bad step"),
        (KeyboardInterrupt(), "cancelled", "interrupted"),
    ],
    ids=["clean", "exception", "keyboard-interrupt"],
)
def test_the_context_manager_finishes_by_how_the_block_ended(service, exc, status, error):
    run = online(service)
    expected = pytest.raises(type(exc)) if exc is not None else contextlib.nullcontext()
    with expected, run:
        run.log_episodes(episodes("e", 2))
        if exc is not None:
            raise exc
    remote = get_run(service, run.id)
    assert (remote["status"], remote["error"]) == (status, error)
    assert remote["episode_count"] == 2
    assert run.status == status
    assert_buckets(run, submitted=2, stored=2)


@pytest.mark.parametrize(("code", "status"), [(0, "completed"), (None, "completed"), (3, "failed")])
def test_sys_exit_in_the_context_manager_finishes_by_its_code(service, code, status):
    run = online(service)
    with pytest.raises(SystemExit), run:
        sys.exit(code)
    assert get_run(service, run.id)["status"] == status


def test_the_blocks_exception_is_not_replaced_by_a_sink_error(service):
    service.faults.reject_marker = MARKER
    run = online(service, on_error="raise")
    with pytest.raises(RuntimeError, match="training blew up"), run:
        run.log_episodes(episodes("e", 2, poisoned=(0,)))
        raise RuntimeError("training blew up")
    assert get_run(service, run.id)["status"] == "failed"
    assert_buckets(run, submitted=2, stored=1, failed={"rejected:invalid_trace": 1})


def test_finish_twice_is_a_no_op(service, caplog):
    run = online(service)
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    finished_at = get_run(service, run.id)["finished_at"]
    requests_before = service.stats()["requests"]
    with caplog.at_level(logging.WARNING, logger="prime_runs"):
        run.finish(status="failed", error="late", timeout_s=FLUSH_TIMEOUT_S)
        run.fail("later")
    assert service.stats()["requests"] == requests_before  # nothing sent
    assert run.status == "completed"
    remote = get_run(service, run.id)
    assert (remote["status"], remote["error"], remote["finished_at"]) == ("completed", None, finished_at)
    assert [r for r in caplog.records if r.name != "prime_runs.console"] == []
    assert run.log_episodes(episodes("late", 2)) is False  # refused after finish, never raised
    assert_buckets(run, submitted=2, stored=0, dropped={"closed": 2})


def test_a_second_run_in_the_same_process_is_a_new_run(service):
    first = online(service, "sweep-1", config={"lr": 1})
    first.finish(timeout_s=FLUSH_TIMEOUT_S)
    second = online(service, "sweep-2", config={"lr": 2})
    assert second.log_episodes(episodes("e", 2))
    second.finish(status="failed", error="diverged", timeout_s=FLUSH_TIMEOUT_S)
    assert second.id != first.id
    assert sorted(list_runs(service)) == sorted([first.id, second.id])
    remote = get_run(service, second.id)
    assert (remote["name"], remote["config"], remote["status"]) == ("sweep-2", {"lr": 2}, "failed")
    assert get_run(service, first.id)["episode_count"] == 0


def test_finish_from_two_threads_records_one_status(service, gate, caplog):
    run = online(service)
    # Only a finish() that lost the race for the finish lock waits on this event.
    run._finisher.finished = NotedWaitEvent()
    assert run.log_episodes(episodes("e", 5))
    assert gate.entered.wait(GATE_TIMEOUT_S)  # the first finish will wait in flush
    done = {s: threading.Event() for s in ("completed", "failed")}
    errors: list[BaseException] = []

    def finish(status: str) -> None:
        try:
            run.finish(status=status, timeout_s=GATE_TIMEOUT_S)
        except BaseException as err:  # noqa: BLE001
            errors.append(err)
        finally:
            done[status].set()

    threads = [threading.Thread(target=finish, args=(s,)) for s in done]
    with caplog.at_level(logging.WARNING, logger="prime_runs"):
        for t in threads:
            t.start()
        assert run._finisher.finished.waiting.wait(GATE_TIMEOUT_S)
        # Neither returns while the first is still flushing: the second waits for it.
        assert not any(d.is_set() for d in done.values())
        gate.open()
        for t in threads:
            t.join(GATE_TIMEOUT_S)
    assert all(d.is_set() for d in done.values()) and errors == []
    remote = get_run(service, run.id)
    assert remote["status"] == run.status
    assert run.status in ("completed", "failed")
    # No second status sent (it would be a 409).
    assert [r.getMessage() for r in caplog.records if r.name != "prime_runs.console"] == []
    assert remote["episode_count"] == 5
    assert_buckets(run, submitted=5, stored=5)


def _wait_for_summary(svc: LocalTracesService, run_id: str, timeout_s: float = 2.0) -> dict[str, Any]:
    """The run's summary on the service once it is not empty, or ``{}`` after ``timeout_s``.

    The updates are sent by a timer, so this waits on the service (bounded), not on a thread.
    """
    deadline = time.monotonic() + timeout_s
    pause = threading.Event()
    while True:
        summary = get_run(svc, run_id)["summary"]
        if summary or time.monotonic() > deadline:
            return summary
        pause.wait(0.02)


@pytest.fixture
def quick_updates(monkeypatch) -> None:
    monkeypatch.setattr("prime_runs._start.init.UPDATE_INTERVAL_S", 0.05)


def test_metrics_are_sent_on_a_timer_while_the_run_goes_on(service, quick_updates):
    run = online(service)
    assert run.log_episodes(episodes("e", 1))
    run.log({"loss": 0.25}, step=7)
    assert _wait_for_summary(service, run.id) == {"loss": 0.25, "step": 7}
    assert get_run(service, run.id)["status"] == "running"
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    assert_buckets(run, submitted=1, stored=1)


def test_metrics_are_sent_on_a_timer_even_before_any_episode(service, quick_updates):
    run = online(service)
    try:
        run.log({"loss": 0.25}, step=7)
        assert _wait_for_summary(service, run.id) == {"loss": 0.25, "step": 7}
    finally:
        run.finish(timeout_s=FLUSH_TIMEOUT_S)


def test_many_threads_logging_at_once_lose_nothing(service):
    run = online(service)
    barrier = threading.Barrier(4, timeout=GATE_TIMEOUT_S)

    def log(worker: int) -> None:
        barrier.wait()
        for step in range(10):
            assert run.log_episodes(episodes(f"w{worker}-s{step}-", 3))

    threads = [threading.Thread(target=log, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(GATE_TIMEOUT_S)
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    stored = stored_episodes(service)
    assert len(stored) == 120 and set(stored.values()) == {1}
    assert_buckets(run, submitted=120, stored=120)


# -- errors ----------------------------------------------------------------------------


def test_on_error_raise_raises_the_first_failure_from_flush_and_finish(service):
    service.faults.reject_marker = MARKER
    run = online(service, on_error="raise")
    assert run.log_episodes(episodes("a", 3, poisoned=(1,)))
    with pytest.raises(prime_runs.SinkError) as caught:
        run.flush(FLUSH_TIMEOUT_S)
    assert caught.value.sink == "traces"
    assert caught.value.failures == {"rejected:invalid_trace": 1}
    assert run.flush(FLUSH_TIMEOUT_S) is True  # raised once
    assert run.log_episodes(episodes("b", 2, poisoned=(0,)))
    with pytest.raises(prime_runs.SinkError):
        run.finish(timeout_s=FLUSH_TIMEOUT_S)
    remote = get_run(service, run.id)
    assert remote["status"] == "completed"  # recorded before raising
    assert remote["episode_count"] == 3
    assert_buckets(run, submitted=5, stored=3, failed={"rejected:invalid_trace": 2})


def test_only_the_finish_that_finished_raises_a_failure(service):
    run = online(service, on_error="raise")
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    # A failure heard after the run finished (a lane reporting late) is not raised by a later finish().
    run._note_error(prime_runs.SinkError("traces", {"transient": 1}))
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    with run:
        pass  # __exit__ finishes again: nothing to raise either


def test_the_default_finish_timeout_can_be_changed_on_the_run(service):
    run = online(service, finish_timeout_s=5)
    run.finish_timeout_s = 12.5
    assert run.finish_timeout_s == 12.5
    with pytest.raises(ValueError, match="finish_timeout_s"):
        run.finish_timeout_s = -1
    run.config = {"replaced": True}
    run.summary = {"loss": 0.5}
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    remote = get_run(service, run.id)
    assert remote["config"] == {"replaced": True}
    assert remote["summary"]["loss"] == 0.5


def test_on_error_warn_logs_once(service, caplog):
    service.faults.reject_marker = MARKER
    run = online(service)
    with caplog.at_level(logging.WARNING, logger="prime_runs"):
        for i in range(3):
            assert run.log_episodes(episodes(f"w{i}-", 2, poisoned=(0,)))
            assert run.flush(FLUSH_TIMEOUT_S) is True  # never raises
        run.finish(timeout_s=FLUSH_TIMEOUT_S)
    from_run = [r for r in caplog.records if r.name == "prime_runs.run"]
    assert len(from_run) == 1, [r.getMessage() for r in from_run]
    assert "rejected:invalid_trace" in from_run[0].getMessage()
    assert run.failed_records == {"traces": 3}
    assert_buckets(run, submitted=6, stored=3, failed={"rejected:invalid_trace": 3})


@pytest.mark.parametrize(
    "bad",
    [{"on_error": "ignore"}, {"max_queued_records": 0}, {"max_queued_bytes": 0}],
    ids=["on_error", "max_queued_records", "max_queued_bytes"],
)
def test_bad_options_are_refused_before_the_run_is_created(service, bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        online(service, **bad)
    assert list_runs(service) == []  # no run left "running" on the service for ever
    assert "PRIME_RUN_ID" not in os.environ


# -- asyncio ---------------------------------------------------------------------------


async def _probe(ticks: list[float], stop: asyncio.Event, enough: asyncio.Event) -> None:
    while not stop.is_set():
        ticks.append(time.monotonic())
        if len(ticks) >= 20:
            enough.set()
        await asyncio.sleep(0.005)


def _worst_gap(ticks: list[float]) -> float:
    return max((b - a for a, b in itertools.pairwise(ticks)), default=0.0)


def test_aflush_and_afinish_do_not_block_the_loop_and_survive_cancellation(service, gate):
    run = online(service)

    async def main() -> None:
        # aflush while the service holds the upload: the loop keeps running.
        assert run.log_episodes(episodes("a", 5))
        ticks: list[float] = []
        stop, enough = asyncio.Event(), asyncio.Event()
        probe = asyncio.create_task(_probe(ticks, stop, enough))
        waiter = asyncio.create_task(run.aflush(GATE_TIMEOUT_S))
        await asyncio.wait_for(enough.wait(), GATE_TIMEOUT_S)
        assert await asyncio.to_thread(gate.entered.wait, GATE_TIMEOUT_S)  # waits off the loop
        assert not waiter.done()
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        # afinish likewise, and cancelling it abandons nothing.
        assert run.log_episodes(episodes("b", 5))
        ticks.clear()
        enough.clear()
        finisher = asyncio.create_task(run.afinish(timeout_s=GATE_TIMEOUT_S))
        await asyncio.wait_for(enough.wait(), GATE_TIMEOUT_S)
        assert not finisher.done()
        finisher.cancel()
        with pytest.raises(asyncio.CancelledError):
            await finisher
        stop.set()
        await probe
        assert _worst_gap(ticks) < 0.5

    asyncio.run(main())
    gate.open()
    assert run.flush(GATE_TIMEOUT_S)
    assert run._finisher.finished.wait(GATE_TIMEOUT_S)  # the cancelled afinish went on in its thread
    assert sorted(stored_episodes(service)) == sorted([*(f"a{i}" for i in range(5)), *(f"b{i}" for i in range(5))])
    assert get_run(service, run.id)["status"] == "completed"
    assert_buckets(run, submitted=10, stored=10)


# -- fork ------------------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_logs_its_own_records_and_never_finishes_the_run(service):
    hold = Gate(hold_first_only=True)
    service.faults.before_upload = hold
    try:
        run = online(service)
        assert run.log_episodes(episodes("p", 5))  # in the service, held
        assert hold.entered.wait(GATE_TIMEOUT_S)
        assert run.log_episodes(episodes("q", 5))  # in the parent's queue
        result = in_child(lambda: _child_body(run))
        assert result == {"submitted": 5, "stored": 5, "failed": {}, "owner": False, "run_id": run.id}
        # The child's own records landed; the parent's held and queued ones are not there yet.
        assert sorted(stored_episodes(service)) == [f"c{i}" for i in range(5)]
        assert get_run(service, run.id)["status"] == "running"
    finally:
        hold.open()
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    stored = stored_episodes(service)
    assert sorted(stored) == sorted(f"{p}{i}" for p in "pqc" for i in range(5))
    assert set(stored.values()) == {1}  # nothing uploaded twice
    remote = get_run(service, run.id)
    assert remote["status"] == "completed"
    assert_buckets(run, submitted=10, stored=10)  # the parent's own: the child counts its 5 in its own process


def _child_body(run: Run, flush_timeout_s: float = GATE_TIMEOUT_S) -> dict[str, Any]:
    assert run.log_episodes(episodes("c", 5))
    assert run.flush(flush_timeout_s), "the child's records were not uploaded in time"
    run.finish(timeout_s=GATE_TIMEOUT_S)  # flushes; must not finish the parent's run
    stats = run.stats()
    return {
        "submitted": stats["submitted"],
        "stored": stats["sinks"]["traces"]["stored"],
        "failed": stats["sinks"]["traces"]["failed"],
        "owner": run._finisher.owner,
        "run_id": os.environ.get("PRIME_RUN_ID"),
    }


def test_a_trickled_run_update_does_not_hold_uploads_back(service, quick_updates):
    patched = threading.Event()
    service.faults.on_run_update = patched.set
    # Each answer to PATCH /runs comes a byte every 20 ms: always inside a read timeout, and
    # several seconds in all.
    service.faults.trickle_run_update_byte_s = 0.02
    run = online(service)
    run.log({"loss": 0.5}, step=1)
    assert run.log_episodes(episodes("a", 2))
    assert patched.wait(GATE_TIMEOUT_S)  # an update is on its way, its answer trickling
    started = time.monotonic()
    logged = episodes("b", 5)
    assert run.log_episodes(logged)
    assert run.flush(FLUSH_TIMEOUT_S)
    flushed_in = time.monotonic() - started
    stored = stored_episodes(service)
    assert all(stored.get(e["id"]) == 1 for e in logged)  # stored while the answer still trickles
    assert flushed_in < 3.0  # not held for the trickle
    service.faults.trickle_run_update_byte_s = 0.0
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    assert_buckets(run, submitted=7, stored=7)
