"""The load test's smoke run: every episode accounted for, by the service and by the run (never a time)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from _run_helpers import REPO

sys.path.insert(0, str(REPO / "tools"))
from _loadtest_floors import _lag_probe
from _loadtest_targets import _lag, _window_speedup, efficiency_bound, share_factors

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
        # Each slowest call: ms, index, own CPU ms, GC ms, waits, preemptions; the slowest first.
        slowest = row["log_slowest"]
        assert slowest[0][0] == pytest.approx(row["log_max_ms"], abs=0.01)
        assert all(len(call) == 6 and min(call) >= 0 for call in slowest)
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


def test_the_lag_target_states_the_floor_measured_without_an_sdk_and_keeps_its_verdict():
    row = {"scenario": "a", "variant": "defaults", "sdk": "ours", "lag_samples": 2000}
    floor = {"cores": 2, "lag_floor_p99_ms": 4.0, "lag_floor_max_ms": 9.5}
    floor |= {"lag_floor_alone_p99_ms": 1.0, "lag_floor_alone_max_ms": 2.5}
    text, passed = _lag([row | {"lag_p99_ms": 5.2, "lag_max_ms": 9.2}], floor)
    assert text.startswith("p99 5.2 ms, max 9.2 ms. The floor here, with no SDK:") and not passed
    assert "2 spinning processes: p99 4.0 ms, max 9.5 ms (without the spinning processes: p99 1.0 ms" in text
    assert text.endswith("ours is 1.30x the floor's p99")
    text, passed = _lag([row | {"lag_p99_ms": 4.9, "lag_max_ms": 14.9}], {})
    assert text == "p99 4.9 ms, max 14.9 ms" and passed  # no floor measured (the smoke run): the figures alone


def test_the_lag_floor_probe_runs_its_python_thread_beside_the_event_loop():
    # Orders of magnitude only: the probe must sample, and the thread it measures beside must have run.
    report = _lag_probe(0.3)
    assert report["samples"] > 10 and report["python_loops"] > 10
    assert 0.0 <= report["p99_ms"] <= report["max_ms"] < 300_000
