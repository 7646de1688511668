"""The upload path's record encoder: byte-identical to orjson, strict, and chunked when large."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import enum
import os
import re
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar
from unittest import mock

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from prime_traces import _chunker, _encode, _sizing
from prime_traces._batching import LineParts
from prime_traces._encode import CHUNK_THRESHOLD_BYTES, RecordEncoder, encode_record

sys.path.insert(0, str(Path(__file__).parents[1] / "tools"))
from workload import generate_episode

NOW = 1_750_000_000.0
OPT = orjson.OPT_SERIALIZE_NUMPY

# Summing a generated list that mixes numpy scalars in can overflow them, which numpy reports.
pytestmark = [
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
]


class HiddenItemsDict(dict):
    """orjson reads a dict subclass's own storage, never these overrides."""

    def items(self):  # type: ignore[override]
        return iter(())

    def __iter__(self):
        return iter(())

    def values(self):  # type: ignore[override]
        return iter(())


class HiddenItemsList(list):
    def __iter__(self):
        return iter(())

    def __getitem__(self, index):  # type: ignore[override]
        raise AssertionError("orjson never indexes a list subclass")


def chunking(piece_bytes: int = 1) -> RecordEncoder:
    """An encoder that takes the chunked path for every record, in tiny pieces."""
    return RecordEncoder(chunk_threshold_bytes=0, piece_bytes=piece_bytes)


def sizing(threshold_bytes: int, piece_bytes: int = 1) -> RecordEncoder:
    """An encoder that sizes a record value by value (under tiny_limits, every record), to dump or chunk it."""
    return RecordEncoder(chunk_threshold_bytes=threshold_bytes, piece_bytes=piece_bytes)


@contextlib.contextmanager
def tiny_limits() -> Iterator[None]:
    """Shrink the chunked path's size constants so small documents reach every branch."""
    with (
        mock.patch.multiple(_chunker, _OWN_PIECE_ITEMS=3, UNPROBED_ITEMS=3, _SEGMENT_BYTES=64),
        mock.patch.object(_encode, "SMALL_RECORD_BYTES", 0),
        mock.patch.multiple(_sizing, UNPROBED_ITEMS=3, ESTIMATE_NODES=3),
    ):
        yield


finite = st.floats(allow_nan=False, allow_infinity=False)
finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
int64 = st.integers(min_value=-(2**63), max_value=2**64 - 1)
numbers = st.lists(st.one_of(int64, finite), min_size=1, max_size=12)
arrays = st.one_of(
    hnp.arrays(np.float64, hnp.array_shapes(max_dims=2, max_side=5), elements=finite),
    hnp.arrays(np.float32, hnp.array_shapes(max_dims=2, max_side=5), elements=finite32),
    hnp.arrays(np.int64, hnp.array_shapes(max_dims=2, max_side=5)),
    hnp.arrays(np.uint8, st.integers(0, 6)),
    hnp.arrays(np.bool_, st.integers(0, 6)),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    int64,
    finite,
    st.text(max_size=20),
    finite.map(np.float64),
    finite32.map(np.float32),
    st.integers(-(2**63), 2**63 - 1).map(np.int64),
    st.booleans().map(np.bool_),
    arrays,
    numbers,
)
keys = st.text(max_size=10)
documents = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=6),
        st.lists(children, max_size=4).map(tuple),
        st.lists(children, max_size=4).map(HiddenItemsList),
        st.dictionaries(keys, children, max_size=6),
        st.dictionaries(keys, children, max_size=4).map(HiddenItemsDict),
        st.dictionaries(keys, children, max_size=4).map(collections.OrderedDict),
        # Numbers at both ends and anything between: not a list of numbers after all.
        st.tuples(int64, st.lists(children, max_size=3), finite).map(lambda t: [t[0], *t[1], t[2]]),
    ),
    max_leaves=40,
)
records = st.dictionaries(keys, documents, max_size=8)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record=records, piece_bytes=st.sampled_from([1, 16, 200, 5000]))
def test_chunked_output_is_byte_identical_to_one_dumps(record, piece_bytes):
    expected = orjson.dumps(record, option=OPT)
    with tiny_limits():
        assert chunking(piece_bytes).encode(record, 0) == expected
        assert sizing(1, piece_bytes).encode(record, 0) == expected  # sized, then chunked
        assert sizing(10**6, piece_bytes).encode(record, 0) == expected  # sized, then one dumps
    assert chunking(piece_bytes).encode(record, 0) == expected
    assert encode_record(record, 0) == expected


