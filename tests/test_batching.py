"""Deterministic, content-addressed batching (contract §2)."""

from __future__ import annotations

import hashlib
import os
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prime_traces import TraceTooLargeError
from prime_traces._upload import batching as _batching
from prime_traces._upload.batching import (
    DEFAULT_TARGET_BATCH_BYTES,
    MAX_BATCH_BYTES,
    MAX_BATCH_LINES,
    MAX_LINE_BYTES,
    Batcher,
    iter_batches,
    iter_file_lines,
)


def _record(i: int, pad: int = 0) -> bytes:
    return b'{"id": "t-%d", "pad": "%s"}' % (i, b"x" * pad)


def test_constants_match_the_contract():
    assert DEFAULT_TARGET_BATCH_BYTES == 30 * 1024**2
    assert MAX_LINE_BYTES == 64 * 1024**2
    assert MAX_BATCH_BYTES == 256 * 1024**2
    assert MAX_BATCH_LINES == 1_000_000


def test_zero_lines_give_no_batches():
    assert list(iter_batches([])) == []
    assert list(iter_batches([b"", b"\n", "  \t\r\n", b"\r\n"])) == []


def test_single_batch_body_key_and_indexes():
    (batch,) = iter_batches([b'{"id": "a"}\n', "", '{"id": "b"}'])
    assert batch.body == b'{"id": "a"}\n{"id": "b"}\n'
    assert batch.key == "sha256:" + hashlib.sha256(batch.body).hexdigest()
    assert batch.index == 0
    assert batch.first_line == 0
    assert batch.line_indexes == [0, 2]
    assert batch.line_count == 2
    assert batch.size_bytes == len(batch.body)
    assert batch.lines == [b'{"id": "a"}\n', b'{"id": "b"}\n']


def test_str_lines_are_utf8_encoded():
    (batch,) = iter_batches(['{"id": "ü"}'])
    assert batch.body == '{"id": "ü"}\n'.encode()


def test_cr_is_kept_and_counts_toward_size():
    (batch,) = iter_batches([b'{"id": "a"}\r\n'])
    assert batch.body == b'{"id": "a"}\r\n'
    assert batch.size_bytes == 13


def test_batch_closes_before_the_line_that_would_overflow():
    line = b"x" * 9  # 10 bytes with its newline
    batches = list(iter_batches([line] * 7, target_batch_bytes=30))
    assert [b.line_count for b in batches] == [3, 3, 1]
    assert [b.size_bytes for b in batches] == [30, 30, 10]
    assert [b.index for b in batches] == [0, 1, 2]
    assert [b.first_line for b in batches] == [0, 3, 6]


def test_batch_closes_at_max_lines():
    batches = list(iter_batches([b"{}"] * 5, max_batch_lines=2))
    assert [b.line_indexes for b in batches] == [[0, 1], [2, 3], [4]]


def test_a_line_larger_than_the_target_travels_alone():
    big = b"y" * 50
    batches = list(iter_batches([b"a", big, b"b"], target_batch_bytes=20))
    assert [b.body for b in batches] == [b"a\n", big + b"\n", b"b\n"]


def test_add_returns_the_closed_batch_without_the_new_line():
    batcher = Batcher(target_batch_bytes=4)
    assert batcher.add(b"ab", 0) is None
    closed = batcher.add(b"cd", 1)
    assert closed is not None and closed.body == b"ab\n"
    last = batcher.close()
    assert last is not None and last.body == b"cd\n" and last.index == 1
    assert batcher.close() is None


def test_too_large_line_raises_before_its_batch_is_yielded(monkeypatch):
    monkeypatch.setattr(_batching, "MAX_LINE_BYTES", 10)
    gen = iter_batches([b"a" * 10, b"b" * 10, b"c" * 11 + b"\n"], target_batch_bytes=11)
    first = next(gen)
    assert first.body == b"a" * 10 + b"\n"
    with pytest.raises(TraceTooLargeError) as info:
        next(gen)
    assert (info.value.line_index, info.value.size_bytes, info.value.limit_bytes) == (2, 11, 10)
    assert "line 3" in str(info.value)


