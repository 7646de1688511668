"""``prime_runs.init()`` and ``Run`` end to end, over real HTTP to the local service.

Background work is synchronised on the service's ``before_upload`` gate and on
``run.flush()``; every test checks the accounting identity of its run.
"""

from __future__ import annotations

import asyncio
import copy
import os
import select
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from _run_helpers import (  # noqa: F401  (fixtures are used by name)
    ENV_NAMES,
    FLUSH_TIMEOUT_S,
    GATE_TIMEOUT_S,
    KEY,
    MARKER,
    REPO,
    Gate,
    assert_buckets,
    episodes,
    gate,
    get_run,
    identity_holds,
    isolated,
    list_runs,
    local_records,
    no_disk,
    online,
    sink_counts,
    stored_episodes,
)
from _wire import episode, trace

import prime_runs
from prime_runs import Run

pytestmark = pytest.mark.timeout(60)


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
    assert_buckets(run, submitted=0, stored=0)


def test_offline_is_the_default_when_nothing_is_configured(isolated):
    run = prime_runs.init(
        "offline-run",
        environments=["e"],
        model="m",
        team_id="t",
        kind="eval",
        handle_signals=False,
    )
    assert run.mode == "offline"
    assert run.url is None
    assert run.log_episodes(episodes("e", 3, members=2))
    assert run.log_traces([trace("bare-1"), trace("bare-2")])
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    run_dir = isolated / "prime-runs" / run.id
    assert Path(run.dir).resolve() == run_dir
    envelopes = local_records(run_dir, "episode")
    bare = local_records(run_dir, "trace")
    assert [e["id"] for e in envelopes] == ["e0", "e1", "e2"]
    assert [t["id"] for t in bare] == ["bare-1", "bare-2"]
    stamp = {"id": run.id, "type": "eval"}
    for doc in [*envelopes, *bare, *(m for e in envelopes for m in e["traces"])]:
        assert {k: doc["run"][k] for k in ("id", "type")} == stamp
    assert_buckets(run, "offline", submitted=5, stored=5)


def test_a_config_file_in_home_counts_as_configured(isolated, service, tmp_path):
    # The isolation fixture points HOME at an empty directory; a key there makes the default online.
    config = Path(os.environ["HOME"]) / ".prime" / "config.json"
    config.parent.mkdir()
    config.write_text(orjson.dumps({"api_key": KEY, "traces_url": service.url}).decode())
    run = prime_runs.init("from-file", environments=["e"], model="m", team_id="t", handle_signals=False)
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
    with pytest.raises(prime_runs.ConfigurationError, match="PRIME_RUNS_MODE"):
        prime_runs.init("x", environments=["e"], model="m", team_id="t", handle_signals=False)


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


def test_log_episodes_never_blocks_and_counts_every_drop(service, gate, tmp_path):
    records = episodes("e", 10_000)
    run = online(service, max_queued_records=20, dir=no_disk(tmp_path))
    assert run.log_episodes(records[:1])
    assert gate.entered.wait(GATE_TIMEOUT_S)  # the worker holds one write in the service; the queue is empty
    slowest = 0.0
    results = []
    for record in records[1:]:
        started = time.perf_counter()
        results.append(run.log_episodes([record]))
        slowest = max(slowest, time.perf_counter() - started)
    assert slowest < 0.5, slowest  # an order of magnitude, not a benchmark: it never waits on the gate
    # The queue holds 20; the worker may take one more write (what was queued when it took it) while
    # the held one waits for its answer, and no more: at most two writes are in progress.
    accepted = [f"e{i}" for i, ok in enumerate(results, start=1) if ok]
    assert results[:20] == [True] * 20 and 20 <= len(accepted) <= 40, len(accepted)
    dropped = 9_999 - len(accepted)
    assert run.dropped_records == dropped
    assert run.stats()["dropped"] == {"queue_full_records": dropped}
    gate.open()
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    assert sorted(stored_episodes(service)) == sorted(["e0", *accepted])
    assert run.failed_records == {}
    assert_buckets(run, submitted=10_000, stored=1 + len(accepted), dropped={"queue_full_records": dropped})


