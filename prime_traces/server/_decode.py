"""Parsing an upload body: multipart parts and bounded decompression.

Decompression never allocates more than the limit plus one step, so a
gzip or zstd bomb is refused as ``upload_too_large`` without being inflated;
its output is charged to the request's share of the body memory budget as it
is produced (before, where its size is known). An uncompressed ``traces``
part is cut out of the body in place rather than copied.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import zstandard

from prime_traces.errors import ErrorCode
from prime_traces.server._body import MemoryCharge
from prime_traces.server._http import ACCEPT_ENCODING, HTTPError

_inflate_module: ModuleType
try:  # ISA-L inflates gzip ~3x faster than zlib; optional (the "server" extra)
    from isal import isal_zlib as _inflate_module
except ImportError:  # pragma: no cover  (exercised by the tests through inflate_with)
    _inflate_module = zlib

_ZSTD_STEP_BYTES = 1024
_ZSTD_HEADER_MAX_BYTES = 18  # magic, descriptor, window, dictionary id, content size
_INFLATE_STEP_BYTES = 8 << 20
_GZIP_MIN_MEMBER_BYTES = 18  # a 10-byte header, an empty deflate block at least, an 8-byte trailer
_DEFLATE_MAX_RATIO = 1032  # deflate's largest expansion: 258 bytes per 2 bits


@dataclass
class Part:
    """One multipart part: lower-cased headers, the form field name, where its bytes are."""

    headers: dict[str, str]
    name: str | None
    filename: str | None
    start: int
    end: int


def decode_body(
    body: bytearray, content_type: str | None, limit_bytes: int, charge: MemoryCharge | None = None
) -> tuple[bytes, bytes | bytearray]:
    """``(metadata part, uncompressed traces part)`` of an upload body.

    400 ``invalid_metadata`` unless there is exactly one part of each. An
    uncompressed traces part is ``body`` itself, cut down in place, so it
    costs no copy: ``body`` is not to be used for anything else afterwards.
    """
    parts = parse_multipart(body, boundary_of(content_type))
    for name in ("metadata", "traces"):
        found = sum(1 for p in parts if p.name == name)
        if found != 1:
            raise HTTPError(400, ErrorCode.INVALID_METADATA, f"expected exactly one {name!r} part, got {found}")
    meta_part = next(p for p in parts if p.name == "metadata")
    traces = next(p for p in parts if p.name == "traces")
    metadata = bytes(body[meta_part.start : meta_part.end])
    coding = (traces.headers.get("content-encoding") or "identity").strip().lower()
    if coding == "identity":
        if traces.end - traces.start > limit_bytes:
            raise _too_large(limit_bytes)
        # The tail first: trimming the end of a bytearray is in place, and
        # deleting its head then only moves its start (no copy either).
        del body[traces.end :]
        del body[: traces.start]
        return metadata, body
    with memoryview(body) as whole, whole[traces.start : traces.end] as view:
        return metadata, decode_part(view, coding, limit_bytes, charge)


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


def parse_multipart(body: bytes | bytearray, boundary: bytes) -> list[Part]:
    """Split a multipart body into parts, by offset (their contents are not copied)."""
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
        parts.append(Part(headers, name, filename, start, end))
        pos = end + 2 + len(delimiter)


def decode_part(
    data: memoryview, coding: str | None, limit_bytes: int, charge: MemoryCharge | None = None
) -> bytes | bytearray:
    """Undo the part's Content-Encoding, refusing output past ``limit_bytes``.

    An unknown coding is 415 with ``Accept-Encoding`` (contract §9); a broken
    stream is 400 ``malformed_encoding``; too much output is 400
    ``upload_too_large``; output the budget cannot hold raises ``MemoryRefused``.
    """
    coding = (coding or "identity").strip().lower()
    if coding != "identity" and not data:
        raise HTTPError(400, ErrorCode.MALFORMED_ENCODING, f"the traces part is empty but says it is {coding}")
    if coding == "identity":
        if len(data) > limit_bytes:
            raise _too_large(limit_bytes)
        return bytes(data)
    if coding in ("gzip", "x-gzip"):
        return _gunzip(data, limit_bytes, charge=charge)
    if coding == "zstd":
        return _unzstd(data, limit_bytes, charge=charge)
    raise HTTPError(
        415,
        ErrorCode.UNSUPPORTED_CONTENT_ENCODING,
        f"Content-Encoding {coding!r} is not accepted; use one of: {ACCEPT_ENCODING}",
        headers={"Accept-Encoding": ACCEPT_ENCODING},
    )


def _too_large(limit_bytes: int) -> HTTPError:
    return HTTPError(
        400,
        ErrorCode.UPLOAD_TOO_LARGE,
        f"the traces part is over {limit_bytes} bytes uncompressed; send smaller batches",
    )


class _Output:
    """Decoded bytes, charged as they are produced; one piece is kept as it is, more are joined as they come."""

    def __init__(self, limit_bytes: int, charge: MemoryCharge | None) -> None:
        self.limit_bytes = limit_bytes
        self.charge = charge
        self.size = 0
        self._first: bytes | None = None
        self._joined: bytearray | None = None

    def take(self, n: int) -> None:
        if self.charge is not None:
            self.charge.take(n)

    def give(self, n: int) -> None:
        if self.charge is not None:
            self.charge.give(n)

    def add(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.limit_bytes:
            raise _too_large(self.limit_bytes)
        if self._first is None and self._joined is None:
            self._first = chunk
            return
        if self._joined is None:
            self._joined, self._first = bytearray(self._first or b""), None
        self._joined += chunk

    def value(self) -> bytes | bytearray:
        if self._joined is not None:
            return self._joined
        return self._first if self._first is not None else b""


def _gunzip(
    data: memoryview, limit_bytes: int, inflate: ModuleType | None = None, *, charge: MemoryCharge | None = None
) -> bytes | bytearray:
    # max_length bounds what zlib produces, so a bomb costs at most the limit,
    # and each step is charged before it is produced. The first step asks for
    # what the last member's trailer says it holds (ISIZE, the size modulo
    # 2**32): a body of one member, as clients send, then decodes in one step
    # (half the CPU of 8 MiB steps); a trailer that lies only sizes a step.
    inflate = inflate or _inflate_module
    out = _Output(limit_bytes, charge)
    pending: bytes | memoryview = data
    first_step = _INFLATE_STEP_BYTES
    if len(data) >= _GZIP_MIN_MEMBER_BYTES:
        # No more than the data could inflate to: a small body's trailer cannot charge the budget much.
        claimed = min(int.from_bytes(data[-4:], "little") + 1, _DEFLATE_MAX_RATIO * len(data))
        first_step = max(first_step, claimed)
    try:
        while pending:
            inflater = inflate.decompressobj(wbits=31)
            while True:
                step = min(first_step, limit_bytes + 1 - out.size)
                first_step = _INFLATE_STEP_BYTES
                out.take(step)
                chunk = inflater.decompress(pending, step)
                out.give(step - len(chunk))
                out.add(chunk)
                pending = inflater.unconsumed_tail
                # A full step may leave output inside zlib even with no input left.
                if inflater.eof or (not pending and len(chunk) < step):
                    break
            if not inflater.eof:
                raise HTTPError(400, ErrorCode.MALFORMED_ENCODING, "gzip stream is truncated")
            pending = inflater.unused_data
    except inflate.error as err:
        raise HTTPError(400, ErrorCode.MALFORMED_ENCODING, f"bad gzip data: {err}") from None
    return out.value()


def _unzstd(data: memoryview, limit_bytes: int, *, charge: MemoryCharge | None = None) -> bytes | bytearray:
    out = _Output(limit_bytes, charge)
    dctx = zstandard.ZstdDecompressor()
    one = _unzstd_one_frame(dctx, data, limit_bytes, out)
    if one is not None:
        return one
    pos, size = 0, len(data)
    try:
        while pos < size:
            frame = dctx.decompressobj()
            declared = zstandard.frame_content_size(data[pos : pos + _ZSTD_HEADER_MAX_BYTES])
            if declared > limit_bytes - out.size:
                raise _too_large(limit_bytes)  # refused from the header, before any output
            if declared >= 0:
                # zstd refuses a frame that decodes to more than its header declares,
                # so decoding it in one call is bounded by the check above.
                out.take(declared)
                chunk = frame.decompress(data[pos:])
                out.give(declared - len(chunk))
                out.add(chunk)
                rest = len(frame.unused_data)
            else:
                rest = _unzstd_unsized(frame, data, pos, out)
            if not frame.eof:
                raise HTTPError(400, ErrorCode.MALFORMED_ENCODING, "zstd stream is truncated")
            pos = size - rest
    except zstandard.ZstdError as err:
        raise HTTPError(400, ErrorCode.MALFORMED_ENCODING, f"bad zstd data: {err}") from None
    return out.value()


def _unzstd_one_frame(dctx: Any, data: memoryview, limit_bytes: int, out: _Output) -> bytes | None:
    """The body as one frame that declares its size (as this package's client sends it), or None.

    Decoded in one call straight into a buffer of the declared size: the
    frame-by-frame path below collects its output in pieces and joins them,
    copies that (with the UTF-8 check's) took an eighth of the service's CPU
    under load. None for anything
    else (no declared size, more than one frame, bad data): the path below
    decodes it, or says exactly what is wrong with it.
    """
    try:
        declared = zstandard.frame_content_size(data[:_ZSTD_HEADER_MAX_BYTES])
    except zstandard.ZstdError:
        return None
    if declared <= 0:
        return None  # zstd answers a frame that declares nothing with nothing, whatever follows it
    if declared > limit_bytes:
        raise _too_large(limit_bytes)  # refused from the header, before any output
    out.take(declared)
    try:
        # zstd refuses a frame that decodes to more or less than its header declares.
        decoded: bytes = dctx.decompress(data, allow_extra_data=False)
    except zstandard.ZstdError:
        out.give(declared)
        return None
    out.add(decoded)
    return decoded


def _unzstd_unsized(frame: Any, data: memoryview, pos: int, out: _Output) -> int:
    """Decode a frame whose header gives no size, in small input slices.

    One zstd input byte can stand for ~32 KiB of output (RLE blocks), so a
    1 KiB slice bounds each step's output to ~32 MiB; that much is charged
    after the step, since zstd cannot cap a step's output beforehand.
    Returns how many input bytes are left after the frame.
    """
    size = len(data)
    rest = 0
    while not frame.eof and pos < size:
        step = data[pos : pos + _ZSTD_STEP_BYTES]
        chunk = frame.decompress(step)
        pos += len(step)
        out.take(len(chunk))
        out.add(chunk)
        rest = len(frame.unused_data) + size - pos
    return rest
