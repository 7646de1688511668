"""Bounded decompression: gzip with ISA-L and with zlib, and zstd frames with and without a declared size."""

from __future__ import annotations

import gzip
import zlib

import pytest
import zstandard

from prime_traces.errors import ErrorCode
from prime_traces.server._decode import _gunzip, _unzstd
from prime_traces.server._http import HTTPError

BODY = b'{"id":"t-1","text":"h\xc3\xa9llo"}\n' * 5000
LIMIT = 1 << 20


def _modules():
    yield pytest.param(zlib, id="zlib")
    try:
        from isal import isal_zlib
    except ImportError:
        return
    yield pytest.param(isal_zlib, id="isal")


@pytest.mark.parametrize("inflate", list(_modules()))
def test_members_inflate_to_the_body(inflate):
    one = gzip.compress(BODY, compresslevel=1, mtime=0)
    assert _gunzip(memoryview(one), LIMIT, inflate) == BODY
    assert _gunzip(memoryview(one + one), 2 * LIMIT, inflate) == BODY + BODY


@pytest.mark.parametrize("inflate", list(_modules()))
@pytest.mark.parametrize(
    ("data", "code"),
    [
        (gzip.compress(BODY, mtime=0)[:-40], ErrorCode.MALFORMED_ENCODING),
        (b"\x1f\x8b\x08\x00garbage-garbage-garbage", ErrorCode.MALFORMED_ENCODING),
        (gzip.compress(b"\0" * (LIMIT + 1), mtime=0), ErrorCode.UPLOAD_TOO_LARGE),
        (gzip.compress(b"\0" * (8 * LIMIT), mtime=0), ErrorCode.UPLOAD_TOO_LARGE),
    ],
    ids=["truncated", "garbage", "one-byte-over", "bomb"],
)
def test_bad_or_oversized_streams_are_refused(inflate, data, code):
    with pytest.raises(HTTPError) as caught:
        _gunzip(memoryview(data), LIMIT, inflate)
    assert caught.value.status == 400
    assert caught.value.code == code.value


def _sized(body: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=1).compress(body)  # the header declares the size


def _unsized(body: bytes) -> bytes:
    stream = zstandard.ZstdCompressor(level=1).compressobj()
    return stream.compress(body) + stream.flush()


def _declaring(frame: bytes, declared: int) -> bytes:
    """``frame`` with its header's content size replaced by ``declared``."""
    header = bytearray(frame[: zstandard.frame_header_size(frame)])
    descriptor = header[4]
    size_flag, single_segment = descriptor >> 6, (descriptor >> 5) & 1
    field = {0: single_segment, 1: 2, 2: 4, 3: 8}[size_flag]
    assert field, "the frame declares no size"
    value = declared - 256 if field == 2 else declared  # the two-byte field is offset by 256
    header[len(header) - field :] = value.to_bytes(field, "little")
    assert zstandard.frame_content_size(bytes(header)) == declared
    return bytes(header) + frame[len(header) :]


@pytest.mark.parametrize(
    "data",
    [_sized(BODY), _unsized(BODY), _sized(BODY[:1000]) + _unsized(BODY[1000:]), _unsized(BODY[:7]) + _sized(BODY[7:])],
    ids=["sized", "unsized", "sized-then-unsized", "unsized-then-sized"],
)
def test_zstd_frames_decode_to_the_body(data):
    assert _unzstd(memoryview(data), LIMIT) == BODY


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (_sized(BODY)[:-20], ErrorCode.MALFORMED_ENCODING),
        (_unsized(BODY)[:-20], ErrorCode.MALFORMED_ENCODING),
        (_sized(BODY) + b"\x28\xb5", ErrorCode.MALFORMED_ENCODING),
        (_declaring(_sized(BODY), len(BODY) - 1), ErrorCode.MALFORMED_ENCODING),
        (_declaring(_sized(BODY), len(BODY) + 1), ErrorCode.MALFORMED_ENCODING),
        (_sized(b"\0" * (LIMIT + 1)), ErrorCode.UPLOAD_TOO_LARGE),
        (_unsized(b"\0" * (LIMIT + 1)), ErrorCode.UPLOAD_TOO_LARGE),
        (_sized(b"\0" * (LIMIT // 2 + 1)) * 2, ErrorCode.UPLOAD_TOO_LARGE),
        (_declaring(_sized(b"\0" * (64 * LIMIT)), 1000), ErrorCode.MALFORMED_ENCODING),
    ],
    ids=[
        "sized-truncated",
        "unsized-truncated",
        "partial-header-after",
        "declares-less",
        "declares-more",
        "sized-one-byte-over",
        "unsized-one-byte-over",
        "two-frames-over",
        "bomb-declaring-little",
    ],
)
def test_bad_or_oversized_zstd_is_refused(data, code):
    with pytest.raises(HTTPError) as caught:
        _unzstd(memoryview(data), LIMIT)
    assert caught.value.status == 400
    assert caught.value.code == code.value


def test_a_declared_size_over_the_limit_is_refused_before_decoding():
    # The header alone says 64 MiB: the frame's blocks are never looked at.
    frame = _declaring(_sized(BODY), 64 * LIMIT)
    header = frame[: zstandard.frame_header_size(frame)]
    with pytest.raises(HTTPError) as caught:
        _unzstd(memoryview(header + b"\xff" * 100), LIMIT)
    assert caught.value.code == ErrorCode.UPLOAD_TOO_LARGE.value
