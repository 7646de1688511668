"""A client used in a forked child builds its own sessions and threads."""

from __future__ import annotations

import gc
import math
import os
import time

import orjson
import pytest
from _fork import in_child
from _wire import trace

from prime_traces import TracesClient, threads

pytestmark = [pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork"), pytest.mark.timeout(120)]

#: Clients made and dropped; each used to leave three after-fork hooks behind for good.
DROPPED_CLIENTS = 20_000


def test_a_forked_child_uploads_through_its_own_sessions_and_threads(service):
    with TracesClient(api_key="k", base_url=service.url, max_in_flight=2) as client:
        client.upload_lines([orjson.dumps(trace("parent-1"))])
        parent_sessions = list(client._transport._sessions)
        parent_threads = client._pool.threads
        assert parent_sessions and parent_threads

        def child() -> dict:
            (receipt,) = client.upload_lines([orjson.dumps(trace("child-1"))])
            fresh = all(s not in parent_sessions for s in client._transport._sessions)
            own_threads = all(t not in parent_threads for t in client._pool.threads)
            return {"receipt": receipt.upload_id, "fresh": fresh, "own": own_threads}

        result = in_child(child)
        assert result["fresh"] and result["own"], result
        # The parent's client still works over its own connections.
        client.upload_lines([orjson.dumps(trace("parent-2"))])
    with service.state.store.reader() as conn:
        ids = {row[0] for row in conn.execute("SELECT trace_id FROM traces")}
    assert ids == {"parent-1", "child-1", "parent-2"}


def fork_s(repeats: int = 7) -> float:
    """The quickest of ``repeats`` forks, counted until the child (which does nothing) has ended.

    The child runs every after-fork hook before it can exit, so their cost is in here.
    """
    quickest = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        quickest = min(quickest, time.perf_counter() - start)
    return quickest


def test_dropped_clients_leave_no_fork_hooks_behind(tmp_path):
    def make_and_drop() -> None:
        TracesClient(api_key="k", base_url="http://127.0.0.1:9", config_path=tmp_path / "none.json")

    make_and_drop()
    gc.collect()
    baseline_s = fork_s()
    objects_before = len(gc.get_objects())
    for _ in range(DROPPED_CLIENTS):
        make_and_drop()
    gc.collect()

    # Each leaked hook was a closure and a WeakMethod the interpreter kept for good.
    grown = len(gc.get_objects()) - objects_before
    # An order of magnitude, not a benchmark: 60,000 leaked hooks made this ~35 times slower.
    after_s = fork_s()
    assert after_s < 5 * baseline_s, (baseline_s, after_s, grown)
    assert grown < DROPPED_CLIENTS // 10, grown
    # What is left are the hooks of objects still alive (this test's own leave none).
    assert len(threads._in_forked_child) < DROPPED_CLIENTS // 100


def test_a_live_objects_hook_runs_in_the_child_in_registration_order_and_a_failing_one_stops_no_other():
    ran: list[str] = []

    class Resettable:
        def __init__(self, name: str, fail: bool = False) -> None:
            self.name, self.fail = name, fail

        def reset(self) -> None:
            ran.append(self.name)
            if self.fail:
                raise RuntimeError("this hook fails")

    first, failing, last = Resettable("first"), Resettable("failing", fail=True), Resettable("last")
    dropped = Resettable("dropped")
    for obj in (first, failing, dropped, last):
        threads.call_in_forked_child(obj.reset)
    del dropped
    gc.collect()

    assert in_child(lambda: ran) == ["first", "failing", "last"]
    assert ran == []  # never in the parent


def test_a_plain_function_runs_in_every_forked_child_and_adds_no_hook_of_its_own():
    ran: list[str] = []

    def reset_module_state() -> None:  # what a module registers for its globals
        ran.append("reset")

    before = len(threads._in_forked_child)
    threads.call_in_forked_child(reset_module_state)
    assert len(threads._in_forked_child) == before + 1
    assert in_child(lambda: ran) == ["reset"]
    assert in_child(lambda: ran) == ["reset"]  # every child, not only the first
    assert ran == []
