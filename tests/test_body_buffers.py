"""Large batch bodies of the client's uploads are joined into reused private maps, given back at commit."""

from __future__ import annotations

import copy
import hashlib
import os
import struct

import pytest
from _client_helpers import client_for, lines_of, stored_trace_ids
from _fork import in_child

from prime_traces import client
from prime_traces._lines.parts import LineParts
from prime_traces._upload import batching as _batching
from prime_traces._upload import body_buffers as _body_buffers
from prime_traces._upload.batching import DEFAULT_TARGET_BATCH_BYTES, iter_batches
from prime_traces._upload.body_buffers import MIN_POOLED_BYTES, BodyBuffers

MiB = 1024**2


def _big_lines(n: int, size: int, prefix: str = "t") -> list[bytes]:
    """``n`` trace lines of about ``size`` bytes each."""
    lines = lines_of(n, pad=size, prefix=prefix)
    assert all(size < len(line) < size + 1000 for line in lines)
    return lines


def _joined(lines: list[bytes]) -> bytes:
    return b"".join(line + b"\n" for line in lines)


@pytest.fixture
def buffers(monkeypatch) -> BodyBuffers:
    """The buffers batches and clients use, this test's own (a late give-back of another test's cannot land here)."""
    own = BodyBuffers()
    monkeypatch.setattr(_batching, "BODY_BUFFERS", own)
    monkeypatch.setattr(client, "BODY_BUFFERS", own)
    yield own
    own.trim()


def test_the_buffers_hold_a_default_batch():
    assert _body_buffers.BUFFER_BYTES == DEFAULT_TARGET_BATCH_BYTES


def test_a_large_batch_is_joined_into_a_reused_buffer_and_given_back_at_release(buffers):
    lines = _big_lines(12, 200_000)
    (batch,) = iter_batches(lines, reuse_buffers=True)
    data = batch.data
    assert isinstance(data, memoryview) and data.readonly
    assert bytes(data) == _joined(lines) and batch.body == _joined(lines) and type(batch.body) is bytes
    assert batch.key == "sha256:" + hashlib.sha256(_joined(lines)).hexdigest()
    assert buffers.created == 1 and buffers.idle == 0

    batch.release()
    assert buffers.idle == 1
    with pytest.raises(ValueError):  # the batch's own view is released, not left to show the next body
        bytes(data)
    with pytest.raises(RuntimeError, match="released"):
        batch.data  # noqa: B018

    # The next batch reuses the buffer; a shorter body shows none of the longer one's bytes.
    shorter = _big_lines(6, 200_000, prefix="u")
    (again,) = iter_batches(shorter, reuse_buffers=True)
    assert bytes(again.data) == _joined(shorter)
    assert again.key == "sha256:" + hashlib.sha256(_joined(shorter)).hexdigest()
    assert buffers.created == 1 and buffers.idle == 0
    again.release()
    assert buffers.idle == 1


def test_without_reuse_buffers_a_batch_joins_bytes_as_before(buffers):
    (batch,) = iter_batches(_big_lines(12, 200_000))
    assert type(batch.data) is bytes and batch.body is batch.data
    batch.key  # noqa: B018
    batch.release()
    assert buffers.created == 0 and buffers.idle == 0


def test_small_bodies_many_small_lines_and_bodies_over_a_buffer_are_joined_as_bytes(buffers):
    (small,) = iter_batches(_big_lines(4, 200_000), reuse_buffers=True)
    assert small.size_bytes < MIN_POOLED_BYTES and type(small.data) is bytes
    many = lines_of(2_000, pad=1_000)  # 2 MB in 4,000 pieces of ~1 KB
    (batch,) = iter_batches(many, reuse_buffers=True)
    assert batch.size_bytes > MIN_POOLED_BYTES and type(batch.data) is bytes and batch.data == _joined(many)
    huge = _big_lines(2, 16 * MiB)
    (over,) = iter_batches(huge, target_batch_bytes=40 * MiB, reuse_buffers=True)
    assert over.size_bytes > _body_buffers.BUFFER_BYTES and type(over.data) is bytes
    assert over.data == _joined(huge)
    assert buffers.created == 0


def test_pieces_that_are_not_bytes_are_joined_as_bytes(buffers):
    lines = _big_lines(8, 300_000)
    cut = [LineParts([line[:1000], memoryview(line[1000:]).cast("c")]) for line in lines]
    (batch,) = iter_batches(cut, reuse_buffers=True)
    assert type(batch.data) is bytes and batch.data == _joined(lines)
    assert buffers.created == 0


def test_idle_buffers_are_capped_trimmed_and_never_kept_twice():
    buffers = BodyBuffers(buffer_bytes=2 * MiB, max_idle=1)
    parts = [b"x" * 700_000, b"\n"] * 2
    (first, body1), (second, body2) = buffers.join(parts, 1_400_002), buffers.join(parts, 1_400_002)
    assert buffers.created == 2 and bytes(body1) == bytes(body2) == b"".join(parts)
    body1.release()
    body2.release()
    buffers.give_back(first)
    buffers.give_back(first)  # as two copies of one batch would: two bodies must never share it
    assert buffers.idle == 1
    buffers.give_back(second)
    assert buffers.idle == 1 and not first.closed and second.closed
    buffers.trim()
    assert buffers.idle == 0 and first.closed


