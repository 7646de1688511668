"""DaemonPool used as code written for executors uses it: submit, map, with, shutdown; and exit never waits."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import Executor, Future
from concurrent.futures import TimeoutError as FuturesTimeoutError

import pytest
from _fork import in_child

from prime_traces.threads import DaemonPool

pytestmark = pytest.mark.timeout(60)

#: The bound on anything a test waits for that should happen at once; joined or waited on, never slept.
WITHIN_S = 10.0
#: The bounded waits under test: short, so a test of them stays quick.
SHORT_S = 0.2
#: How far past its bound a bounded wait may return on a loaded machine (well under WITHIN_S,
#: when a hung task gives up by itself).
LATE_S = 3.0


def blocked_until(started: threading.Event, gate: threading.Event, value: object = "ran") -> object:
    """A task that says it runs, then waits for ``gate`` (a hung call, until the test releases it)."""
    started.set()
    gate.wait(WITHIN_S)
    return value


def test_it_is_an_executor_whose_map_yields_in_order():
    finished = [threading.Event() for _ in range(4)]

    def last_first(i: int) -> int:
        # Each call waits for the one after it: they complete in reverse order of submission.
        if i + 1 < len(finished):
            finished[i + 1].wait(WITHIN_S)
        finished[i].set()
        return i * i

    with DaemonPool(4, name="prime-traces-map") as pool:
        assert isinstance(pool, Executor)
        assert list(pool.map(last_first, range(4), timeout=WITHIN_S, chunksize=3)) == [0, 1, 4, 9]
        assert list(pool.map(pow, [2, 3], [5, 2])) == [32, 9]


def test_map_raises_the_exception_of_a_call_where_its_result_comes():
    with DaemonPool(2, name="prime-traces-map") as pool:
        results = pool.map(lambda x: 12 // x, [4, 0, 3])
        assert next(results) == 3
        with pytest.raises(ZeroDivisionError):
            next(results)


def test_map_timeout_counts_from_the_call_to_map():
    started, gate = threading.Event(), threading.Event()
    pool = DaemonPool(1, name="prime-traces-map")
    try:
        results = pool.map(lambda _: blocked_until(started, gate), [1], timeout=SHORT_S)
        with pytest.raises(FuturesTimeoutError):
            next(results)
    finally:
        gate.set()
        assert pool.shutdown(timeout_s=WITHIN_S)


def test_leaving_a_with_block_waits_for_the_work_submitted_in_it():
    gate = threading.Event()
    with DaemonPool(1, name="prime-traces-with") as pool:
        first = pool.submit(blocked_until, threading.Event(), gate, "first")
        queued = pool.submit(lambda: "queued")
        # Released as the block ends: only a shutdown that waits sees both done below.
        gate.set()
    assert first.done() and queued.done()
    assert (first.result(), queued.result()) == ("first", "queued")
    assert not any(t.is_alive() for t in pool.threads)
    with pytest.raises(RuntimeError, match="cannot schedule new futures after shutdown"):
        pool.submit(lambda: None)


def test_leaving_a_with_block_is_bounded_by_exit_timeout_s():
    started, gate = threading.Event(), threading.Event()
    try:
        with pytest.raises(FuturesTimeoutError, match="still running"):
            with DaemonPool(1, name="prime-traces-with", exit_timeout_s=SHORT_S) as pool:
                hung = pool.submit(blocked_until, started, gate)
                assert started.wait(WITHIN_S)
        assert not hung.done()
        # A block that raises keeps its own exception; the pool's timeout is only logged.
        with pytest.raises(KeyError):
            with DaemonPool(1, name="prime-traces-with", exit_timeout_s=SHORT_S) as other:
                other.submit(blocked_until, threading.Event(), gate)
                raise KeyError("the block's own")
    finally:
        gate.set()
    assert pool.shutdown(timeout_s=WITHIN_S) and other.shutdown(timeout_s=WITHIN_S)
    with pytest.raises(ValueError, match="exit_timeout_s"):
        DaemonPool(1, exit_timeout_s=-1)


def test_cancel_futures_cancels_the_work_not_yet_started():
    started, gate = threading.Event(), threading.Event()
    pool = DaemonPool(1, name="prime-traces-cancel")
    running = pool.submit(blocked_until, started, gate)
    queued = [pool.submit(lambda: "should not run") for _ in range(3)]
    assert started.wait(WITHIN_S)
    assert pool.shutdown(wait=False, cancel_futures=True) is False
    assert all(f.cancelled() for f in queued)
    assert not running.cancelled()
    gate.set()
    # Idempotent, and the worker still ends: the cancel did not take its wake-up away.
    assert pool.shutdown(wait=True, timeout_s=WITHIN_S)
    assert running.result() == "ran"


def test_without_cancel_futures_queued_work_still_runs_after_shutdown():
    started, gate = threading.Event(), threading.Event()
    pool = DaemonPool(1, name="prime-traces-drain")
    pool.submit(blocked_until, started, gate)
    queued = pool.submit(lambda: "queued ran")
    assert started.wait(WITHIN_S)
    assert pool.shutdown(wait=False) is False
    with pytest.raises(RuntimeError, match="cannot schedule new futures after shutdown"):
        pool.submit(lambda: None)
    gate.set()
    assert queued.result(WITHIN_S) == "queued ran"
    assert pool.shutdown(timeout_s=WITHIN_S)


def test_shutdown_with_timeout_s_on_a_hung_task_returns_false_within_the_bound():
    started, gate = threading.Event(), threading.Event()
    pool = DaemonPool(2, name="prime-traces-hung")
    hung: Future[object] = pool.submit(blocked_until, started, gate)
    assert started.wait(WITHIN_S)
    try:
        start = time.monotonic()
        assert pool.shutdown(wait=True, timeout_s=SHORT_S) is False
        waited_s = time.monotonic() - start
        assert SHORT_S <= waited_s < SHORT_S + LATE_S
        assert not hung.done()
    finally:
        gate.set()
    assert pool.shutdown(timeout_s=WITHIN_S)
    with pytest.raises(ValueError, match="timeout_s"):
        pool.shutdown(timeout_s=-1)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_neither_waits_on_nor_refuses_because_of_the_parent_pool():
    started, gate = threading.Event(), threading.Event()
    pool = DaemonPool(1, name="prime-traces-fork")
    pool.submit(blocked_until, started, gate)
    assert started.wait(WITHIN_S)
    pool.shutdown(wait=False)

    def child() -> dict:
        ran = pool.submit(lambda: "child").result(WITHIN_S)
        return {"ran": ran, "ended": pool.shutdown(timeout_s=WITHIN_S)}

    try:
        assert in_child(child) == {"ran": "child", "ended": True}
    finally:
        gate.set()
    assert pool.shutdown(timeout_s=WITHIN_S)


def test_a_process_whose_pool_has_a_hung_task_still_exits_promptly():
    script = textwrap.dedent(
        """
        import threading
        from prime_traces.threads import DaemonPool

        started = threading.Event()
        def hang():
            started.set()
            threading.Event().wait()

        kept = DaemonPool(2, name="kept")
        kept.submit(hang)
        closed = DaemonPool(2, name="closed")
        closed.submit(hang)
        assert started.wait(10)
        assert closed.shutdown(wait=False) is False
        print("exiting", flush=True)
        """
    )
    # A pool whose workers were joined at exit (the stdlib's) would hang here until the timeout kills it.
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "exiting"
