"""``prime_runs.init()`` and ``Run`` end to end, over real HTTP to the local service.

Background work is synchronised on the service's ``before_upload`` gate and on
``run.flush()``; every test checks the accounting identity of its run.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import logging
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import requests
from _fork import in_child
from _wire import episode, trace

import prime_runs
from prime_runs import Run
from prime_traces.server import LocalTracesService

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[1]
KEY = "test-key"
GATE_TIMEOUT_S = 30.0
FLUSH_TIMEOUT_S = 30.0
MARKER = "POISON-7d41"
ENV_NAMES = ("PRIME_API_KEY", "PRIME_TRACES_URL", "PRIME_TEAM_ID", "PRIME_RUNS_MODE", "PRIME_RUN_ID", "RANK")


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path) -> Path:
    """No configuration from the machine; ``PRIME_RUN_ID`` that ``init`` exports is undone after the test."""
    for name in ENV_NAMES:
        monkeypatch.setenv(name, "")  # records the original, so teardown restores it
        monkeypatch.delenv(name)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


class Gate:
    """A ``before_upload`` hook: uploads wait (bounded) until ``open()``; ``entered`` is set on arrival.

    With ``hold_first_only`` only the first upload is held.
    """

    def __init__(self, *, hold_first_only: bool = False) -> None:
        self._open = threading.Event()
        self.entered = threading.Event()
        self.hold_first_only = hold_first_only
        self._lock = threading.Lock()
        self.arrivals = 0

    def __call__(self) -> None:
        with self._lock:
            self.arrivals += 1
            first = self.arrivals == 1
        self.entered.set()
        if first or not self.hold_first_only:
            self._open.wait(GATE_TIMEOUT_S)

    def open(self) -> None:
        self._open.set()

    def close(self) -> None:
        self.entered.clear()
        self._open.clear()


@pytest.fixture
def gate(service) -> Iterator[Gate]:
    """The service's uploads wait on this gate; it opens before the service stops."""
    hold = Gate()
    service.faults.before_upload = hold
    yield hold
    hold.open()


def online(svc: LocalTracesService, name: str = "test-run", **options: Any) -> Run:
    options.setdefault("handle_signals", False)
    return prime_runs.init(name, api_key=KEY, base_url=svc.url, **options)