def test_line_at_the_limit_is_accepted_and_cr_counts(monkeypatch):
    monkeypatch.setattr(_batching, "MAX_LINE_BYTES", 10)
    (batch,) = iter_batches([b"a" * 10 + b"\n"])
    assert batch.line_count == 1
    with pytest.raises(TraceTooLargeError):
        list(iter_batches([b"a" * 10 + b"\r\n"]))


def test_interior_newline_is_refused():
    with pytest.raises(ValueError, match="line 2 contains a newline"):
        list(iter_batches([b"{}", b'{"a": 1}\n{"b": 2}\n']))


def test_non_text_lines_are_refused():
    with pytest.raises(TypeError, match="line 1 is a int"):
        list(iter_batches([1]))  # type: ignore[list-item]


def test_bytearray_and_memoryview_are_accepted():
    (batch,) = iter_batches([bytearray(b"{}"), memoryview(b"[]")])
    assert batch.body == b"{}\n[]\n"


@pytest.mark.parametrize("target", [0, -1, MAX_BATCH_BYTES + 1])
def test_target_out_of_range_is_refused(target):
    with pytest.raises(ValueError, match="target_batch_bytes"):
        Batcher(target_batch_bytes=target)


def test_target_at_the_maximum_is_accepted():
    assert Batcher(target_batch_bytes=MAX_BATCH_BYTES).target_batch_bytes == MAX_BATCH_BYTES


@pytest.mark.parametrize("lines", [0, MAX_BATCH_LINES + 1])
def test_max_lines_out_of_range_is_refused(lines):
    with pytest.raises(ValueError, match="max_batch_lines"):
        Batcher(max_batch_lines=lines)


