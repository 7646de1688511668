"""``prime-runs sync`` against a service that never answers: it says it waits, then gives up in time."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from _run_helpers import KEY, episodes, isolated, stored_episodes  # noqa: F401

import prime_runs
from prime_runs.cli.sync_watch import SyncTimedOut, SyncWatch
from prime_traces.server import LocalTracesService

pytestmark = pytest.mark.timeout(180)

REPO = Path(__file__).resolve().parents[1]


def test_a_call_that_ends_gives_its_result_and_its_error():
    watch = SyncWatch(60, say=lambda _text: None)
    assert watch.run(lambda: 42, "http://svc") == 42
    with pytest.raises(KeyError):
        watch.run(lambda: {}["missing"], "http://svc")


def test_a_call_that_never_moves_is_reported_then_given_up():
    said: list[str] = []
    never = threading.Event()
    watch = SyncWatch(2.0, say=said.append)
    started = time.monotonic()
    with pytest.raises(SyncTimedOut, match=r"no progress uploading to http://svc for [0-9.]+ s: gave up"):
        watch.run(lambda: never.wait(60), "http://svc")
    assert 2.0 <= time.monotonic() - started < 20  # an order of magnitude, not a timing claim
    assert said == ["no answer from http://svc for 1 s; still waiting (gives up at 2 s)"]
    never.set()  # the abandoned call ends (a real sync's ends with the process)
    for thread in threading.enumerate():
        if thread.name == "prime-runs-sync":
            thread.join(10)


def test_progress_keeps_a_slow_call_alive():
    steps = [threading.Event() for _ in range(8)]
    watch = SyncWatch(1.0, say=lambda _text: None)

    def slow() -> str:
        for step in steps:  # 2 s in all, twice the timeout, but progress every quarter of a second
            step.wait(0.25)
            watch.progress()
        return "done"

    assert watch.run(slow, "http://svc") == "done"


def test_sync_against_a_service_that_never_answers_says_so_and_exits_1_in_time(isolated, tmp_path):
    run = prime_runs.init(
        "silent", mode="offline", dir=isolated / "runs", handle_signals=False, console="off",
        environments=["e"], model="m", team_id="t",
    )  # fmt: skip
    batch = episodes("e", 5)
    run.log_episodes(batch)
    run.finish()
    env = {**os.environ, "PRIME_API_KEY": KEY}
    with LocalTracesService(tmp_path / "db") as service:
        service.faults.hang_uploads = True
        command = [sys.executable, "-m", "prime_runs.cli", "sync", str(run.dir), "--base-url", service.url]
        started = time.monotonic()
        silent = subprocess.run([*command, "--timeout-s", "4"], env=env, cwd=REPO, capture_output=True, text=True,
                                timeout=120, check=False)  # fmt: skip
        elapsed = time.monotonic() - started
        assert silent.returncode == 1, silent.stderr
        assert elapsed < 4 + 30, elapsed  # the timeout plus the interpreter's start and the run's creation
        assert f"no answer from {service.url} for 2 s; still waiting" in silent.stderr
        assert f"gave up; run prime-runs sync {run.dir} again" in silent.stderr
        assert "--timeout-s, now 4" in silent.stderr
        service.faults.hang_uploads = False
        again = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
        assert again.returncode == 0, again.stderr
        assert stored_episodes(service) == {e["id"]: 1 for e in batch}


def test_timeout_s_must_be_a_positive_number(capsys):
    from prime_runs import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["sync", "--timeout-s", "0"])
    assert exit_info.value.code == 2
    assert "must be greater than 0" in capsys.readouterr().err
