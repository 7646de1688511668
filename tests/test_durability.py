"""Nothing lost, nothing twice: real processes killed, services hung, killed and refusing, then one sync.

Every test ends with ``prime-runs sync`` against a working local service and
compares record ids: each record that was confirmed (or logged) is stored
exactly once.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from _run_helpers import KEY, REPO, episodes, isolated, local_records, online, stored_episodes  # noqa: F401

from prime_runs import cli
from prime_runs._local.rundir import RunDirectory
from prime_runs._upload.worker import ACCOUNTING_GRACE_S
from prime_traces.server import LocalTracesService

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

# What a finish() bound allows for scheduling: a deadline stretched by 40 % would not fit (see test_run.py).
FINISH_MARGIN_S = 0.25

PRODUCER = str(REPO / "tests" / "_crash_producer.py")


def _sync(svc: LocalTracesService, *paths: str) -> int:
    return cli.main(["sync", "--api-key", KEY, "--base-url", svc.url, *paths])


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}


def test_kill_9_of_an_offline_producer_at_random_points_loses_no_confirmed_record(isolated, service):
    root = isolated / "runs"
    confirmed: list[str] = []
    rng = random.Random(20261201)
    for seed in range(10):
        proc = subprocess.Popen(
            [sys.executable, PRODUCER, str(seed), "--dir", str(root)], stdout=subprocess.PIPE, text=True, env=_env()
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        # Killed at a random moment: mid-encode, mid-write, mid-fsync or between writes.
        time.sleep(rng.uniform(0.05, 0.6))
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate(timeout=60)
        confirmed += [i for line in out.splitlines() for i in line.split()]
    assert len(confirmed) > 10
    run_dir = root / "crashy-run"
    assert _sync(service, str(run_dir)) == 0
    stored = stored_episodes(service)
    assert all(count == 1 for count in stored.values()), {k: v for k, v in stored.items() if v != 1}
    missing = set(confirmed) - set(stored)
    assert not missing, sorted(missing)[:10]
    # Only records some producer logged: a torn write never turns into a record.
    assert all(i.startswith("s") and i.split("-")[0][1:].isdigit() for i in stored)
    before = service.stats()
    assert _sync(service, str(run_dir)) == 0
    assert service.stats()["uploads"] == before["uploads"]


def test_a_service_that_hangs_at_finish_loses_nothing(isolated, tmp_path):
    db = tmp_path / "traces.db"
    logged = episodes("h", 300)
    with LocalTracesService(db, hang_uploads=True) as hung:
        run = online(hung, dir=isolated / "runs", spill_timeout_s=20)
        assert run.log_episodes(logged)
        started = time.monotonic()
        run.finish(timeout_s=3)
        elapsed = time.monotonic() - started
    # The drain gives up at the deadline less the status's reserve (20 %), the held upload is abandoned
    # 0.3 s later, and 300 small records are written in a moment: within the timeout, far inside the spill bound.
    assert 2.4 <= elapsed < 3 + FINISH_MARGIN_S, elapsed
    stats = run.stats()
    counts = stats["sinks"]["traces"]
    assert stats["dropped"] == {} and counts["failed"] == {}
    assert counts["stored"] == 0 and counts["spooled"] == 300 and counts["spooled_reasons"] == {"deadline": 300}
    assert stats["submitted"] == counts["stored"] + counts["spooled"]
    with LocalTracesService(db) as working:
        assert _sync(working, run.dir) == 0
        assert stored_episodes(working) == {e["id"]: 1 for e in logged}
        remote = working.state.store  # the status, too, is recorded by the sync
        with remote.reader() as conn:
            assert conn.execute("SELECT status FROM runs WHERE run_id = ?", (run.id,)).fetchone()[0] == "completed"


def _serve(db: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "prime_traces.cli", "serve", "--db", str(db)],
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line.startswith("listening on "), line
    return proc, line.removeprefix("listening on ")


def test_a_service_killed_mid_run_loses_nothing_once_the_run_is_synced(isolated, tmp_path):
    db = tmp_path / "traces.db"
    proc, url = _serve(db)
    import prime_runs

    run = prime_runs.init(
        "killed",
        environments=["e"],
        model="m",
        team_id="t",
        api_key=KEY,
        base_url=url,
        dir=isolated / "runs",
        handle_signals=False,
    )
    logged = []
    try:
        for step in range(10):
            batch = episodes(f"k{step}-", 30)
            logged += [e["id"] for e in batch]
            assert run.log_episodes(batch)
            if step == 4:
                assert run.flush(30)
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=30)
        run.finish(timeout_s=5)
    finally:
        if proc.poll() is None:
            proc.kill()
    counts = run.stats()["sinks"]["traces"]
    assert counts["stored"] >= 150 and counts["stored"] + counts["spooled"] == 300 and counts["failed"] == {}
    with LocalTracesService(db) as restarted:
        online_part = stored_episodes(restarted)
        assert _sync(restarted, run.dir) == 0
        everything = stored_episodes(restarted)
    assert len(online_part) == counts["stored"]
    assert everything == {i: 1 for i in logged}


def test_a_refused_key_keeps_the_run_for_a_sync_with_the_right_one(isolated, tmp_path):
    with LocalTracesService(tmp_path / "db", api_key="the-real-key") as svc:
        import prime_runs

        # The run is created with its key, then the service's key is rotated under it.
        run = prime_runs.init(
            "rotated",
            environments=["e"],
            model="m",
            team_id="t",
            api_key="the-real-key",
            base_url=svc.url,
            dir=isolated / "runs",
            handle_signals=False,
        )
        svc.state.api_key = "the-new-key"
        logged = episodes("r", 40)
        assert run.log_episodes(logged)
        run.finish(timeout_s=10)
        counts = run.stats()["sinks"]["traces"]
        assert counts["spooled"] == 40 and counts["spooled_reasons"] == {"refused:unauthenticated": 40}
        assert cli.main(["sync", "--api-key", "the-new-key", "--base-url", svc.url, run.dir]) == 0
        assert stored_episodes(svc) == {e["id"]: 1 for e in logged}


def test_a_service_that_fails_every_upload_keeps_everything_on_disk_without_retiring(isolated, service):
    service.faults.fail_status = 502
    service.faults.fail_fraction = 1.0
    service.faults.fail_retry_after_s = 0
    run = online(service, dir=isolated / "runs")
    logged = []
    for step in range(6):
        batch = episodes(f"x{step}-", 10)
        logged += [e["id"] for e in batch]
        assert run.log_episodes(batch)
        assert run.flush(60)
    run.finish(timeout_s=30)
    counts = run.stats()["sinks"]["traces"]
    # A failed batch starts an outage: what follows waits on disk, and nothing retires the sink.
    assert run.stats()["retired_sinks"] == []
    assert counts["spooled"] == 60 and set(counts["spooled_reasons"]) == {"transient", "outage"}
    service.faults.fail_fraction = 0.0
    assert _sync(service, run.dir) == 0
    assert stored_episodes(service) == {i: 1 for i in logged}


WRITER = """
import sys
sys.path.insert(0, {tests!r})
import prime_runs
from _wire import episode, trace
who = sys.argv[2]
run = prime_runs.init("shared", mode="offline", dir=sys.argv[1], id="shared-run", handle_signals=False)
big = who * 1_200_000  # over 1 MiB: the writes of two processes would interleave in one file
for i in range(20):
    run.log_episodes([episode(f"{{who}}-{{i}}", [trace(f"{{who}}-{{i}}-t")], info={{"big": big}})])