def test_log_episodes_costs_the_same_for_a_35_mb_record_as_for_a_1_kb_one(service, gate):  # a fixture
    small = episodes("small", 1)[0]
    big = episode("big", [trace("big-t", info={"text": "x" * 35_000_000})])  # one 35 MB string, logged again and again
    run = online(service, console="off")
    assert run.log_episodes([small])
    assert gate.entered.wait(GATE_TIMEOUT_S)  # the worker is held in the service: the timed calls only queue
    costs: dict[str, list[float]] = {"small": [], "big": []}
    try:
        for _ in range(9):
            for name, record in (("small", small), ("big", big)):
                started = time.perf_counter()
                accepted = run.log_episodes([record])
                costs[name].append(time.perf_counter() - started)
                assert accepted
    finally:
        run.finish(timeout_s=1)  # the service still holds the first upload: all is written to the run directory
    # The caller queues references; encoding them there would make the big one over 1000 times dearer.
    ratio = statistics.median(costs["big"]) / statistics.median(costs["small"])
    assert ratio < 5, costs
    assert_buckets(run, submitted=19, stored=0, spooled={"deadline": 19})


def test_a_small_write_is_flushed_promptly(service):
    run = online(service)
    assert run.log_episodes(episodes("warm", 1)) and run.flush(FLUSH_TIMEOUT_S)  # connection set up
    # The service answers in two writes (headers, then body): behind Nagle each
    # keep-alive answer would wait ~40 ms for a delayed ACK. Checked on the
    # sockets themselves, as a timing bound that tight would flake under load.
    server = service._server
    assert server is not None
    with server._conn_lock:
        accepted = list(server._connections)
    assert accepted  # the worker's keep-alive connection is still open
    assert all(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for conn in accepted)
    waits = []
    for i in range(9):
        assert run.log_episodes(episodes(f"s{i}-", 1))
        started = time.perf_counter()
        assert run.flush(FLUSH_TIMEOUT_S)
        waits.append(time.perf_counter() - started)
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    # A worker that does not wake on submit sleeps until its next tick (10 s);
    # loopback round trips take milliseconds. An order of magnitude, not a benchmark.
    assert sorted(waits)[4] < 0.2, waits
    assert_buckets(run, submitted=10, stored=10)


def test_a_write_larger_than_the_bound_fits_an_empty_queue_only(service, gate, tmp_path):
    run = online(service, max_queued_records=10, dir=no_disk(tmp_path))
    gate.open()
    assert run.log_episodes(episodes("warm", 1)) and run.flush(FLUSH_TIMEOUT_S)  # codings known, window of two
    gate.close()
    # Two writes held in the service: the worker takes no third, so what is queued next stays queued.
    assert run.log_episodes(episodes("h", 1)) and gate.wait_arrivals(2)
    assert run.log_episodes(episodes("i", 1)) and gate.wait_arrivals(3)
    assert run.log_episodes(episodes("big", 50)) is True  # the queue is empty: 50 > 10 still fits
    assert run.log_episodes(episodes("late", 1)) is False  # but nothing fits beside it
    gate.open()
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    assert sorted(stored_episodes(service)) == sorted(["warm0", "h0", "i0", *(f"big{i}" for i in range(50))])
    assert_buckets(run, submitted=54, stored=53, dropped={"queue_full_records": 1})


def fixed_trace(trace_id: str) -> dict[str, Any]:
    """A trace whose encoded size depends only on ``len(trace_id)`` (no clock in it)."""
    now = float(int(time.time()))  # ten digits and ".0" until 2286
    doc = trace(trace_id)
    doc["timing"] = {"start": now, "scoring": {"start": now + 0.5, "end": now + 0.75}}
    doc["calls"][0]["time"] = {"start": now, "end": now + 0.5}
    return doc


