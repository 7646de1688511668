"""The upload path's record encoder: byte-identical to orjson, strict, and chunked when large."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import enum
import re
import sys
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

from prime_traces._lines import chunker as _chunker
from prime_traces._lines import encoder as _encode
from prime_traces._lines import sizing as _sizing
from prime_traces._lines.encoder import CHUNK_THRESHOLD_BYTES, RecordEncoder, encode_record
from prime_traces._lines.parts import LineParts

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
    expected = r"^record 1: list is not a mapping and has no to_record\(\), to_json\(\) or model_dump\(\)"
    with pytest.raises(TypeError, match=expected):
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
    from prime_traces._lines.encoder import RecordEncoder

    encoder = RecordEncoder(chunk_threshold_bytes=0, piece_bytes=64)
    record = {"id": "r", "nodes": [{"message": {"content": "é" * 300, "n": i}} for i in range(40)]}
    parts = encoder.encode_parts(record, 0)
    assert isinstance(parts, LineParts) and len(parts) >= 1
    assert b"".join(parts) == encoder.encode(record, 0) == orjson.dumps(record)
    assert parts.size == len(orjson.dumps(record))
    small = RecordEncoder().encode_parts({"id": "s"}, 0)
    assert small == b'{"id":"s"}'