run.finish()
"""


def test_two_processes_logging_to_one_run_directory_never_interleave(isolated):
    root = isolated / "runs"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER.format(tests=str(REPO / "tests")), str(root), who],
            env=_env(),
            stderr=subprocess.PIPE,
            text=True,
        )
        for who in ("a", "b")
    ]
    for proc in procs:
        _out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    records = local_records(root / "shared-run", "episode")  # every line parses: none is cut or glued
    assert sorted(r["id"] for r in records) == sorted(f"{w}-{i}" for w in "ab" for i in range(20))
    assert all(r["info"]["big"] == r["id"][0] * 1_200_000 for r in records)
    assert RunDirectory(str(root / "shared-run")).recover() == []


def test_finish_stays_bounded_when_the_disk_stalls(isolated, monkeypatch):
    real_fsync, stalled, release = os.fsync, threading.Event(), threading.Event()

    def stalling_fsync(fd: int) -> None:
        if threading.current_thread().name == "prime-runs-upload":  # the worker's own writes hang
            stalled.set()
            release.wait(120)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", stalling_fsync)
    import prime_runs

    run = prime_runs.init("stalled", mode="offline", dir=isolated / "runs", handle_signals=False, spill_timeout_s=1)
    try:
        assert run.log_episodes(episodes("a", 5))
        assert stalled.wait(60)
        assert run.log_episodes(episodes("b", 5))  # queued behind the stalled write
        started = time.monotonic()
        run.finish(timeout_s=1)
        elapsed = time.monotonic() - started
        # The drain ends at 0.8 s; the stalled spill is waited for its bound and the accounting grace, no more.
        bound = 0.8 + 1 + ACCOUNTING_GRACE_S
        assert bound <= elapsed < bound + FINISH_MARGIN_S, elapsed
        counts = run.stats()["sinks"]["offline"]
        assert counts["failed"] == {"spill_timeout": 10}  # said, and counted: never silently
    finally:
        release.set()


def test_finish_with_writes_queued_behind_a_hung_upload_does_not_wait_out_the_spill_bound(isolated, tmp_path):
    with LocalTracesService(tmp_path / "db", hang_uploads=True) as hung:
        run = online(hung, dir=isolated / "runs", spill_timeout_s=30)
        for i in range(20):  # one write each: the first hangs in flight, the rest wait in the queue
            assert run.log_episodes(episodes(f"w{i}-", 3))
        started = time.monotonic()
        run.finish(timeout_s=1)
        took = time.monotonic() - started
    # The drain ends at 0.8 s, the held upload is abandoned 0.3 s later, 60 small records are written at once.
    assert took < 1 + FINISH_MARGIN_S, took  # the spill of 60 small records takes well under its 30 s bound
    counts = run.stats()["sinks"]["traces"]
    assert counts["spooled"] == 60 and counts["failed"] == {}


def test_records_logged_while_finish_waits_are_stored_or_spooled_never_lost(isolated, service):
    service.faults.latency_ms = 1500  # a slow service: finish() waits, another thread goes on logging
    run = online(service, dir=isolated / "runs", spill_timeout_s=5)
    logging_started, stop = threading.Event(), threading.Event()

    def rollouts() -> None:
        i = 0
        while not stop.is_set():
            run.log_episodes(episodes(f"r{i}-", 2))
            logging_started.set()
            i += 1

    thread = threading.Thread(target=rollouts)
    thread.start()
    try:
        assert logging_started.wait(30)
        run.finish(timeout_s=10)
    finally:
        stop.set()
        thread.join(30)
    stats = run.stats()
    counts = stats["sinks"]["traces"]
    assert counts["failed"] == {}
    assert stats["submitted"] == counts["stored"] + counts["spooled"] + sum(stats["dropped"].values())
