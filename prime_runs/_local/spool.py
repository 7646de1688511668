"""The spool: what a sink could not deliver, kept in the run directory for ``prime-runs sync``.

:class:`RecordFiles` is this process's set of segment writers in one
directory (one per line format, one for rejected records). :class:`Spool`
writes into it what a sink left undelivered (the service failed, the sink
retired, the deadline came) and sets aside what was refused for its own
fault. Both run on the worker's threads (two writes' at once, at most), or
on the thread that finishes the run, and block on local disk only, within the deadline they are given.

Records that went out together as one upload whose fate is unknown (its
answer never came) are spooled as one ``batch`` entry, re-encoded byte for
byte, so that ``prime-runs sync`` sends them as that same upload and the
service replays it if it had stored it: nothing is stored twice.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import orjson

from prime_runs._local.disk_budget import DiskBudget
from prime_runs._local.segments import (
    DATA_KINDS,
    METRICS,
    REJECTED,
    Frame,
    SegmentWriter,
    frames_of,
)
from prime_runs._records import reasons
from prime_runs._records.ledger import Ledger, Rejection, Undelivered
from prime_runs._records.lines import EncodedWrite, RunStamp, as_mapping, releaser
from prime_runs._records.size_meter import SizeMeter
from prime_traces.encoding import LineParts

logger = logging.getLogger(__name__)

#: The reason of records that could not even be spooled within ``spill_timeout_s``.
_REPR_CHARS = 10_000


class RecordFiles:
    """This process's segment writers in one directory, created on first use.

    ``on_first_write(directory)`` runs once, before the first file is
    created (the run writes its ``run.json`` then).
    """

    def __init__(
        self,
        directory: str,
        *,
        on_first_write: Callable[[str], Any] | None = None,
        max_segment_bytes: int | None = None,
        budget: DiskBudget | None = None,
    ) -> None:
        self.directory = directory
        self.on_first_write = on_first_write
        #: ``max_spool_bytes``: what this process's record files may take, all kinds together.
        self.budget = budget
        options: dict[str, Any] = {"max_segment_bytes": max_segment_bytes} if max_segment_bytes else {}
        self._writers = {
            kind: SegmentWriter(directory, kind, budget=budget, **options) for kind in (*DATA_KINDS, REJECTED, METRICS)
        }
        self._announced = False
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"RecordFiles({self.directory!r})"

    def writer(self, kind: str) -> SegmentWriter:
        if not self._announced:
            with self._lock:
                if not self._announced:
                    self._announced = True
                    if self.on_first_write is not None:
                        try:
                            self.on_first_write(self.directory)
                        except Exception:  # the records matter more than the index
                            logger.warning("could not prepare %s", self.directory, exc_info=True)
        return self._writers[kind]

    def disk_stats(self) -> dict[str, int]:
        """``spool_bytes`` this process's record files take, and their ``max_spool_bytes`` ({} without a budget)."""
        if self.budget is None:
            return {}
        return {"spool_bytes": self.budget.used_bytes, "max_spool_bytes": self.budget.limit_bytes}

    def sealed(self) -> dict[str, list[int]]:
        """This process's record files closed whole: ``{file name: [bytes, lines]}`` (for ``run.json``)."""
        return {
            os.path.basename(path): [size, lines]
            for kind in DATA_KINDS
            for path, (size, lines) in list(self._writers[kind].sealed.items())
        }

    def own_files(self) -> list[str]:
        """The record files (not the rejected ones) this process wrote here."""
        return [path for kind in DATA_KINDS for path in self._writers[kind].created]

    def keep_rejected(self, records: Sequence[Any], line_format: str, rejections: Sequence[Rejection]) -> None:
        """Keep refused records, each wrapped with why, in ``rejected-*.jsonl.zst``; never raises."""
        if not rejections:
            return
        lines = [
            rejected_entry(*_lossy_json(records[r.index]), line_format, r.reason, r.message, by=_by(r.by_service))
            for r in rejections
        ]
        try:
            self.writer(REJECTED).append(frames_of(lines))
        except OSError as err:
            logger.warning("could not keep %d refused records in %s: %s", len(lines), self.directory, err)

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()


