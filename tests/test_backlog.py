"""A link slower than the run, and a preemption: the backlog waits on disk, and nothing is lost or stored twice.

Against the local service with a shared uplink (``link_mb_s``): every upload
of the run shares one link, as on a real network.
"""

from __future__ import annotations

import random
import re
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import orjson
import pytest
from _run_helpers import (  # noqa: F401  (fixtures are used by name)
    KEY,
    identity_holds,
    isolated,
    local_records,
    online,
    stored_episodes,
)
from _wire import episode, trace
from test_run_processes import first_line, script_env, spawn

from prime_runs import cli
from prime_runs._records.size_meter import SizeMeter
from prime_runs._upload.queue import CALM_BELOW_FRACTION, SPILL_AT_FRACTION, RecordQueue
from prime_traces.server import LocalTracesService

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

#: How long a preempted process has between SIGTERM and SIGKILL in these tests.
GRACE_S = 10.0


def _pads(count: int, floats: int, seed: int) -> list[list[float]]:
    rng = random.Random(seed)
    return [[round(rng.random(), 6) for _ in range(floats)] for _ in range(count)]


def _sync(service: LocalTracesService, run_dir: str | Path) -> None:
    assert cli.main(["sync", "--api-key", KEY, "--base-url", service.url, str(run_dir)]) == 0


def test_each_write_is_charged_its_size_when_queued_so_growth_does_not_inflate_what_came_before():
    meter = SizeMeter()
    queue = RecordQueue(10_000, 10_000, meter)
    meter.observe(100)  # records of 100 bytes under a bound of 10,000: a hundred fit
    assert sum(queue.put([{"id": f"s{i}"}], "trace")[0] for i in range(150)) == 100
    meter = SizeMeter()
    queue = RecordQueue(10_000, 10_000, meter)
    meter.observe(100)
    assert all(queue.put([{"id": f"s{i}"}], "trace")[0] for i in range(50))  # 5,000 bytes held
    meter.observe(1_000)  # the records grew tenfold
    results = [queue.put([{"id": f"l{i}"}], "trace")[0] for i in range(8)]
    assert results == [True] * 5 + [False] * 3  # 5,000 + 5 x 1,000; the small ones still count 100 each
    assert queue.held_bytes == queue.peak_held_bytes == 10_000


def test_the_queue_is_under_pressure_past_half_a_bound_and_calm_below_a_quarter():
    queue = RecordQueue(100, 10**12, SizeMeter())
    assert queue.put([{"id": "a"}], "trace")[0]
    half = int(100 * SPILL_AT_FRACTION)
    assert queue.put([{"id": f"b{i}"} for i in range(half - 2)], "trace")[0]
    assert not queue.pressure.is_set()
    assert queue.put([{"id": "c"}], "trace")[0]  # half the record bound held
    assert queue.pressure.is_set()
    first = queue.take(float("inf"), 0)
    queue.done(first[:1])  # one record done: still more than a quarter held
    assert queue.pressure.is_set()
    queue.done(first)
    assert queue.queued_records + queue.taken_records < 100 * CALM_BELOW_FRACTION
    assert not queue.pressure.is_set()


