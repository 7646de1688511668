"""``prime-runs sync``: upload what a run directory holds, exactly once, resumable at any point.

Each segment is uploaded in line order with the client's deterministic
batching. What has been uploaded is recorded in ``sync.json`` (atomically)
as each batch commits, as the number of leading lines ``done``. The batches a
sync sends are a function of the file and of that record alone (``done``,
the lines set aside, and the points where a batch must end), and the record
is written before anything that depends on it is sent. So a sync that is
interrupted anywhere and run again sends the very same batches: the service
replays those it had stored, and nothing is stored twice. ``horizon`` fixes
where a pass ends while a live writer is still appending to the file.

A batch must also end at both sides of a ``batch`` entry (records that went
out as one upload whose answer never came): that entry is sent alone, as the
same bytes, so the service replays it if it had stored it.

A line the service refuses for its own fault is set aside in the sync's
``rejected-*.jsonl.zst`` and skipped; a refused batch without a named line is
split in two until the line is found.
"""

from __future__ import annotations

import bisect
import collections
import logging
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from prime_runs._local.file_progress import FileProgress, pending
from prime_runs._local.segment_reader import Entry, Scan, iter_entry_lines
from prime_runs._local.segments import Frame, SegmentName, SegmentWriter
from prime_runs._local.spool import rejected_entry
from prime_runs._local.sync_server_errors import settle_server_error
from prime_runs._records import reasons
from prime_runs._records.faults import (
    RECORD,
    SIZE_CODES,
    TRANSIENT,
    fault_of,
    is_server_error,
    outcome_text,
    rejection_reason,
)
from prime_traces.client import DEFAULT_TARGET_BATCH_BYTES, MAX_BATCH_BYTES, TracesClient
from prime_traces.errors import NotFoundError, PrimeTracesError, TraceTooLargeError, UploadError

logger = logging.getLogger(__name__)

#: Progress callback: (records, uncompressed bytes) just uploaded.
OnProgress = Callable[[int, int], Any]


