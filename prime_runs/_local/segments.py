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
by the kernel however the process ends: reading and repairing
(:mod:`prime_runs._local.segment_reader`) cut a torn tail only off files no live
process holds. The format itself (names, entries, frames) is
:mod:`prime_runs._local.segment_format`; its names are importable from here too.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass

import zstandard

from prime_runs._local.disk_budget import DiskBudget
from prime_runs._local.segment_format import (
    DATA_KINDS,
    FRAME_HEADER,
    MAX_FRAME_BYTES,
    MAX_FRAME_LINES,
    MAX_META_BYTES,
    META_MAGIC,
    METRICS,
    REJECTED,
    SKIPPABLE,
    SUFFIX,
    ZSTD_LEVEL,
    ZSTD_MAGIC,
    Frame,
    SegmentName,
    encode_entry,
    frame_bytes,
    frames_of,
    host_label,
    segment_files,
)
from prime_traces.threads import call_in_forked_child

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; a live writer's tail is never repaired there
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

#: A segment rolls over to the next file once it is this large.
DEFAULT_MAX_SEGMENT_BYTES = 128 * 1024**2

# The format's names, for the modules that read and write segments through this one.
__all__ = [
    "DATA_KINDS",
    "DEFAULT_MAX_SEGMENT_BYTES",
    "FRAME_HEADER",
    "MAX_FRAME_BYTES",
    "MAX_FRAME_LINES",
    "MAX_META_BYTES",
    "META_MAGIC",
    "METRICS",
    "REJECTED",
    "SKIPPABLE",
    "SUFFIX",
    "ZSTD_LEVEL",
    "ZSTD_MAGIC",
    "Durable",
    "Frame",
    "SegmentName",
    "SegmentWriter",
    "encode_entry",
    "frame_bytes",
    "frames_of",
    "fsync_directory",
    "host_label",
    "segment_files",
]


