"""An online run's directory: empty when all goes well, the spool when not, a copy with save_local."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from pathlib import Path

import orjson
import pytest
from _run_helpers import (  # noqa: F401  (fixtures are used by name)
    FLUSH_TIMEOUT_S,
    MARKER,
    assert_buckets,
    episodes,
    gate,
    isolated,
    local_records,
    online,
)

from prime_runs._local.segment_reader import iter_entry_lines, scan
from prime_runs._local.segments import segment_files
from prime_traces.server import LocalTracesService

pytestmark = pytest.mark.timeout(120)


def test_a_healthy_online_run_leaves_nothing_on_disk(isolated, service):
    run = online(service, dir=isolated / "runs")
    assert run.log_episodes(episodes("e", 20))
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    assert run.dir is not None and not Path(run.dir).exists()
    assert not (isolated / "runs").exists()


def test_save_local_keeps_a_copy_of_every_record_and_the_run(isolated, service):
    service.faults.reject_marker = MARKER
    run = online(service, dir=isolated / "runs", save_local=True, config={"lr": 3})
    logged = episodes("e", 12, poisoned=(5,))
    assert run.log_episodes(logged)
    run.log({"reward": 1.0}, step=0)
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    local = Path(run.dir) / "local"
    copies = local_records(local, "episode")
    assert [c["id"] for c in copies] == [e["id"] for e in logged]  # the service's refusal changes no copy
    assert all(c["run"]["id"] == run.id for c in copies)
    document = orjson.loads((Path(run.dir) / "run.json").read_bytes())
    counts = {
        "_records/logged": 12,
        "_records/stored": 11,
        "_records/dropped": 0,
        "_records/failed": 1,
        "_records/spooled": 0,
        "prime_runs": {"traces_episodes_written": 11},  # an evaluation's count on the platform
    }
    assert (document["status"], document["config"], document["summary"]) == (
        "completed",
        {"lr": 3},
        {"reward": 1.0, "step": 0, **counts},
    )
    assert_buckets(run, "local", submitted=12, stored=12)
    assert_buckets(run, "traces", submitted=12, stored=11, failed={"rejected:invalid_trace": 1})
    # The one record the service refused is set aside, with the service's reason; nothing else is spooled.
    [kept] = local_records(run.dir, "rejected")
    assert (kept["id"], kept["code"]) == ("e5", "invalid_trace")
    assert local_records(run.dir, "episode") == []


def test_finish_says_what_it_kept_where_and_how_to_upload_it(isolated, tmp_path, caplog):
    with LocalTracesService(tmp_path / "db", hang_uploads=True) as hung:
        run = online(hung, dir=isolated / "runs")
        assert run.log_episodes(episodes("e", 10))
        with caplog.at_level(logging.WARNING, logger="prime_runs"):
            run.finish(timeout_s=1)
    where = str(Path(run.dir).resolve())
    said = [r.getMessage() for r in caplog.records if r.name == "prime_runs._finish.finisher"]
    assert any(
        f"10 records were not delivered (deadline: 10) and are saved in {where}; upload them with: "
        f"prime-runs sync {where}" in m
        for m in said
    ), said


def test_a_status_the_service_never_confirmed_is_kept_for_the_sync(isolated, service):
    run = online(service, dir=isolated / "runs")
    assert run.log_episodes(episodes("e", 3))
    assert run.flush(FLUSH_TIMEOUT_S)
    service.faults.latency_ms = 5_000  # the status request cannot be answered within finish()
    started = time.monotonic()
    run.finish(timeout_s=2)
    elapsed = time.monotonic() - started
    # The status request is given the time left and gives up at the deadline; run.json is written at once.
    # 0.25 s for scheduling: a deadline stretched by 40 % would not fit.
    assert 2.0 <= elapsed < 2.0 + 0.25, elapsed
    service.faults.latency_ms = 0
    document = orjson.loads((Path(run.dir) / "run.json").read_bytes())
    assert document["status"] == "completed" and document["service_url"] == service.url
    assert local_records(run.dir, "episode") == []  # every record had been delivered


def _batch_entries(run_dir: str) -> list[bytes]:
    bodies = []
    for path in segment_files(run_dir, ["episode"]):
        found = scan(path)
        for entry, lines in iter_entry_lines(path, found.entries):
            if entry.batch:
                bodies.append(b"".join(line + b"\n" for line in lines))
    return bodies


def test_an_upload_whose_answer_never_came_is_kept_as_the_very_same_bytes(isolated, tmp_path):
    keys: list[str] = []
    with LocalTracesService(tmp_path / "db", hang_uploads=True) as hung:
        hung.faults.on_upload = keys.append
        run = online(hung, dir=isolated / "runs")
        assert run.log_episodes(episodes("e", 10))
        run.finish(timeout_s=1)
    [body] = _batch_entries(run.dir)
    assert keys == [f"sha256:{hashlib.sha256(body).hexdigest()}"]


def test_records_changed_after_logging_are_kept_but_not_as_the_upload_they_went_in(isolated, tmp_path, caplog):
    arrived = threading.Event()
    with LocalTracesService(tmp_path / "db", hang_uploads=True) as hung:
        hung.faults.before_upload = arrived.set
        run = online(hung, dir=isolated / "runs")
        logged = episodes("e", 10)
        assert run.log_episodes(logged)
        assert arrived.wait(30)
        logged[3]["info"] = {"edited": True}  # the caller reuses its dicts after logging them
        with caplog.at_level(logging.WARNING, logger="prime_runs"):
            run.finish(timeout_s=1)
    assert _batch_entries(run.dir) == []
    assert len(local_records(run.dir, "episode")) == 10
    assert "changed after they were logged" in caplog.text


def test_finish_refuses_what_is_logged_while_it_waits_and_lets_a_slow_upload_finish(isolated, service, gate):
    run = online(service, dir=isolated / "runs")
    assert run.log_episodes(episodes("a", 5))
    assert gate.entered.wait(30)  # the upload is in flight, held by the service
    queue = run._worker._queue
    refusing, refuse = threading.Event(), queue.refuse

    def noted_refuse() -> None:
        refuse()
        refusing.set()

    queue.refuse = noted_refuse
    finisher = threading.Thread(target=run.finish, kwargs={"timeout_s": 30})
    finisher.start()
    try:
        assert refusing.wait(30)
        assert run.log_episodes(episodes("late", 2)) is False  # the run is ending: refused, and counted
    finally:
        gate.open()
        finisher.join(60)
    stats = run.stats()
    counts = stats["sinks"]["traces"]
    assert (counts["stored"], counts["spooled"], counts["failed"]) == (5, 0, {})
    assert stats["dropped"] == {"closed": 2}
    assert not Path(run.dir).exists()


def test_the_run_directory_stays_put_when_the_process_changes_directory(tmp_path, monkeypatch):
    started_in = Path.cwd()  # the test's own working directory (see isolated)
    with LocalTracesService(tmp_path / "db", hang_uploads=True) as hung:
        run = online(hung)  # ./prime-runs by default: here, where the run started
        assert run.log_episodes(episodes("e", 3))
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        monkeypatch.chdir(elsewhere)  # as a framework that changes directory after init() does
        run.finish(timeout_s=1)
    run_dir = started_in / "prime-runs" / run.id
    assert Path(run.dir).resolve() == run_dir
    assert len(local_records(run_dir, "episode")) == 3  # what finish() kept, where the run said it lives
    assert not (elsewhere / "prime-runs").exists()