def test_a_link_slower_than_the_run_keeps_the_backlog_on_disk_and_drops_nothing(isolated, tmp_path, caplog):
    # 60 episodes of about 1.1 MB logged at 20 MB/s under a 30 MB bound, a 2 MB/s link, 5 s to finish:
    # the link carries part of them; the rest wait on disk instead of being dropped at the full queue.
    pads = _pads(4, 100_000, seed=1)
    logged = [f"ep-{i}" for i in range(60)]
    with LocalTracesService(tmp_path / "traces.db", link_mb_s=2) as service:
        run = online(service, dir=isolated / "runs", max_queued_bytes=30_000_000)
        pace = threading.Event()  # never set: the training loop's own pace, 20 MB/s
        for i, episode_id in enumerate(logged):
            assert run.log_episodes([episode(episode_id, [trace(f"t-{i}", info={"pad": pads[i % 4]})])])
            pace.wait(0.055)
        # What the console adds to the backlog's line, from the run's own figures.
        waiting = run.stats()
        assert waiting["held_memory_bytes"] >= waiting["held_bytes"]  # objects take at least their JSON
        assert run.console.backlog_status is not None
        assert re.fullmatch(
            r"\d+ wait on disk, uploaded from there at [\d.]+ [KMG]?B/s; \d+ in memory \(~[\d.]+ [KMG]?B\)",
            run.console.backlog_status() or "",
        )
        run.finish(timeout_s=5)
        stats = run.stats()
        counts = stats["sinks"]["traces"]
        service.faults.link_mb_s = None
        for thread in threading.enumerate():  # the drain finish() left ends with its request in flight
            if thread.name == "prime-runs-resync":
                thread.join(60)
        on_service = stored_episodes(service)
        on_disk = [r["id"] for r in local_records(run.dir, "episode")]
        assert stats["dropped"] == {} and counts["failed"] == {}
        assert counts["backlogs"] >= 1
        assert "backlog" in counts["spooled_reasons"] or counts["resynced"] > 0, counts
        # Every record is counted stored or kept on disk, and each is in one place or both: a batch whose
        # answer finish() did not wait for (abandoned at its deadline) may be committed all the same, and is
        # kept on disk with its key, so the sync below is answered as a replay.
        assert counts["stored"] < 60  # a cold first process may have none stored by the deadline
        assert counts["spooled"] == 60 - counts["stored"], counts
        assert all(copies == 1 for copies in on_service.values()), on_service
        assert counts["stored"] <= len(on_service)
        assert set(on_service) | set(on_disk) == set(logged)
        assert identity_holds(run)
        messages = [r.getMessage() for r in caplog.records]
        assert any("slower than the run logs" in m for m in messages)
        if counts["resynced"]:
            assert any(f"of them uploaded since) are kept in {run.dir}" in m for m in messages), messages
        _sync(service, run.dir)
        assert stored_episodes(service) == {i: 1 for i in logged}


PREEMPTED = """
import random, sys
import prime_runs
from _wire import episode, trace

rng = random.Random(2)
pads = [[round(rng.random(), 6) for _ in range(20_000)] for _ in range(16)]  # about 200 KB each
run = prime_runs.init("preempted", environments=["e"], model="m", team_id="t", dir=sys.argv[1])
for i in range(400):
    run.log_episodes([episode(f"ep-{i}", [trace(f"t-{i}", info={"pad": pads[i % 16]})])])
print(run.id, flush=True)
while True:
    sys.stdin.readline() or exit()  # training goes on until the signal
"""


