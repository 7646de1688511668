"""Adaptive zstd levels: up while the link is the limit, down when the CPU is, never past the ladder."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import orjson
import pytest
from _client_helpers import client_for

from prime_traces import TracesClient
from prime_traces._upload.levels import SETTLE_REQUESTS, STEP_DOWN_ABOVE, ZSTD_LADDER, AdaptiveLevel
from prime_traces.server import LocalTracesService

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from workload import generate_episode

RATIO = dict(zip(ZSTD_LADDER, (5.2, 6.3, 7.0, 8.6), strict=True))  # the workload's, as measured


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _levels() -> AdaptiveLevel:
    return AdaptiveLevel(clock=_Clock())


def _feed(levels: AdaptiveLevel, cpu_s: float, wire_s: float, requests: int, *, link: bool = True) -> list[int]:
    """Requests of 30 MB one after another; on a ``link`` the wire time shrinks with the body, else (a busy
    service) it does not. The answers come ``wire`` apart (compressing overlaps the request before)."""
    clock = levels.clock
    assert isinstance(clock, _Clock)
    seen = []
    for _ in range(requests):
        level = levels.current()
        seen.append(level)
        wire = wire_s * RATIO[1] / RATIO[level] if link else wire_s
        cpu = cpu_s * levels.cost[levels.ladder.index(level)]
        clock.now += max(wire, cpu)  # compressing overlaps the request before
        levels.observe(level, 30_000_000, cpu, wire, int(30_000_000 / RATIO[level]))
    return seen


def test_a_slow_link_climbs_the_ladder_one_rung_at_a_time_and_stops_at_its_top():
    levels = _levels()
    seen = _feed(levels, cpu_s=0.01, wire_s=2.0, requests=20)  # the wire takes 200 times the CPU
    assert seen[0] == 1 and levels.current() == ZSTD_LADDER[-1]
    assert sorted(set(seen)) == list(ZSTD_LADDER) and seen == sorted(seen)
    assert levels.snapshot() == {"zstd_level": ZSTD_LADDER[-1], "steps_up": 3, "steps_down": 0, "trials_failed": 0}


def test_a_fast_link_stays_at_level_1():
    levels = _levels()
    assert set(_feed(levels, cpu_s=0.05, wire_s=0.1, requests=50)) == {1}
    assert levels.snapshot()["steps_up"] == 0


def test_a_rung_whose_cpu_outgrows_the_wire_steps_back_down_and_settles():
    levels = _levels()
    _feed(levels, cpu_s=0.01, wire_s=2.0, requests=20)
    assert levels.current() == 9
    # The link got faster: level 9 now costs more than half the wire time.
    wire_s = 0.07 * levels.cost[-1] / STEP_DOWN_ABOVE / 1.5
    seen = _feed(levels, cpu_s=0.07, wire_s=wire_s, requests=30)
    assert levels.current() < 9 and levels.snapshot()["steps_down"] >= 1
    assert len(set(seen[-10:])) == 1  # settled, not flapping


def test_a_busy_service_that_fewer_bytes_do_not_speed_up_keeps_level_1():
    # Its time is in the wire time too, so level 3 is tried; it moves raw bytes no faster, and is left.
    levels = _levels()
    seen = _feed(levels, cpu_s=0.01, wire_s=2.0, requests=200, link=False)
    assert levels.current() in (1, 3) and seen.count(1) > len(seen) / 2  # a trial now and then, each left
    snapshot = levels.snapshot()
    assert snapshot["trials_failed"] >= 1 and snapshot["steps_up"] == snapshot["trials_failed"]


def test_an_answer_for_a_level_no_longer_current_moves_nothing():
    levels = _levels()
    _feed(levels, cpu_s=0.01, wire_s=2.0, requests=SETTLE_REQUESTS)
    assert levels.current() == 3
    for _ in range(10):
        levels.observe(1, 30_000_000, 10.0, 0.001)  # late answers of level-1 requests
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
