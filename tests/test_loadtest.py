"""The load test's smoke run: every episode accounted for, by the service and by the run (never a time)."""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import resource
import subprocess
import sys

import pytest
from _run_helpers import REPO

from prime_runs._upload.switch_interval import DEFAULT_SWITCH_INTERVAL_S

sys.path.insert(0, str(REPO / "tools"))
import _loadtest_floors
from _loadtest_floors import _lag_probe, _probe
from _loadtest_parts import _proc_page_faults
from _loadtest_targets import _lag, _log_max, _window_speedup, efficiency_bound, share_factors

pytestmark = pytest.mark.timeout(300)


def test_the_smoke_scenarios_deliver_every_good_episode_and_account_for_the_poisoned_one(tmp_path):
    out = tmp_path / "loadtest.json"
    subprocess.run(
        [sys.executable, str(REPO / "tools" / "loadtest.py"), "--smoke", "--json", str(out)],
        check=True,
        timeout=280,
        capture_output=True,
        text=True,
    )
    rows = {row["scenario"]: row for row in json.loads(out.read_text())["rows"]}
    assert sorted(rows) == ["a", "c"]
    for scenario, failed in (("a", 0), ("c", 1)):
        row = rows[scenario]
        assert row["sdk"] == "ours"
        # The service's count, the run's count, and the accounting identity, each on its own.
        assert row["delivered_all"] == row["episodes"] - failed
        assert row["stored"] == row["episodes"] - failed
        # Lost is what neither reached the service nor waits on disk: the poisoned record, reported as failed.
        assert (row["dropped"], row["failed"], row["spooled"], row["lost_all"]) == (0, failed, 0, failed)
        assert row["submitted"] == row["stored"] + row["dropped"] + row["failed"] + row["spooled"]
        assert not row["exit_killed"]
        # The upload thread (read in clock ticks) and the main thread: never more than the whole process spent.
        assert row["upload_thread_cpu_s"] >= 0 and row["main_thread_cpu_s"] > 0
        assert row["upload_thread_cpu_s"] + row["main_thread_cpu_s"] <= row["cpu_s"] + 0.02
        assert 0 <= row["log_max_without_gc_ms"] <= row["log_max_ms"]
        # Memory touched for the first time, by the producer and by the service, each counted.
        assert row["page_faults"] > 0 and row["service_page_faults_all"] > 0
        assert 0 < row["service_rss_at_start_mb_all"] <= row["service_peak_rss_mb_all"]
        # Each slowest call: ms, index, own CPU ms, GC ms, waits, preemptions; the slowest first.
        slowest = row["log_slowest"]
        assert slowest[0][0] == pytest.approx(row["log_max_ms"], abs=0.01)
        assert all(len(call) == 6 and min(call) >= 0 for call in slowest)
        # The calls over 1 ms, as the slowest (rounded to 0.01 ms) show them.
        over = min(row["log_over_1ms"], len(slowest))
        assert sum(call[0] > 1.01 for call in slowest) <= over <= sum(call[0] >= 0.99 for call in slowest)
        # Its own CPU and the collector's pauses fit inside each call (rounded to 0.01 ms).
        assert all(call[2] <= call[0] + 0.01 and call[3] <= call[0] + 0.01 for call in slowest)
    assert list(rows["c"]["failure_details"]) == ["invalid_record"]
    assert "is NaN" in next(iter(rows["c"]["failure_details"].values()))


def test_the_share_of_the_ceiling_is_exactly_efficiency_times_busy_and_the_bound_replaces_only_the_upload_thread():
    ceiling = {"client_s_per_mb": 0.005, "service_s_per_mb": 0.0025, "dumps_s_per_mb": 0.0016, "walk_s_per_mb": 0.0007}
    ceiling["ceiling_mb_s"] = 2 / (ceiling["client_s_per_mb"] + ceiling["service_s_per_mb"])
    row = {"json_bytes": 800e6, "wall_s": 5.0, "cpu_s": 7.5, "service_cpu_s_all": 2.5, "upload_thread_cpu_s": 3.5}
    efficiency, busy = share_factors(row, ceiling)
    assert efficiency == pytest.approx(6.0 / 10.0)  # 7.5 ms/MB of the ceiling's work for 800 MB, over 10 CPU-s
    assert busy == pytest.approx(10.0 / 10.0)  # 10 CPU-s over two cores for 5 s
    share = row["json_bytes"] / 1e6 / row["wall_s"] / ceiling["ceiling_mb_s"]
    assert efficiency * busy == pytest.approx(share)
    # The upload thread's 3.5 s becomes (1.6 + 0.7) ms/MB x 800 MB = 1.84 s; the other 6.5 s stay.
    assert efficiency_bound(row, ceiling) == pytest.approx(6.0 / (6.5 + 1.84))


