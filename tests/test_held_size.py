"""The memory a record holds, estimated from a bounded sample, and the meter that bounds the queue by it."""

from __future__ import annotations

import random
import sys
from typing import Any

import orjson
from _wire import episode, trace

from prime_runs._records import held_size, reasons
from prime_runs._records.held_size import MAX_NODES, held_bytes
from prime_runs._records.size_meter import LARGE_FROM_BYTES, MEASURE_EVERY, SizeMeter
from prime_runs._upload.queue import RecordQueue
from prime_runs.cli.workload import generate_episode


def _full(obj: Any, seen: set[int]) -> int:
    """Every object once, every dict key included: what the sample estimates, measured whole."""
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(_full(k, seen) + _full(v, seen) for k, v in obj.items())
    elif isinstance(obj, (list, tuple)):
        size += sum(_full(v, seen) for v in obj)
    return size


def _records() -> dict[str, Any]:
    rng = random.Random(5)
    return {
        "generated episode": generate_episode(1, target_bytes=3_000_000),
        "orjson.loads output": orjson.loads(orjson.dumps(generate_episode(2, target_bytes=3_000_000))),
        "floats": episode("e", [trace("t", info={"pad": [round(rng.random(), 6) for _ in range(100_000)]})]),
        "token ids": {"id": "x", "ids": [rng.randrange(1_000, 150_000) for _ in range(100_000)]},
        "chat": {"messages": [{"role": "user", "content": "w" * rng.randrange(10, 2000)} for _ in range(2000)]},
    }


def test_the_sampled_estimate_is_within_fifteen_percent_of_a_full_walk():
    for name, record in _records().items():
        estimate, full = held_bytes(record), _full(record, set())
        assert 0.85 < estimate / full < 1.15, (name, estimate, full)


def test_python_objects_hold_several_times_their_json():
    ratios = {name: held_bytes(r) / len(orjson.dumps(r)) for name, r in _records().items()}
    assert 1.0 < ratios["chat"] < 1.5, ratios
    assert 2.3 < ratios["generated episode"] < 3.5, ratios
    assert 3.3 < ratios["floats"] < 4.0 and 4.8 < ratios["token ids"] < 6.0, ratios


def test_a_walk_is_bounded_whatever_the_record(monkeypatch):
    walks: list[Any] = []
    real = held_size._Walk

    class Counted(real):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            walks.append(self)

    monkeypatch.setattr(held_size, "_Walk", Counted)
    deep = [[[{"k": [float(i)] * 50} for i in range(50)] for _ in range(50)] for _ in range(50)]
    assert held_bytes(deep) > 50**3 * sys.getsizeof({"k": []})
    assert walks[0].nodes <= MAX_NODES + 2


def test_shared_objects_are_not_counted():
    assert held_bytes(None) == held_bytes(True) == held_bytes(7) == 0
    assert held_bytes(10**6) == sys.getsizeof(10**6)
    short, long_key = {"k": None}, {"k" * 100: None}
    assert held_bytes(short) == sys.getsizeof(short)
    assert held_bytes(long_key) == sys.getsizeof(long_key) + sys.getsizeof("k" * 100)
    assert held_bytes(b"x" * 1000) == sys.getsizeof(b"x" * 1000)


def test_the_meter_measures_growth_at_once_and_one_record_in_a_few_otherwise():
    meter = SizeMeter()
    small = {"step": 1, "loss": 0.5}
    meter.observe(len(orjson.dumps(small)), small)
    assert meter.held_bytes == held_bytes(small) and meter.ratios[0] > 1
    floats = {"pad": [float(i) / 7 for i in range(10_000)]}
    size = len(orjson.dumps(floats))
    assert size >= LARGE_FROM_BYTES
    meter.observe(size, floats)  # larger than any before: measured, and the estimate at once
    assert meter.held_bytes == held_bytes(floats) and meter.estimate_bytes == size
    ratio = meter.ratios[1]
    chat = {"text": "w" * size}  # as large in JSON, far smaller in memory: taken at the ratio until measured
    for _ in range(MEASURE_EVERY - 1):
        meter.observe(size, chat)
    assert meter.ratios[1] == ratio
    meter.observe(size, chat)  # the class's next sample
    assert meter.ratios[1] < 1.2
    meter.observe(500)  # no object: its size
    assert meter.held_bytes >= 500


def _floats(tag: str, count: int = 20_000) -> dict[str, Any]:
    return {"id": tag, "pad": [i / 7 for i in range(count)]}


def test_a_burst_is_bounded_by_memory_from_its_first_record_though_nothing_was_encoded_yet():
    # The encoder has measured nothing (it lags behind the caller): put measures the write's first record.
    per_record = held_bytes(_floats("r0"))
    queue = RecordQueue(10_000, int(3.5 * per_record), SizeMeter())
    assert [queue.put([_floats(f"r{i}")], "episode")[0] for i in range(5)] == [True, True, True, False, False]
    assert queue.put([_floats("r5")], "episode")[1] == reasons.QUEUE_FULL_BYTES
    assert queue.meter.held_bytes == per_record


def test_a_caller_measures_nothing_while_the_encoder_keeps_up():
    meter = SizeMeter()
    queue = RecordQueue(10_000, 10**12, meter)
    row = {"step": 1, "loss": 0.5}
    assert queue.put([row], "metric")[0]  # the first write: nothing measured yet, so this one is
    first = meter.held_bytes
    assert first > 0
    for step in range(2, 5):
        meter.observe(len(orjson.dumps(row)), row)  # the worker encoded one since the last write
        before = meter.held_bytes
        assert queue.put([_floats(f"big-{step}")], "episode")[0]
        assert meter.held_bytes == before  # not measured by the caller
    assert queue.put([_floats("after-a-lag")], "episode")[0]  # nothing encoded since: measured
    assert meter.held_bytes == held_bytes(_floats("after-a-lag"))
