"""Body coding and the auto gzip→zstd switch (contract §2, §9)."""

from __future__ import annotations

import gzip
import threading
import zlib

import pytest
import zstandard

from prime_traces._upload import compress as _compress
from prime_traces._upload.compress import (
    DEFAULT_ZSTD_LEVEL,
    GZIP_LEVEL,
    ISAL_GZIP_LEVEL,
    CodingSelector,
    advertises_zstd,
    compress,
    content_encoding_header,
)

BODY = b"".join(b'{"id": "t-%d", "nodes": [{"role": "user", "content": "hi"}]}\n' % i for i in range(2000))


def test_levels():
    assert GZIP_LEVEL == 1
    assert ISAL_GZIP_LEVEL == 1
    assert DEFAULT_ZSTD_LEVEL >= 1


@pytest.fixture(params=["isal", "zlib"])
def deflater(request, monkeypatch):
    """gzip as the client codes it with ISA-L installed, then without it."""
    if request.param == "isal":
        pytest.importorskip("isal")
    else:
        monkeypatch.setattr(_compress, "_isal_zlib", None)
    return request.param


def test_gzip_is_one_reproducible_member_with_mtime_zero(deflater):
    first = compress(BODY, "gzip")
    assert first == compress(BODY, "gzip")
    assert first[:2] == b"\x1f\x8b"
    assert first[4:8] == b"\x00\x00\x00\x00"  # MTIME
    assert gzip.decompress(first) == BODY
    # Exactly one member: nothing follows the first member's trailer.
    member = zlib.decompressobj(wbits=31)
    assert member.decompress(first) == BODY and member.eof and member.unused_data == b""


def test_gzip_without_isal_is_zlibs_level_one(monkeypatch):
    monkeypatch.setattr(_compress, "_isal_zlib", None)
    assert compress(BODY, "gzip") == gzip.compress(BODY, compresslevel=1, mtime=0)
    assert compress(BODY, "gzip") != gzip.compress(BODY, compresslevel=9, mtime=0)


def test_gzip_with_isal_is_its_level_one_and_no_larger_than_zlibs():
    isal_zlib = pytest.importorskip("isal.isal_zlib")
    coded = compress(BODY, "gzip")
    assert coded == isal_zlib.compress(BODY, 1, wbits=31)
    assert coded != isal_zlib.compress(BODY, 0, wbits=31)
    assert len(coded) <= len(gzip.compress(BODY, compresslevel=1, mtime=0))


def test_zstd_is_one_frame_with_content_size():
    frame = compress(BODY, "zstd")
    params = zstandard.get_frame_parameters(frame)
    assert params.content_size == len(BODY)
    decompressor = zstandard.ZstdDecompressor().decompressobj()
    assert decompressor.decompress(frame) == BODY
    assert decompressor.eof and decompressor.unused_data == b""
    assert frame == compress(BODY, "zstd")


def test_zstd_level_is_applied():
    assert compress(BODY, "zstd", zstd_level=19) != compress(BODY, "zstd", zstd_level=1)


def test_zstd_is_safe_across_threads():
    bodies = [BODY + b'{"id": "%d"}\n' % i for i in range(8)]
    results: dict[int, bytes] = {}
    barrier = threading.Barrier(len(bodies))

    def work(i: int) -> None:
        barrier.wait(timeout=10)
        for _ in range(5):
            results[i] = compress(bodies[i], "zstd")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    decompressor = zstandard.ZstdDecompressor()
    assert all(decompressor.decompress(results[i]) == bodies[i] for i in range(len(bodies)))


@pytest.mark.parametrize("coding", ["identity", None])
def test_identity_is_raw(coding):
    assert compress(BODY, coding) is BODY


def test_unknown_coding_is_refused():
    with pytest.raises(ValueError, match="br"):
        compress(BODY, "br")


def test_content_encoding_header():
    assert content_encoding_header("gzip") == "gzip"
    assert content_encoding_header("zstd") == "zstd"
    assert content_encoding_header("identity") is None


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"Accept-Encoding": "zstd, gzip"}, True),
        ({"accept-encoding": "gzip,zstd"}, True),
        ({"Accept-Encoding": "ZSTD;q=0.5"}, True),
        ({"Accept-Encoding": "gzip"}, False),
        ({"Accept-Encoding": "zstd;q=0"}, False),
        ({"Accept-Encoding": "zstd; q=0.0, gzip"}, False),
        ({"Accept-Encoding": "xzstd, zstdx"}, False),
        ({"Content-Encoding": "zstd"}, False),
        ({}, False),
        ([("Accept-Encoding", "gzip"), ("Accept-Encoding", "zstd")], True),
    ],
)
def test_advertises_zstd(headers, expected):
    assert advertises_zstd(headers) is expected


def test_auto_starts_with_gzip_and_switches_once_advertised():
    selector = CodingSelector("auto")
    assert selector.current() == "gzip"
    selector.observe({"Accept-Encoding": "gzip"})
    selector.observe({})
    assert selector.current() == "gzip"
    selector.observe({"Accept-Encoding": "zstd, gzip"})
    assert selector.current() == "zstd"
    # Later responses without the header do not switch it back.
    selector.observe({})
    assert selector.current() == "zstd"


def test_auto_falls_back_to_gzip_when_zstd_is_refused():
    selector = CodingSelector("auto")
    selector.observe({"Accept-Encoding": "zstd"})
    selector.refused("zstd")
    assert selector.current() == "gzip"


@pytest.mark.parametrize(("compression", "expected"), [("gzip", "gzip"), ("zstd", "zstd"), ("none", "identity")])
def test_fixed_modes_ignore_advertisements(compression, expected):
    selector = CodingSelector(compression)
    assert selector.current() == expected
    selector.observe({"Accept-Encoding": "zstd"})
    selector.refused("zstd")
    assert selector.current() == expected


def test_default_is_auto():
    assert CodingSelector().compression == "auto"


@pytest.mark.parametrize("value", ["br", "", "GZIP", None, True])
def test_invalid_compression_lists_the_valid_values(value):
    with pytest.raises(ValueError) as info:
        CodingSelector(value)  # type: ignore[arg-type]
    for choice in ("'auto'", "'gzip'", "'zstd'", "'none'"):
        assert choice in str(info.value)


def test_selector_switch_is_seen_by_every_thread():
    selector = CodingSelector("auto")
    start = threading.Barrier(8)
    observed = threading.Barrier(8)
    seen: list[str] = []

    def work(i: int) -> None:
        start.wait(timeout=10)
        selector.observe({"Accept-Encoding": "zstd" if i == 0 else "gzip"})
        # Read only once every thread has observed, so each reader comes after
        # the one advertisement and after every gzip-only answer.
        observed.wait(timeout=10)
        seen.append(selector.current())

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert seen == ["zstd"] * 8
    assert selector.current() == "zstd"
