"""Segment files: records on local disk as zstd frames of whole JSONL lines.

A segment is written by one process only (its name carries the host and the
pid, and it is created exclusively), as a sequence of entries::

    [skippable frame: {"lines": n, "bytes": raw, "zbytes": z, "batch": true?}] [zstd frame: n lines]

Each entry is written whole and each call of :meth:`SegmentWriter.append` is
fsynced before it returns, so ``zstdcat`` reads the lines of any segment (it
skips the metadata) and a crash can tear only the last entry of a file. The
metadata lets a reader count and skip lines without decompressing, and marks
a ``batch``: lines that once went to the service as one upload of unknown
fate, to be sent again exactly as they were so that the service replays
instead of storing them twice.

The writer holds an exclusive ``flock`` on the file it appends to, released
by the kernel however the process ends: :func:`scan` with ``repair`` cuts a
torn tail only off files no live process holds.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import socket
import struct
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

import orjson
import zstandard

from prime_traces._batching import LineParts
from prime_traces._pool import call_in_forked_child

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; a live writer's tail is never repaired there
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

SUFFIX = ".jsonl.zst"
#: Kinds of segment: records to upload (by line format), and records set aside.
DATA_KINDS = ("episode", "trace")
REJECTED = "rejected"
#: A segment rolls over to the next file once it is this large.
DEFAULT_MAX_SEGMENT_BYTES = 128 * 1024**2
#: Lines are cut into frames of about this many uncompressed bytes (a batch entry is never cut).
MAX_FRAME_BYTES = 16 * 1024**2
ZSTD_LEVEL = 1

_META_MAGIC = 0x184D2A5E  # a zstd skippable frame: decoders pass over it
_SKIPPABLE = range(0x184D2A50, 0x184D2A60)
_ZSTD_MAGIC = 0xFD2FB528
_HEADER = struct.Struct("<II")
_MAX_META_BYTES = 4096
_NAME_RE = re.compile(r"^(?P<kind>[a-z]+)-(?P<host>.+)-(?P<pid>\d+)-(?P<seq>\d{6,})" + re.escape(SUFFIX) + "$")
_HOST_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def host_label() -> str:
    """This machine's name, safe inside a file name."""
    return _HOST_UNSAFE.sub("_", socket.gethostname() or "host")[:64] or "host"


@dataclass(frozen=True)
class SegmentName:
    """``<kind>-<host>-<pid>-<seq>.jsonl.zst``."""

    kind: str
    host: str
    pid: int
    seq: int

    @classmethod
    def parse(cls, filename: str) -> SegmentName | None:
        match = _NAME_RE.match(filename)
        if match is None:
            return None
        return cls(match["kind"], match["host"], int(match["pid"]), int(match["seq"]))

    def __str__(self) -> str:
        return f"{self.kind}-{self.host}-{self.pid}-{self.seq:06d}{SUFFIX}"


def segment_files(directory: str, kinds: Iterable[str]) -> list[str]:
    """Paths of the segments of ``kinds`` in ``directory``, in name order (missing directory: none)."""
    wanted = set(kinds)
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = [(n, SegmentName.parse(n)) for n in names]
    return sorted(os.path.join(directory, n) for n, parsed in found if parsed is not None and parsed.kind in wanted)


@dataclass
class Frame:
    """Lines to write as one entry; ``batch`` marks lines that must travel as one upload."""

    lines: list[bytes | LineParts]
    batch: bool = False