@settings(max_examples=100, deadline=None)
@given(record=records)
def test_dict_subclass_record_encodes_like_its_storage(record):
    subclassed = HiddenItemsDict(record)
    assert encode_record(subclassed, 0) == orjson.dumps(record, option=OPT)
    assert chunking().encode(subclassed, 0) == orjson.dumps(record, option=OPT)


def test_large_workload_episode_is_byte_identical_through_both_paths():
    episode = generate_episode(3, target_bytes=2_500_000, now=NOW)
    expected = orjson.dumps(episode)
    assert len(expected) > CHUNK_THRESHOLD_BYTES
    assert encode_record(episode, 0) == expected
    assert RecordEncoder(chunk_threshold_bytes=10**12).encode(episode, 0) == expected
    assert chunking(4096).encode(episode, 0) == expected


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


@dataclasses.dataclass
class Score:
    """orjson writes a dataclass's public attributes: a NaN there would become null."""

    value: float
    _cache: float = float("nan")  # private: orjson leaves it out, so it is never refused
    unit: ClassVar[float] = float("nan")  # a class variable: left out too


@dataclasses.dataclass(slots=True)
class SlottedScore:
    value: float
    _cache: float = float("nan")


class Level(enum.Enum):
    """orjson writes a member as its value."""

    UNKNOWN = float("nan")
    GOOD = 1.0


@pytest.mark.parametrize(
    "value",
    [
        float("nan"),
        float("inf"),
        -float("inf"),
        [1.0, 2.0, float("nan")],
        [0, 1, -float("inf"), 3],
        [1, {"deep": [float("inf")]}, 2],
        [0.5] * 5000 + [float("nan")] + [0.5] * 5000,
        {"rewards": {"correctness": {"score": float("nan"), "weight": 1.0}}},
        np.array([0.0, np.nan]),
        np.array([[1.0], [np.inf]], dtype=np.float32),
        np.array([0.0, 9.0, np.nan, 9.0])[::2],
        np.float32("inf"),
        np.float64("nan"),
        Score(float("nan")),
        [1.0, SlottedScore(-float("inf")), 2.0],
        {"level": Level.UNKNOWN},
    ],
    ids=lambda value: repr(value)[:40],
)
@pytest.mark.parametrize(
    "encoder",
    [RecordEncoder(), chunking(), chunking(100_000), sizing(1), sizing(10**6)],
    ids=["fast", "chunked-tiny", "chunked", "sized-then-chunked", "sized-then-dumped"],
)
def test_nan_and_infinity_are_refused_naming_the_record(encoder, value):
    record = {"id": "t-1", "calls": [{"logprobs": value}]}
    with pytest.raises(
        ValueError, match=r"^record 4: calls\[0\]\.logprobs.* is (NaN|-?Infinity); NaN and Infinity are not JSON$"
    ):
        encoder.encode(record, 4)
    with tiny_limits(), pytest.raises(ValueError, match=r"^record 4: "):
        encoder.encode(record, 4)


@pytest.mark.parametrize("encoder", [RecordEncoder(), chunking()], ids=["fast", "chunked"])
def test_dataclasses_and_enums_encode_as_orjson_writes_them_and_a_nan_inside_is_refused(encoder):
    score = Score(0.5)
    record = {"id": "t-1", "scores": [score, SlottedScore(1.5)], "level": Level.GOOD}
    # Their private attributes and class variables hold NaN, but orjson leaves those out.
    assert (
        encoder.encode(record, 2)
        == orjson.dumps(record)
        == b'{"id":"t-1","scores":[{"value":0.5},{"value":1.5}],"level":1.0}'
    )
    score.extra = float("inf")  # set on the instance: orjson writes it
    with pytest.raises(ValueError, match=r"^record 2: scores\[0\]\.extra is Infinity; NaN and Infinity are not JSON$"):
        encoder.encode(record, 2)


