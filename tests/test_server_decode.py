"""Bounded decompression: gzip with ISA-L and with zlib, and zstd frames with and without a declared size."""

from __future__ import annotations

import gzip
import zlib

import pytest
import zstandard

from prime_traces.errors import ErrorCode
from prime_traces.server import _decode
from prime_traces.server._body import MemoryBudget
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


class _CountingInflate:
    """An inflate module whose decoders count their calls."""

    def __init__(self, module) -> None:
        self.module, self.error, self.calls = module, module.error, 0

    def decompressobj(self, **kwargs):
        real, counter = self.module.decompressobj(**kwargs), self

        class Counted:
            def decompress(self, data, max_length=0):
                counter.calls += 1
                return real.decompress(data, max_length)

            def __getattr__(self, name):
                return getattr(real, name)

        return Counted()


@pytest.mark.parametrize("inflate", list(_modules()))
def test_one_member_inflates_in_one_step_sized_by_its_trailer(inflate):
    body = BODY * 60  # 9.6 MB: more than one 8 MiB step
    counting = _CountingInflate(inflate)
    assert _gunzip(memoryview(gzip.compress(body, compresslevel=1, mtime=0)), 16 * LIMIT, counting) == body
    assert counting.calls == 1
    lying = bytearray(gzip.compress(body, compresslevel=1, mtime=0))
    lying[-4:] = (3 * len(body)).to_bytes(4, "little")  # only sizes the first step; zlib checks it at the end
    with pytest.raises(HTTPError) as caught:
        _gunzip(memoryview(bytes(lying)), 16 * LIMIT, inflate)
    assert caught.value.code == ErrorCode.MALFORMED_ENCODING.value


@pytest.mark.parametrize("inflate", list(_modules()))
def test_a_small_body_whose_trailer_lies_charges_no_more_than_it_could_inflate_to(inflate):
    lying = bytearray(gzip.compress(b"tiny", mtime=0))
    lying[-4:] = b"\xff\xff\xff\xff"  # claims 4 GiB
    budget = MemoryBudget(64 * LIMIT)
    with pytest.raises(HTTPError) as caught:
        _gunzip(memoryview(bytes(lying)), 32 * LIMIT, inflate, charge=budget.charge())
    assert caught.value.code == ErrorCode.MALFORMED_ENCODING.value  # not a 503 for want of budget
    assert budget.snapshot()["peak_body_memory_bytes"] <= 8 << 20  # a step, as before: not the limit


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
    [
        _sized(BODY),
        _unsized(BODY),
        _sized(BODY[:1000]) + _unsized(BODY[1000:]),
        _unsized(BODY[:7]) + _sized(BODY[7:]),
        _sized(b"") + _sized(BODY),  # zstd answers a frame declaring 0 bytes with b"", whatever follows
    ],
    ids=["sized", "unsized", "sized-then-unsized", "unsized-then-sized", "empty-then-sized"],
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
        (_sized(b"") + b"garbage", ErrorCode.MALFORMED_ENCODING),
        (_sized(b"")[:-3], ErrorCode.MALFORMED_ENCODING),
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
        "empty-then-garbage",
        "empty-truncated",
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


class _CountingDecompressor:
    """A ZstdDecompressor that counts the frame-by-frame decoders it hands out."""

    made: list[None] = []
    real = zstandard.ZstdDecompressor

    def __init__(self) -> None:
        self._real = self.real()

    def decompress(self, *args, **kwargs):
        return self._real.decompress(*args, **kwargs)

    def decompressobj(self, *args, **kwargs):
        self.made.append(None)
        return self._real.decompressobj(*args, **kwargs)


@pytest.mark.parametrize(
    ("data", "frame_by_frame"),
    [(_sized(BODY), 0), (_sized(BODY[:1000]) + _sized(BODY[1000:]), 2), (_unsized(BODY), 1)],
    ids=["one-sized-frame", "two-sized-frames", "unsized"],
)
def test_one_frame_that_declares_its_size_is_decoded_in_one_call(monkeypatch, data, frame_by_frame):
    # The frame-by-frame path collects its output in pieces and joins them: a fifth of the service's CPU.
    made: list[None] = []
    monkeypatch.setattr(_CountingDecompressor, "made", made)
    monkeypatch.setattr(_decode.zstandard, "ZstdDecompressor", _CountingDecompressor)
    budget = MemoryBudget(4 * LIMIT)
    charge = budget.charge()
    assert _unzstd(memoryview(data), LIMIT, charge=charge) == BODY
    assert len(made) == frame_by_frame
    assert charge.held == len(BODY)  # a one-call attempt that gave up gave its charge back