def test_a_copied_batch_released_twice_gives_its_buffer_back_once(buffers):
    (batch,) = iter_batches(_big_lines(8, 200_000), reuse_buffers=True)
    batch.key  # noqa: B018
    twin = copy.copy(batch)
    batch.release()
    twin.release()
    assert buffers.idle == 1
    first, second = iter_batches(_big_lines(16, 200_000, prefix="u"), target_batch_bytes=2 * MiB, reuse_buffers=True)
    assert bytes(first.data) != bytes(second.data) and buffers.created == 2


def test_parts_that_do_not_add_up_are_refused_and_the_buffer_kept():
    buffers = BodyBuffers(buffer_bytes=2 * MiB)
    parts = [b"y" * 600_000, b"\n", b"z" * 600_000, b"\n"]
    with pytest.raises(ValueError, match="not the 1300000 given"):
        buffers.join(parts, 1_300_000)
    with pytest.raises(ValueError, match="more than the 1100000"):
        buffers.join(parts, 1_100_000)
    assert buffers.created == 1 and buffers.idle == 1
    buffer, body = buffers.join(parts, 1_200_002)
    assert buffers.created == 1 and bytes(body) == b"".join(parts)


def test_a_batch_whose_size_does_not_add_up_is_joined_as_bytes(buffers):
    lines = _big_lines(8, 200_000)
    parts = [piece for line in lines for piece in (line, b"\n")]
    batch = _batching.Batch(0, parts, list(range(8)), len(_joined(lines)) + 5, reuse_buffers=True)
    assert type(batch.data) is bytes and batch.data == _joined(lines)
    assert buffers.idle == 1  # the buffer the failed copy took went back


def test_a_body_still_read_at_release_keeps_its_buffer_out_of_the_pool(buffers):
    lines = _big_lines(8, 200_000)
    (batch,) = iter_batches(lines, reuse_buffers=True)
    batch.key  # noqa: B018  (hashed: release() drops the bytes)
    reader = struct.iter_unpack("B", batch.data)  # holds the view exported, as a C call reading it would
    batch.release()
    assert buffers.idle == 0
    other = _big_lines(8, 200_000, prefix="u")
    (next_batch,) = iter_batches(other, reuse_buffers=True)
    assert bytes(next_batch.data) == _joined(other) and buffers.created == 2  # a map of its own
    read = bytes(b for (b,) in reader)
    assert read == _joined(lines)  # what was being read stayed as it was


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.timeout(60)
def test_a_forked_child_writes_its_own_copy_and_joins_though_the_parent_held_the_lock(buffers):
    lines = _big_lines(8, 200_000)
    (batch,) = iter_batches(lines, reuse_buffers=True)
    data = batch.data

    def child() -> list[int]:
        batch.key  # noqa: B018  (hashed: release() gives the buffer back)
        batch.release()  # the child gives back the buffer it inherited, and reuses it
        (again,) = iter_batches(_big_lines(8, 200_000, prefix="c"), reuse_buffers=True)
        return [len(again.data), buffers.created]

    with buffers._lock:  # as a parent thread might hold it at fork time
        result = in_child(child)
    assert result == [len(_joined(lines)), 0]  # the child's list started empty: it mapped none
    assert bytes(data) == _joined(lines)  # the child's writes did not reach the parent's map


@pytest.mark.parametrize("compression", ["zstd", "gzip", "none"])
def test_pooled_bodies_upload_and_commit_in_every_coding(service, buffers, compression):
    lines = _big_lines(24, 150_000, prefix=compression)
    batches = list(iter_batches(lines, target_batch_bytes=1_300_000, reuse_buffers=True))
    assert len(batches) == 3 and all(isinstance(b.data, memoryview) for b in batches)
    keys = [b.key.removeprefix("sha256:") for b in batches]
    for batch in batches:
        batch.release()
    assert buffers.idle == 3 and buffers.created == 3
    with client_for(service, compression=compression) as traces:
        receipts = traces.upload_lines(lines, target_batch_bytes=1_300_000)
        assert buffers.created == 3  # the upload's bodies went into the three buffers given back
        assert buffers.idle == 3  # and each committed body gave its own back before the upload returned
    assert buffers.idle == 0  # closing the client unmapped them
    assert [r.upload_id for r in receipts] == keys
    assert all(r.status == "committed" for r in receipts)
    assert stored_trace_ids(service) == {f"{compression}-{i}" for i in range(24)}


def test_lines_in_pieces_that_are_not_bytes_upload(service, buffers):
    lines = _big_lines(8, 300_000, prefix="cut")
    cut = [LineParts([line[:1000], memoryview(line[1000:]).cast("c")]) for line in lines]
    with client_for(service, compression="gzip") as traces:
        receipts = traces.upload_lines(cut)
    assert [r.status for r in receipts] == ["committed"]
    assert stored_trace_ids(service) == {f"cut-{i}" for i in range(8)}