def test_the_window_target_says_what_8_in_flight_would_need_beside_the_run_without_network():
    def row(scenario, variant, mb_s, **extra):
        base = {"scenario": scenario, "variant": variant, "sdk": "ours", "mb_s": mb_s, "json_bytes": 600e6}
        return base | {"wall_s": 600 / mb_s, "cpu_s": 3.0, "service_cpu_s_all": 1.0, "uploads_all": 20} | extra

    one = row("b", "max_in_flight=1", 100.0, wire_mb_all=80.0)  # 4 MB per batch on the wire: n = 0.14 s
    eight = row("b", "max_in_flight=8", 250.0)
    text, passed = _window_speedup([one, eight], {})
    assert "2.50x over 1 in flight; bound 3.40x" in text and not passed  # c = 4 s / 20 = 0.2 s
    assert "(a)" not in text
    text, _ = _window_speedup([one, eight, row("a", "defaults", 280.0)], {})
    asked = "0.9 of the bound asks 306 MB/s at 8 in flight, 1.09x what (a) did with no network time (280 MB/s)"
    assert text.endswith(asked)


def test_the_lag_target_states_the_floors_measured_without_an_sdk_and_keeps_its_verdict():
    row = {"scenario": "a", "sdk": "ours", "lag_samples": 2000}
    rows = [row | {"variant": "defaults", "lag_p99_ms": 5.1, "lag_max_ms": 9.1}]
    rows.append(row | {"variant": "gzip", "lag_p99_ms": 5.2, "lag_max_ms": 12.6})
    floors = {"lag_floor_spinners": 3, "lag_floor_p99_ms": 4.0, "lag_floor_max_ms": 9.5}
    floors |= {"lag_floor_busy_spinners": 2, "lag_floor_busy_p99_ms": 0.7, "lag_floor_busy_max_ms": 6.5}
    floors |= {"lag_floor_alone_p99_ms": 1.0, "lag_floor_alone_max_ms": 2.5}
    text, passed = _lag(rows, floors)
    assert not passed  # the floor explains, it never passes
    assert text == (
        "p99 5.2 ms (a gzip), max 12.6 ms. The floor here, with no SDK: the same probe beside one thread of "
        "pure Python (it lets go of the GIL within a few bytecodes once another thread has waited a switch "
        "interval for it), with one thread more than cores (3 spinning processes) p99 4.0 ms, max 9.5; with "
        "the cores busy (2) p99 0.7 ms, max 6.5; alone p99 1.0 ms, max 2.5. Ours at worst is 1.30x the first "
        "floor's p99"
    )
    text, _ = _lag(rows, floors | {"lag_floor_p99_ms": 0.0})
    assert text.endswith("alone p99 1.0 ms, max 2.5")  # no ratio to a floor of nothing
    text, passed = _lag(rows[:1], {})
    assert text == "p99 5.1 ms (a defaults), max 9.1 ms" and not passed  # no floor measured (the smoke run)
    text, passed = _lag([rows[0] | {"lag_p99_ms": 4.9, "lag_max_ms": 14.9}], {})
    assert passed


def test_the_lag_floor_probe_runs_its_python_thread_while_it_probes_at_the_runs_switch_interval():
    report = _lag_probe(0.3)
    assert report["samples"] > 10 and report["python_loops"] > 10  # loops counted while the probe ran
    assert report["switch_interval_s"] == pytest.approx(DEFAULT_SWITCH_INTERVAL_S)
    assert 0.0 <= report["p99_ms"] <= report["max_ms"]


def test_the_call_floor_probe_times_each_stand_in_call_while_its_python_and_hashing_threads_run():
    alone = _probe("call", 0.3, "0")
    beside = _probe("call", 0.3, "1")
    for report in (alone, beside):
        assert report["calls"] > 100 and report["python_loops"] > 10  # counted while the loop ran
        assert 0 < report["median_us"] <= report["max_ms"] * 1e3
    assert alone["hashed_mb"] == 0 and beside["hashed_mb"] > 0  # the hashing thread runs only when asked for


def test_the_log_target_states_the_call_floor_and_our_row_with_the_most_slow_calls_per_call():
    slowest = {"scenario": "f", "variant": "10000 x 2.2 MB", "sdk": "ours", "log_max_ms": 4.02, "episodes": 10_000}
    slowest |= {"log_slowest": [(4.02, 8927, 0.3, 0.0, 10, 0)], "log_over_1ms": 12, "log_s": 0.44}
    most = {"scenario": "e", "variant": "two credentials", "sdk": "ours", "log_max_ms": 2.5, "episodes": 1000}
    most |= {"log_slowest": [(2.5, 3, 0.1, 0.0, 3, 0)], "log_over_1ms": 6, "log_s": 21.5}
    floor = {"call_floor_seconds": 2.0, "call_floor_python_median_us": 1.24, "call_floor_median_us": 1.78}
    floor |= {"call_floor_python_max_ms": 1.43, "call_floor_python_over_1ms": 4, "call_floor_python_calls": 314_645}
    floor |= {"call_floor_max_ms": 3.35, "call_floor_over_1ms": 231, "call_floor_calls": 294_550}
    text, passed = _log_max([slowest, most], floor)
    assert not passed  # the floor explains, it never passes
    assert text.startswith("4.02 ms at worst (f 10000 x 2.2 MB)")
    assert text.endswith(
        ". The floor here, with no SDK: a stand-in for the call's path (copy the list, queue it under a "
        "condition, count under a lock: 1.2 µs at the median) called in a tight loop for 2 s with the collector "
        "off, beside one thread of pure Python: the slowest took 1.43 ms, 4 of 314,645 calls over 1 ms; beside "
        "that thread and one hashing in 1 MiB steps: the slowest took 3.35 ms, 231 of 294,550 calls over 1 ms; "
        "ours, the most per call: 6 of 1,000 calls over 1 ms (e two credentials, 21.50 s of logging)"
    )
    del most["log_over_1ms"], slowest["log_over_1ms"]  # rows from before the count was kept
    text, _ = _log_max([slowest, most], floor)
    assert text.endswith("the slowest took 3.35 ms, 231 of 294,550 calls over 1 ms")


