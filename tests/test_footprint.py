"""What records take in memory over their JSON, and the queue's pressure mark that counts it."""

from __future__ import annotations

import os
import random
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from _fork import in_child
from _run_helpers import online

from prime_runs._records.footprint import MAX_EXPANSION, expansion
from prime_runs._records.size_meter import SizeMeter
from prime_runs._sinks import link_gauge
from prime_runs._sinks.link_gauge import Behind, LinkGauge
from prime_runs._upload.queue import SPILL_AT_FRACTION, RecordQueue
from prime_runs.cli.workload import generate_episode


def held_per_json_byte(record: Any) -> float:
    """What ``record``'s objects take, each counted once (a full walk), per byte of its JSON."""
    seen: set[int] = set()
    total = 0
    stack = [record]
    while stack:
        value = stack.pop()
        shared = value is None or isinstance(value, bool) or (isinstance(value, int) and -5 <= value <= 256)
        if shared or id(value) in seen:
            continue
        seen.add(id(value))
        total += sys.getsizeof(value)
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
    return total / len(orjson.dumps(record))


SHAPES: dict[str, Callable[[], Any]] = {
    "generated episode": lambda: generate_episode(1, target_bytes=2_000_000),
    "parsed JSON": lambda: orjson.loads(orjson.dumps(generate_episode(2, target_bytes=2_000_000))),
    "token ids": lambda: {"id": "t", "tokens": [[random.randrange(150_000) for _ in range(2_000)] for _ in range(50)]},
    "floats": lambda: {"id": "f", "logprobs": [[random.random() for _ in range(2_000)] for _ in range(50)]},
    "long text": lambda: {"id": "c", "messages": [{"role": "user", "content": "word " * 20_000} for _ in range(20)]},
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_sampled_walk_is_within_a_fifth_of_what_the_objects_take(shape):
    record = SHAPES[shape]()
    truth = held_per_json_byte(record)
    estimate = expansion(record)
    assert estimate is not None
    assert 0.8 * truth <= estimate <= 1.2 * truth, (estimate, truth)


def test_shapes_differ_as_their_objects_do():
    ratios = {name: expansion(make()) for name, make in SHAPES.items()}
    assert ratios["long text"] == pytest.approx(1.0, abs=0.1)
    assert ratios["token ids"] > 4 > ratios["parsed JSON"] > 2


def test_the_walk_is_bounded_however_large_the_record():
    record = generate_episode(3, target_bytes=20_000_000)
    started = time.perf_counter()
    expansion(record)
    assert time.perf_counter() - started < 0.05  # about a millisecond; encoding the record takes ~50


def test_odd_records_give_a_ratio_in_range_or_none():
    assert expansion({}) == MAX_EXPANSION  # an empty mapping: 64 bytes for 2 of JSON, capped
    assert expansion(object()) is None
    assert 1.0 <= (expansion({"a": [[], [], {}]}) or 0) <= MAX_EXPANSION
    assert expansion(b"x" * 1000) == pytest.approx(1.0, abs=0.1)  # a record's own bytes are as large as their JSON


def test_the_meter_takes_a_larger_expansion_at_once_and_a_smaller_one_slowly():
    meter = SizeMeter()
    assert meter.expansion == 1.0 and meter.expansion_due()
    meter.observe_expansion(2.0)
    assert meter.expansion == 2.0 and not meter.expansion_due()  # the next is measured a while later
    meter.observe_expansion(5.0)
    assert meter.expansion == 5.0
    meter.observe_expansion(1.0)
    assert 1.0 < meter.expansion < 5.0


def test_the_queue_marks_half_the_bound_counted_in_memory():
    # Records of 1,000 JSON bytes that take three times that as objects: the pressure mark (half of
    # 30,000 bytes) is reached at 5 records, not at the 15 their JSON alone would need.
    meter = SizeMeter()
    meter.observe(1_000)
    meter.observe_expansion(3.0)
    queue = RecordQueue(10_000, 30_000, meter)
    for i in range(4):
        assert queue.put([{"id": f"r{i}"}], "trace")[0]
    assert not queue.memory_pressure.is_set()
    assert queue.put([{"id": "r4"}], "trace")[0]
    assert queue.memory_pressure.is_set()
    assert not queue.pressure.is_set()  # the mark in JSON bytes is still far
    assert queue.held_bytes * meter.expansion >= SPILL_AT_FRACTION * 30_000
    # The bound that drops still counts JSON bytes: the run keeps taking writes while it spools.
    assert all(queue.put([{"id": f"s{i}"}], "trace")[0] for i in range(10))


def test_the_gauge_counts_the_encoder_busy_while_it_makes_a_line_and_idle_while_the_line_waits(monkeypatch):
    monkeypatch.setattr(link_gauge, "IDLE_S", 0.0)
    gauge = LinkGauge()
    seen: list[float] = []

    def lines():
        for n in range(2):
            seen.append(gauge.idle_s())  # asked for a line: the encoder is at work
            yield n

    timed = gauge.timed(lines())
    assert next(timed) == 0
    assert seen == [0.0] and gauge.link_bound()  # the line handed over: nothing is being encoded
    assert next(timed) == 1 and seen == [0.0, 0.0]
    assert list(timed) == [] and gauge.link_bound()


def test_past_the_mark_in_memory_the_run_is_behind_only_while_the_encoder_waits_for_the_link(monkeypatch):
    monkeypatch.setattr(link_gauge, "IDLE_S", 0.0)
    pressure, memory, gauge = threading.Event(), threading.Event(), LinkGauge()
    behind = Behind(pressure, memory, gauge)
    assert not behind.is_set()
    memory.set()
    assert behind.is_set()  # idle encoder, records held in memory past the mark: the link is the limit
    latch = behind.latch()
    assert latch.is_set()
    inside: list[bool] = []

    def encoding():
        inside.append(behind.is_set())
        yield 1

    assert list(gauge.timed(encoding())) == [1]
    assert inside == [False]  # while a line is being made the CPU is the limit: disk would not help
    memory.clear()
    assert not behind.is_set()
    pressure.set()
    assert behind.is_set()  # half a bound in JSON bytes or records: disk, whatever the link
    pressure.clear()
    assert not behind.is_set() and latch.is_set()  # one upload's stop, once set, stays set


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_gets_a_gauge_no_parent_thread_holds(service):
    # A worker thread may hold the gauge's lock at the fork: the child's run must not wait on it forever.
    run = online(service)
    sink = run._worker.sinks[0]
    held = sink.link._lock
    held.acquire()
    try:

        def child() -> dict[str, Any]:
            free = sink.link._lock.acquire(timeout=1)
            if free:
                sink.link._lock.release()
            lines = list(sink.link.timed(iter([1, 2])))
            return {"free": free, "lines": lines, "fresh": sink.link._lock is not held}

        result = in_child(child)
    finally:
        held.release()
        run.finish()
    assert result == {"free": True, "lines": [1, 2], "fresh": True}
