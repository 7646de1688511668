"""The record encoder's chunker: how a record is sized before it is cut, and how it hands the GIL over."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from prime_traces._lines import chunker as _chunker
from prime_traces._lines import encoder as _encode
from prime_traces._lines import sizing as _sizing
from prime_traces._lines.encoder import CHUNK_THRESHOLD_BYTES, RecordEncoder, encode_record
from prime_traces._lines.parts import LineParts

sys.path.insert(0, str(Path(__file__).parents[1] / "tools"))
from workload import generate_episode

NOW = 1_750_000_000.0


@pytest.mark.parametrize("target_bytes", [300_000, 900_000, 3_000_000])
def test_a_value_plainly_too_big_for_a_piece_is_not_scanned_first(monkeypatch, target_bytes):
    # Scanning a piece's worth of a value only to descend into it and scan its parts again walked
    # 2.0-3.4 times an episode's size; a guess from its first and last items now spares most of it
    # (2.3, 1.6 and 1.5 times here).
    scanned = [0]
    real_scan = _sizing.scan

    def scan(value, limit, own_piece_items=0):
        size = real_scan(value, limit, own_piece_items)
        scanned[0] += min(size, limit + 1)
        return size

    monkeypatch.setattr(_encode, "scan", scan)
    monkeypatch.setattr(_chunker, "scan", scan)
    episode = generate_episode(3, target_bytes=target_bytes, now=NOW)
    expected = orjson.dumps(episode)
    assert encode_record(episode, 0) == expected
    assert scanned[0] <= 1.6 * len(expected) + CHUNK_THRESHOLD_BYTES  # the scan deciding to chunk may be spent


def test_a_value_sized_past_what_is_left_of_the_threshold_is_still_checked_in_full():
    # The record's own values are scanned up to what is left of the threshold; a value that fits a
    # piece but not what is left must still have every float checked before it goes into a piece.
    record = {"a": "x" * 900, "b": [1.0] * 30 + [float("nan")]}
    encoder = RecordEncoder(chunk_threshold_bytes=1000, piece_bytes=4096)
    with pytest.raises(ValueError, match=r"record 3: .*\bb\b"):
        encoder.encode(record, 3)
    fine = {"a": "x" * 900, "b": [1.0] * 31}
    assert encoder.encode(fine, 3) == orjson.dumps(fine)


def test_a_large_record_is_not_scanned_to_the_threshold_before_it_is_cut(monkeypatch):
    # An episode's traces are a few large values: a guess says so, and the record is cut at once.
    # Scanning a quarter MB of it first, to walk it again piece by piece, cost ~8% of the encoder.
    beyond_a_piece: list[int] = []  # what each scan with a limit past a piece walked
    real_scan = _sizing.scan

    def scan(value, limit, own_piece_items=0):
        size = real_scan(value, limit, own_piece_items)
        if limit > _encode.PIECE_BYTES:
            beyond_a_piece.append(min(size, limit + 1))
        return size

    monkeypatch.setattr(_encode, "scan", scan)
    monkeypatch.setattr(_chunker, "scan", scan)
    for seed in range(4):
        beyond_a_piece.clear()
        episode = generate_episode(seed, target_bytes=2_000_000, now=NOW)
        assert encode_record(episode, 0) == orjson.dumps(episode)
        assert 0 < sum(beyond_a_piece) < _encode.SMALL_RECORD_BYTES + 16_000, seed  # the envelope, not the traces


def test_a_nan_past_the_first_scan_of_a_record_dumped_whole_is_refused():
    # The first scan stops at the text; the values are then sized one by one, and the record goes in one dumps.
    record = {"text": "x" * 5000, "calls": [{"logprobs": [0.1] * 100 + [float("nan")]}]}
    with pytest.raises(ValueError, match=r"^record 7: calls\[0\]\.logprobs\[100\] is NaN"):
        encode_record(record, 7)
    fine = {"text": "x" * 5000, "calls": [{"logprobs": [0.1] * 101}]}
    assert _encode.encode_record_parts(fine, 7) == orjson.dumps(fine)  # bytes: one dumps


def test_a_record_under_the_threshold_with_a_short_list_guessed_over_it_is_chunked():
    # 60 messages, the last one long: the guess takes it for half of them (~900 KB), the record is ~38 KB.
    chat = {"id": "c", "messages": [{"role": "user", "content": "m" * 100} for _ in range(59)]}
    chat["messages"].append({"role": "assistant", "content": "a" * 30_000})
    assert _sizing.estimate(chat["messages"], CHUNK_THRESHOLD_BYTES) > CHUNK_THRESHOLD_BYTES
    assert len(orjson.dumps(chat)) < CHUNK_THRESHOLD_BYTES
    parts = _encode.encode_record_parts(chat, 0)
    assert isinstance(parts, LineParts) and b"".join(parts) == orjson.dumps(chat)


@pytest.mark.parametrize(("count", "last"), [(40, 4_000), (20, 8_000), (10, 20_000)])
def test_a_chat_whose_guess_is_over_a_piece_but_not_the_threshold_is_scanned_and_one_dumps(count, last):
    # Cut into pieces, these cost twice the CPU of one scan and one dumps.
    chat = {"id": "c", "messages": [{"role": "user", "content": "m" * 500} for _ in range(count - 1)]}
    chat["messages"].append({"role": "assistant", "content": "a" * last})
    assert _sizing.estimate(chat["messages"], _encode.PIECE_BYTES) > _encode.PIECE_BYTES > len(orjson.dumps(chat))
    assert _encode.encode_record_parts(chat, 0) == orjson.dumps(chat)  # bytes, not pieces


def test_a_wide_record_counts_its_keys_when_sized_value_by_value():
    # 40,000 small values: ~12 bytes of key each, as scan() counts them, put it past the threshold.
    wide = {f"k{i:06d}": i for i in range(40_000)}
    assert sum(_encode.item_sizes(wide, _encode.PIECE_BYTES, CHUNK_THRESHOLD_BYTES)) < CHUNK_THRESHOLD_BYTES
    parts = _encode.encode_record_parts(wide, 0)
    assert isinstance(parts, LineParts) and b"".join(parts) == orjson.dumps(wide)


def test_a_small_record_whose_size_a_guess_overshoots_is_still_one_dumps():
    # The guess takes the last message for half of them: 317 KB guessed for 29 KB. Only a scan decides.
    chat = {"messages": [{"role": "user", "content": "m" * 100} for _ in range(199)]}
    chat["messages"].append({"role": "assistant", "content": "a" * 3000})
    assert _sizing.estimate(chat["messages"], 10**9) > CHUNK_THRESHOLD_BYTES > len(orjson.dumps(chat))
    assert _encode.encode_record_parts(chat, 0) == orjson.dumps(chat)  # bytes, not pieces
    deep: list = []
    for _ in range(253):
        deep = [deep]
    too_deep = {"a": [deep, "s", "x" * 130_000]}  # one dumps refuses it, and so must the encoder
    with pytest.raises(orjson.JSONEncodeError):
        orjson.dumps(too_deep)
    with pytest.raises(TypeError, match=r"^record 0: "):
        encode_record(too_deep, 0)


def test_a_guess_at_a_size_is_cheap_and_safe_on_any_value():
    class Sized:
        size = property(lambda self: 1 / 0)  # never read: only a numpy array's size counts

    looped: list = [1.5]
    looped.append(looped)  # the guess stops after a bounded number of containers
    wide = {str(i): {"x": "y" * 10} for i in range(1000)}
    assert _sizing.estimate([Sized(), Sized()], 10**9) == 4 + 2 * _sizing.INT_BYTES
    assert _sizing.estimate(looped, 10**9) > 0
    assert len(orjson.dumps(wide)) < _sizing.estimate(wide, 10**9) < 2 * len(orjson.dumps(wide))
    assert 1000 < _sizing.estimate([wide, wide], 1000) < _sizing.estimate([wide, wide], 10**9)  # stops past the limit


@pytest.fixture
def switch_interval_5_ms() -> Iterator[None]:
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)  # CPython's default, whatever a run left
    yield
    sys.setswitchinterval(before)


def test_the_yield_hands_the_gil_to_a_thread_waiting_for_it(switch_interval_5_ms):
    # A thread spinning in Python wants the GIL all the time; each yield must let it run. (os.sched_yield
    # releases the GIL too, but returns before the waiter wakes: it ran in 0 to 33 of ~50 yields here.)
    # The best of three rounds, each yield once the spinner has run since the last one: a spinner without
    # a core cannot take the GIL, whatever the yield does (with two busy processes on the two cores, 3 of
    # 20 runs failed without that wait, 0 of 50 with it; a yield that does nothing hands over 0 of 50).
    spins, stop, started = [0], threading.Event(), threading.Event()

    def spin() -> None:
        started.set()
        while not stop.is_set():
            spins[0] += 1

    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    started.wait()
    rounds = []
    try:
        for _ in range(3):
            handed = 0
            for _ in range(50):
                # First until the spinner has run since the last yield: then it is on a core, wanting the GIL
                # again, and what the yield is asked is only to hand the GIL over (not to get it a core).
                ran = spins[0]
                while spins[0] == ran:
                    pass
                before = spins[0]
                _chunker._yield()
                handed += spins[0] != before
            rounds.append(handed)
            if handed >= 40:
                break
    finally:
        stop.set()
        spinner.join()
    assert max(rounds) >= 40, rounds


@pytest.mark.skipif(not hasattr(os, "sched_yield"), reason="the platform has no sched_yield")
def test_a_switch_interval_that_hands_the_gil_over_makes_the_yields_cheap(monkeypatch):
    sleeps: list[None] = []
    sched: list[None] = []
    monkeypatch.setattr(_chunker, "_yield", lambda: sleeps.append(None))
    monkeypatch.setattr(_chunker, "_sched_yield", lambda: sched.append(None))
    episode = generate_episode(2, target_bytes=3_000_000, now=NOW)
    before = sys.getswitchinterval()
    try:
        for interval_s in (0.0005, 0.005):
            sys.setswitchinterval(interval_s)
            assert RecordEncoder(yield_interval_s=0.001).encode(episode, 0) == orjson.dumps(episode)
            if interval_s == 0.0005:
                assert sleeps == [] and len(sched) > 0
                sched.clear()
    finally:
        sys.setswitchinterval(before)
    assert sched == [] and len(sleeps) > 0


def test_small_records_take_one_dumps_and_never_yield(monkeypatch):
    sleeps: list[None] = []
    monkeypatch.setattr(_chunker, "_yield", lambda: sleeps.append(None))
    episode = generate_episode(1, target_bytes=CHUNK_THRESHOLD_BYTES // 3, now=NOW)
    assert RecordEncoder(yield_interval_s=0).encode(episode, 0) == orjson.dumps(episode)
    assert sleeps == []


def test_chunked_path_yields_the_gil_between_bounded_pieces(monkeypatch):
    sleeps: list[None] = []
    monkeypatch.setattr(_chunker, "_yield", lambda: sleeps.append(None))
    pieces: list[int] = []

    class RecordingOrjson:
        def __getattr__(self, name):
            return getattr(orjson, name)

        @staticmethod
        def dumps(value, **kwargs):
            data = orjson.dumps(value, **kwargs)
            pieces.append(len(data))
            return data

    monkeypatch.setattr(_chunker, "orjson", RecordingOrjson())
    episode = generate_episode(2, target_bytes=3_000_000, now=NOW)
    encoded = RecordEncoder(yield_interval_s=0).encode(episode, 0)
    assert encoded == orjson.dumps(episode)
    assert len(sleeps) >= len(encoded) // _encode.PIECE_BYTES
    assert max(pieces) <= 4 * _encode.PIECE_BYTES


def test_yield_interval_spaces_the_yields(monkeypatch, switch_interval_5_ms):
    sleeps: list[None] = []
    monkeypatch.setattr(_chunker, "_yield", lambda: sleeps.append(None))
    ticks = iter(range(10**6))
    monkeypatch.setattr(_chunker.time, "perf_counter", lambda: next(ticks) * 0.0004)
    episode = generate_episode(2, target_bytes=3_000_000, now=NOW)
    RecordEncoder(yield_interval_s=0).encode(episode, 0)
    every_piece = len(sleeps)
    sleeps.clear()
    RecordEncoder(yield_interval_s=0.001).encode(episode, 0)
    # Two clock reads per piece, 0.4 ms apart: a yield about every other piece.
    assert 0 < len(sleeps) < every_piece
