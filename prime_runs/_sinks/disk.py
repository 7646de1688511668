"""The sink that writes records into a run directory: offline runs, and ``save_local``'s copy.

Each write becomes zstd segment entries of whole lines (:mod:`prime_runs._local.segments`),
fsynced before its records count as stored. Each line is exactly the line the
Traces sink would upload (same stamping, same encoding), so ``prime-runs
sync`` sends the files as they are. An offline run checks every record
against the contract's line rules first (the module the local service uses,
with the same messages): a record the service would refuse is set aside in
``rejected-*.jsonl.zst`` with why, and counted.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from prime_runs._local.segments import Frame, frames_of
from prime_runs._local.spool import RecordFiles, Spool
from prime_runs._records import reasons
from prime_runs._records.ledger import Ledger
from prime_runs._records.lines import EncodedWrite, RunStamp, releaser
from prime_runs._records.sink import Sink, SinkStatus
from prime_runs._records.size_meter import SizeMeter
from prime_traces.encoding import LineParts, check_record

logger = logging.getLogger(__name__)


class DiskSink(Sink):
    """Writes each write's records to a :class:`RecordFiles` as segment entries.

    ``write`` runs on the worker's threads, one write at a time (it never
    says ``ledger.encoded()``), and blocks on local disk I/O only. It
    stops between entries once ``cancel`` is set; what it has not written
    is left for the worker, which spools it to the same files. Records count
    as ``stored`` once fsynced. With ``validate``, records that break a line
    rule are rejected as ``rejected:<code>`` and set aside; records that
    cannot be encoded fail as ``invalid_record``, and are set aside too. An
    ``OSError`` (disk full, read-only directory) fails the write's other
    records as ``disk_error`` and returns ``TRANSIENT``. Not thread-safe: one
    worker drives it.

    Usage::

        sink = DiskSink(RecordFiles("prime-runs/run-1"), RunStamp("run-1", "eval"))
        status = sink.write(episodes, "episode", ledger, cancel)
        sink.close()
    """

    def __init__(
        self,
        files: RecordFiles,
        stamp: RunStamp | None,
        meter: SizeMeter | None = None,
        *,
        name: str = "offline",
        validate: bool = True,
    ) -> None:
        self.name = name
        self.files = files
        self.stamp = stamp
        self.meter = meter
        self.validate = validate
        #: Where the worker keeps what a deadline left unwritten: the same files.
        self.spool: Spool = Spool(files, stamp)

    @property
    def directory(self) -> str:
        return self.files.directory

    def __repr__(self) -> str:
        return f"DiskSink(name={self.name!r}, directory={self.directory!r})"

    def stats(self) -> dict[str, Any]:
        """What the run's record files take on disk, and their budget."""
        return dict(self.files.disk_stats())

    def write(self, records: Sequence[Any], line_format: str, ledger: Ledger, cancel: threading.Event) -> SinkStatus:
        """Append ``records`` as segment entries, fsync, and report them into ``ledger``."""
        check = functools.partial(_check, line_format, time.time()) if self.validate else None
        # The last sink to read the records lets go of each once it is a line (see Ledger.last_reader).
        release = releaser(records, range(len(records))) if ledger.last_reader else None
        encoded = EncodedWrite(records, line_format, self.stamp, self.meter, ledger, check=check, release=release)
        written: list[tuple[int, int]] = []
        try:
            frames = frames_of(_until_cancelled(encoded, cancel))
            self.files.writer(line_format).append(_noting(frames, written))
        except OSError as err:
            # The writer kept what fitted and cut the entry it was writing off again; it says how many lines stay.
            durable = getattr(err, "durable_lines", 0)
            ledger.stored(encoded.line_records[:durable], getattr(err, "durable_bytes", 0))
            rejected = {position for position, _ in encoded.errors}
            lost = [i for i in range(len(records)) if i not in rejected]
            # (the stored ones are no longer open: not counted twice); the message names errno and path
            ledger.failed(lost, reasons.disk_failure(err), str(err))
            logger.warning("%s sink: records not written to %s: %s", self.name, self.directory, err)
            self.spool.keep_rejected(records, line_format, ledger)
            return SinkStatus.TRANSIENT
        lines = sum(count for count, _ in written)
        ledger.stored(encoded.line_records[:lines], sum(size for _, size in written))
        self.spool.keep_rejected(records, line_format, ledger)
        return SinkStatus.OK

    def close(self) -> None:
        self.files.close()


def _check(line_format: str, now: float, record: Mapping[str, Any]) -> None:
    check_record(record, line_format, now)


def _until_cancelled(lines: Iterable[bytes | LineParts], cancel: threading.Event) -> Iterator[bytes | LineParts]:
    for line in lines:
        yield line
        if cancel.is_set():
            return


def _noting(frames: Iterator[Frame], written: list[tuple[int, int]]) -> Iterator[Frame]:
    # A frame is noted once the writer asks for the next one: it has been written by then.
    for frame in frames:
        yield frame
        size = sum(len(line) if isinstance(line, (bytes, bytearray)) else line.size for line in frame.lines)
        written.append((len(frame.lines), size + len(frame.lines)))