class Spool:
    """Writes undelivered records to a :class:`RecordFiles`, and reports them ``spooled``.

    Usage::

        spool = Spool(RecordFiles("prime-runs/run-1"), RunStamp("run-1", "train"))
        spool.spill(records, "episode", ledger, ledger.take_undelivered(reasons.DEADLINE), deadline)
    """

    def __init__(self, files: RecordFiles, stamp: RunStamp | None, meter: SizeMeter | None = None) -> None:
        self.files = files
        self.stamp = stamp
        #: Fed by what is spooled without having been sent: behind a slow link, the upload's first pass is here.
        self.meter = meter
        self.directory = files.directory

    def __repr__(self) -> str:
        return f"Spool({self.directory!r})"

    def spill(
        self,
        records: Sequence[Any],
        line_format: str,
        ledger: Ledger,
        groups: Sequence[Undelivered],
        deadline: float | None,
    ) -> int:
        """Write ``groups`` of ``records``; returns how many were spooled.

        What the deadline leaves unwritten stays unaccounted in ``ledger``.
        """
        spooled = 0
        for group in groups:
            if deadline is not None and time.monotonic() >= deadline:
                break
            subset = [records[i] for i in group.indexes]
            # The last sink to read the records lets go of each once it is a line (see Ledger.last_reader).
            release = releaser(records, group.indexes) if ledger.last_reader else None
            meter = None if group.batch else self.meter
            encoded = EncodedWrite(
                subset, line_format, self.stamp, meter, ledger, indexes=group.indexes, release=release
            )
            del subset
            written: list[int] = []
            try:
                if group.batch:
                    lines = list(encoded)
                    frames: Iterator[Frame] = iter([Frame(lines, batch=self._same_upload(lines, group, encoded))])
                else:
                    frames = frames_of(_until(encoded, deadline))
                self.files.writer(line_format).append(_noting(frames, written))
            except OSError as err:
                # What fitted is kept (the writer says how many lines are durable); the rest fails, errno and path told.
                kept = getattr(err, "durable_lines", 0)
                ledger.spooled([group.indexes[encoded.line_records[j]] for j in range(kept)], group.reason)
                ledger.failed(group.indexes, reasons.disk_failure(err), str(err))
                logger.warning("could not spool %d records to %s: %s", len(group.indexes) - kept, self.directory, err)
                spooled += kept
                continue
            ledger.spooled([group.indexes[encoded.line_records[j]] for j in range(sum(written))], group.reason)
            spooled += sum(written)
        self.keep_rejected(records, line_format, ledger)
        return spooled

    def _same_upload(self, lines: list[Any], group: Undelivered, encoded: EncodedWrite) -> bool:
        """Whether ``lines`` are the very bytes of the upload they went out in (else it cannot be replayed)."""
        digest = hashlib.sha256()
        for line in lines:
            for part in (line,) if isinstance(line, (bytes, bytearray)) else line:
                digest.update(part)
            digest.update(b"\n")
        if not encoded.errors and (group.key is None or group.key == f"sha256:{digest.hexdigest()}"):
            return True
        logger.warning(
            "%d records of an upload whose answer never came changed after they were logged; if the "
            "service stored that upload, a sync stores them again",
            len(group.indexes),
        )
        return False

    def keep_rejected(self, records: Sequence[Any], line_format: str, ledger: Ledger) -> None:
        """Keep the records ``ledger`` reports refused for their own fault (each once)."""
        self.files.keep_rejected(records, line_format, ledger.take_rejections())

    def close(self) -> None:
        self.files.close()


def _until(lines: Iterable[bytes | LineParts], deadline: float | None) -> Iterator[bytes | LineParts]:
    for line in lines:
        yield line
        if deadline is not None and time.monotonic() >= deadline:
            return


def _noting(frames: Iterator[Frame], written: list[int]) -> Iterator[Frame]:
    # Lines count as spooled only once append() has fsynced their frame.
    for frame in frames:
        yield frame
        written.append(len(frame.lines))


def _lossy_json(record: Any) -> tuple[bytes, str | None]:
    """The record as JSON for a person to read (non-finite floats as null, odd values as text), and its id."""
    try:
        mapping = as_mapping(record, 0)
        record_id = mapping.get("id")
        data = orjson.dumps(mapping, default=_repr, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)
        return data, record_id if isinstance(record_id, str) else None
    except Exception as err:  # noqa: BLE001  (a refused record may be refused because it cannot be read)
        return orjson.dumps({"unreadable": f"{type(err).__name__}: {err}", "repr": _repr(record)}), None


def _repr(value: Any) -> str:
    try:
        text = repr(value)
    except Exception as err:  # noqa: BLE001
        text = f"<{type(value).__name__}: repr() raised {type(err).__name__}>"
    return text[:_REPR_CHARS]


def rejected_entry(
    record_json: bytes, record_id: str | None, line_format: str, reason: str, message: str, *, by: str = "local"
) -> bytes:
    """One line of a rejected file: the record's id, format, error code, reason and message, then the record.

    ``code`` is the service's error code (``invalid_trace``...) or the local one
    (``invalid_record``, ``record_too_large``); ``by`` is ``service`` when the
    service refused it (``prime-runs sync --retry-rejected`` sends those again)
    and ``local`` for this package's own rules; ``record_json`` must be one JSON
    value (it is embedded as it is).
    """
    head = orjson.dumps(
        {
            "id": record_id,
            "line_format": line_format,
            "code": reason.rpartition(":")[2],
            "reason": reason,
            "by": by,
            "message": message,
            "rejected_at": time.time(),
            "pid": os.getpid(),
        }
    )
    return head[:-1] + b',"record":' + record_json + b"}"


def _by(by_service: bool) -> str:
    return "service" if by_service else "local"
