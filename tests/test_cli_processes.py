"""The command lines as processes: a reader that stops early, a terminal that is asked, the log level.

What only a real process shows: a closed pipe under ``| head`` (the EPIPE, and
the flush Python attempts at exit), a stdin that is a terminal (a pseudo
terminal here), and logging configured by ``main``. The service runs in this
process on loopback; the commands run as ``python -m prime_traces.cli`` and
``python -m prime_runs.cli``.
"""

from __future__ import annotations

import hashlib
import os
import pty
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import requests
from _upload_helpers import make_trace, upload

from prime_runs._local.rundir import RunDirectory
from prime_traces import TracesClient
from prime_traces.server import LocalTracesService

pytestmark = pytest.mark.timeout(120)

KEY = "pk-cli-process-0123456789"
PRIME_TRACES = [sys.executable, "-m", "prime_traces.cli"]
PRIME_RUNS = [sys.executable, "-m", "prime_runs.cli"]
PIPE_BUFFER_BYTES = 64 * 1024
WAIT_S = 60.0


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # PYTHONUNBUFFERED too: a user's stdout into a pipe is block-buffered, and
    # the buffer's last flush (at exit) is the one that fails unseen.
    for name in ("PRIME_API_KEY", "PRIME_TRACES_URL", "PRIME_TEAM_ID", "PRIME_RUNS_DIR", "PYTHONUNBUFFERED"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


@pytest.fixture
def svc(tmp_path: Path) -> Iterator[LocalTracesService]:
    """100 traces of run-1 whose list page is several pipe buffers of JSON, a 1 MB trace and a small one."""
    with LocalTracesService(tmp_path / "processes.db", api_key=KEY) as service:
        now = time.time()
        traces = [make_trace(f"t-{i}", start=now - 100 + i, run_id="run-1") for i in range(100)]
        resp = upload(service.url, traces, context={"pad": "x" * 4000}, token=KEY)
        assert resp.status_code == 201, resp.text
        resp = upload(
            service.url, [make_trace("big", start=now, text="y" * 1_000_000), make_trace("small", start=now)], token=KEY
        )
        assert resp.status_code == 201, resp.text
        yield service


def connection(svc: LocalTracesService) -> list[str]:
    return ["--api-key", KEY, "--base-url", svc.url]


def run_traces(svc: LocalTracesService) -> list[str]:
    resp = requests.get(
        f"{svc.url}/api/v1/traces",
        params={"run_id": "run-1", "limit": 100},
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=WAIT_S,
    )
    assert resp.status_code == 200, resp.text
    return [item["trace_id"] for item in resp.json()["items"]]


def read_a_little_then_close(argv: list[str]) -> tuple[bytes, int, bytes]:
    """Run ``argv`` into a reader that takes the first bytes and goes away, as ``| head -c 100`` does."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        first = proc.stdout.read(100)
        proc.stdout.close()
        err = proc.stderr.read()  # until the process ends
        return first, proc.wait(WAIT_S), err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# -- a reader that stops early ------------------------------------------------------


@pytest.mark.parametrize(
    "argv, size_url",
    [
        (["list", "--run-id", "run-1", "--limit", "100", "--json"], "/api/v1/traces?run_id=run-1&limit=100"),
        (["get", "big", "--raw"], "/api/v1/traces/big?raw=true"),
    ],
    ids=["list", "get-raw"],
)
def test_prime_traces_into_a_reader_that_stops_early_ends_quietly(svc, argv, size_url):
    whole = requests.get(svc.url + size_url, headers={"Authorization": f"Bearer {KEY}"}, timeout=WAIT_S)
    assert len(whole.content) > 4 * PIPE_BUFFER_BYTES  # the command cannot finish before the reader goes
    first, status, err = read_a_little_then_close([*PRIME_TRACES, *argv, *connection(svc)])
    assert first[:1] in (b"{", b"[") and len(first) == 100
    assert err == b""  # no traceback, no "Exception ignored ... BrokenPipeError"
    assert status == 141


@pytest.mark.parametrize("json_option", [[], ["--json"]], ids=["table", "json"])
def test_prime_runs_ls_into_a_reader_that_stops_early_ends_quietly(tmp_path, json_option):
    root = tmp_path / "runs"
    for i in range(300):
        RunDirectory(str(root / f"run-{i:03d}")).write_run(
            {"id": f"run-{i:03d}", "name": f"{i}-" + "n" * 1000, "status": "completed"}
        )
    first, status, err = read_a_little_then_close([*PRIME_RUNS, "ls", str(root), *json_option])
    assert first.startswith(b"[" if json_option else b"NAME ")
    assert (err, status) == (b"", 141)


@pytest.mark.parametrize(
    "command",
    [
        ["prime-traces", "get", "small", "--json"],
        ["prime-traces", "--version"],
        ["prime-runs", "ls", "RUNS"],
    ],
    ids=["get", "version", "ls"],
)
def test_a_reader_gone_before_the_first_byte_ends_it_quietly_too(svc, tmp_path, command):
    # The output is small, so it is still in stdout's buffer when the command
    # ends: the flush then fails, and so would Python's own flush at exit.
    RunDirectory(str(tmp_path / "runs" / "run-0")).write_run({"id": "run-0", "status": "completed"})
    program, *words = command
    argv = [
        *(PRIME_TRACES if program == "prime-traces" else PRIME_RUNS),
        *(str(tmp_path / "runs") if w == "RUNS" else w for w in words),
        *(connection(svc) if words[0] == "get" else []),
    ]
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            argv, check=False, stdin=subprocess.DEVNULL, stdout=write_end, stderr=subprocess.PIPE, timeout=WAIT_S
        )
    finally:
        os.close(write_end)
    assert (done.stderr, done.returncode) == (b"", 141)


# -- delete-run asks a person at a terminal -----------------------------------------


@pytest.mark.parametrize(
    "stdin, answer, yes, deleted",
    [
        ("terminal", b"n\n", False, False),
        ("terminal", b"\n", False, False),
        ("terminal", b"yes\n", False, True),
        ("terminal", b"", True, True),
        ("pipe", b"", False, True),
    ],
    ids=["no", "enter", "yes", "--yes", "script"],
)
def test_delete_run_asks_first_on_a_terminal(svc, stdin, answer, yes, deleted):
    argv = [*PRIME_TRACES, "delete-run", "run-1", *(["--yes"] if yes else []), *connection(svc)]
    before = svc.stats()["requests"]
    master, slave = pty.openpty() if stdin == "terminal" else (None, None)
    try:
        proc = subprocess.Popen(
            argv,
            stdin=slave if slave is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        if slave is not None:
            os.close(slave)
            slave = None
        if answer:
            assert master is not None
            os.write(master, answer)
        out, err = proc.communicate(timeout=WAIT_S)
    finally:
        for fd in (master, slave):
            if fd is not None:
                os.close(fd)
    prompt = f"delete every trace of run run-1 on {svc.url}? [y/N] ".encode()
    asked = stdin == "terminal" and not yes
    if deleted:
        assert (proc.returncode, out) == (0, b"deleted the traces of run run-1\n")
        assert err == (prompt if asked else b"")
        assert run_traces(svc) == []
    else:
        assert (proc.returncode, out, err) == (1, b"", prompt + b"prime-traces: aborted\n")
        assert svc.stats()["requests"] == before  # nothing was sent
        assert len(run_traces(svc)) == 100


# -- --log-level --------------------------------------------------------------------


def test_log_level_reaches_the_log_of_a_client_command(svc):
    argv = ["get", "t-1", "--json", *connection(svc)]
    quiet = subprocess.run([*PRIME_TRACES, *argv], check=False, capture_output=True, timeout=WAIT_S)
    assert (quiet.returncode, quiet.stderr) == (0, b"")
    chatty = subprocess.run(
        [*PRIME_TRACES, "--log-level", "debug", *argv], check=False, capture_output=True, timeout=WAIT_S
    )
    assert chatty.returncode == 0 and orjson.loads(chatty.stdout)["trace_id"] == "t-1"
    assert b" DEBUG urllib3.connectionpool: " in chatty.stderr and KEY.encode() not in chatty.stderr


# -- upload ---------------------------------------------------------------------------


def test_prime_traces_upload_of_a_file_commits_it_and_running_it_again_replays(svc, tmp_path):
    now = time.time()
    path = tmp_path / "up.jsonl"
    path.write_bytes(
        b"".join(orjson.dumps(make_trace(f"up-{i}", start=now, run_id="run-up")) + b"\n" for i in range(5))
    )
    argv = [*PRIME_TRACES, "upload", str(path), "--context", "source=cli-process", "--json", *connection(svc)]
    first = subprocess.run(argv, check=False, stdin=subprocess.DEVNULL, capture_output=True, timeout=WAIT_S)
    assert (first.returncode, first.stderr) == (0, b"")
    # One batch: the file's bytes, keyed by their digest.
    receipts = [(r["upload_id"], r["status"]) for r in orjson.loads(first.stdout)]
    assert receipts == [(hashlib.sha256(path.read_bytes()).hexdigest(), "committed")]
    with TracesClient(KEY, svc.url) as client:
        tagged = sorted(t.trace_id for t in client.iter(context={"source": "cli-process"}))
    assert tagged == [f"up-{i}" for i in range(5)]
    before = svc.stats()
    again = subprocess.run(argv, check=False, stdin=subprocess.DEVNULL, capture_output=True, timeout=WAIT_S)
    assert (again.returncode, again.stderr) == (0, b"")
    assert [(r["upload_id"], r["status"]) for r in orjson.loads(again.stdout)] == receipts
    after = svc.stats()
    assert (after["uploads"], after["replays"]) == (before["uploads"], before["replays"] + 1)  # nothing stored twice
