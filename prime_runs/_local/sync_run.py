"""Syncing one run directory: repair, create or attach the run, upload every segment, finish the run.

``sync.json`` keeps, per service, what each segment has uploaded and what of
the run's lifecycle was sent, so syncing to a second service starts afresh
and a repeated sync sends nothing that is already there. A run directory
without ``run.json`` (a rank's spool on another machine) has its records
uploaded under the directory's run id, and its lifecycle left to the owner.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import orjson

from prime_runs._local.rundir import RunDirectory, check_run_id
from prime_runs._local.segment_reader import Scan, iter_entry_lines, scan
from prime_runs._local.segments import REJECTED, SegmentWriter
from prime_runs._local.sync_file import FileProgress, FileSync, OnProgress, SyncStopped
from prime_runs._service.updates import describe_error
from prime_runs.errors import PrimeRunsError
from prime_traces import TracesClient
from prime_traces.client import MAX_METRIC_ROWS_PER_REQUEST, RUN_KINDS, TERMINAL_STATUSES
from prime_traces.errors import PrimeTracesError, RunFinishedError

logger = logging.getLogger(__name__)

#: The error a run is finished with when its process died before finishing it.
DIED_UNFINISHED = "the run's process ended without finishing the run"


@dataclass
class SyncReport:
    """What one run's sync did, and what is left."""

    path: str
    run_id: str
    uploaded: int = 0
    uploaded_bytes: int = 0
    rejected_now: int = 0
    rejected_total: int = 0
    left: int = 0
    left_bytes: int = 0
    unreadable: int = 0
    torn: list[Scan] = field(default_factory=list)
    status: str | None = None
    errors: list[str] = field(default_factory=list)
    #: Metrics history rows sent by this sync (all of a file's rows are sent again until it is done: a replay
    #: changes nothing on the service).
    metric_rows: int = 0

    @property
    def uploaded_all(self) -> bool:
        """Nothing this sync could send is left (unreadable records aside)."""
        return self.left == 0 and not self.errors

    @property
    def complete(self) -> bool:
        """Everything but the records set aside is on the service."""
        return self.uploaded_all and self.unreadable == 0


def sync_run(
    rundir: RunDirectory,
    client: TracesClient,
    *,
    on_start: Any = None,
    on_progress: OnProgress | None = None,
    only: Collection[str] | None = None,
) -> SyncReport:
    """Sync one run directory; ``on_start(records, bytes)`` is told what is left before anything is sent.

    ``only``: upload just the record files of these names, and leave the run's
    lifecycle alone (a live run resyncing what it spooled itself: its own
    updates are newer than its ``run.json``).
    """
    rundir.lock_for_sync()
    try:
        return _RunSync(rundir, client).run(on_start, on_progress, only)
    finally:
        rundir.unlock_sync()


def run_kind(rundir: RunDirectory, document: dict[str, Any] | None) -> str:
    """The run's kind: its ``run.json``, else the ``run.type`` stamped on its first record."""
    kind = (document or {}).get("kind")
    if kind in RUN_KINDS:
        return str(kind)
    for path in rundir.data_segments():
        try:
            found = scan(path, verify_last=False)
            for _entry, lines in iter_entry_lines(path, found.entries[:1]):
                stamped = orjson.loads(lines[0]).get("run", {}).get("type")
                if stamped in RUN_KINDS:
                    return str(stamped)
        except (OSError, ValueError, AttributeError, IndexError):
            continue
    return "train"