def test_a_preempted_run_is_on_disk_or_stored_before_the_kill_and_a_sync_makes_it_whole(tmp_path):
    # SIGTERM, SIGKILL 10 s later (a scheduler's grace period): 80 MB that a 1 MB/s link cannot carry in time.
    runs = tmp_path / "runs"
    with LocalTracesService(tmp_path / "traces.db", link_mb_s=1) as service:
        argv = [sys.executable, "-c", textwrap.dedent(PREEMPTED), str(runs)]
        proc = spawn(argv, service, tmp_path, stdin=subprocess.PIPE)
        run_id = first_line(proc)
        proc.send_signal(signal.SIGTERM)
        try:
            _out, err = proc.communicate(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            _out, err = proc.communicate()
        on_service = stored_episodes(service)
        on_disk = {r["id"] for r in local_records(runs / run_id, "episode")}
        logged = {f"ep-{i}" for i in range(400)}
        assert all(copies == 1 for copies in on_service.values()), on_service
        assert set(on_service) | on_disk == logged, err[-3000:]
        assert len(on_disk) > 0  # the link could not have carried them all
        service.faults.link_mb_s = None
        _sync(service, runs / run_id)
        assert stored_episodes(service) == {i: 1 for i in logged}


def test_records_that_grow_against_a_hung_service_are_bounded_in_memory_and_kept_on_disk(isolated, tmp_path):
    # 2,000 records of ~250 B, then 40 of ~1 MB under a 30 MB bound: the meter follows the growth from
    # the first large record, the small ones before it keep their own size, and what the service does
    # not take waits on disk. The small ones wait in memory (the service hangs, the queue is far from full).
    pads = _pads(4, 100_000, seed=4)
    small = [episode(f"small-{i}", []) for i in range(2_000)]
    large = [episode(f"large-{i}", [trace(f"t-{i}", info={"pad": pads[i % 4]})]) for i in range(40)]
    bound = 30_000_000
    with LocalTracesService(tmp_path / "traces.db") as service:
        service.faults.hang_uploads = True
        run = online(service, dir=isolated / "runs", max_queued_bytes=bound)
        for record in small:
            assert run.log_episodes([record])
        # Never set: the training loop's own pace, 10 MB/s once they grow. Past half the bound, the writes
        # on the hung service's wire get a second (abandon_after_s) before they are kept on disk: the
        # other half holds what the run logs meanwhile.
        pace = threading.Event()
        for record in large:
            assert run.log_episodes([record])
            pace.wait(0.1)
        meter = run._worker.meter
        stats = run.stats()
        assert stats["dropped"] == {}
        assert 0 < stats["peak_held_bytes"] <= bound
        run.finish(timeout_s=2)
        # From the first large record the worker encodes, the meter holds their size (on a busy machine the
        # worker may still be on the small ones when finish() keeps everything on disk).
        # Each record is measured once, whether by the upload or as it is kept on disk.
        assert meter.observed <= len(small) + len(large)
        assert meter.estimate_bytes >= len(orjson.dumps(large[0])) or meter.observed <= len(small), meter.observed
        counts = run.stats()["sinks"]["traces"]
        assert run.stats()["dropped"] == {} and counts["failed"] == {}
        on_disk = [r["id"] for r in local_records(run.dir, "episode")]
        logged = [r["id"] for r in small + large]
        assert sorted(on_disk) == sorted(logged) and counts["spooled"] == len(logged)
    for thread in threading.enumerate():  # the drain finish() left ends once the hung service is gone
        if thread.name == "prime-runs-resync":
            thread.join(60)
    with LocalTracesService(tmp_path / "healthy.db") as healthy:
        _sync(healthy, run.dir)
        assert stored_episodes(healthy) == {i: 1 for i in logged}


#: What a run holds besides its records, stated in the README: the encoder's and the uploads' buffers,
#: the episode the caller is generating, and what the allocator keeps after they are freed.
MEMORY_CONSTANT_BYTES = 150_000_000
#: The issue's allowance over the bound.
OVER_BOUND = 1.15

MEMORY = """
import json, os, sys, threading
import prime_runs
from prime_runs.cli.workload import generate_episode

page = os.sysconf("SC_PAGE_SIZE")
def rss():
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * page
run = prime_runs.init("memory", environments=["e"], dir=sys.argv[1], console="off", handle_signals=False,
                      max_queued_bytes=int(sys.argv[2]))
start = rss()
peak, done = [start], threading.Event()
def sample():
    while not done.wait(0.005):
        peak[0] = max(peak[0], rss())
sampler = threading.Thread(target=sample, daemon=True)
sampler.start()
for i in range(40):
    episode = generate_episode(i, target_bytes=10_000_000)  # ~0.5 s each: the loop's own pace
    episode["id"] = f"ep-{i}"
    run.log_episodes([episode])
    del episode
run.finish(timeout_s=3)
done.set()
sampler.join()
stats = run.stats()
traces = stats["sinks"]["traces"]
print(json.dumps({"above": peak[0] - start, "dropped": stats["dropped"], "failed": traces["failed"],
                  "stored": traces["stored"], "spooled": traces["spooled"], "peak_held": stats["peak_held_bytes"]}))
"""


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads RSS from /proc")
def test_generated_episodes_over_a_slow_link_are_all_kept_within_the_bounds_memory_and_a_constant(tmp_path):
    # 40 generated episodes of 10 MB (28 MB each as Python objects), each dropped by the caller once
    # logged, under a 200 MB bound, over a 1 MB/s link: all kept, and RSS above the start within the
    # bound and 15 %, plus the stated constant (measured: 320 MB; 650 to 750 MB when the queue counted
    # JSON bytes alone and so held 2.8 times the bound's worth of objects before it went to disk).
    bound = 200_000_000
    with LocalTracesService(tmp_path / "traces.db", link_mb_s=1) as service:
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(MEMORY), str(tmp_path / "runs"), str(bound)],
            env=script_env(service, tmp_path),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        result = orjson.loads(done.stdout.strip().splitlines()[-1])
    assert result["dropped"] == {} and result["failed"] == {}, result
    assert result["stored"] + result["spooled"] == 40, result
    assert 0 < result["peak_held"] <= bound, result
    assert result["above"] <= OVER_BOUND * bound + MEMORY_CONSTANT_BYTES, result
