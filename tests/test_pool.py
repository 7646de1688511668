"""DaemonPool: its threads hold the pool weakly, so a pool nobody shuts down still ends them."""

from __future__ import annotations

import gc
import threading
import time

import orjson
import pytest
from _wire import trace

from prime_traces import TracesClient
from prime_traces.threads import DaemonPool

pytestmark = pytest.mark.timeout(60)

#: How long a thread of a dropped pool gets to notice; joined, never slept on.
END_WITHIN_S = 10.0


def alive_after_join(threads: list[threading.Thread]) -> list[str]:
    deadline = time.monotonic() + END_WITHIN_S
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [thread.name for thread in threads if thread.is_alive()]


def start_all_threads(pool: DaemonPool) -> None:
    """Make ``pool`` start every one of its threads: each task waits until all of them run."""
    barrier = threading.Barrier(pool.max_workers)
    futures = [pool.submit(barrier.wait, END_WITHIN_S) for _ in range(pool.max_workers)]
    for future in futures:
        future.result(END_WITHIN_S)
    assert len(pool.threads) == pool.max_workers


def test_the_threads_of_pools_dropped_without_shutdown_end():
    threads: list[threading.Thread] = []
    for _ in range(5):
        pool = DaemonPool(4, name="prime-traces-dropped")
        start_all_threads(pool)
        threads += pool.threads
        del pool
    gc.collect()
    assert alive_after_join(threads) == []


def test_work_queued_before_the_pool_was_dropped_still_runs():
    release = threading.Event()
    pool = DaemonPool(1, name="prime-traces-dropped")
    first = pool.submit(release.wait, END_WITHIN_S)
    second = pool.submit(lambda: "ran")
    (thread,) = pool.threads
    del pool
    gc.collect()
    release.set()
    assert first.result(END_WITHIN_S) is True
    assert second.result(END_WITHIN_S) == "ran"
    assert alive_after_join([thread]) == []


def test_shutdown_still_ends_the_threads_of_a_live_pool():
    pool = DaemonPool(3, name="prime-traces-shutdown")
    start_all_threads(pool)
    assert pool.shutdown(timeout_s=END_WITHIN_S)
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(lambda: None)


def test_the_upload_threads_of_a_client_nobody_closed_end(service):
    client = TracesClient(api_key="k", base_url=service.url, max_in_flight=2)
    client.upload_lines([orjson.dumps(trace(f"dropped-{i}")) for i in range(4)], target_batch_bytes=1)
    threads = client._pool.threads
    assert threads
    del client
    gc.collect()
    assert alive_after_join(threads) == []