class SyncStopped(Exception):
    """The run cannot go on now: the service is down (``transient``), or refuses the uploads."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


@dataclass
class FileOutcome:
    uploaded: int = 0
    uploaded_bytes: int = 0
    rejected: int = 0


class FileSync:
    """Uploads one segment from where the last sync left it."""

    def __init__(
        self,
        client: TracesClient,
        path: str,
        scan: Scan,
        progress: FileProgress,
        *,
        context: dict[str, str],
        save: Callable[[], None],
        rejected: SegmentWriter,
        on_progress: OnProgress | None = None,
        restamp: Callable[[bytes, str], bytes] | None = None,
        on_file_progress: Callable[[str, int, int], Any] | None = None,
        cancel: threading.Event | None = None,
    ) -> None:
        name = SegmentName.parse(os.path.basename(path))
        assert name is not None
        self.client = client
        self.path = path
        self.line_format = name.kind
        self.scan = scan
        self.p = progress
        self.context = context
        self.save = save
        self.rejected_writer = rejected
        self.on_progress = on_progress
        #: Told ``(line_format, records, bytes)`` as each batch of this file commits.
        self.on_file_progress = on_file_progress
        #: Gives a line the run's id on the service, when it was written under another (an offline run's).
        self.restamp = restamp
        #: Once set, no new batch goes out; those in flight are abandoned with their keys (a later sync replays them).
        self.cancel = cancel
        self.outcome = FileOutcome()
        self.total = scan.lines
        self._starts: list[int] = []
        first = 0
        for entry in scan.entries:
            self._starts.append(first)
            first += entry.lines
        self._index = {id(entry): i for i, entry in enumerate(scan.entries)}
        self._batches = [i for i, entry in enumerate(scan.entries) if entry.batch]
        #: Batches (their line numbers) answered 500 in this sync, and how often (``sync_server_errors.py``).
        self.server_errors: collections.Counter[tuple[int, ...]] = collections.Counter()

    def left(self) -> tuple[int, int]:
        """Records and (about) uncompressed bytes not uploaded yet."""
        return pending(self.scan, self.p)

    def run(self) -> None:
        """Upload up to the end of the file's whole entries; raises :class:`SyncStopped`."""
        if self.p.done > self.total:
            # A writer cut a failed write back off after a sync had read it; it never appends there again.
            logger.warning(
                "%s now ends at line %d, before the %d lines uploaded from it: a failed write was cut off it",
                self.path,
                self.total,
                self.p.done,
            )
            self.p.done = self.p.horizon = self.total
            self.save()
        while self.p.done < self.total:
            if self.cancel is not None and self.cancel.is_set():
                raise SyncStopped(f"{self.path}: stopped before it was uploaded whole", transient=True)
            if self.p.horizon is None or self.p.horizon <= self.p.done:
                self.p.horizon = self.total
                self.save()  # before any batch that depends on it
            start = self.p.done
            end, unit = self._next_cut(start)
            self._upload(start, end, unit)

    def _next_cut(self, start: int) -> tuple[int, Entry | None]:
        assert self.p.horizon is not None
        cuts = {self.p.horizon, *(c for c in self.p.cuts if c > start)}
        for i in self._batches:
            entry, first = self.scan.entries[i], self._starts[i]
            if first == start:
                return min(cuts | {first + entry.lines}), entry
            if first > start:
                cuts.add(first)
                break
        return min(cuts), None

    def _entries_between(self, start: int, end: int) -> list[int]:
        """Indexes of the entries holding lines ``start`` to ``end``."""
        first = max(0, bisect.bisect_right(self._starts, start) - 1)
        last = bisect.bisect_left(self._starts, end)
        return list(range(first, last))

    def _lines(self, start: int, end: int, numbers: list[int]) -> Iterator[bytes]:
        wanted = [self.scan.entries[i] for i in self._entries_between(start, end)]
        skipped = self.p.skip_test()  # spans added while this runs are of lines already sent
        for entry, lines in iter_entry_lines(self.path, wanted, on_corrupt=self._unreadable):
            first = self._starts[self._index[id(entry)]]
            for offset, line in enumerate(lines):
                number = first + offset
                if start <= number < end and not skipped(number):
                    numbers.append(number)
                    yield line if self.restamp is None else self.restamp(line, self.line_format)

    def _unreadable(self, entry: Entry, problem: str) -> None:
        # The disk changed an entry: it is the same every time, so passing over it keeps batches deterministic.
        first = self._starts[self._index[id(entry)]]
        if (first, first + entry.lines) in self.p.unreadable:
            return
        self.p.unreadable.append((first, first + entry.lines))
        logger.error("%s: %s; its %d lines cannot be read and are not uploaded", self.path, problem, entry.lines)

    def _upload(self, start: int, end: int, unit: Entry | None) -> None:
        numbers: list[int] = []
        target = DEFAULT_TARGET_BATCH_BYTES
        if unit is not None:  # sent alone, as the one upload it was
            target = min(MAX_BATCH_BYTES, max(target, unit.raw_bytes))

        expected = [0]  # the first input line of the next batch, while no batch before it failed

        def on_batch(batch: Any, _receipt: Any) -> None:
            last = batch.line_indexes[-1]
            if batch.first_line == expected[0]:
                expected[0] = last + 1
                self.p.advance(numbers[last] + 1)
            else:  # stored, but a batch before it was not: ``done`` stays behind that one
                first = numbers[batch.first_line]
                self.p.uploaded.append((first, numbers[last] + 1))
                # The batches before it must end where they did, or the one that failed (and may
                # be stored) would be sent with other lines, as a new upload.
                self.p.cuts.add(first)
            self.outcome.uploaded += batch.line_count
            self.outcome.uploaded_bytes += batch.size_bytes
            self.save()
            if self.on_progress is not None:
                self.on_progress(batch.line_count, batch.size_bytes)
            if self.on_file_progress is not None:
                self.on_file_progress(self.line_format, batch.line_count, batch.size_bytes)

        try:
            self.client.upload_lines(
                self._lines(start, end, numbers),
                line_format=self.line_format,
                context=self.context,
                target_batch_bytes=target,
                on_batch=on_batch,
                # Cut where every earlier sync of this file cut, whatever this client knows: each batch replays.
                learn_coding=False,
                cancel=self.cancel,
            )
        except TraceTooLargeError as err:
            self.keep_rejected(numbers[err.line_index], reasons.rejected("trace_too_large"), str(err), by="local")
            return
        except UploadError as err:
            self._settle(err, numbers)
            return
        self.p.advance(end)
        self.save()

    def _settle(self, err: UploadError, numbers: list[int]) -> None:
        if isinstance(err.error, TraceTooLargeError):
            too_large = reasons.rejected("trace_too_large")
            self.keep_rejected(numbers[err.error.line_index], too_large, str(err.error), by="local")
            return
        failed = err.report.first_failure
        if failed is None:
            raise SyncStopped(f"{self.path}: {err}")
        if is_server_error(failed):
            stop = settle_server_error(self, [numbers[j] for j in failed.line_indexes], failed)
            if stop is not None:
                raise SyncStopped(stop, transient=True)
            return
        fault = fault_of(failed)
        if fault == TRANSIENT:
            raise SyncStopped(f"could not upload {self.path}: {failed.error}", transient=True)
        if fault != RECORD:
            raise SyncStopped(f"the service refused {self.path}: {outcome_text(failed)}")
        batch = [numbers[j] for j in failed.line_indexes]
        if failed.rejected_line is not None and failed.code not in SIZE_CODES:
            self.keep_rejected(numbers[failed.rejected_line], rejection_reason(failed), outcome_text(failed))
        elif len(batch) == 1:
            self.keep_rejected(batch[0], rejection_reason(failed), outcome_text(failed))
        else:  # no line named: split the batch until the line is found
            self.p.cuts.add(batch[len(batch) // 2])
            self.save()

    def keep_rejected(self, number: int, reason: str, message: str, *, by: str = "service") -> None:
        line = self._line_at(number)
        try:
            record_id = orjson.loads(line).get("id")
            record_json = line
        except (orjson.JSONDecodeError, AttributeError):
            record_id, record_json = None, orjson.dumps(line.decode("utf-8", "replace"))
        entry = rejected_entry(
            record_json, record_id if isinstance(record_id, str) else None, self.line_format, reason, message, by=by
        )
        self.rejected_writer.append([Frame([entry])])
        self.p.excluded.add(number)
        self.outcome.rejected += 1
        self.save()
        logger.warning(
            "%s line %d (%s) refused: %s; kept in %s",
            self.path,
            number + 1,
            record_id,
            message,
            self.rejected_writer.path,
        )

    def stored_already(self, number: int) -> bool | None:
        """Whether the service holds the record on line ``number`` (``None``: it could not say)."""
        try:
            record_id = orjson.loads(self._line_at(number)).get("id")
        except (orjson.JSONDecodeError, AttributeError):
            return None
        if not isinstance(record_id, str):
            return None
        try:
            if self.line_format == "episode":
                self.client.get_episode(record_id)
            else:
                self.client.get(record_id)
        except NotFoundError as err:
            if err.code in ("episode_not_found", "trace_not_found"):
                return False
            logger.warning("could not ask the service whether it holds %s: %s", record_id, err)
            return None  # not the record's answer (a route the service does not have): cannot tell
        except PrimeTracesError as err:
            logger.warning("could not ask the service whether it holds %s: %s", record_id, err)
            return None
        return True

    def mark_stored(self, batch: list[int]) -> None:
        """Lines the service stored though it answered an error: never sent again."""
        self.p.uploaded.append((batch[0], batch[-1] + 1))
        self.outcome.uploaded += len(batch)
        self.save()

    def in_batch_entry(self, number: int) -> bool:
        """Whether line ``number`` is in a ``batch`` entry (one upload, sent whole)."""
        [i] = self._entries_between(number, number + 1)
        return self.scan.entries[i].batch

    def send_alone(self, number: int) -> None:
        """Upload line ``number`` by itself, as the in-order sync will once cut around it (same bytes, same key)."""
        line = self._line_at(number)
        self.client.upload_lines(
            [line if self.restamp is None else self.restamp(line, self.line_format)],
            line_format=self.line_format,
            context=self.context,
            target_batch_bytes=DEFAULT_TARGET_BATCH_BYTES,
            learn_coding=False,
            cancel=self.cancel,
        )

    def _line_at(self, number: int) -> bytes:
        [i] = self._entries_between(number, number + 1)
        _entry, lines = next(iter_entry_lines(self.path, [self.scan.entries[i]]))
        return lines[number - self._starts[i]]