def test_the_queue_refuses_by_bytes_before_records(service, gate, tmp_path):
    run_id = "run-bytes-0001"
    stamped = fixed_trace("t-000")
    stamped["run"] = {**stamped["run"], "id": run_id}  # the trace's own type is kept
    line_bytes = len(orjson.dumps(stamped)) + 1
    # Ten records fit by bytes, while the record bound (1000) is far away.
    gate.open()
    run = online(
        service,
        id=run_id,
        max_queued_records=1_000,
        max_queued_bytes=10 * line_bytes + line_bytes // 2,
        dir=no_disk(tmp_path),
    )
    assert run.log_traces([fixed_trace("t-000")])
    assert run.flush(FLUSH_TIMEOUT_S)  # the size meter has seen a record now
    assert run._worker.meter.mean_bytes == run._worker.meter.estimate_bytes == line_bytes
    gate.close()
    assert run.log_traces([fixed_trace("t-001")])
    assert gate.entered.wait(GATE_TIMEOUT_S)
    results = [run.log_traces([fixed_trace(f"t-{i:03d}")]) for i in range(2, 22)]
    assert results == [True] * 9 + [False] * 11  # the record in flight is held too: 1 + 9
    assert run.stats()["dropped"] == {"queue_full_bytes": 11}
    gate.open()
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    assert_buckets(run, submitted=22, stored=11, dropped={"queue_full_bytes": 11})


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
    assert_buckets(run, submitted=500, stored=499, failed={"rejected:invalid_trace": 1})


def test_a_503_refusal_storm_is_backpressure_and_loses_nothing(service):
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
    # Refusals spend no attempt and never strike: every record is stored, once.
    assert stored == {r["id"]: 1 for r in records}
    assert counts["stored"] == 200 and counts["failed"] == {} and counts["spooled"] == 0
    assert run.stats()["retired_sinks"] == []
    stats = service.stats()
    assert stats["upload_attempts"] > stats["uploads"] + 5  # the storm did refuse uploads
    assert_buckets(run, submitted=200, stored=200)


# -- bounded finish ------------------------------------------------------------------

# finish(timeout_s) returns by its deadline, plus 0.5 s for a status request still in flight, plus
# the spill when records are left. Each test below asserts the time its case takes by that design,
# with this much for scheduling: a deadline stretched by 40 % would not fit.
FINISH_MARGIN_S = 0.25


def test_finish_returns_in_time_when_the_service_hangs(service):
    service.faults.hang_uploads = True
    run = online(service)
    assert run.log_episodes(episodes("e", 30))
    started = time.monotonic()
    run.finish(timeout_s=2)
    elapsed = time.monotonic() - started
    # The drain gives up at the deadline less the status's reserve (20 %): 1.6 s. The upload the
    # service holds is abandoned 0.3 s later and its records written to disk, then the status is
    # answered at once: within the timeout, give or take scheduling.
    assert 1.6 <= elapsed < 2.0 + FINISH_MARGIN_S, elapsed
    assert run.failed_records == {}
    assert len(local_records(run.dir, "episode")) == 30
    assert_buckets(run, submitted=30, stored=0, spooled={"deadline": 30})
    assert get_run(service, run.id)["status"] == "completed"  # the status is still recorded in time


HANGING_SCRIPT = """
import sys, time
sys.path.insert(0, {tests!r})
import prime_runs
from _wire import episode, trace
run = prime_runs.init("hung", environments=["e"], model="m", team_id="t", api_key="k", base_url={url!r})
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
    proc = subprocess.Popen(
        [sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
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
    finished_in = float(out.split()[1])
    assert finished_in < 2.0 + FINISH_MARGIN_S, (out, err)  # as test_finish_returns_in_time_when_the_service_hangs
    assert elapsed < finished_in + 1.0, (elapsed, out, err)  # and the process exits at once: no thread holds it


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
    assert envelopes["e0"]["run"] == {**stamp, "type": "train", "name": "keep-me"}  # its own type is kept
    assert envelopes["e1"]["run"] == stamp
    assert len(docs) == 7
    for doc_id, doc in docs.items():
        assert {k: doc["run"][k] for k in ("id", "type")} == stamp, doc_id
    assert docs["e1-t0"]["run"] == {**stamp, "name": "mine", "work": {"type": "step", "step": 4}}
    assert rows == {(run.id, "eval")}
    assert_buckets(run, submitted=4, stored=4)
