"""Large batch bodies are joined into reused memory maps, given back at commit, and upload as bytes would."""

from __future__ import annotations

import hashlib
import os
import struct

import pytest
from _client_helpers import client_for, lines_of, stored_trace_ids
from _fork import in_child

from prime_traces import _body_buffers
from prime_traces._batching import DEFAULT_TARGET_BATCH_BYTES, iter_batches
from prime_traces._body_buffers import BODY_BUFFERS, MIN_POOLED_BYTES, BodyBuffers

MiB = 1024**2


def _big_lines(n: int, size: int, prefix: str = "t") -> list[bytes]:
    """``n`` trace lines of about ``size`` bytes each."""
    lines = lines_of(n, pad=size, prefix=prefix)
    assert all(size < len(line) < size + 1000 for line in lines)
    return lines


@pytest.fixture(autouse=True)
def no_idle_buffers():
    BODY_BUFFERS.trim()
    yield
    BODY_BUFFERS.trim()


def test_the_buffers_hold_a_default_batch():
    assert _body_buffers.BUFFER_BYTES == DEFAULT_TARGET_BATCH_BYTES


def test_a_large_batch_is_joined_into_a_reused_buffer_and_given_back_at_release():
    lines = _big_lines(12, 200_000)
    joined = b"".join(line + b"\n" for line in lines)
    created = BODY_BUFFERS.created
    (batch,) = iter_batches(lines)
    data = batch.data
    assert isinstance(data, memoryview) and data.readonly
    assert bytes(data) == joined and batch.body == joined and type(batch.body) is bytes
    assert batch.key == "sha256:" + hashlib.sha256(joined).hexdigest()
    assert BODY_BUFFERS.created == created + 1 and BODY_BUFFERS.idle == 0

    batch.release()
    assert BODY_BUFFERS.idle == 1
    with pytest.raises(ValueError):  # the view read by nobody any more is released, not left stale
        bytes(data)
    with pytest.raises(RuntimeError, match="released"):
        batch.data  # noqa: B018

    # The next batch reuses the buffer; a shorter body shows none of the longer one's bytes.
    shorter = _big_lines(6, 200_000, prefix="u")
    (again,) = iter_batches(shorter)
    expected = b"".join(line + b"\n" for line in shorter)
    assert bytes(again.data) == expected and again.key == "sha256:" + hashlib.sha256(expected).hexdigest()
    assert BODY_BUFFERS.created == created + 1 and BODY_BUFFERS.idle == 0
    again.release()
    assert BODY_BUFFERS.idle == 1


def test_small_bodies_and_bodies_of_many_small_lines_are_joined_as_bytes():
    created = BODY_BUFFERS.created
    (small,) = iter_batches(_big_lines(4, 200_000))
    assert small.size_bytes < MIN_POOLED_BYTES and type(small.data) is bytes
    many = lines_of(2_000, pad=1_000)  # 2 MB, in 4,000 pieces of ~1 KB
    (batch,) = iter_batches(many)
    assert batch.size_bytes > MIN_POOLED_BYTES and type(batch.data) is bytes
    assert batch.data == b"".join(line + b"\n" for line in many)
    assert BODY_BUFFERS.created == created


def test_a_body_larger_than_a_buffer_is_joined_as_bytes():
    lines = _big_lines(2, 3 * MiB)
    (batch,) = iter_batches(lines, target_batch_bytes=8 * MiB)
    buffers = BodyBuffers(buffer_bytes=4 * MiB)
    assert buffers.join([line + b"\n" for line in lines], batch.size_bytes) is None
    assert buffers.created == 0


def test_idle_buffers_are_capped_and_trimmed():
    buffers = BodyBuffers(buffer_bytes=2 * MiB, max_idle=1)
    parts = [b"x" * 700_000, b"\n"] * 2
    (first, body1), (second, body2) = buffers.join(parts, 1_400_002), buffers.join(parts, 1_400_002)
    assert buffers.created == 2 and bytes(body1) == bytes(body2) == b"".join(parts)
    body1.release()
    body2.release()
    buffers.give_back(first)
    buffers.give_back(second)
    assert buffers.idle == 1 and not first.closed and second.closed
    buffers.trim()
    assert buffers.idle == 0 and first.closed


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


def test_a_body_still_read_at_release_keeps_its_buffer_out_of_the_pool():
    (batch,) = iter_batches(_big_lines(8, 200_000))
    batch.key  # noqa: B018  (hashed: release() drops the bytes)
    reader = struct.iter_unpack("B", batch.data)  # holds the view exported, as a C call reading it would
    batch.release()
    assert BODY_BUFFERS.idle == 0  # not reused while read: its bytes stay as they were
    assert next(reader) == (ord("{"),)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.timeout(60)
def test_a_forked_child_joins_bodies_though_the_parent_held_the_lock():
    lines = _big_lines(8, 200_000)
    with BODY_BUFFERS._lock:  # as a parent thread might at fork time
        result = in_child(lambda: [len(bytes(b.data)) for b in iter_batches(lines)])
    assert result == [sum(len(line) + 1 for line in lines)]


@pytest.mark.parametrize("compression", ["zstd", "gzip", "none"])
def test_pooled_bodies_upload_and_commit_in_every_coding(service, compression):
    lines = _big_lines(24, 150_000, prefix=compression)
    batches = list(iter_batches(lines, target_batch_bytes=1_300_000))
    assert len(batches) == 3 and all(BODY_BUFFERS.fits(b.size_bytes, 2 * b.line_count) for b in batches)
    keys = [b.key.removeprefix("sha256:") for b in batches]
    for batch in batches:
        batch.release()
    assert BODY_BUFFERS.idle == 3
    created = BODY_BUFFERS.created
    with client_for(service, compression=compression) as client:
        receipts = client.upload_lines(lines, target_batch_bytes=1_300_000)
        assert BODY_BUFFERS.created == created  # the upload's bodies went into the three buffers given back
        assert BODY_BUFFERS.idle == 3  # and each committed body gave its own back
    assert BODY_BUFFERS.idle == 0  # closing the client unmapped them
    assert [r.upload_id for r in receipts] == keys
    assert all(r.status == "committed" for r in receipts)
    assert stored_trace_ids(service) == {f"{compression}-{i}" for i in range(24)}
