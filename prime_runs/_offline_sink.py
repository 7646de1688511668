"""The sink that appends records to JSONL files in a run directory.

Layout, one directory per run::

    <dir>/traces.jsonl     trace-format writes, one stamped trace per line
    <dir>/episodes.jsonl   episode-format writes, one stamped envelope per line

Each line is exactly the line the Traces sink would upload (same stamping,
same encoding), so the files can later be sent as they are with
``prime-traces upload --line-format episode <dir>/episodes.jsonl``. Each
write is appended and then flushed and ``fsync``'d, and its records count as
stored only after that. A write that fails part-way is cut off again, so
the files always end on a whole line.

A later release replaces the files with zstd-compressed segments and an
atomically replaced ``run.json`` index. All the writing lives in
:class:`OfflineSink`, so only this class changes then.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from typing import Any

from prime_runs._encoding import EncodedWrite, RunStamp
from prime_runs._queue import SizeMeter
from prime_runs._sink import Ledger, SinkStatus
from prime_traces._batching import LineParts, line_size

logger = logging.getLogger(__name__)

DISK_ERROR = "disk_error"
FILE_NAMES = {"trace": "traces.jsonl", "episode": "episodes.jsonl"}
_WRITE_BUFFER_BYTES = 1024**2


class OfflineSink:
    """Appends each write to ``<dir>/traces.jsonl`` or ``<dir>/episodes.jsonl``.

    ``write`` runs on the worker thread and blocks on local disk I/O only. It
    stops between records once ``cancel`` is set, and keeps what it has
    written so far. Records count as ``stored`` once fsync'd. Records that
    cannot be encoded fail as ``invalid_record``. An ``OSError`` (disk full,
    read-only directory) fails the write's unwritten records as
    ``disk_error`` and returns ``TRANSIENT``. The directory, parents
    included, is created on the first write. Not thread-safe: one worker
    drives it.

    Usage::

        sink = OfflineSink("runs/run-1", RunStamp("run-1", "eval"))
        status = sink.write(episodes, "episode", ledger, cancel)
        sink.close()
    """

    name = "offline"

    def __init__(self, directory: str | os.PathLike[str], stamp: RunStamp | None,
                 meter: SizeMeter | None = None) -> None:  # fmt: skip
        self.directory = os.fspath(directory)
        self.stamp = stamp
        self.meter = meter

    def __repr__(self) -> str:
        return f"OfflineSink(directory={self.directory!r})"

    def path_for(self, line_format: str) -> str:
        """The file that writes of ``line_format`` (``trace`` or ``episode``) append to."""
        try:
            return os.path.join(self.directory, FILE_NAMES[line_format])
        except KeyError:
            raise ValueError(f"line_format must be 'trace' or 'episode', not {line_format!r}") from None

    def write(
        self, records: Sequence[Any], line_format: str, ledger: Ledger, cancel: threading.Event
    ) -> SinkStatus:
        """Append ``records`` as JSONL, fsync, and report them into ``ledger``."""
        path = self.path_for(line_format)
        encoded = EncodedWrite(records, line_format, self.stamp, self.meter, ledger)
        written = size = 0
        start: int | None = None
        try:
            os.makedirs(self.directory, exist_ok=True)
            with open(path, "ab", buffering=_WRITE_BUFFER_BYTES) as handle:
                start = handle.tell()
                for line in encoded:
                    handle.writelines(line) if isinstance(line, LineParts) else handle.write(line)
                    handle.write(b"\n")
                    written += 1
                    size += line_size(line) + 1
                    if cancel.is_set():
                        break  # keep what is written: it is fsync'd below and counted stored
                handle.flush()
                os.fsync(handle.fileno())
            if start == 0:
                _fsync_directory(self.directory)  # a new file's name must survive a crash too
        except OSError as err:
            if start is not None:
                _truncate(path, start)
            # None of this write is known to be on disk; the invalid records are already counted.
            lost = len(records) - len(encoded.errors)
            ledger.failed(lost, DISK_ERROR)
            logger.warning("offline sink: %d records not written to %s: %s", lost, path, err)
            return SinkStatus.TRANSIENT
        ledger.stored(written, size)
        return SinkStatus.OK

    def close(self) -> None:
        """Nothing to release: each write opens and closes its file."""


def _truncate(path: str, size: int) -> None:
    # Cut a partly written write off, so the next write starts on a fresh line.
    try:
        os.truncate(path, size)
    except OSError as err:
        logger.debug("offline sink: could not truncate %s back to %d bytes: %s", path, size, err)


def _fsync_directory(directory: str) -> None:
    if not hasattr(os, "O_DIRECTORY"):  # Windows cannot open a directory; NTFS journals names
        return
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
