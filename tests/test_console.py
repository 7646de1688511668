"""The run's console: where it goes, every kind of loss named precisely, the summary, quiet when asked."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _run_helpers import FLUSH_TIMEOUT_S, KEY, REPO, episodes, get_run, isolated, online  # noqa: F401
from _wire import episode, trace

import prime_runs
from prime_runs._console.console import Console
from prime_runs._console.progress import backlog_status
from prime_runs._records import lines as _encoding
from prime_runs._records.reasons import BACKLOG
from prime_runs.errors import SinkError
from prime_traces.server import LocalTracesService

PREFIX = "prime-runs: "
PRODUCER = REPO / "tests" / "_console_producer.py"
PROCESS_TIMEOUT_S = 60.0


def console_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(PREFIX)]


class _Raises:
    id = "ep-raises"

    def to_record(self) -> dict[str, Any]:
        raise RuntimeError("tokenizer not loaded")


def _bad(kind: str) -> tuple[Any, str]:
    """A bad record, and the cause its line must name (down to the value's path)."""
    if kind == "nan":
        bad = episode("ep-bad", [trace("t-ok"), trace("t-nan", calls=[{"logprobs": [0.1] * 17 + [float("nan")]}])])
        return bad, "traces[1].calls[0].logprobs[17] is NaN; NaN and Infinity are not JSON"
    if kind == "set":
        return episode("ep-bad", [trace("t-set", info={"tags": {"a"}})]), "traces[0].info.tags is a set"
    if kind == "bytes":
        return episode("ep-bad", [trace("t-bytes", info={"raw": b"\x00"})]), "traces[0].info.raw is bytes"
    if kind == "int-key":
        return (
            episode("ep-bad", [trace("t-key", info={"by_step": {3: 1.0}})]),
            "traces[0].info.by_step has the key 3 (int); JSON keys must be strings",
        )
    if kind == "oversized":
        return episode("ep-bad", [trace("t-big", info={"blob": "x" * 5000})]), "bytes encoded, over the limit of 4000"
    assert kind == "to_record"
    return _Raises(), "to_record() raised RuntimeError: tokenizer not loaded"


@pytest.mark.parametrize("kind", ["nan", "set", "bytes", "int-key", "oversized", "to_record"])
def test_each_bad_value_gets_one_line_naming_the_record_call_position_and_path(service, capsys, monkeypatch, kind):
    monkeypatch.setattr(_encoding, "MAX_LINE_BYTES", 4000)
    bad, cause = _bad(kind)
    run = online(service, console="on", on_error="raise")
    run.log_episodes(episodes("a", 3))
    run.log_episodes(episodes("b", 2) + [bad] + episodes("c", 1))  # call 2, item 2
    with pytest.raises(SinkError) as raised:
        run.finish(timeout_s=FLUSH_TIMEOUT_S)
    named = "record 'ep-raises'" if kind == "to_record" else "record 'ep-bad'"
    where = f"{named} (log_episodes call 2, item 2): "
    lines = [line for line in console_lines(capsys.readouterr().err) if "not stored, " in line]
    assert len(lines) == 1, lines
    assert where in lines[0] and cause in lines[0]
    # The same text in the error raised and in stats().
    assert raised.value.detail is not None and raised.value.detail.startswith(where) and cause in raised.value.detail
    [detail] = run.stats()["sinks"]["traces"]["failure_details"].values()
    assert detail == raised.value.detail
    counts = run.stats()["sinks"]["traces"]
    assert counts["stored"] == 6 and sum(counts["failed"].values()) == 1


def test_the_init_line_and_the_summary_say_where_and_what(service, capsys):
    run = online(service, console="on")
    run.log_episodes(episodes("s", 4))
    run.log({"reward": 0.5}, step=1)
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    lines = console_lines(capsys.readouterr().err)
    assert lines[0] == f"{PREFIX}logging run 'test-run' (id {run.id}) to {service.url} (view at {run.url})"
    assert re.match(rf"^{PREFIX}run 'test-run' \(id {run.id}\) completed in 0:\d\d: 4 of 4 records stored \(", lines[1])
    assert lines[2] == f"{PREFIX}  reward            ▅  last 0.5  min 0.5  max 0.5  steps 1..1 (1)"
    assert len(lines) == 3
    summary = get_run(service, run.id)["summary"]
    assert summary["_records/stored"] == 4 and summary["_records/failed"] == 0 and summary["reward"] == 0.5


def test_losses_after_the_first_are_counted_at_most_once_per_interval():
    now = [100.0]
    console = Console(enabled=True, repeat_interval_s=30.0, clock=lambda: now[0], background=False)
    said: list[str] = []
    console.say = lambda message, *args, progress=False: said.append(message % args)  # type: ignore[method-assign]
    console.count_loss("failed", "traces", "invalid_record", 1, "record 'x' (log_episodes call 1, item 0): boom")
    console.count_loss("failed", "traces", "invalid_record", 4, None)
    console.count_loss("dropped", None, "queue_full_records", 16, "log_episodes call 9 (16 records) dropped: full")
    assert console._take_lines() == [
        "not stored, invalid_record: record 'x' (log_episodes call 1, item 0): boom",
        "log_episodes call 9 (16 records) dropped: full (queue_full_records)",
    ]
    assert console._due_in() == 30.0  # the counts of invalid_record wait for the interval
    now[0] += 29.0
    assert console._take_lines() == []
    now[0] += 1.0
    assert console._take_lines() == ["4 more records not stored (invalid_record) in the last 30 s; 5 in all"]
    assert console._due_in() is None
    console.close()


def test_the_backlogs_repeated_line_says_what_waits_on_disk_and_in_memory_and_how_fast_it_drains():
    now = [100.0]
    console = Console(enabled=True, repeat_interval_s=30.0, clock=lambda: now[0], background=False)
    stats: dict[str, Any] = {
        "queued_records": 12,
        "held_memory_bytes": 48_000_000,
        "sinks": {"traces": {"spooled": 240, "drain_bytes_per_s": 3_900_000.0}},
    }
    console.backlog_status = lambda: backlog_status(stats)
    console.count_loss("spooled", "traces", BACKLOG, 10, None)
    assert console._take_lines()[0].startswith("uploads are slower than the run logs")
    console.count_loss("spooled", "traces", BACKLOG, 230, None)
    console.count_loss("failed", "traces", "invalid_record", 1, None)  # a first line, before the backlog's
    now[0] += 30.0
    assert console._take_lines() == [
        "1 records not stored (invalid_record)",
        "230 more records waited on disk for the link (the run uploads them from there) (backlog) in the last "
        "30 s; 240 in all; 240 wait on disk, uploaded from there at 3.9 MB/s; 12 in memory (~48.0 MB)",
    ]
    # A status that fails leaves the line as it was.
    console.backlog_status = lambda: 1 / 0  # type: ignore[assignment,return-value]
    console.count_loss("spooled", "traces", BACKLOG, 5, None)
    now[0] += 30.0
    assert console._take_lines() == [
        "5 more records waited on disk for the link (the run uploads them from there) (backlog) in the last "
        "30 s; 245 in all"
    ]
    console.close()


def test_the_console_is_off_for_other_ranks_by_default(service, capsys, isolated, monkeypatch):
    owner = online(service, console="auto")
    monkeypatch.setenv("RANK", "1")
    other = prime_runs.init(
        environments=["e"],
        model="m",
        team_id="t",
        api_key=KEY,
        base_url=service.url,
        handle_signals=False,
        id=owner.id,
    )
    assert other.id == owner.id and not other.console.enabled
    other.log_episodes([episode("r1-bad", [trace("t", info={"x": float("inf")})])])
    other.finish(timeout_s=FLUSH_TIMEOUT_S)
    monkeypatch.delenv("RANK")
    owner.finish(timeout_s=FLUSH_TIMEOUT_S)
    err = capsys.readouterr().err
    assert "r1-bad" not in err and owner.id in err  # the owner speaks, the other rank does not
    assert other.stats()["sinks"]["traces"]["failed"] == {"invalid_record": 1}


def test_misuse_warns_once(service, capsys):
    first = online(service, console="on")
    second = online(service, console="on", name="second")
    second.finish(timeout_s=FLUSH_TIMEOUT_S)
    first.finish(timeout_s=FLUSH_TIMEOUT_S)
    for _ in range(3):
        first.log_episodes(episodes("late", 1))
        first.log({"late": 1.0})
    lines = console_lines(capsys.readouterr().err)
    assert sum("init() was called while run " in line and "is still live" in line for line in lines) == 1
    assert sum("log_episodes() was called after finish()" in line for line in lines) == 1
    assert sum("run.log() was called after finish()" in line for line in lines) == 1
    assert first.stats()["dropped"] == {"closed": 3}


def test_logging_configuration_can_silence_the_console(service, capsys):
    console_logger = logging.getLogger("prime_runs.console")
    console_logger.setLevel(logging.ERROR)
    try:
        run = online(service, console="on")
        run.finish(timeout_s=FLUSH_TIMEOUT_S)
    finally:
        console_logger.setLevel(logging.INFO)
    assert capsys.readouterr().err == ""


def _producer(
    service_url: str, root: Path, *args: str, env: dict[str, str] | None = None, **popen: Any
) -> subprocess.Popen[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PRIME_", "RANK"))}
    environ["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests"), str(REPO)])
    environ.update(env or {})
    return subprocess.Popen(
        [sys.executable, str(PRODUCER), service_url, str(root), *args], env=environ, text=True, **popen
    )


