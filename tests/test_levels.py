"""Adaptive zstd levels: up while the link is the limit, down when the CPU is, never past the ladder."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import orjson
import pytest
from _client_helpers import client_for

from prime_traces import TracesClient
from prime_traces._upload.levels import STEP_DOWN_ABOVE, ZSTD_LADDER, AdaptiveLevel
from prime_traces.server import LocalTracesService

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from workload import generate_episode


def _feed(levels: AdaptiveLevel, cpu_s: float, wire_s: float, requests: int) -> list[int]:
    seen = []
    for _ in range(requests):
        level = levels.current()
        seen.append(level)
        levels.observe(level, cpu_s * levels.cost[levels.ladder.index(level)], wire_s)
    return seen


def test_a_slow_link_climbs_the_ladder_one_rung_at_a_time_and_stops_at_its_top():
    levels = AdaptiveLevel()
    seen = _feed(levels, cpu_s=0.01, wire_s=2.0, requests=20)  # the wire takes 200 times the CPU
    assert seen[0] == 1 and levels.current() == ZSTD_LADDER[-1]
    assert sorted(set(seen)) == list(ZSTD_LADDER) and seen == sorted(seen)
    assert levels.snapshot() == {"zstd_level": ZSTD_LADDER[-1], "steps_up": 3, "steps_down": 0}


def test_a_fast_link_stays_at_level_1():
    levels = AdaptiveLevel()
    assert set(_feed(levels, cpu_s=0.05, wire_s=0.1, requests=50)) == {1}
    assert levels.snapshot()["steps_up"] == 0


def test_a_rung_whose_cpu_outgrows_the_wire_steps_back_down_and_settles():
    levels = AdaptiveLevel()
    _feed(levels, cpu_s=0.01, wire_s=2.0, requests=20)
    assert levels.current() == 9
    # The link got faster: level 9 now costs more than half the wire time.
    wire_s = 0.07 * levels.cost[-1] / STEP_DOWN_ABOVE / 1.5
    seen = _feed(levels, cpu_s=0.07, wire_s=wire_s, requests=30)
    assert levels.current() < 9 and levels.snapshot()["steps_down"] >= 1
    assert len(set(seen[-10:])) == 1  # settled, not flapping


def test_an_answer_for_a_level_no_longer_current_moves_nothing():
    levels = AdaptiveLevel()
    _feed(levels, cpu_s=0.01, wire_s=2.0, requests=2)
    assert levels.current() == 3
    for _ in range(10):
        levels.observe(1, 10.0, 0.001)  # late answers of level-1 requests
    assert levels.current() == 3


@pytest.mark.slow
def test_a_client_on_a_4_mb_s_link_raises_its_level_and_a_pinned_one_does_not(tmp_path):
    now = time.time()
    lines = [orjson.dumps(generate_episode(i, target_bytes=2_000_000, now=now)) for i in range(24)]
    with LocalTracesService(tmp_path / "db", link_mb_s=4) as svc:
        with client_for(svc, max_in_flight=2, compression="zstd") as adaptive:
            adaptive.upload_lines(lines, line_format="episode", target_batch_bytes=4_000_000)
            climbed = adaptive.upload_stats()
        with client_for(svc, max_in_flight=2, compression="zstd", zstd_level=1) as pinned:
            pinned.upload_lines(lines[:4], line_format="episode", target_batch_bytes=4_000_000)
            stayed = pinned.upload_stats()
    assert climbed["zstd_level"] > 1 and climbed["steps_up"] >= 1, climbed
    assert stayed["zstd_level"] == 1 and "steps_up" not in stayed
    with pytest.raises(ValueError, match="zstd_level must be between 1 and 19"):
        TracesClient("key", "http://127.0.0.1:9", zstd_level=0)