def test_body_is_joined_once_and_shared_between_threads():
    (batch,) = iter_batches([_record(i, 100) for i in range(1000)])
    barrier = threading.Barrier(4)
    bodies: list[bytes] = []
    keys: list[str] = []

    def read() -> None:
        barrier.wait(timeout=10)
        # The body itself, not the key: separate joins hash to the same key.
        bodies.append(batch.body)
        keys.append(batch.key)

    threads = [threading.Thread(target=read) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert len(bodies) == 4 and all(body is bodies[0] for body in bodies)
    assert bodies[0] is batch.body
    assert len(set(keys)) == 1 and len(keys) == 4
    assert batch.input_index_of(1) == 0 and batch.input_index_of(1000) == 999
    assert batch.input_index_of(0) is None and batch.input_index_of(1001) is None


# --- files ------------------------------------------------------------------


def test_iter_file_lines_splits_on_lf_only(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"a": "x\ry"}\r\n\n{"b": "\xc2\x85"}\n{"c": 3}')
    assert list(iter_file_lines(path)) == [
        b'{"a": "x\ry"}\r\n',
        b"\n",
        b'{"b": "\xc2\x85"}\n',
        b'{"c": 3}',
    ]
    batches = list(iter_batches(iter_file_lines(path)))
    assert batches[0].line_indexes == [0, 2, 3]
    assert batches[0].body.endswith(b'{"c": 3}\n')


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs a named pipe")
def test_iter_file_lines_streams(tmp_path):
    # Through a pipe whose writer holds back the rest until the first line was
    # read: reading the whole file before yielding would never see that line.
    pipe = tmp_path / "pipe.jsonl"
    os.mkfifo(pipe)
    release = threading.Event()
    first: list[bytes] = []

    def write() -> None:
        with open(pipe, "wb", buffering=0) as handle:
            handle.write(b'{"a": 1}\n')
            release.wait(timeout=30)
            handle.write(b'{"b": 2}')

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    lines = iter_file_lines(pipe)
    reader = threading.Thread(target=lambda: first.append(next(lines)), daemon=True)
    try:
        reader.start()
        reader.join(timeout=5)
        assert first == [b'{"a": 1}\n']
    finally:
        release.set()
        reader.join(timeout=30)
        writer.join(timeout=30)
    assert list(lines) == [b'{"b": 2}']


def test_empty_file_gives_no_batches(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"")
    assert list(iter_batches(iter_file_lines(path))) == []


# --- properties ---------------------------------------------------------------

_line = st.one_of(
    st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")),
    st.sampled_from([b"", b" ", b"\t\r", b"\n"]),
    st.text(max_size=20).map(lambda s: s.replace("\n", "")),
)


def _normalised(line: bytes | str) -> bytes | None:
    data = line.encode() if isinstance(line, str) else line
    if not data or data.isspace():
        return None
    return data if data.endswith(b"\n") else data + b"\n"


@settings(max_examples=300, deadline=None)
@given(
    lines=st.lists(_line, max_size=60),
    target=st.integers(min_value=1, max_value=200),
    max_lines=st.integers(min_value=1, max_value=10),
)
def test_batching_properties(lines, target, max_lines):
    batches = list(iter_batches(lines, target_batch_bytes=target, max_batch_lines=max_lines))
    again = list(iter_batches(lines, target_batch_bytes=target, max_batch_lines=max_lines))

    # Deterministic: the same input gives the same cuts and keys.
    assert [(b.body, b.key, b.line_indexes) for b in batches] == [(b.body, b.key, b.line_indexes) for b in again]
    # Nothing lost, nothing added, nothing reordered.
    expected = [n for n in map(_normalised, lines) if n is not None]
    assert b"".join(b.body for b in batches) == b"".join(expected)
    assert [i for b in batches for i in b.line_indexes] == [
        i for i, line in enumerate(lines) if _normalised(line) is not None
    ]
    for position, batch in enumerate(batches):
        assert batch.index == position
        assert batch.size_bytes == len(batch.body)
        assert batch.key == "sha256:" + hashlib.sha256(batch.body).hexdigest()
        assert 1 <= batch.line_count <= max_lines
        # Over target only when a single line is.
        assert batch.size_bytes <= target or batch.line_count == 1
    # Greedy: a batch closed by size could not have taken the next line.
    for current, following in zip(batches, batches[1:]):
        if current.line_count < max_lines:
            assert current.size_bytes + len(following.lines[0]) > target


def test_a_line_in_parts_batches_exactly_like_the_joined_line():
    from prime_traces._lines.parts import LineParts

    lines = [b'{"id":"a","x":"' + b"y" * 500 + b'"}', b'{"id":"b"}', b'{"id":"c","z":[1,2,3]}']
    parted = [LineParts((line[:7], line[7:20], line[20:])) for line in lines]
    whole = [(b.key, b.line_indexes, b.size_bytes) for b in iter_batches(lines, target_batch_bytes=520)]
    pieces = [(b.key, b.line_indexes, b.size_bytes) for b in iter_batches(parted, target_batch_bytes=520)]
    assert pieces == whole
    assert len(whole) == 2


def test_a_line_in_parts_over_the_line_limit_is_refused(monkeypatch):
    import prime_traces._upload.batching as batching
    from prime_traces._lines.parts import LineParts

    monkeypatch.setattr(batching, "MAX_LINE_BYTES", 10)
    with pytest.raises(TraceTooLargeError, match="line 2"):
        list(iter_batches([b'{"id":1}', LineParts((b'{"id":', b'"long-id"}'))]))


def test_the_first_batch_may_close_sooner_than_the_rest():
    lines = [b"x" * 100 for _ in range(10)]  # 101 bytes each with its newline
    sizes = [len(b.line_indexes) for b in iter_batches(lines, target_batch_bytes=505, first_batch_bytes=202)]
    assert sizes == [2, 5, 3]
    assert [len(b.line_indexes) for b in iter_batches(lines, target_batch_bytes=505, first_batch_bytes=None)] == [5, 5]
    # A first size above the target is the target.
    above = iter_batches(lines, target_batch_bytes=505, first_batch_bytes=10_000)
    assert [len(b.line_indexes) for b in above] == [5, 5]