def test_a_script_with_no_logging_set_up_hears_about_a_hung_service(tmp_path):
    with LocalTracesService(tmp_path / "db", hang_uploads=True) as hung:
        url = hung.url
        proc = _producer(
            url, tmp_path / "runs", "--finish-timeout", "2", stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        out, err = proc.communicate(timeout=PROCESS_TIMEOUT_S)
    assert proc.returncode == 0, err
    lines = console_lines(err)
    assert not [line for line in err.splitlines() if line and not line.startswith(PREFIX)], err
    run_id = out.split()[-1]
    where = str(tmp_path / "runs" / run_id)
    assert lines[0].startswith(f"{PREFIX}logging run 'console-producer' (id {run_id}) to {url}")
    assert any(
        "not stored, invalid_record: record 'p-bad' (log_episodes call 2, item 1): traces[0].info.score is NaN" in line
        for line in lines
    ), err
    summary = [line for line in lines if f"(id {run_id}) completed in" in line]
    assert summary and "0 of 21 records stored" in summary[0], err
    assert f"{PREFIX}  20 not delivered (deadline 20) are kept in {where}" in lines, err
    assert f"{PREFIX}  upload them with: prime-runs sync {where}" in lines, err
    assert f"{PREFIX}  1 not stored: invalid_record 1" in lines, err


def test_console_off_leaves_stderr_empty(tmp_path):
    with LocalTracesService(tmp_path / "db", hang_uploads=True) as hung:
        proc = _producer(
            hung.url,
            tmp_path / "runs",
            "--finish-timeout",
            "2",
            env={"PRIME_RUNS_CONSOLE": "off"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        _out, err = proc.communicate(timeout=PROCESS_TIMEOUT_S)
    assert proc.returncode == 0
    assert err == ""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_that_loses_a_record_says_so(tmp_path):
    from _fork import in_child

    run = prime_runs.init("forking", mode="offline", dir=str(tmp_path), console="on")

    def child() -> list[str]:
        import io

        sys.stderr = io.StringIO()  # the console writes to the current stderr
        run.log_episodes([episode("ep-child", [trace("t-set", info={"tags": {"a"}})])])
        assert run.flush(FLUSH_TIMEOUT_S)
        run.console.close()  # writes what is pending
        return console_lines(sys.stderr.getvalue())

    lines = [line for line in in_child(child) if "not stored, " in line]
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    # The child's own accounting hears its losses (before, only the parent's did: the child lost records silently).
    assert len(lines) == 1, lines
    assert "record 'ep-child'" in lines[0] and "traces[0].info.tags is a set" in lines[0]