def get_run(svc: LocalTracesService, run_id: str) -> dict[str, Any]:
    resp = requests.get(f"{svc.url}/api/v1/runs/{run_id}", headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    assert resp.status_code == 200, resp.text
    return resp.json()


def list_runs(svc: LocalTracesService) -> list[str]:
    resp = requests.get(f"{svc.url}/api/v1/runs", headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    assert resp.status_code == 200, resp.text
    return [item["run_id"] for item in resp.json()["items"]]


def episodes(prefix: str, count: int, poisoned: tuple[int, ...] = (), members: int = 1) -> list[dict[str, Any]]:
    """Small episodes (about 1.2 KB per member); ``poisoned`` ones carry the service's reject marker."""
    out = []
    for i in range(count):
        extra = {"info": {"note": MARKER}} if i in poisoned else {}
        out.append(episode(f"{prefix}{i}", [trace(f"{prefix}{i}-t{k}") for k in range(members)], **extra))
    return out


def stored_episodes(svc: LocalTracesService) -> dict[str, int]:
    """Stored rows per episode id (a record uploaded twice shows as 2)."""
    with svc.state.store.reader() as conn:
        return dict(conn.execute("SELECT episode_id, COUNT(*) FROM episodes GROUP BY episode_id").fetchall())


def identity_holds(run: Run, sink: str = "traces") -> bool:
    assert run._worker is not None
    return run._worker.accounting.unaccounted(sink) == 0


def sink_counts(run: Run, sink: str = "traces") -> dict[str, Any]:
    return run.stats()["sinks"][sink]


# -- init modes ----------------------------------------------------------------


def test_online_when_a_key_and_url_are_given_creates_the_run(service):
    run = online(service, "grpo-math", kind="eval", config={"lr": 1e-6, "model": "m"}, tags=["a"])
    try:
        assert run.mode == "online"
        remote = get_run(service, run.id)
        assert remote["name"] == "grpo-math"
        assert remote["kind"] == "eval"
        assert remote["status"] == "running"
        assert remote["config"] == {"lr": 1e-6, "model": "m"}
        assert remote["finished_at"] is None
        assert run.url and run.id in run.url
        assert os.environ["PRIME_RUN_ID"] == run.id  # processes it starts join this run
    finally:
        run.finish(timeout_s=FLUSH_TIMEOUT_S)
    assert identity_holds(run)


def test_offline_is_the_default_when_nothing_is_configured(isolated):
    run = prime_runs.init("offline-run", kind="eval", handle_signals=False)
    assert run.mode == "offline"
    assert run.url is None
    assert run.log_episodes(episodes("e", 3, members=2))
    assert run.log_traces([trace("bare-1"), trace("bare-2")])
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    run_dir = isolated / "prime-runs" / run.id
    assert Path(run.dir).resolve() == run_dir
    envelopes = [orjson.loads(line) for line in (run_dir / "episodes.jsonl").read_bytes().splitlines()]
    bare = [orjson.loads(line) for line in (run_dir / "traces.jsonl").read_bytes().splitlines()]
    assert [e["id"] for e in envelopes] == ["e0", "e1", "e2"]
    assert [t["id"] for t in bare] == ["bare-1", "bare-2"]
    stamp = {"id": run.id, "type": "eval"}
    for doc in [*envelopes, *bare, *(m for e in envelopes for m in e["traces"])]:
        assert {k: doc["run"][k] for k in ("id", "type")} == stamp
    assert sink_counts(run, "offline")["stored"] == 5
    assert identity_holds(run, "offline")


def test_a_config_file_in_home_counts_as_configured(isolated, service, tmp_path):
    # The isolation fixture points HOME at an empty directory; a key there makes the default online.
    config = Path(os.environ["HOME"]) / ".prime" / "config.json"
    config.parent.mkdir()
    config.write_text(orjson.dumps({"api_key": KEY, "traces_url": service.url}).decode())
    run = prime_runs.init("from-file", handle_signals=False)
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    assert run.mode == "online"
    assert get_run(service, run.id)["status"] == "completed"


@pytest.mark.parametrize("env_mode", ["offline", "disabled"])
def test_PRIME_RUNS_MODE_overrides_the_default(service, monkeypatch, isolated, env_mode):
    monkeypatch.setenv("PRIME_RUNS_MODE", env_mode)
    run = online(service)  # a key and URL would make it online
    assert run.log_episodes(episodes("e", 2))
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    assert run.mode == env_mode
    assert list_runs(service) == []  # nothing was created on the service
    assert stored_episodes(service) == {}
    assert (isolated / "prime-runs").exists() == (env_mode == "offline")


def test_an_unknown_PRIME_RUNS_MODE_is_refused(monkeypatch):
    monkeypatch.setenv("PRIME_RUNS_MODE", "bogus")
    with pytest.raises(ValueError, match="PRIME_RUNS_MODE"):
        prime_runs.init("x", handle_signals=False)


@pytest.mark.parametrize(("env_mode", "mode"), [("offline", "online"), ("online", "disabled"), ("disabled", "offline")])
def test_the_mode_argument_overrides_the_environment(service, monkeypatch, isolated, env_mode, mode):
    monkeypatch.setenv("PRIME_RUNS_MODE", env_mode)
    run = online(service, mode=mode)
    assert run.log_episodes(episodes("e", 2))
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    assert run.mode == mode
    assert (list_runs(service) == [run.id]) == (mode == "online")
    assert (isolated / "prime-runs").exists() == (mode == "offline")


def test_disabled_is_a_no_op_with_the_same_shape(isolated):
    threads_before = set(threading.enumerate())
    run = prime_runs.init("quiet", mode="disabled", config={"a": 1}, handle_signals=False)
    assert isinstance(run, Run)
    assert run.mode == "disabled"
    assert run.log_episodes(episodes("e", 3)) is True
    assert run.log_traces([trace("t")]) is True
    run.log({"loss": 1.0}, step=3)
    run.update_config({"b": 2})
    run.update_summary({"c": 3})
    assert run.flush(timeout_s=1) is True
    assert set(threading.enumerate()) - threads_before == set()  # no worker started
    assert asyncio.run(run.aflush(1)) is True
    assert run.stats() == {}
    assert run.dropped_records == 0
    assert run.failed_records == {}
    run.finish()
    run.finish()  # twice is fine too
    assert run.status == "completed"
    with prime_runs.init("quiet-2", mode="disabled", handle_signals=False) as other:
        other.log_episodes(episodes("x", 1))
    assert other.status == "completed"
    assert list(isolated.iterdir()) == []  # nothing written


# -- never blocks, bounded by records and bytes ------------------------------------


def test_log_episodes_never_blocks_and_counts_every_drop(service, gate):
    records = episodes("e", 10_000)
    run = online(service, max_queued_records=20)
    assert run.log_episodes(records[:1])
    assert gate.entered.wait(GATE_TIMEOUT_S)  # the worker holds one write in the service; the queue is empty
    slowest = 0.0
    results = []
    for record in records[1:]:
        started = time.perf_counter()
        results.append(run.log_episodes([record]))
        slowest = max(slowest, time.perf_counter() - started)
    assert slowest < 0.5, slowest  # an order of magnitude, not a benchmark: it never waits on the gate
    assert results == [True] * 20 + [False] * 9_979
    assert run.dropped_records == 9_979
    assert run.stats()["dropped"] == {"queue_full_records": 9_979}
    gate.open()
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    assert sorted(stored_episodes(service)) == sorted(f"e{i}" for i in range(21))
    assert sink_counts(run)["stored"] == 21
    assert run.failed_records == {}
    assert identity_holds(run)


def test_a_small_write_is_flushed_promptly(service):
    run = online(service)
    assert run.log_episodes(episodes("warm", 1)) and run.flush(FLUSH_TIMEOUT_S)  # connection set up
    waits = []
    for i in range(9):
        assert run.log_episodes(episodes(f"s{i}-", 1))
        started = time.perf_counter()
        assert run.flush(FLUSH_TIMEOUT_S)
        waits.append(time.perf_counter() - started)
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    # Loopback round trips take a few milliseconds; a delayed ACK behind Nagle takes 40.
    assert sorted(waits)[4] < 0.025, waits
    assert identity_holds(run)


def test_a_write_larger_than_the_bound_fits_an_empty_queue_only(service, gate):
    run = online(service, max_queued_records=10)
    assert run.log_episodes(episodes("h", 1))
    assert gate.entered.wait(GATE_TIMEOUT_S)
    assert run.log_episodes(episodes("big", 50)) is True  # the queue is empty: 50 > 10 still fits
    assert run.log_episodes(episodes("late", 1)) is False  # but nothing fits beside it
    gate.open()
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    assert len(stored_episodes(service)) == 51
    assert run.stats()["dropped"] == {"queue_full_records": 1}
    assert identity_holds(run)


def fixed_trace(id: str) -> dict[str, Any]:
    """A trace whose encoded size depends only on ``len(id)`` (no clock in it)."""
    now = float(int(time.time()))  # ten digits and ".0" until 2286
    doc = trace(id)
    doc["timing"] = {"start": now, "scoring": {"start": now + 0.5, "end": now + 0.75}}
    doc["calls"][0]["time"] = {"start": now, "end": now + 0.5}
    return doc


def test_the_queue_refuses_by_bytes_before_records(service, gate):
    run_id = "run-bytes-0001"
    stamped = fixed_trace("t-000")
    stamped["run"] = {**stamped["run"], "id": run_id, "type": "train"}
    line_bytes = len(orjson.dumps(stamped)) + 1
    # Ten records fit by bytes, while the record bound (1000) is far away.
    gate.open()
    run = online(service, id=run_id, max_queued_records=1_000, max_queued_bytes=10 * line_bytes + line_bytes // 2)
    assert run.log_traces([fixed_trace("t-000")])
    assert run.flush(FLUSH_TIMEOUT_S)  # the size meter has seen a record now
    assert run._worker.meter.mean_bytes == line_bytes
    gate.close()
    assert run.log_traces([fixed_trace("t-001")])
    assert gate.entered.wait(GATE_TIMEOUT_S)
    results = [run.log_traces([fixed_trace(f"t-{i:03d}")]) for i in range(2, 22)]
    assert results == [True] * 10 + [False] * 10
    assert run.stats()["dropped"] == {"queue_full_bytes": 10}
    gate.open()
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    assert sink_counts(run)["stored"] == 12
    assert identity_holds(run)


# -- per-record failures ---------------------------------------------------------


@pytest.mark.parametrize("omit_line", [False, True], ids=["located", "bisected"])
def test_one_bad_record_loses_only_itself(service, omit_line):
    service.faults.reject_marker = MARKER
    service.faults.reject_omit_line = omit_line
    records = episodes("e", 500, poisoned=(321,))
    run = online(service)
    for start in range(0, 500, 100):
        assert run.log_episodes(records[start : start + 100])
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    stored = stored_episodes(service)
    assert len(stored) == 499 and "e321" not in stored
    assert set(stored.values()) == {1}  # nothing stored twice
    assert get_run(service, run.id)["episode_count"] == 499  # the read API agrees, by the stamped run id
    assert run.failed_records == {"traces": 1}
    assert sink_counts(run)["failed"] == {"rejected:invalid_trace": 1}
    assert sink_counts(run)["stored"] == 499
    assert identity_holds(run)


def test_a_503_storm_keeps_the_accounting_identity(service):
    service.faults.fail_fraction = 0.5
    service.faults.fail_status = 503
    service.faults.fail_retry_after_s = 0
    records = episodes("e", 200)
    run = online(service)
    for start in range(0, 200, 10):
        assert run.log_episodes(records[start : start + 10])
        assert run.flush(FLUSH_TIMEOUT_S)  # one write per batch, so each meets the storm on its own
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    counts = sink_counts(run)
    stored = stored_episodes(service)
    assert set(stored.values()) <= {1}
    assert counts["stored"] == len(stored)
    assert counts["stored"] + sum(counts["failed"].values()) == 200
    assert set(counts["failed"]) <= {"transient", "sink_retired"}
    stats = service.stats()
    assert stats["upload_attempts"] > stats["uploads"] + 5  # the storm did refuse uploads
    assert identity_holds(run)


# -- bounded finish ------------------------------------------------------------------


def test_finish_returns_in_time_when_the_service_hangs(service):
    service.faults.hang_uploads = True
    run = online(service)
    assert run.log_episodes(episodes("e", 30))
    started = time.monotonic()
    run.finish(timeout_s=2)
    elapsed = time.monotonic() - started
    assert elapsed < 3.0, elapsed
    assert run.failed_records == {"traces": 30}
    assert sink_counts(run)["failed"] == {"deadline": 30}
    assert identity_holds(run)
    assert get_run(service, run.id)["status"] == "completed"  # the status is still recorded in time


HANGING_SCRIPT = """
import sys, time
sys.path.insert(0, {tests!r})
import prime_runs
from _wire import episode, trace
run = prime_runs.init("hung", api_key="k", base_url={url!r})
run.log_episodes([episode(f"e{{i}}", [trace(f"e{{i}}-t")]) for i in range(20)])
print("finishing", flush=True)
started = time.monotonic()
run.finish(timeout_s=2)
print(f"finished {{time.monotonic() - started:.3f}}", flush=True)
"""


def test_a_process_finishing_against_a_hung_service_exits_in_time(service):
    service.faults.hang_uploads = True
    script = HANGING_SCRIPT.format(tests=str(REPO / "tests"), url=service.url)
    env = {k: v for k, v in os.environ.items() if k not in ENV_NAMES} | {"PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready, "the script did not start"
        assert proc.stdout.readline().strip() == "finishing"
        started = time.monotonic()
        out, err = proc.communicate(timeout=10)
        elapsed = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert out.startswith("finished"), (out, err)
    assert elapsed < 4.0, (elapsed, out, err)


# -- stamping --------------------------------------------------------------------


def test_records_are_stamped_with_the_run_and_not_mutated(service):
    records = episodes("e", 3, members=2)
    records[0]["run"] = {"id": "callers-run", "type": "train", "name": "keep-me"}
    for member in records[1]["traces"]:
        member["run"] = {"name": "mine", "work": {"type": "step", "step": 4}}
    bare = [trace("bare-0")]
    before = copy.deepcopy([records, bare])
    run = online(service, kind="eval")
    assert run.log_episodes(records)
    assert run.log_traces(bare)
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    assert [records, bare] == before
    with service.state.store.reader() as conn:
        envelopes = {d["id"]: d for d in (orjson.loads(r) for (r,) in conn.execute("SELECT raw FROM episode_docs"))}
        docs = {d["id"]: d for d in (orjson.loads(r) for (r,) in conn.execute("SELECT raw FROM trace_docs"))}
        rows = {tuple(row) for row in conn.execute("SELECT run_id, run_type FROM traces")}
    stamp = {"id": run.id, "type": "eval"}
    assert envelopes["e0"]["run"] == {**stamp, "name": "keep-me"}
    assert envelopes["e1"]["run"] == stamp
    assert len(docs) == 7
    for doc_id, doc in docs.items():
        assert {k: doc["run"][k] for k in ("id", "type")} == stamp, doc_id
    assert docs["e1-t0"]["run"] == {**stamp, "name": "mine", "work": {"type": "step", "step": 4}}
    assert rows == {(run.id, "eval")}
    assert identity_holds(run)


# -- lifecycle -------------------------------------------------------------------------


def test_log_and_update_config_reach_the_run_at_finish(service):
    run = online(service, config={"lr": 1, "seed": 0})
    run.log({"loss": 1.0, "acc": 0.1}, step=1)
    run.log({"loss": 0.5}, step=2)
    run.update_config({"lr": 2})
    run.update_config({"batch": 8})
    run.finish({"final": True}, timeout_s=FLUSH_TIMEOUT_S)
    remote = get_run(service, run.id)
    assert remote["summary"] == {"loss": 0.5, "acc": 0.1, "step": 2, "final": True}
    assert remote["config"] == {"lr": 2, "seed": 0, "batch": 8}
    assert remote["status"] == "completed"
    assert remote["error"] is None and remote["finished_at"] is not None
    assert run.status == "completed"


def test_fail_records_failed_with_the_error(service):
    run = online(service)
    run.fail(ValueError("reward model diverged"), timeout_s=FLUSH_TIMEOUT_S)
    remote = get_run(service, run.id)
    assert remote["status"] == "failed"
    assert "reward model diverged" in remote["error"]
    assert run.status == "failed"


@pytest.mark.parametrize(
    ("exc", "status", "error"),
    [(None, "completed", None), (RuntimeError("bad step"), "failed", "RuntimeError: bad step"),
     (KeyboardInterrupt(), "cancelled", "KeyboardInterrupt")],
    ids=["clean", "exception", "keyboard-interrupt"],
)  # fmt: skip
def test_the_context_manager_finishes_by_how_the_block_ended(service, exc, status, error):
    run = online(service)
    expected = pytest.raises(type(exc)) if exc is not None else contextlib.nullcontext()
    with expected, run:
        run.log_episodes(episodes("e", 2))
        if exc is not None:
            raise exc
    remote = get_run(service, run.id)
    assert (remote["status"], remote["error"]) == (status, error)
    assert remote["episode_count"] == 2
    assert run.status == status
    assert identity_holds(run)




@pytest.mark.parametrize(("code", "status"), [(0, "completed"),
                                              (None, "completed"), (3, "failed")])  # fmt: skip
def test_sys_exit_in_the_context_manager_finishes_by_its_code(service, code, status):
    run = online(service)
    with pytest.raises(SystemExit), run:
        sys.exit(code)
    assert get_run(service, run.id)["status"] == status


def test_the_blocks_exception_is_not_replaced_by_a_sink_error(service):
    service.faults.reject_marker = MARKER
    run = online(service, on_error="raise")
    with pytest.raises(RuntimeError, match="training blew up"), run:
        run.log_episodes(episodes("e", 2, poisoned=(0,)))
        raise RuntimeError("training blew up")
    assert get_run(service, run.id)["status"] == "failed"
    assert identity_holds(run)


def test_finish_twice_is_a_no_op(service, caplog):
    run = online(service)
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    finished_at = get_run(service, run.id)["finished_at"]
    requests_before = service.stats()["requests"]
    with caplog.at_level(logging.WARNING, logger="prime_runs"):
        run.finish(status="failed", error="late", timeout_s=FLUSH_TIMEOUT_S)
        run.fail("later")
    assert service.stats()["requests"] == requests_before  # nothing sent
    assert run.status == "completed"
    remote = get_run(service, run.id)
    assert (remote["status"], remote["error"], remote["finished_at"]) == ("completed", None, finished_at)
    assert caplog.records == []
    assert run.log_episodes(episodes("late", 2)) is False  # refused after finish, never raised
    assert run.stats()["dropped"] == {"closed": 2}
    assert identity_holds(run)


def test_a_second_run_in_the_same_process_is_a_new_run(service):
    first = online(service, "sweep-1", config={"lr": 1})
    first.finish(timeout_s=FLUSH_TIMEOUT_S)
    second = online(service, "sweep-2", config={"lr": 2})
    assert second.log_episodes(episodes("e", 2))
    second.finish(status="failed", error="diverged", timeout_s=FLUSH_TIMEOUT_S)
    assert second.id != first.id
    assert sorted(list_runs(service)) == sorted([first.id, second.id])
    remote = get_run(service, second.id)
    assert (remote["name"], remote["config"], remote["status"]) == ("sweep-2", {"lr": 2}, "failed")
    assert get_run(service, first.id)["episode_count"] == 0


def test_finish_from_two_threads_records_one_status(service, gate, caplog):
    run = online(service)
    assert run.log_episodes(episodes("e", 5))
    assert gate.entered.wait(GATE_TIMEOUT_S)  # the first finish will wait in flush
    barrier = threading.Barrier(2, timeout=GATE_TIMEOUT_S)
    errors: list[BaseException] = []

    def finish(status: str) -> None:
        barrier.wait()
        try:
            run.finish(status=status, timeout_s=GATE_TIMEOUT_S)
        except BaseException as err:  # noqa: BLE001
            errors.append(err)

    threads = [threading.Thread(target=finish, args=(s,)) for s in ("completed", "failed")]
    with caplog.at_level(logging.WARNING, logger="prime_runs"):
        for t in threads:
            t.start()
        for t in threads:
            t.join(0.3)
        # Neither returns while the first is still flushing: the second waits for it.
        assert all(t.is_alive() for t in threads)
        gate.open()
        for t in threads:
            t.join(GATE_TIMEOUT_S)
    assert not any(t.is_alive() for t in threads) and errors == []
    remote = get_run(service, run.id)
    assert remote["status"] == run.status
    assert run.status in ("completed", "failed")
    assert [r.getMessage() for r in caplog.records] == []  # no second status sent (it would be a 409)
    assert remote["episode_count"] == 5
    assert identity_holds(run)


def _wait_for_summary(svc: LocalTracesService, run_id: str, timeout_s: float = 2.0) -> dict[str, Any]:
    """The run's summary on the service once it is not empty, or ``{}`` after ``timeout_s``.

    The updates are sent by a timer, so this waits on the service (bounded), not on a thread.
    """
    deadline = time.monotonic() + timeout_s
    pause = threading.Event()
    while True:
        summary = get_run(svc, run_id)["summary"]
        if summary or time.monotonic() > deadline:
            return summary
        pause.wait(0.02)


@pytest.fixture
def quick_updates(monkeypatch) -> None:
    monkeypatch.setattr("prime_runs._init.UPDATE_INTERVAL_S", 0.05)


def test_metrics_are_sent_on_a_timer_while_the_run_goes_on(service, quick_updates):
    run = online(service)
    assert run.log_episodes(episodes("e", 1))
    run.log({"loss": 0.25}, step=7)
    assert _wait_for_summary(service, run.id) == {"loss": 0.25, "step": 7}
    assert get_run(service, run.id)["status"] == "running"
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    assert identity_holds(run)


def test_metrics_are_sent_on_a_timer_even_before_any_episode(service, quick_updates):
    run = online(service)
    try:
        run.log({"loss": 0.25}, step=7)
        assert _wait_for_summary(service, run.id) == {"loss": 0.25, "step": 7}
    finally:
        run.finish(timeout_s=FLUSH_TIMEOUT_S)


def test_many_threads_logging_at_once_lose_nothing(service):
    run = online(service)
    barrier = threading.Barrier(4, timeout=GATE_TIMEOUT_S)

    def log(worker: int) -> None:
        barrier.wait()
        for step in range(10):
            assert run.log_episodes(episodes(f"w{worker}-s{step}-", 3))

    threads = [threading.Thread(target=log, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(GATE_TIMEOUT_S)
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    stored = stored_episodes(service)
    assert len(stored) == 120 and set(stored.values()) == {1}
    assert run.stats()["submitted"] == 120
    assert sink_counts(run)["stored"] == 120
    assert identity_holds(run)


# -- errors ----------------------------------------------------------------------------


def test_on_error_raise_raises_the_first_failure_from_flush_and_finish(service):
    service.faults.reject_marker = MARKER
    run = online(service, on_error="raise")
    assert run.log_episodes(episodes("a", 3, poisoned=(1,)))
    with pytest.raises(prime_runs.SinkError) as caught:
        run.flush(FLUSH_TIMEOUT_S)
    assert caught.value.sink == "traces"
    assert caught.value.failures == {"rejected:invalid_trace": 1}
    assert run.flush(FLUSH_TIMEOUT_S) is True  # raised once
    assert run.log_episodes(episodes("b", 2, poisoned=(0,)))
    with pytest.raises(prime_runs.SinkError):
        run.finish(timeout_s=FLUSH_TIMEOUT_S)
    remote = get_run(service, run.id)
    assert remote["status"] == "completed"  # recorded before raising
    assert remote["episode_count"] == 3
    assert identity_holds(run)


def test_on_error_warn_logs_once(service, caplog):
    service.faults.reject_marker = MARKER
    run = online(service)
    with caplog.at_level(logging.WARNING, logger="prime_runs"):
        for i in range(3):
            assert run.log_episodes(episodes(f"w{i}-", 2, poisoned=(0,)))
            assert run.flush(FLUSH_TIMEOUT_S) is True  # never raises
        run.finish(timeout_s=FLUSH_TIMEOUT_S)
    from_run = [r for r in caplog.records if r.name == "prime_runs.run"]
    assert len(from_run) == 1, [r.getMessage() for r in from_run]
    assert "rejected:invalid_trace" in from_run[0].getMessage()
    assert run.failed_records == {"traces": 3}
    assert identity_holds(run)


@pytest.mark.parametrize("bad", [{"on_error": "ignore"}, {"max_queued_records": 0}, {"max_queued_bytes": 0}],
                         ids=["on_error", "max_queued_records", "max_queued_bytes"])  # fmt: skip
def test_bad_options_are_refused_before_the_run_is_created(service, bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        online(service, **bad)
    assert list_runs(service) == []  # no run left "running" on the service for ever
    assert "PRIME_RUN_ID" not in os.environ


# -- asyncio ---------------------------------------------------------------------------


async def _probe(ticks: list[float], stop: asyncio.Event, enough: asyncio.Event) -> None:
    while not stop.is_set():
        ticks.append(time.monotonic())
        if len(ticks) >= 20:
            enough.set()
        await asyncio.sleep(0.005)


def _worst_gap(ticks: list[float]) -> float:
    return max((b - a for a, b in itertools.pairwise(ticks)), default=0.0)


def test_aflush_and_afinish_do_not_block_the_loop_and_survive_cancellation(service, gate):
    run = online(service)

    async def main() -> None:
        # aflush while the service holds the upload: the loop keeps running.
        assert run.log_episodes(episodes("a", 5))
        ticks: list[float] = []
        stop, enough = asyncio.Event(), asyncio.Event()
        probe = asyncio.create_task(_probe(ticks, stop, enough))
        waiter = asyncio.create_task(run.aflush(GATE_TIMEOUT_S))
        await asyncio.wait_for(enough.wait(), GATE_TIMEOUT_S)
        assert gate.entered.is_set() and not waiter.done()
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        # afinish likewise, and cancelling it abandons nothing.
        assert run.log_episodes(episodes("b", 5))
        ticks.clear()
        enough.clear()
        finisher = asyncio.create_task(run.afinish(timeout_s=GATE_TIMEOUT_S))
        await asyncio.wait_for(enough.wait(), GATE_TIMEOUT_S)
        assert not finisher.done()
        finisher.cancel()
        with pytest.raises(asyncio.CancelledError):
            await finisher
        stop.set()
        await probe
        assert _worst_gap(ticks) < 0.5

    asyncio.run(main())
    gate.open()
    assert run.flush(GATE_TIMEOUT_S)
    assert run._finished.wait(GATE_TIMEOUT_S)  # the cancelled afinish went on in its thread
    assert sorted(stored_episodes(service)) == sorted([*(f"a{i}" for i in range(5)), *(f"b{i}" for i in range(5))])
    assert get_run(service, run.id)["status"] == "completed"
    assert identity_holds(run)


# -- fork ------------------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_logs_its_own_records_and_never_finishes_the_run(service):
    hold = Gate(hold_first_only=True)
    service.faults.before_upload = hold
    try:
        run = online(service)
        assert run.log_episodes(episodes("p", 5))  # in the service, held
        assert hold.entered.wait(GATE_TIMEOUT_S)
        assert run.log_episodes(episodes("q", 5))  # in the parent's queue
        result = in_child(lambda: _child_body(run))
        assert result == {"submitted": 5, "stored": 5, "failed": {}, "owner": False, "run_id": run.id}
        # The child's own records landed; the parent's held and queued ones are not there yet.
        assert sorted(stored_episodes(service)) == [f"c{i}" for i in range(5)]
        assert get_run(service, run.id)["status"] == "running"
    finally:
        hold.open()
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    stored = stored_episodes(service)
    assert sorted(stored) == sorted(f"{p}{i}" for p in "pqc" for i in range(5))
    assert set(stored.values()) == {1}  # nothing uploaded twice
    remote = get_run(service, run.id)
    assert remote["status"] == "completed"
    assert sink_counts(run)["stored"] == 10
    assert identity_holds(run)


def _child_body(run: Run, flush_timeout_s: float = GATE_TIMEOUT_S) -> dict[str, Any]:
    assert run.log_episodes(episodes("c", 5))
    assert run.flush(flush_timeout_s), "the child's records were not uploaded in time"
    run.finish(timeout_s=GATE_TIMEOUT_S)  # flushes; must not finish the parent's run
    stats = run.stats()
    return {
        "submitted": stats["submitted"],
        "stored": stats["sinks"]["traces"]["stored"],
        "failed": stats["sinks"]["traces"]["failed"],
        "owner": run._owner,
        "run_id": os.environ.get("PRIME_RUN_ID"),
    }
