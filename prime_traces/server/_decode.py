"""Parsing an upload body: multipart parts and bounded decompression.

Decompression never allocates more than the limit plus one chunk, so a
gzip or zstd bomb is refused as ``upload_too_large`` without being inflated.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import zstandard

from prime_traces.errors import ErrorCode
from prime_traces.server._http import ACCEPT_ENCODING, HTTPError

try:  # ISA-L inflates gzip ~3x faster than zlib; optional (the "server" extra)
    from isal import isal_zlib as _inflate_module
except ImportError:  # pragma: no cover  (exercised by the tests through inflate_with)
    _inflate_module = zlib

_ZSTD_STEP_BYTES = 1024
_ZSTD_HEADER_MAX_BYTES = 18  # magic, descriptor, window, dictionary id, content size


@dataclass
class Part:
    """One multipart part: lower-cased headers, the form field name, the bytes."""

    headers: dict[str, str]
    name: str | None
    filename: str | None
    body: memoryview


def boundary_of(content_type: str | None) -> bytes:
    """The boundary of a ``multipart/form-data`` Content-Type."""
    if not content_type:
        raise HTTPError(400, ErrorCode.INVALID_METADATA, "Content-Type multipart/form-data is required")
    kind, _, rest = content_type.partition(";")
    if kind.strip().lower() != "multipart/form-data":
        raise HTTPError(400, ErrorCode.INVALID_METADATA, f"expected multipart/form-data, got {kind.strip()!r}")
    for param in rest.split(";"):
        key, _, value = param.strip().partition("=")
        if key.lower() == "boundary" and value:
            return value.strip('"').encode("latin-1")
    raise HTTPError(400, ErrorCode.INVALID_METADATA, "multipart Content-Type has no boundary")


def _disposition(value: str) -> tuple[str | None, str | None]:
    name = filename = None
    for param in value.split(";")[1:]:
        key, _, raw = param.strip().partition("=")
        raw = raw.strip()
        if len(raw) >= 2 and raw[0] == raw[-1] == '"':
            raw = raw[1:-1]
        if key.lower() == "name":
            name = raw
        elif key.lower() == "filename":
            filename = raw
    return name, filename


def parse_multipart(body: bytes, boundary: bytes) -> list[Part]:
    """Split a multipart body into parts without copying their contents."""
    view = memoryview(body)
    delimiter = b"--" + boundary
    pos = body.find(delimiter)
    if pos < 0:
        raise HTTPError(400, ErrorCode.INVALID_METADATA, "multipart body has no boundary line")
    parts: list[Part] = []
    pos += len(delimiter)
    while True:
        if body.startswith(b"--", pos):
            return parts
        if not body.startswith(b"\r\n", pos):
            raise HTTPError(400, ErrorCode.INVALID_METADATA, "malformed multipart boundary line")
        head_end = body.find(b"\r\n\r\n", pos + 2)
        if head_end < 0:
            raise HTTPError(400, ErrorCode.INVALID_METADATA, "multipart part has no header end")
        headers: dict[str, str] = {}
        for raw_line in body[pos + 2 : head_end].split(b"\r\n"):
            key, sep, value = raw_line.decode("latin-1").partition(":")
            if not sep:
                raise HTTPError(400, ErrorCode.INVALID_METADATA, "malformed multipart part header")
            headers[key.strip().lower()] = value.strip()
        start = head_end + 4
        end = body.find(b"\r\n" + delimiter, start)
        if end < 0:
            raise HTTPError(400, ErrorCode.INVALID_METADATA, "multipart part is not terminated")
        name, filename = _disposition(headers.get("content-disposition", ""))
        parts.append(Part(headers, name, filename, view[start:end]))
        pos = end + 2 + len(delimiter)


def decode_part(data: memoryview, coding: str | None, limit_bytes: int) -> bytes:
    """Undo the part's Content-Encoding, refusing output past ``limit_bytes``.

    An unknown coding is 415 with ``Accept-Encoding`` (contract §9); a broken
    stream is 400 ``malformed_encoding``; too much output is 400
    ``upload_too_large``.
    """
    coding = (coding or "identity").strip().lower()
    if coding != "identity" and not data:
        raise HTTPError(400, ErrorCode.MALFORMED_ENCODING, f"the traces part is empty but says it is {coding}")
    if coding == "identity":
        if len(data) > limit_bytes:
            raise _too_large(limit_bytes)
        return bytes(data)
    if coding in ("gzip", "x-gzip"):
        return _gunzip(data, limit_bytes)
    if coding == "zstd":
        return _unzstd(data, limit_bytes)
    raise HTTPError(
        415,
        ErrorCode.UNSUPPORTED_CONTENT_ENCODING,
        f"Content-Encoding {coding!r} is not accepted; use one of: {ACCEPT_ENCODING}",
        headers={"Accept-Encoding": ACCEPT_ENCODING},
    )


def _too_large(limit_bytes: int) -> HTTPError:
    return HTTPError(
        400, ErrorCode.UPLOAD_TOO_LARGE,
        f"the traces part is over {limit_bytes} bytes uncompressed; send smaller batches",
    )  # fmt: skip


def _gunzip(data: memoryview, limit_bytes: int, inflate: ModuleType | None = None) -> bytes:
    # max_length bounds what zlib produces, so a bomb costs at most the limit.
    inflate = inflate or _inflate_module
    out: list[bytes] = []
    total = 0
    pending: bytes | memoryview = data
    try:
        while pending:
            inflater = inflate.decompressobj(wbits=31)
            chunk = inflater.decompress(pending, limit_bytes + 1 - total)
            total += len(chunk)
            out.append(chunk)
            if total > limit_bytes or (inflater.unconsumed_tail and not inflater.eof):
                raise _too_large(limit_bytes)
            if not inflater.eof:
                raise HTTPError(400, ErrorCode.MALFORMED_ENCODING, "gzip stream is truncated")
            pending = inflater.unused_data
    except inflate.error as err:
        raise HTTPError(400, ErrorCode.MALFORMED_ENCODING, f"bad gzip data: {err}") from None
    return out[0] if len(out) == 1 else b"".join(out)


def _unzstd(data: memoryview, limit_bytes: int) -> bytes:
    out: list[bytes] = []
    total, pos, size = 0, 0, len(data)
    dctx = zstandard.ZstdDecompressor()
    try:
        while pos < size:
            frame = dctx.decompressobj()
            declared = zstandard.frame_content_size(data[pos : pos + _ZSTD_HEADER_MAX_BYTES])
            if declared > limit_bytes - total:
                raise _too_large(limit_bytes)  # refused from the header, before any output
            if declared >= 0:
                # zstd refuses a frame that decodes to more than its header declares,
                # so decoding it in one call is bounded by the check above.
                chunk = frame.decompress(data[pos:])
                total += len(chunk)
                out.append(chunk)
                rest = len(frame.unused_data)
            else:
                total, rest = _unzstd_unsized(frame, data, pos, out, total, limit_bytes)
            if total > limit_bytes:
                raise _too_large(limit_bytes)
            if not frame.eof:
                raise HTTPError(400, ErrorCode.MALFORMED_ENCODING, "zstd stream is truncated")
            pos = size - rest
    except zstandard.ZstdError as err:
        raise HTTPError(400, ErrorCode.MALFORMED_ENCODING, f"bad zstd data: {err}") from None
    return out[0] if len(out) == 1 else b"".join(out)


def _unzstd_unsized(frame: Any, data: memoryview, pos: int, out: list[bytes], total: int,
                    limit_bytes: int) -> tuple[int, int]:  # fmt: skip
    """Decode a frame whose header gives no size, in small input slices.

    One zstd input byte can stand for ~32 KiB of output (RLE blocks), so a
    1 KiB slice bounds each step's output to ~32 MiB. Returns the new total
    and how many input bytes are left after the frame.
    """
    size = len(data)
    rest = 0
    while not frame.eof and pos < size:
        step = data[pos : pos + _ZSTD_STEP_BYTES]
        chunk = frame.decompress(step)
        pos += len(step)
        total += len(chunk)
        out.append(chunk)
        if total > limit_bytes:
            raise _too_large(limit_bytes)
        rest = len(frame.unused_data) + size - pos
    return total, rest
