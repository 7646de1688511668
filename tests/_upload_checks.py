"""Shared pieces of the upload tests: answer assertions, counts, streams of zeros."""

from __future__ import annotations

import functools
import hashlib
import zlib
from typing import Any

import zstandard
from _wire import (
    ACCEPT_ENCODING,
    episode,
    trace,
)

from prime_traces.server import LocalTracesService

MIB = 1024 * 1024
DAY_S = 24 * 3600
TABLES = ("uploads", "traces", "trace_docs", "episodes", "episode_docs")


def committed(resp: Any, body: bytes, status: int = 201) -> dict[str, Any]:
    """Assert a receipt for ``body`` (uncompressed) and return it."""
    assert resp.status_code == status, resp.text
    assert resp.headers.get("Accept-Encoding") == ACCEPT_ENCODING
    receipt = resp.json()
    assert receipt["upload_id"] == hashlib.sha256(body).hexdigest()
    assert receipt["status"] == "committed"
    return receipt


def error_of(resp: Any, status: int, code: str | None) -> dict[str, Any]:
    """Assert an error envelope on an upload answer and return its ``error``."""
    assert resp.status_code == status, resp.text
    assert resp.headers.get("Accept-Encoding") == ACCEPT_ENCODING
    error = resp.json()["error"]
    assert isinstance(error["message"], str) and error["message"]
    if code is not None:
        assert error["code"] == code, error
    return error


def line_error(resp: Any, code: str, line: int, record_id: str | None) -> dict[str, Any]:
    error = error_of(resp, 400, code)
    assert error.get("line") == line, error
    if record_id is None:
        assert "id" not in error, error
    else:
        assert error.get("id") == record_id, error
    return error


def counts(svc: LocalTracesService) -> dict[str, int]:
    with svc.state.store.reader() as conn:
        return {t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in TABLES}


def assert_nothing_stored(svc: LocalTracesService) -> None:
    assert counts(svc) == dict.fromkeys(TABLES, 0)
    assert svc.stats()["uploads"] == 0


def good_then(bad: dict[str, Any] | bytes | str, *, fmt: str = "trace") -> list[Any]:
    """A valid first line, then ``bad`` as line 2."""
    first = trace("good-1") if fmt == "trace" else episode("ep-good", [trace("good-m1")])
    return [first, bad]


@functools.cache
def zeros_key(mib: int) -> str:
    digest = hashlib.sha256()
    for _ in range(mib):
        digest.update(bytes(MIB))
    return "sha256:" + digest.hexdigest()


@functools.cache
def zeros_stream(coding: str, mib: int) -> bytes:
    """``mib`` MiB of zero bytes in one gzip member or zstd frame.

    Compressed chunk by chunk, so the test never holds the inflated bytes.
    """
    chunk = bytes(MIB)
    if coding == "gzip":
        comp: Any = zlib.compressobj(9, zlib.DEFLATED, 31, 9, zlib.Z_RLE)
    else:
        comp = zstandard.ZstdCompressor(level=1).compressobj()
    out = []
    for _ in range(mib):
        out.append(comp.compress(chunk))
    out.append(comp.flush())
    return b"".join(out)
