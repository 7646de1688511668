"""Throttling and outages during a run, against a real local service: nothing lost, nothing twice."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from _run_helpers import (  # noqa: F401  (fixtures are used by name)
    GATE_TIMEOUT_S,
    KEY,
    assert_buckets,
    episodes,
    get_run,
    identity_holds,
    isolated,
    online,
    sink_counts,
    stored_episodes,
)
from _wire import episode, trace
from test_traces_sink import STAMP, ledger_for, stored_ids

from prime_runs import cli
from prime_runs._local.spool import RecordFiles, Spool
from prime_runs._sinks import outage as outage_module
from prime_runs._sinks.outage import Outage
from prime_traces import TracesClient
from prime_traces.server import LocalTracesService

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def restartable(tmp_path) -> Iterator[LocalTracesService]:
    """A service on a fixed port, so it can be stopped (an outage) and started again at the same URL."""
    service = LocalTracesService(tmp_path / "traces.db", port=_free_port())
    service.start()
    yield service
    service.stop()


def _log_steps(run, prefix: str, steps: int, pace_s: float = 0.0) -> list[str]:
    """One write of 5 episodes per step, ``pace_s`` apart (the training loop's own pace)."""
    pace = threading.Event()
    ids = []
    for step in range(steps):
        batch = episodes(f"{prefix}{step}-", 5)
        ids += [e["id"] for e in batch]
        assert run.log_episodes(batch)
        pace.wait(pace_s)
    return ids


def test_twelve_seconds_of_429s_lose_nothing_and_retire_nothing(isolated, restartable):
    service = restartable
    service.faults.fail_status = 429
    service.faults.fail_retry_after_s = 1.0
    service.faults.fail_count = 12  # one refused upload a second or so: about 12 s of 429s
    run = online(service, dir=isolated / "runs")
    logged = _log_steps(run, "r", 40, pace_s=0.75)  # a 30 s run
    run.finish(timeout_s=120)
    counts = sink_counts(run)
    assert stored_episodes(service) == {i: 1 for i in logged}
    assert run.stats()["retired_sinks"] == []
    assert counts["refusals"] >= 12
    assert get_run(service, run.id)["status"] == "completed"
    assert len(logged) == 200
    assert_buckets(run, submitted=200, stored=200)


def test_an_outage_that_ends_before_finish_is_resynced_during_the_run(isolated, restartable):
    service = restartable
    run = online(service, dir=isolated / "runs")
    logged = _log_steps(run, "before", 5)
    assert run.flush(60)
    service.stop()  # down for 40 s while the run goes on
    logged += _log_steps(run, "during", 20, pace_s=2.0)
    service.start()
    logged += _log_steps(run, "after", 10, pace_s=0.5)
    run.finish(timeout_s=120)
    stats = run.stats()
    counts = stats["sinks"]["traces"]
    assert stored_episodes(service) == {i: 1 for i in logged}  # each once
    assert len(logged) == 175
    # Each bucket by hand: what the run spooled and then resynced itself is stored, and spooled no more.
    assert (stats["submitted"], counts["stored"], stats["dropped"], counts["failed"]) == (175, 175, {}, {})
    assert counts["resynced"] > 0 and counts["outages"] >= 1  # kept on disk, then sent by the run itself
    assert counts["spooled"] == 0
    assert stats["retired_sinks"] == []
    assert get_run(service, run.id)["status"] == "completed"
    assert identity_holds(run)


def test_an_outage_past_finish_is_kept_and_a_later_sync_stores_it_once(isolated, restartable):
    service = restartable
    run = online(service, dir=isolated / "runs")
    logged = _log_steps(run, "before", 5)
    assert run.flush(60)
    service.stop()
    logged += _log_steps(run, "during", 10)
    run.finish(timeout_s=20)
    stats = run.stats()
    counts = stats["sinks"]["traces"]
    # The 25 flushed before the outage are stored; the 50 logged during it are all kept on disk.
    assert (stats["submitted"], counts["stored"], stats["dropped"], counts["failed"]) == (75, 25, {}, {})
    assert counts["spooled"] == 50 and counts["resynced"] == 0
    assert sum(counts["spooled_reasons"].values()) == 50
    assert set(counts["spooled_reasons"]) <= {"transient", "outage", "deadline"}, counts["spooled_reasons"]
    assert identity_holds(run)
    service.start()
    assert cli.main(["sync", "--api-key", KEY, "--base-url", service.url, run.dir]) == 0
    assert stored_episodes(service) == {i: 1 for i in logged}


def test_a_refused_key_retires_the_sink_at_once_and_keeps_the_rest_of_the_run(isolated, restartable, caplog):
    service = restartable
    run = online(service, dir=isolated / "runs")
    first = episodes("first-", 5)
    service.state.api_key = "another-key"  # from now on this run's key is refused: 401
    assert run.log_episodes(first) and run.flush(60)
    assert run.stats()["retired_sinks"] == ["traces"]
    later = _log_steps(run, "later", 2)
    run.finish(timeout_s=30)
    assert_buckets(run, submitted=15, stored=0, spooled={"refused:unauthenticated": 5, "sink_retired": 10})
    errors = [r for r in caplog.records if r.levelname == "ERROR" and "retired" in r.getMessage()]
    assert len(errors) == 1 and "refused:unauthenticated" in errors[0].getMessage()
    service.state.api_key = None
    assert cli.main(["sync", "--api-key", KEY, "--base-url", service.url, run.dir]) == 0
    assert stored_episodes(service) == {e["id"]: 1 for e in first} | {i: 1 for i in later}


def _spill(spool: Spool, prefix: str) -> None:
    records: list[Any] = [episode(f"{prefix}{i}", [trace(f"{prefix}{i}-t0")]) for i in range(3)]
    _, ledger = ledger_for(len(records))
    ledger.undelivered(range(len(records)), "backlog")
    assert spool.spill(records, "episode", ledger, ledger.take_undelivered("backlog"), None) == 3


def test_a_spill_while_the_drain_is_on_its_way_out_is_uploaded_by_the_next_drain(tmp_path, monkeypatch):
    # The drain found nothing new and is ending (its client closing) when records are spooled and finish()
    # waits for the drain: a new drain uploads them. Told to the ending one, they were left for a sync.
    closing, go_on = threading.Event(), threading.Event()
    held: list[bool] = []

    class HeldClose(TracesClient):
        def close(self) -> None:
            if not held:  # the first drain's client only
                held.append(True)
                closing.set()
                go_on.wait(GATE_TIMEOUT_S)
            super().close()

    monkeypatch.setattr(outage_module, "TracesClient", HeldClose)
    files = RecordFiles(str(tmp_path / "run-77"))
    with LocalTracesService(tmp_path / "db") as svc, TracesClient(api_key="k", base_url=svc.url) as client:
        outage = Outage(client, Spool(files, STAMP))
        try:
            _spill(outage.spool, "a")
            outage.fall_behind("a test")
            outage.spilled()  # behind a slow link: a drain uploads what was spooled
            assert closing.wait(GATE_TIMEOUT_S), "the first drain did not end"
            _spill(outage.spool, "b")
            done: list[bool] = []
            waiter = threading.Thread(target=lambda: done.append(outage.wait_for_resync(None)))
            waiter.start()
            waiter.join(GATE_TIMEOUT_S / 2)  # the ending drain is held: only a new one can finish this wait
            assert done == [True], "finish() waited for a drain that was ending"
            assert sorted(stored_ids(svc)) == ["a0", "a1", "a2", "b0", "b1", "b2"]
        finally:
            go_on.set()
            outage.close()
            files.close()