@dataclass
class Durable:
    """Lines (and their uncompressed bytes) an ``append`` wrote, and as of its last fsync."""

    lines: int = 0
    bytes: int = 0
    fsynced: tuple[int, int] = (0, 0)
    #: The file this append last wrote to, and its size before.
    start: tuple[str | None, int] | None = None


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

    def __init__(
        self,
        directory: str,
        kind: str,
        *,
        max_segment_bytes: int = DEFAULT_MAX_SEGMENT_BYTES,
        budget: DiskBudget | None = None,
    ) -> None:
        if max_segment_bytes < 1:
            raise ValueError(f"max_segment_bytes must be greater than 0, not {max_segment_bytes}")
        self.directory = directory
        self.kind = kind
        self.max_segment_bytes = max_segment_bytes
        #: The run's disk budget, shared with its other writers: past it, a write fails as on a full disk.
        self.budget = budget
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
        self._lines = 0
        #: Files closed whole (rolled over or closed): their size in bytes and lines, for ``run.json``.
        self.sealed: dict[str, tuple[int, int]] = {}
        self._next_seq = 1
        self._close_requested = False
        self._failed_path: str | None = None
        #: Every file this writer created (in this process), in order.
        self.created: list[str] = []
        self._compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_checksum=True, write_content_size=True)

    @property
    def path(self) -> str | None:
        """The file being appended to, if any."""
        return self._path

    def append(self, frames: Iterable[Frame]) -> int:
        """Write ``frames`` and fsync; returns the bytes written.

        A disk that fills up keeps what fits: a frame that does not fit is
        written again in halves (a ``batch`` frame only whole), down to single
        lines. Raises ``OSError`` naming the file, with ``durable_lines`` and
        ``durable_bytes`` (uncompressed, newlines included): how many of the
        lines, in order, are fsynced. The entry being written when it failed
        is cut off again, a file left empty is removed, and the file is never
        appended to again.
        """
        written = 0
        done = Durable()
        with self._lock:
            try:
                for frame in frames:
                    written += self._append_frame(frame, done)
                if written and self._fd is not None:
                    os.fsync(self._fd)
            except BaseException as err:
                durable = self._after_failure(done)
                if isinstance(err, OSError) and err.filename is None:
                    err.filename = self._failed_path or self.directory
                with contextlib.suppress(AttributeError):
                    err.durable_lines = durable.lines  # type: ignore[attr-defined]
                    err.durable_bytes = durable.bytes  # type: ignore[attr-defined]
                raise
            finally:
                if self._close_requested:
                    self._close_requested = False
                    self._close_file(seal=True)
        return written

    def _append_frame(self, frame: Frame, done: Durable) -> int:
        if not frame.lines:
            return 0
        entry = encode_entry(self._compressor, frame)
        size = len(entry[0]) + len(entry[1])
        if self._fd is not None and self._size and self._size + size > self.max_segment_bytes:
            os.fsync(self._fd)  # rolling over: every frame before this one is on disk
            done.fsynced = (done.lines, done.bytes)
            self._close_file(seal=True)
        if self._fd is None:
            self._open_next()
        assert self._fd is not None
        if done.start is None or done.start[0] != self._path:
            done.start = (self._path, self._size)
        try:
            if self.budget is not None:
                self.budget.charge(size, self._path)
            try:
                _write_all(self._fd, entry)
            except OSError:
                if self.budget is not None:
                    self.budget.refund(size)
                raise
        except OSError as err:
            if err.errno != errno.ENOSPC or frame.batch or len(frame.lines) < 2:
                raise
            self._cut_back(self._size)  # the partial entry off; the two halves may fit where the whole did not
            if self._fd is None:
                raise
            half = len(frame.lines) // 2
            return self._append_frame(Frame(frame.lines[:half]), done) + self._append_frame(
                Frame(frame.lines[half:]), done
            )
        self._size += size
        self._lines += len(frame.lines)
        done.lines += len(frame.lines)
        done.bytes += frame_bytes(frame)
        return size

    def _after_failure(self, done: Durable) -> Durable:
        """Keep the whole entries written before the failure if they can be fsynced; what is durable."""
        self._failed_path = self._path
        kept = Durable(*done.fsynced, fsynced=done.fsynced)
        if self._fd is not None:
            try:
                self._cut_back(self._size)  # the file ends on a whole entry
                if self._fd is not None:
                    os.fsync(self._fd)
                    kept = Durable(done.lines, done.bytes, fsynced=done.fsynced)
            except OSError as err:
                logger.warning("could not make what was written to %s durable: %s", self._path, err)
                if self._fd is not None and done.start is not None and done.start[0] == self._path:
                    self._cut_back(done.start[1])  # not durable: not kept either
        path, empty = self._path, self._fd is not None and self._size == 0
        # Never appended to again: a live sync may have counted the lines cut off.
        self._close_file()
        if empty and path is not None:
            self._remove_empty(path)
        return kept

    def _remove_empty(self, path: str) -> None:
        # A file with no entry would only make ``zstdcat`` fail.
        try:
            os.unlink(path)
            self.created.remove(path)
            fsync_directory(self.directory)
        except (OSError, ValueError) as err:
            logger.warning("could not remove the empty file %s: %s", path, err)

    def _cut_back(self, size: int) -> None:
        assert self._fd is not None
        try:
            os.ftruncate(self._fd, size)
            self._size = size
        except OSError as err:
            logger.warning("could not cut %s back to %d bytes after a failed write: %s", self._path, size, err)
            self._close_file()  # the next write starts a fresh file; recovery cuts this tail

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
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX)  # held until this process closes it or dies
            fsync_directory(self.directory)  # the new name must survive a crash too
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(path)  # never an empty file left behind
            raise
        self._fd, self._path, self._size, self._lines = fd, path, 0, 0
        self.created.append(path)

    def _close_file(self, *, seal: bool = False) -> None:
        # ``seal``: the file ends on a whole entry, all of it fsynced (a rollover or a close after an append).
        if self._fd is not None:
            if seal and self._path is not None and self._size:
                self.sealed[self._path] = (self._size, self._lines)
            os.close(self._fd)
        self._fd, self._path, self._size, self._lines = None, None, 0, 0

    def close(self) -> None:
        """Close the current file (the next append starts a new one); never waits for an append."""
        # Asked first, so an append ending meanwhile still sees it (a hung disk must not hold finish()).
        self._close_requested = True
        if self._lock.acquire(blocking=False):
            try:
                self._close_requested = False
                self._close_file(seal=True)
            finally:
                self._lock.release()


def _write_all(fd: int, buffers: tuple[bytes, ...]) -> None:
    views = [memoryview(b) for b in buffers if b]
    while views:
        done = os.writev(fd, views) if hasattr(os, "writev") else os.write(fd, views[0])  # (Windows has no writev)
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
