"""Reading segments back: their entries, counted from the metadata, and torn tails found and cut.

A writer appends whole entries and fsyncs, so after any crash a segment is a
run of whole entries, then possibly the torn start of one more. :func:`scan`
walks the entries (reading only the small metadata frames), checks that the
last one decodes to the lines it claims, and with ``repair`` cuts off what
follows the last whole entry, unless a live writer holds the file. Frames
written by other tools (without metadata) are decoded to find their end.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import orjson
import zstandard

from prime_runs._local.segments import FRAME_HEADER, MAX_META_BYTES, META_MAGIC, SKIPPABLE, ZSTD_MAGIC

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; tails are never cut there (a writer may be live)
    fcntl = None  # type: ignore[assignment]


@dataclass
class Entry:
    """One entry of a segment: where its zstd frame is, and what it holds."""

    offset: int  # where the entry starts (its metadata, if any)
    data_offset: int
    data_bytes: int  # compressed
    lines: int
    raw_bytes: int
    batch: bool = False


@dataclass
class Scan:
    """The whole entries of a segment, and what was wrong with its tail."""

    path: str
    entries: list[Entry]
    size: int  # bytes up to the end of the last whole entry
    torn_bytes: int = 0  # bytes past it (cut off when repaired)
    problem: str | None = None
    live: bool = False  # a live writer holds the file: its tail may still be growing

    @property
    def lines(self) -> int:
        return sum(e.lines for e in self.entries)

    @property
    def raw_bytes(self) -> int:
        return sum(e.raw_bytes for e in self.entries)


class _Torn(Exception):
    pass


def scan(path: str, *, repair: bool = False, verify_last: bool = True) -> Scan:
    """Walk the entries of ``path``; with ``repair``, cut a torn tail off (unless a live writer holds it).

    An entry is whole when its metadata and frame are complete and, for the
    last entry, when its frame decodes to exactly the lines its metadata
    counts, ending with a newline. Anything after the last whole entry is torn.
    """
    with open(path, "rb+" if repair else "rb") as handle:
        live = fcntl is None  # without locks a live writer cannot be told apart: nothing is ever cut
        if fcntl is not None:
            try:
                fcntl.flock(handle.fileno(), (fcntl.LOCK_EX if repair else fcntl.LOCK_SH) | fcntl.LOCK_NB)
            except BlockingIOError:
                live = True
        total = os.fstat(handle.fileno()).st_size
        entries, problem = _walk(handle, total)
        if verify_last and entries and not live:
            try:
                _check(read_entry(handle, entries[-1]), entries[-1])
            except _Torn as err:
                problem = str(err)
                entries.pop()
        end = entries[-1].data_offset + entries[-1].data_bytes if entries else 0
        result = Scan(path, entries, end, total - end, problem if total > end else None, live)
        if live:
            result.torn_bytes, result.problem = 0, None  # still being written: not torn, only unfinished
        elif repair and result.torn_bytes:
            handle.truncate(end)
            handle.flush()
            os.fsync(handle.fileno())
    return result


def _walk(handle: BinaryIO, total: int) -> tuple[list[Entry], str | None]:
    entries: list[Entry] = []
    pos = 0
    meta: dict[str, object] | None = None
    meta_at = 0
    while pos < total:
        handle.seek(pos)
        header = handle.read(FRAME_HEADER.size)
        if len(header) < 4:
            return entries, f"{len(header)} stray bytes at the end"
        magic = int.from_bytes(header[:4], "little")
        if magic == ZSTD_MAGIC:
            try:
                data_bytes, lines, raw = _measure_frame(handle, pos) if meta is None else _from_meta(meta, pos, total)
            except _Torn as err:
                return entries, str(err)
            batch = bool(meta.get("batch")) if meta is not None else False
            start = meta_at if meta is not None else pos
            entries.append(Entry(start, pos, data_bytes, lines, raw, batch))
            pos += data_bytes
            meta = None
            continue
        if len(header) < FRAME_HEADER.size or magic not in SKIPPABLE:
            return entries, f"no frame at byte {pos}"
        (size,) = struct.unpack_from("<I", header, 4)
        if pos + FRAME_HEADER.size + size > total:
            return entries, f"a metadata frame at byte {pos} is cut short"
        if magic == META_MAGIC and meta is None and size <= MAX_META_BYTES:
            try:
                parsed = orjson.loads(handle.read(size))
            except orjson.JSONDecodeError:
                return entries, f"unreadable metadata at byte {pos}"
            meta, meta_at = parsed if isinstance(parsed, dict) else {}, pos
        elif magic == META_MAGIC:
            return entries, f"metadata without its frame at byte {meta_at}"
        pos += FRAME_HEADER.size + size
    if meta is not None:
        return entries, f"metadata at byte {meta_at} without its frame"
    return entries, None


def _from_meta(meta: dict[str, object], pos: int, total: int) -> tuple[int, int, int]:
    try:
        data_bytes, lines, raw = int(meta["zbytes"]), int(meta["lines"]), int(meta["bytes"])  # type: ignore[call-overload]
    except (KeyError, TypeError, ValueError):
        raise _Torn(f"metadata before byte {pos} is incomplete") from None
    if pos + data_bytes > total:
        raise _Torn(f"the frame at byte {pos} is cut short ({total - pos} of {data_bytes} bytes)")
    return data_bytes, lines, raw


def _measure_frame(handle: BinaryIO, pos: int) -> tuple[int, int, int]:
    """A frame without our metadata (written by another tool): decode it to find its end."""
    handle.seek(pos)
    stream = zstandard.ZstdDecompressor().decompressobj()
    consumed = lines = raw = 0
    tail = b""
    try:
        while not stream.eof:
            chunk = handle.read(1 << 20)
            if not chunk:
                raise _Torn(f"the frame at byte {pos} is cut short")
            out = stream.decompress(chunk)
            lines += out.count(b"\n")
            raw += len(out)
            tail = (tail + out)[-1:] if out else tail
            consumed += len(chunk) - len(stream.unused_data)
    except zstandard.ZstdError as err:
        raise _Torn(f"the frame at byte {pos} does not decode: {err}") from None
    if raw == 0 or tail != b"\n":
        raise _Torn(f"the frame at byte {pos} does not end with a whole line")
    return consumed, lines, raw


def read_entry(handle: BinaryIO, entry: Entry) -> bytes:
    """The uncompressed lines of ``entry``."""
    handle.seek(entry.data_offset)
    data = handle.read(entry.data_bytes)
    try:
        return zstandard.ZstdDecompressor().decompressobj().decompress(data)
    except zstandard.ZstdError as err:
        raise _Torn(f"the frame at byte {entry.data_offset} does not decode: {err}") from None


def _check(body: bytes, entry: Entry) -> None:
    if not body:
        raise _Torn(f"the frame at byte {entry.data_offset} is empty")
    if len(body) != entry.raw_bytes or body.count(b"\n") != entry.lines or not body.endswith(b"\n"):
        raise _Torn(f"the frame at byte {entry.data_offset} does not hold the whole lines it should")


class CorruptSegment(Exception):
    """An entry in the middle of a segment does not decode (the disk changed it)."""


def iter_entry_lines(
    path: str, entries: list[Entry], *, on_corrupt: Callable[[Entry, str], Any] | None = None
) -> Iterator[tuple[Entry, list[bytes]]]:
    """Each entry with its lines (without their newlines), decoded one entry at a time.

    An entry that does not decode raises :class:`CorruptSegment`, or, with
    ``on_corrupt``, is reported to it and passed over.
    """
    with open(path, "rb") as handle:
        for entry in entries:
            try:
                body = read_entry(handle, entry)
                _check(body, entry)
            except _Torn as err:
                if on_corrupt is None:
                    raise CorruptSegment(f"{path}: {err}") from None
                on_corrupt(entry, str(err))
                continue
            yield entry, body.split(b"\n")[:-1]
