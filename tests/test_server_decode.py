"""Bounded gzip inflation, with ISA-L and with the standard library's zlib."""

from __future__ import annotations

import gzip
import zlib

import pytest

from prime_traces.errors import ErrorCode
from prime_traces.server._decode import _gunzip
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