class Tagged:
    """A plain mixin: it gives a slots dataclass built on it a __dict__, which orjson does not write."""


@dataclasses.dataclass(slots=True)
class TaggedScore(Tagged):
    value: float


@dataclasses.dataclass
class Base:
    a: float


@dataclasses.dataclass(slots=True)
class SlotsOnBase(Base):
    b: float = 2.0


class NotADataclass(Base):
    """A plain subclass of a dataclass: orjson does not take it for one."""


class Bundle(enum.Enum):
    LOGPROBS = [0.5, float("nan")]


@pytest.mark.parametrize("encoder", [RecordEncoder(), chunking()], ids=["fast", "chunked"])
def test_dataclasses_are_read_as_orjson_reads_them(encoder):
    # A slots dataclass writes its fields, even when a base class gives it a __dict__.
    with pytest.raises(ValueError, match=r"^record 1: v\.value is NaN; NaN and Infinity are not JSON$"):
        encoder.encode({"v": TaggedScore(float("nan"))}, 1)
    with pytest.raises(ValueError, match=r"^record 1: v\.a is Infinity; NaN and Infinity are not JSON$"):
        encoder.encode({"v": SlotsOnBase(float("inf"))}, 1)
    on_base = SlotsOnBase(1.0)
    on_base.dynamic = float("nan")  # in the base's __dict__, which orjson leaves out for a slots dataclass
    assert encoder.encode({"v": on_base}, 1) == orjson.dumps({"v": on_base}) == b'{"v":{"a":1.0,"b":2.0}}'
    # A subclass that is not itself a dataclass is no dataclass to orjson: refused as a type, not for its NaN.
    with pytest.raises(TypeError, match=r"^record 1: v is a NotADataclass, which JSON cannot hold$"):
        encoder.encode({"v": NotADataclass(float("nan"))}, 1)
    # An Enum member holding a list: the NaN inside is named.
    with pytest.raises(ValueError, match=r"^record 1: v\[1\] is NaN; NaN and Infinity are not JSON$"):
        encoder.encode({"v": Bundle.LOGPROBS}, 1)


@dataclasses.dataclass(slots=True)
class Later:
    step: int
    reward: float = dataclasses.field(init=False)  # set later, if ever


@pytest.mark.parametrize("encoder", [RecordEncoder(), chunking()], ids=["fast", "chunked"])
def test_a_dataclass_orjson_would_crash_on_is_written_without_its_unset_slot(encoder):
    # orjson 3.13 writing this itself kills the process (SIGSEGV), and an attribute named "" too (SIGILL).
    later = Later(3)
    assert encoder.encode({"v": later}, 0) == b'{"v":{"step":3}}'
    blank = Score(0.5)
    setattr(blank, "", 1)
    assert encoder.encode({"v": blank}, 0) == b'{"v":{"value":0.5,"":1}}'
    later.reward = float("nan")
    with pytest.raises(ValueError, match=r"^record 0: v\.reward is NaN; NaN and Infinity are not JSON$"):
        encoder.encode({"v": later}, 0)


def test_a_big_dataclass_is_cut_into_pieces_like_a_dict():
    @dataclasses.dataclass
    class Trace:
        messages: list

    record = {"trace": Trace([{"content": "x" * 100, "n": i} for i in range(3000)])}
    real_emit = _chunker.Chunker._emit
    with mock.patch.object(_chunker.Chunker, "_emit", autospec=True, side_effect=real_emit) as emit:
        assert RecordEncoder(chunk_threshold_bytes=0, piece_bytes=4096).encode(record, 0) == orjson.dumps(record)
    assert emit.call_count > 50  # about 4 KB each, not one dumps of the whole dataclass (360 KB)


def test_the_walk_ends_on_an_enum_member_whose_value_is_itself():
    class Loop(enum.Enum):
        A = 1

    Loop.A._value_ = Loop.A
    assert _sizing.scan({"v": Loop.A}, 10_000) > 10_000