class _RunSync:
    def __init__(self, rundir: RunDirectory, client: TracesClient) -> None:
        self.rundir = rundir
        self.client = client
        self.url = client.config.base_url
        self.document = rundir.read_run()
        self.run_id = check_run_id(str((self.document or {}).get("id") or rundir.run_id), rundir.path)
        self.state = rundir.read_sync()
        services = self.state.setdefault("services", {})
        self.mine: dict[str, Any] = services.setdefault(self.url, {})
        self.progress = {name: FileProgress.load(raw) for name, raw in self.mine.get("files", {}).items()}
        self.report = SyncReport(rundir.path, self.run_id)

    def save(self) -> None:
        self.mine["files"] = {name: p.dump() for name, p in self.progress.items()}
        self.state["last_service"] = self.url
        self.rundir.write_sync(self.state)

    def run(self, on_start: Any, on_progress: OnProgress | None, only: Collection[str] | None) -> SyncReport:
        self.report.torn = self.rundir.recover()
        kind = run_kind(self.rundir, self.document)
        context = {"source": "prime-runs", "run_type": kind}
        rejected = SegmentWriter(self.rundir.path, REJECTED)
        files = []
        for path in self.rundir.data_segments():
            if only is not None and os.path.basename(path) not in only:
                continue
            name = os.path.basename(path)
            progress = self.progress.setdefault(name, FileProgress())
            files.append(
                FileSync(
                    self.client,
                    path,
                    scan(path),
                    progress,
                    context=context,
                    save=self.save,
                    rejected=rejected,
                    on_progress=on_progress,
                )
            )
        records, size = (sum(x) for x in zip(*(f.left() for f in files))) if files else (0, 0)
        if on_start is not None:
            on_start(records, size)
        try:
            if self.document is not None and only is None and not self.mine.get("run_created"):
                self._create_run(kind)
            for sync in files:
                try:
                    sync.run()
                except SyncStopped as err:
                    self.report.errors.append(str(err))
                    break
            if only is None and not self.report.errors:
                self._sync_metrics()
        except (PrimeTracesError, PrimeRunsError) as err:
            self.report.errors.append(f"the service at {self.url} failed: {describe_error(err)}")
        finally:
            rejected.close()
            for sync in files:
                self.report.uploaded += sync.outcome.uploaded
                self.report.uploaded_bytes += sync.outcome.uploaded_bytes
                self.report.rejected_now += sync.outcome.rejected
                left, left_bytes = sync.left()
                self.report.left += left
                self.report.left_bytes += left_bytes
                self.report.unreadable += sync.p.unreadable_lines()
        if self.document is not None and only is None and self.report.uploaded_all:
            self._finish_run()
        self.report.rejected_total = sum(scan(p, verify_last=False).lines for p in self.rundir.rejected_segments())
        self.mine["last_sync"] = {
            "at": time.time(),
            "complete": self.report.complete,
            "uploaded": self.report.uploaded,
            "left": self.report.left,
        }
        self.save()
        return self.report

    def _sync_metrics(self) -> None:
        """Send the rows of each metrics file not yet sent whole to this service (contract §9)."""
        sent = self.mine.setdefault("metrics_sent", {})
        for path in self.rundir.metrics_segments():
            name = os.path.basename(path)
            found = scan(path, verify_last=False)
            if sent.get(name) == found.lines:
                continue
            rows: list[Any] = []
            for _entry, lines in iter_entry_lines(path, found.entries, on_corrupt=lambda *_: None):
                rows.extend(orjson.loads(line) for line in lines)
            for start in range(0, len(rows), MAX_METRIC_ROWS_PER_REQUEST):
                self.client.post_metrics(self.run_id, rows[start : start + MAX_METRIC_ROWS_PER_REQUEST])
            self.report.metric_rows += len(rows)
            sent[name] = found.lines
            self.save()

    def _create_run(self, kind: str) -> None:
        doc = self.document or {}
        self.client.create_run(
            doc.get("name"), kind=kind, config=doc.get("config") or {}, tags=doc.get("tags") or [], run_id=self.run_id
        )
        self.mine["run_created"] = True
        self.save()

    def _finish_run(self) -> None:
        """Send the run's config, summary and (terminal) status, once per change."""
        doc = self.document or {}
        status, error = doc.get("status"), doc.get("error")
        if status not in TERMINAL_STATUSES:
            if self.rundir.owner_alive():
                status, error = None, None  # still running: its own finish() records the status
            else:
                status, error = "crashed", DIED_UNFINISHED
        update: dict[str, Any] = {
            "config": doc.get("config") or {},
            "summary": doc.get("summary") or {},
            "status": status,
            "error": error,
        }
        digest = hashlib.sha256(orjson.dumps(update, option=orjson.OPT_SORT_KEYS, default=str)).hexdigest()
        self.report.status = status
        if self.mine.get("lifecycle_sent") == digest:
            return
        try:
            self.client.update_run(self.run_id, **update)
        except (PrimeTracesError, PrimeRunsError) as err:
            if not isinstance(err, RunFinishedError):
                self.report.errors.append(f"could not record the run's status on {self.url}: {describe_error(err)}")
                return
            logger.warning("run %s was already finished on %s with another status; it keeps it", self.run_id, self.url)
        self.mine["lifecycle_sent"] = digest
