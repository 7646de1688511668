"""The run directory: where it is, ids that cannot escape it, run.json replaced atomically, one owner."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from _run_helpers import REPO, isolated, local_records  # noqa: F401
from _wire import episode, trace

import prime_runs
from prime_runs._local.rundir import MAX_RUN_ID_CHARS, RunDirectory, check_run_id, write_json_atomic
from prime_runs.errors import PrimeRunsError

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(
    "bad",
    [
        "../../escaped",
        "a/b",
        "..",
        ".",
        "",
        "x" * (MAX_RUN_ID_CHARS + 1),
        "tab\there",
        "nl\n",
        "back\\slash",
        "del\x7f",
    ],
)
def test_a_run_id_that_could_escape_the_runs_directory_is_refused(bad):
    with pytest.raises(PrimeRunsError, match=r"from id=.*a run id names a directory"):
        check_run_id(bad, "id=")


@pytest.mark.parametrize("good", ["run-1a2b", "grpo.v2_seed-3", "x" * MAX_RUN_ID_CHARS, "ünïcode"])
def test_ordinary_run_ids_are_kept(good):
    assert check_run_id(good, "id=") == good


@pytest.mark.parametrize("source", ["argument", "environment"])
def test_init_refuses_an_escaping_id_wherever_it_comes_from_and_writes_nothing(isolated, monkeypatch, source):
    options = {"id": "../../escaped"} if source == "argument" else {}
    if source == "environment":
        monkeypatch.setenv("PRIME_RUN_ID", "../../escaped")
    expected = "id=" if source == "argument" else "PRIME_RUN_ID"
    with pytest.raises(PrimeRunsError, match=expected):
        prime_runs.init("x", mode="offline", handle_signals=False, **options)
    assert list(isolated.parent.rglob("escaped")) == []
    assert not (isolated / "prime-runs").exists()


def test_the_runs_directory_is_the_argument_else_the_environment_else_the_current_one(isolated, monkeypatch):
    run = prime_runs.init("a", mode="offline", handle_signals=False)
    run.finish()
    assert Path(run.dir).resolve() == isolated / "prime-runs" / run.id
    monkeypatch.setenv("PRIME_RUNS_DIR", str(isolated / "from-env"))
    run = prime_runs.init("b", mode="offline", handle_signals=False)
    run.finish()
    assert Path(run.dir) == isolated / "from-env" / run.id
    run = prime_runs.init("c", mode="offline", handle_signals=False, dir=isolated / "from-arg")
    run.finish()
    assert Path(run.dir) == isolated / "from-arg" / run.id
    assert (Path(run.dir) / "run.json").is_file()


def test_an_offline_run_keeps_everything_in_run_json(isolated, monkeypatch):
    monkeypatch.setattr("prime_runs._start.init.UPDATE_INTERVAL_S", 0.05)
    run = prime_runs.init(
        "kept", kind="eval", config={"lr": 0.1}, tags=["a"], mode="offline", handle_signals=False, dir=isolated
    )
    path = Path(run.dir) / "run.json"
    first = orjson.loads(path.read_bytes())
    assert (first["name"], first["kind"], first["status"], first["mode"]) == ("kept", "eval", "running", "offline")
    assert first["config"] == {"lr": 0.1} and first["tags"] == ["a"] and first["summary"] == {}
    assert first["owner"] == {"host": first["owner"]["host"], "pid": os.getpid()}
    assert first["service_url"] is None
    run.log({"reward": 0.5}, step=2)
    run.log_episodes([episode("e0", [trace("e0-t")])])
    assert run.flush(30)
    run._worker._run_tick()  # the worker's timer, as it fires every UPDATE_INTERVAL_S
    assert orjson.loads(path.read_bytes())["summary"] == {"reward": 0.5, "step": 2}
    run.finish(status="failed", error="boom")
    last = orjson.loads(path.read_bytes())
    assert (last["status"], last["error"], last["created_at"]) == ("failed", "boom", first["created_at"])
    assert last["finished_at"] is not None
    assert last["counters"]["sinks"]["offline"]["stored"] == 1
    assert b"key" not in path.read_bytes().lower() or b"api_key" not in path.read_bytes()


def test_run_json_never_holds_the_key(isolated, service):
    run = prime_runs.init(
        "secret",
        environments=["e"],
        model="m",
        team_id="t",
        api_key="sk-very-secret-123",
        base_url=service.url,
        save_local=True,
        handle_signals=False,
        dir=isolated,
    )
    run.log_episodes([episode("e0", [trace("e0-t")])])
    run.finish()
    blob = b"".join(p.read_bytes() for p in Path(run.dir).rglob("*") if p.is_file())
    assert b"sk-very-secret-123" not in blob
    assert orjson.loads((Path(run.dir) / "run.json").read_bytes())["service_url"] == service.url


def test_a_second_process_that_claims_a_live_run_logs_into_it_without_owning_it(isolated, caplog):
    first = prime_runs.init("one", mode="offline", handle_signals=False, dir=isolated, id="shared-run")
    rundir = RunDirectory(first.dir)
    # Another process claiming the same run meanwhile (its lock is on another open file).
    script = (
        "import logging, prime_runs, sys\n"
        "logging.basicConfig()\n"
        "run = prime_runs.init('two', mode='offline', handle_signals=False, dir=sys.argv[1], id='shared-run')\n"
        "run.log_traces([{'id': 'from-second', 'timing': {'start': __import__('time').time()}}])\n"
        "run.finish()\n"
        "print(run._finisher.run_file is None)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(isolated)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=True,
    )
    assert out.stdout.strip() == "True", out.stderr
    assert "still running in another process" in out.stderr
    assert orjson.loads((Path(first.dir) / "run.json").read_bytes())["name"] == "one"
    assert [t["id"] for t in local_records(first.dir, "trace")] == ["from-second"]
    assert rundir.owner_alive()
    first.finish()
    assert not rundir.owner_alive()


WRITER = """
import os, sys
from prime_runs._local.rundir import write_json_atomic
path = sys.argv[1]
n = 0
print("ready", flush=True)
while True:
    n += 1
    write_json_atomic(path, {"n": n, "pad": "x" * (n % 5000), "check": n * 7})
"""


def test_run_json_is_always_the_old_or_the_new_file_whatever_kills_its_writer(tmp_path):
    tmp_path = tmp_path / "run"
    tmp_path.mkdir()
    path = tmp_path / "run.json"
    write_json_atomic(str(path), {"n": 0, "pad": "", "check": 0})
    rng = random.Random(7)
    seen = []
    for _ in range(12):
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.01, 0.3))  # a random point in the loop: what is killed is not synchronised on
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        document = orjson.loads(path.read_bytes())
        assert document["check"] == document["n"] * 7 and len(document["pad"]) == document["n"] % 5000
        seen.append(document["n"])
    assert max(seen) > 0
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "run.json"]
    rundir = RunDirectory(tmp_path)
    rundir.recover()  # no live owner: a killed writer's temporary file goes
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"], leftovers