def test_nan_inside_a_big_chunked_episode_is_refused():
    episode = generate_episode(5, target_bytes=2_000_000, now=NOW)
    episode["traces"][-1]["calls"][-1]["logprobs"][-7] = float("nan")
    last, calls = len(episode["traces"]) - 1, len(episode["traces"][-1]["calls"]) - 1
    logprobs = len(episode["traces"][-1]["calls"][-1]["logprobs"]) - 7
    path = f"traces[{last}].calls[{calls}].logprobs[{logprobs}]"
    with pytest.raises(ValueError, match=rf"^record 9: {re.escape(path)} is NaN; NaN and Infinity are not JSON$"):
        encode_record(episode, 9)


@pytest.mark.parametrize("encoder", [RecordEncoder(), chunking()], ids=["fast", "chunked"])
def test_unencodable_value_names_the_record_and_type(encoder):
    with pytest.raises(TypeError, match=r"^record 3: info\.tags is a set; JSON has no sets \(use a list\)$"):
        encoder.encode({"id": "t-1", "info": {"tags": {"a", "b"}}}, 3)
    with pytest.raises(TypeError, match=r"^record 3: x\[1\] is a complex, which JSON cannot hold$"):
        encoder.encode({"x": [1, 2j]}, 3)
    with pytest.raises(TypeError, match=r"^record 3: \['raw bytes'\] is bytes; JSON holds text"):
        encoder.encode({"raw bytes": b"\x00"}, 3)


@pytest.mark.parametrize("encoder", [RecordEncoder(), chunking()], ids=["fast", "chunked"])
@pytest.mark.parametrize(
    "record",
    [
        {1: "int key"},
        {"nested": {2.5: "x"}},
        {"big": {7: list(range(5000))}},
        {"ok": 1, "n": 2**64},
        {"n": -(2**63) - 1},
    ],
    ids=repr,
)
def test_values_one_dumps_refuses_are_refused_naming_the_record(encoder, record):
    with pytest.raises(orjson.JSONEncodeError):
        orjson.dumps(record, option=OPT)
    with pytest.raises(TypeError, match=r"^record 6: .*(JSON keys must be strings|too large for JSON)"):
        encoder.encode(record, 6)


def test_a_cycle_is_a_type_error_on_both_paths():
    record: dict = {"id": "t-1"}
    record["self"] = record
    for encoder in (RecordEncoder(), RecordEncoder(chunk_threshold_bytes=0, piece_bytes=64)):
        with pytest.raises(
            TypeError,
            match=r"^record 0: self\.self\..* is nested deeper than 254 levels \(does the record contain itself\?\)$",
        ):
            encoder.encode(record, 0)


def test_numpy_arrays_encode_like_lists():
    values = np.arange(12, dtype=np.int64).reshape(3, 4)
    floats = np.linspace(-1.0, 1.0, 7)
    strided = np.arange(20.0)[::3]
    fortran = np.asfortranarray(np.arange(6.0).reshape(2, 3))
    big = np.random.default_rng(0).standard_normal(300_000)
    # Every other row: one row alone is contiguous, and orjson prints a float32 shorter than tolist() does.
    rows32 = (np.arange(4000, dtype=np.float32).reshape(200, 20) / 7)[::2]
    assert not strided.flags.c_contiguous and not fortran.flags.c_contiguous and not rows32.flags.c_contiguous
    assert orjson.dumps(rows32[:1], option=OPT) != orjson.dumps(rows32[:1].tolist())
    for array in (values, floats, strided, fortran, big, big[::2], rows32):
        expected = orjson.dumps({"a": array.tolist()})
        assert encode_record({"a": array}, 0) == expected
        assert chunking(1000).encode({"a": array}, 0) == expected
        assert chunking(100).encode({"a": array}, 0) == expected


def test_a_huge_string_is_split_between_pieces(monkeypatch):
    text = ('naïve café 数据 🚀 "quoted"\n\u0001 ' * 40_000)[:1_000_003]
    record = {"id": "t-1", "nodes": [{"message": {"role": "tool", "content": text}}]}
    pieces: list[int] = []
    real_emit = _chunker.Chunker._emit

    def emit(self, value, *args, **kwargs):
        pieces.append(len(value) if isinstance(value, str) else 0)
        return real_emit(self, value, *args, **kwargs)

    monkeypatch.setattr(_chunker.Chunker, "_emit", emit)
    assert encode_record(record, 0) == orjson.dumps(record)
    assert max(pieces) <= _encode.PIECE_BYTES and sum(pieces) == len(text)