class SegmentWriter:
    """Appends entries to this process's segments of one kind; thread-safe.

    Files are created exclusively and lazily, on the first :meth:`append`, so
    a writer that never writes leaves nothing behind. :meth:`append` returns
    once the data is fsynced. A forked child drops the parent's file (without
    unlocking it) and starts files of its own.

    Usage::

        writer = SegmentWriter("runs/run-1", "episode")
        writer.append([Frame([b'{"id": "e1", ...}'])])
        writer.close()
    """

    def __init__(self, directory: str, kind: str, *, max_segment_bytes: int = DEFAULT_MAX_SEGMENT_BYTES) -> None:
        if max_segment_bytes < 1:
            raise ValueError(f"max_segment_bytes must be greater than 0, not {max_segment_bytes}")
        self.directory = directory
        self.kind = kind
        self.max_segment_bytes = max_segment_bytes
        self._reset()
        call_in_forked_child(self._reset)

    def _reset(self) -> None:
        # After fork: the parent's descriptor is closed, never unlocked (the lock is
        # the parent's too), and the child's files get its own pid.
        fd = getattr(self, "_fd", None)
        if fd is not None and getattr(self, "_pid", None) != os.getpid():
            try:
                os.close(fd)
            except OSError:
                pass
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._pid = os.getpid()
        self._path: str | None = None
        self._size = 0
        self._next_seq = 1
        self._compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_checksum=True, write_content_size=True)

    @property
    def path(self) -> str | None:
        """The file being appended to, if any."""
        return self._path

    def append(self, frames: Iterable[Frame]) -> int:
        """Write ``frames`` and fsync; returns the bytes written. Raises ``OSError``."""
        written = 0
        with self._lock:
            start: tuple[int, int] | None = None
            try:
                for frame in frames:
                    if not frame.lines:
                        continue
                    entry = encode_entry(self._compressor, frame)
                    fd = self._file_for(len(entry[0]) + len(entry[1]))
                    if start is None or start[0] != fd:
                        start = (fd, self._size)
                    _write_all(fd, entry)
                    self._size += len(entry[0]) + len(entry[1])
                    written += len(entry[0]) + len(entry[1])
                if written and self._fd is not None:
                    os.fsync(self._fd)
            except BaseException:
                if start is not None and start[0] == self._fd:
                    self._cut_back(start[1])  # nothing of a failed call stays: the file ends on a whole entry
                raise
        return written

    def _cut_back(self, size: int) -> None:
        assert self._fd is not None
        try:
            os.ftruncate(self._fd, size)
            self._size = size
        except OSError as err:
            logger.warning("could not cut %s back to %d bytes after a failed write: %s", self._path, size, err)
            self._close_file()  # the next write starts a fresh file; recovery cuts this tail

    def _file_for(self, size: int) -> int:
        if self._fd is not None and self._size and self._size + size > self.max_segment_bytes:
            os.fsync(self._fd)
            self._close_file()
        if self._fd is None:
            self._open_next()
        assert self._fd is not None
        return self._fd

    def _open_next(self) -> None:
        os.makedirs(self.directory, exist_ok=True)
        host, pid = host_label(), os.getpid()
        while True:
            path = os.path.join(self.directory, str(SegmentName(self.kind, host, pid, self._next_seq)))
            self._next_seq += 1
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
            except FileExistsError:
                continue  # an earlier process with this pid (a reused pid) left it: never append to it
            break
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)  # held until this process closes it or dies
        fsync_directory(self.directory)  # the new name must survive a crash too
        self._fd, self._path, self._size = fd, path, 0

    def _close_file(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd, self._path, self._size = None, None, 0

    def close(self) -> None:
        """Close the current file (the next append starts a new one)."""
        with self._lock:
            self._close_file()


def encode_entry(compressor: zstandard.ZstdCompressor, frame: Frame) -> tuple[bytes, bytes]:
    """The metadata frame and the zstd frame of ``frame``'s lines."""
    raw = sum(len(line) if isinstance(line, (bytes, bytearray)) else line.size for line in frame.lines)
    raw += len(frame.lines)
    stream = compressor.compressobj(size=raw)
    chunks = []
    for line in frame.lines:
        for part in (line,) if isinstance(line, (bytes, bytearray)) else line:
            chunks.append(stream.compress(part))
        chunks.append(stream.compress(b"\n"))
    chunks.append(stream.flush())
    data = b"".join(chunks)
    meta: dict[str, object] = {"lines": len(frame.lines), "bytes": raw, "zbytes": len(data)}
    if frame.batch:
        meta["batch"] = True
    payload = orjson.dumps(meta)
    return _HEADER.pack(_META_MAGIC, len(payload)) + payload, data


def frames_of(lines: Iterable[bytes | LineParts], max_frame_bytes: int = MAX_FRAME_BYTES) -> Iterator[Frame]:
    """Cut a stream of lines into frames of about ``max_frame_bytes`` (never splitting a line)."""
    pending: list[bytes | LineParts] = []
    size = 0
    for line in lines:
        pending.append(line)
        size += (len(line) if isinstance(line, (bytes, bytearray)) else line.size) + 1
        if size >= max_frame_bytes:
            yield Frame(pending)
            pending, size = [], 0
    if pending:
        yield Frame(pending)


def _write_all(fd: int, buffers: tuple[bytes, ...]) -> None:
    views = [memoryview(b) for b in buffers if b]
    while views:
        done = os.writev(fd, views)
        while views and done >= len(views[0]):
            done -= len(views[0])
            views.pop(0)
        if views and done:
            views[0] = views[0][done:]


def fsync_directory(directory: str) -> None:
    """Make a directory's entries (a new or renamed file) durable; a no-op where unsupported."""
    if not hasattr(os, "O_DIRECTORY"):  # Windows cannot open a directory; NTFS journals names
        return
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno != errno.EINVAL:  # some filesystems cannot fsync a directory
            raise
    finally:
        os.close(fd)


# -- reading -------------------------------------------------------------------


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
        live = False
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
        header = handle.read(_HEADER.size)
        if len(header) < 4:
            return entries, f"{len(header)} stray bytes at the end"
        magic = int.from_bytes(header[:4], "little")
        if magic == _ZSTD_MAGIC:
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
        if len(header) < _HEADER.size or magic not in _SKIPPABLE:
            return entries, f"no frame at byte {pos}"
        (size,) = struct.unpack_from("<I", header, 4)
        if pos + _HEADER.size + size > total:
            return entries, f"a metadata frame at byte {pos} is cut short"
        if magic == _META_MAGIC and meta is None and size <= _MAX_META_BYTES:
            try:
                parsed = orjson.loads(handle.read(size))
            except orjson.JSONDecodeError:
                return entries, f"unreadable metadata at byte {pos}"
            meta, meta_at = parsed if isinstance(parsed, dict) else {}, pos
        elif magic == _META_MAGIC:
            return entries, f"metadata without its frame at byte {meta_at}"
        pos += _HEADER.size + size
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


def iter_entry_lines(path: str, entries: list[Entry]) -> Iterator[tuple[Entry, list[bytes]]]:
    """Each entry with its lines (without their newlines), decoded one entry at a time."""
    with open(path, "rb") as handle:
        for entry in entries:
            try:
                body = read_entry(handle, entry)
                _check(body, entry)
            except _Torn as err:
                raise CorruptSegment(f"{path}: {err}") from None
            yield entry, body.split(b"\n")[:-1]
