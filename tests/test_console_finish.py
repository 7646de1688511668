"""finish() on the console: progress on a terminal or in plain lines, and Ctrl-C twice to stop waiting."""

from __future__ import annotations

import os
import pty
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _run_helpers import REPO, local_records

from prime_traces.server import LocalTracesService

PRODUCER = REPO / "tests" / "_console_producer.py"
PROCESS_TIMEOUT_S = 60.0
PREFIX = "prime-runs: "


def _env() -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PRIME_", "RANK"))}
    environ["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests"), str(REPO)])
    return environ


def _start(url: str, root: Path, *args: str, **popen: Any) -> subprocess.Popen[Any]:
    return subprocess.Popen([sys.executable, str(PRODUCER), url, str(root), *args], env=_env(), **popen)


def _read_until(stream: Any, marker: str, seen: list[str]) -> str:
    """Lines of ``stream`` until one holds ``marker`` (each kept in ``seen``)."""
    while True:
        line = stream.readline()
        assert line, f"ended before {marker!r}: {seen}"
        seen.append(line)
        if marker in line:
            return line


def test_ctrl_c_twice_during_a_hung_finish_keeps_the_records_and_ends_by_sigint(tmp_path):
    with LocalTracesService(tmp_path / "db", hang_uploads=True) as hung:
        proc = _start(
            hung.url,
            tmp_path / "runs",
            "--finish-timeout",
            "120",
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        seen: list[str] = []
        try:
            run_id = re.search(r"\(id (\S+)\)", _read_until(proc.stderr, "logging run", seen)).group(1)
            _read_until(proc.stderr, "finishing: ", seen)  # finish() is waiting for the hung service
            proc.send_signal(signal.SIGINT)
            notice = _read_until(proc.stderr, "interrupted: ", seen)
            second = time.monotonic()
            proc.send_signal(signal.SIGINT)
            _out, err = proc.communicate(timeout=PROCESS_TIMEOUT_S)
            ended_after = time.monotonic() - second
        finally:
            proc.kill()
            proc.wait()
    assert "press Ctrl-C again to stop waiting" in notice
    assert proc.returncode == -signal.SIGINT, "".join(seen) + err
    assert ended_after < 10.0, ended_after  # at once, against finish()'s 120 s (a loaded machine gets room)
    assert "Traceback" not in err
    run_dir = tmp_path / "runs" / run_id
    assert sorted(e["id"] for e in local_records(run_dir, "episode")) == sorted([f"p-{i}" for i in range(20)])
    assert f"{PREFIX}  upload them with: prime-runs sync {run_dir}" in err


def test_a_terminal_sees_the_progress_redrawn_in_place(tmp_path):
    with LocalTracesService(tmp_path / "db", hang_uploads=True) as hung:
        master, slave = pty.openpty()
        proc = _start(hung.url, tmp_path / "runs", "--finish-timeout", "3", stdout=subprocess.DEVNULL, stderr=slave)
        os.close(slave)
        chunks = []
        try:
            while True:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            proc.wait(PROCESS_TIMEOUT_S)
        finally:
            os.close(master)
            proc.kill()
            proc.wait()
    text = b"".join(chunks).decode()
    redraws = text.count("\r\x1b[K" + PREFIX + "finishing: ")
    assert redraws >= 3, text  # at least a second of 0.2 s redraws
    assert re.search(r"finishing: \d+ records \(~[\d.]+ [KM]?B\) left to upload, ", text), text
    # The summary starts on a clean line.
    assert "\r\x1b[K" + PREFIX + "run 'console-producer'" in text, text


def test_a_pipe_gets_plain_progress_lines(tmp_path):
    with LocalTracesService(tmp_path / "db", hang_uploads=True) as hung:
        proc = _start(
            hung.url,
            tmp_path / "runs",
            "--finish-timeout",
            "3",
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        _out, err = proc.communicate(timeout=PROCESS_TIMEOUT_S)
    assert "\r" not in err and "\x1b" not in err
    progress = [line for line in err.splitlines() if line.startswith(PREFIX + "finishing: ")]
    assert len(progress) == 1, err  # one after a second; the next would come 10 s later


def test_the_progress_line_says_what_is_left_to_do_online_and_offline():
    from prime_runs._console.console import Console
    from prime_runs._console.summary import FinishProgress

    now = [100.0]
    stats = {"queued_records": 3, "queued_bytes": 3_000_000, "in_flight_records": 1, "sinks": {"s": {"bytes_sent": 0}}}
    lines = {}
    for action in ("upload", "write"):
        progress = FinishProgress(
            Console(enabled=False), lambda: stats, lambda: 1e6, action=action, clock=lambda: now[0]
        )
        progress._started, progress._base = now[0], 0
        lines[action] = progress.line()
    assert lines["upload"] is not None and lines["upload"].startswith("finishing: 4 records (~4.0 MB) left to upload, ")
    assert lines["write"] is not None and lines["write"].startswith("finishing: 4 records (~4.0 MB) left to write, ")