def test_numpy_scalars_encode_like_python_values():
    record = {"f": np.float64(0.25), "i": np.int64(-3), "b": np.bool_(True), "u": np.uint8(7)}
    assert encode_record(record, 0) == b'{"f":0.25,"i":-3,"b":true,"u":7}'
    assert chunking().encode(record, 0) == b'{"f":0.25,"i":-3,"b":true,"u":7}'


class ToRecord:
    def __init__(self, value):
        self.value = value

    def to_record(self):
        return self.value


class ToJson:
    def __init__(self, data):
        self.data = data

    def to_json(self):
        return self.data

    def to_record(self):
        raise AssertionError("to_json wins: the record is never re-encoded")


def test_to_record_mapping_is_encoded():
    proxy = ToRecord(collections.ChainMap({"id": "t-1"}, {"ok": True}))
    assert encode_record(ToRecord({"id": "t-1", "timing": {"start": NOW}}), 2) == orjson.dumps(
        {"id": "t-1", "timing": {"start": NOW}}
    )
    assert orjson.loads(encode_record(proxy, 0)) == {"id": "t-1", "ok": True}


@pytest.mark.parametrize("returned", [[{"id": "t-1"}], "{}", None], ids=repr)
def test_to_record_returning_a_non_mapping_is_a_clear_type_error(returned):
    kind = type(returned).__name__
    with pytest.raises(TypeError, match=rf"^record 5: to_record\(\) returned {kind}, expected a mapping"):
        encode_record(ToRecord(returned), 5)


def test_a_record_that_is_neither_is_a_type_error():
    with pytest.raises(TypeError, match=r"^record 1: list is not a mapping and has no to_record\(\) or to_json\(\)"):
        encode_record([{"id": "t-1"}], 1)


def test_to_json_bytes_pass_through_unchanged():
    data = b'{"id":"t-1","x":NaN-is-not-our-business}'
    assert encode_record(ToJson(data), 0) is data
    assert encode_record(ToJson(data + b"\n"), 0) == data
    assert encode_record(ToJson(bytearray(data)), 0) == data
    assert encode_record(ToJson('{"id":"é"}\n'), 0) == '{"id":"é"}'.encode()


@pytest.mark.parametrize("data", [b"", b"\n", b'{"a":1}\n{"b":2}', b"[1,2]", b'{"a":"b"}\n\n', b'"text"'], ids=repr)
def test_to_json_must_be_one_json_object_on_one_line(data):
    with pytest.raises(ValueError, match=r"^record 8: to_json\(\)"):
        encode_record(ToJson(data), 8)


def test_to_json_of_the_wrong_type_is_a_type_error():
    with pytest.raises(TypeError, match=r"^record 8: to_json\(\) returned dict"):
        encode_record(ToJson({"id": "t-1"}), 8)


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


@pytest.mark.parametrize(
    "kwargs",
    [{"chunk_threshold_bytes": -1}, {"piece_bytes": 0}, {"yield_interval_s": -0.5}],
    ids=lambda kw: next(iter(kw)),
)
def test_settings_are_validated(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        RecordEncoder(**kwargs)


def test_docstring_example_holds():
    line = RecordEncoder().encode({"id": "t-1", "timing": {"start": 1.75e9}}, 0) + b"\n"
    assert line == b'{"id":"t-1","timing":{"start":1750000000.0}}\n'


def test_encode_parts_joins_to_exactly_what_encode_returns():
    from prime_traces._encode import RecordEncoder

    encoder = RecordEncoder(chunk_threshold_bytes=0, piece_bytes=64)
    record = {"id": "r", "nodes": [{"message": {"content": "é" * 300, "n": i}} for i in range(40)]}
    parts = encoder.encode_parts(record, 0)
    assert isinstance(parts, LineParts) and len(parts) >= 1
    assert b"".join(parts) == encoder.encode(record, 0) == orjson.dumps(record)
    assert parts.size == len(orjson.dumps(record))
    small = RecordEncoder().encode_parts({"id": "s"}, 0)
    assert small == b'{"id":"s"}'