def test_the_lag_floor_stops_its_spinning_processes_when_a_probe_fails(monkeypatch):
    started = []

    def spinners(seconds, count):
        procs = real_spinners(seconds, count)
        started.extend(procs)
        return procs

    calls = []

    def failing_probe(seconds):  # the alone setting probes, the busy one (one spinner) fails
        calls.append(seconds)
        if len(calls) == 2:
            raise RuntimeError("probe failed")
        return {"p99_ms": 1.0, "max_ms": 2.0, "samples": 100}

    real_spinners = _loadtest_floors._spinners
    monkeypatch.setattr(_loadtest_floors, "_spinners", spinners)
    monkeypatch.setattr(_loadtest_floors, "_lag_probe", failing_probe)
    monkeypatch.setattr(_loadtest_floors, "_cores", lambda: 2)
    with pytest.raises(RuntimeError, match="probe failed"):
        _loadtest_floors.measure_lag_floor(crowded_s=0.1, busy_s=0.1, alone_s=0.1)
    assert len(started) == 1 and started[0].returncode is not None  # started for the busy setting, stopped


def test_the_log_target_says_a_lone_spinning_thread_never_lost_its_core_when_no_gap_was_seen():
    row = {"scenario": "e", "variant": "two credentials", "sdk": "ours", "log_max_ms": 7.34}
    row["log_slowest"] = [(7.34, 12, 0.05, 0.0, 5, 3)]
    pauses = {"cores": 2, "seconds": 4.0, "crowded_median_ms": 4.0, "crowded_max_ms": 8.0, "pause_threshold_ms": 0.3}
    text, passed = _log_max([row], pauses | {"alone_max_ms": 0.0})
    assert "5 times waiting (the GIL, a lock) and was preempted 3 times" in text and not passed
    assert text.endswith("alone, a spinning thread never lost its core for over 0.3 ms in 4 s")
    text, _ = _log_max([row], pauses | {"alone_max_ms": 1.6})
    assert text.endswith("alone, a spinning thread lost its core for at most 1.6 ms in 4 s")


def test_page_faults_are_read_for_any_process_and_count_each_first_touch_of_a_page_again_after_it_is_dropped():
    page, pages, slack = mmap.PAGESIZE, 2048, 256  # slack: the interpreter's own allocations between reads

    def counts() -> tuple[int, int]:
        return _proc_page_faults(os.getpid()), resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    def touch(memory: mmap.mmap, drop_first: bool = False) -> tuple[int, int]:
        before = counts()
        if drop_first:  # given back to the system: the touch faults each page in again, and RSS ends where it was
            memory.madvise(mmap.MADV_DONTNEED)
        for offset in range(0, pages * page, page):
            memory[offset] = 1
        after = counts()
        return after[0] - before[0], after[1] - before[1]

    with mmap.mmap(-1, pages * page) as memory:
        with contextlib.suppress(AttributeError, OSError):  # no huge pages here: one fault per page anyway
            memory.madvise(mmap.MADV_NOHUGEPAGE)
        first = touch(memory)
        again = touch(memory)  # in memory now: no fault
        dropped = touch(memory, drop_first=True)
    for from_proc, own in (first, again, dropped):
        # /proc (how the load test reads the service) and getrusage (how the producer reads itself) agree.
        assert abs(from_proc - own) <= slack
    assert pages <= first[0] < pages + slack
    assert again[0] < slack
    assert pages <= dropped[0] < pages + slack


def test_the_paired_encoder_bench_loads_a_committed_encoder_and_times_both_on_each_record(tmp_path):
    import bench_encode_paired as paired
    import orjson

    from prime_traces._lines import encoder as _encode

    older = paired.encoder_at("HEAD", tmp_path)
    assert older.__file__ != _encode.__file__ and older.encode_record_parts is not _encode.encode_record_parts
    records = [{"id": f"r-{i}", "text": "t" * (i * 40_000), "nums": [0.5] * 3_000} for i in range(4)]
    for index, record in enumerate(records):
        assert older.encode_record(record, index) == orjson.dumps(record)
    encoders = {"older": older.encode_record_parts, "this tree": _encode.encode_record_parts}
    result = paired.compare(encoders, records, passes=2)
    assert result["older"][1:] == (1.0, 1.0, 1.0)  # its own ratio, each pass
    mean_ms, ratio, low, high = result["this tree"]
    assert mean_ms > 0 and low <= ratio <= high and 0.1 < ratio < 10
