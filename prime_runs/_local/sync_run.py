"""Syncing one run directory: repair, create or attach the run, upload every segment, finish the run.

The run lives on the platform (contract §10): an online run's directory is
named by its id there; an offline run is created there by its first sync,
from what ``run.json`` kept of ``init()``'s arguments, and its id is kept in
``sync.json`` before anything is uploaded, so its records (written under the
local id) are restamped with it, the same bytes at every sync. ``sync.json``
keeps, per service, that id, what each segment has uploaded and what of the
run's lifecycle was sent, so syncing to a second service starts afresh and a
repeated sync sends nothing that is already there. A run directory without
``run.json`` (a rank's spool on another machine) has its records uploaded
under the directory's run id, and its lifecycle left to the owner.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import orjson

from prime_runs._local.damage import Damage, lost_by_run
from prime_runs._local.file_progress import FileProgress
from prime_runs._local.rundir import RunDirectory, check_run_id
from prime_runs._local.segment_reader import Scan, iter_entry_lines, scan
from prime_runs._local.segments import REJECTED, SegmentWriter
from prime_runs._local.sync_file import FileSync, OnProgress, SyncStopped
from prime_runs._local.sync_rejected import RetryOutcome, retried_count
from prime_runs._local.sync_rejected import retry_rejected as retry_rejected_records
from prime_runs._records.lines import RunStamp, restamped
from prime_runs._service.platform_runs import PlatformRuns, runs_for, spec_from_document
from prime_runs._service.updates import describe_error
from prime_runs.errors import PrimeRunsError
from prime_runs.models import RunStatus
from prime_traces import TracesClient
from prime_traces.client import RUN_KINDS, TERMINAL_STATUSES
from prime_traces.errors import PrimeTracesError, RetryableAPIError, TransportError
from prime_traces.platform import PlatformClient

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
    #: Record files that read fewer lines than their writer closed them with (``damage.py``).
    damaged: list[Damage] = field(default_factory=list)
    #: What ``--retry-rejected`` did (``None``: not asked).
    retried: RetryOutcome | None = None
    #: Records the run itself could not keep anywhere (dropped, a disk error...), by reason, from ``run.json``.
    lost_by_run: dict[str, int] = field(default_factory=dict)
    status: str | None = None
    errors: list[str] = field(default_factory=list)
    #: The sync stopped because the service failed (it may answer later), not because it refused.
    transient: bool = False
    #: Metrics history rows sent by this sync (all of a file's rows are sent again until it is done: a replay
    #: changes nothing on the service).
    metric_rows: int = 0

    @property
    def uploaded_all(self) -> bool:
        """Nothing this sync could send is left (unreadable records aside)."""
        return self.left == 0 and not self.errors

    @property
    def lost_to_damage(self) -> int:
        """Records kept on disk once that no longer read: entries that do not decode, files cut short."""
        return self.unreadable + sum(d.lost for d in self.damaged)

    @property
    def lost(self) -> int:
        """Records that will never reach the service from here: lost to damage, or by the run itself."""
        return self.lost_to_damage + sum(self.lost_by_run.values())

    @property
    def complete(self) -> bool:
        """Everything but the records set aside is on the service."""
        return self.uploaded_all and self.lost == 0


def sync_run(
    rundir: RunDirectory,
    client: TracesClient,
    platform: PlatformClient | None = None,
    *,
    on_start: Any = None,
    on_progress: OnProgress | None = None,
    only: Collection[str] | None = None,
    on_file_progress: Callable[[str, int, int], Any] | None = None,
    cancel: threading.Event | None = None,
    wait_for_lock_s: float = 0.0,
    retry_rejected: bool = False,
) -> SyncReport:
    """Sync one run directory; ``on_start(records, bytes)`` is told what is left before anything is sent.

    ``platform`` creates, updates and finishes the run (without one, only the
    records of a run that exists there already are uploaded). ``only``: upload
    just the record files of these names, and leave the run's lifecycle alone
    (a live run resyncing what it spooled itself: its own updates are newer
    than its ``run.json``). ``on_file_progress(line_format, records, bytes)``
    is told what each batch stored, with the kind of its file. ``cancel``:
    once set, no new batch is sent and those in flight are abandoned with
    their keys after the client's ``abandon_after_s``; the sync then returns,
    its lock released. ``wait_for_lock_s``: how long to wait for another
    sync of this run to end before refusing. ``retry_rejected``: send the
    records the service set aside again (``sync_rejected.py``).
    """
    rundir.lock_for_sync(wait_s=wait_for_lock_s)
    try:
        sync = _RunSync(rundir, client, platform, on_file_progress, cancel)
        sync.retry_rejected = retry_rejected
        return sync.run(on_start, on_progress, only)
    finally:
        rundir.unlock_sync()


def _restamp(stamp: RunStamp, line: bytes, line_format: str) -> bytes:
    return restamped(line, stamp, line_format)


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
    def __init__(
        self,
        rundir: RunDirectory,
        client: TracesClient,
        platform: PlatformClient | None,
        on_file_progress: Callable[[str, int, int], Any] | None = None,
        cancel: threading.Event | None = None,
    ) -> None:
        self.rundir = rundir
        self.on_file_progress = on_file_progress
        self.cancel = cancel
        self.retry_rejected = False
        self.client = client
        self.platform = platform
        self.runs: PlatformRuns | None = None
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
        self.report.torn = self.rundir.recover(self.report.damaged)
        self.report.lost_by_run = lost_by_run(self.document)
        kind = run_kind(self.rundir, self.document)
        context = spec_from_document(self.document or {}, kind).upload_context()
        if self.platform is not None:
            team = ((self.document or {}).get("spec") or {}).get("team_id") or self.client.config.team_id or None
            self.runs = runs_for(kind, self.platform, team_id=team)
        lifecycle = self.document is not None and only is None
        try:
            service_id = self._service_id(kind) if lifecycle else self.mine.get("platform_id", self.run_id)
        except (PrimeTracesError, PrimeRunsError) as err:
            self.report.errors.append(f"could not create the run on {self._platform_url()}: {describe_error(err)}")
            service_id = None
        stamp = RunStamp(service_id, kind) if service_id and service_id != self.run_id else None
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
                    restamp=functools.partial(_restamp, stamp) if stamp is not None else None,
                    on_file_progress=self.on_file_progress,
                    cancel=self.cancel,
                )
            )
        records, size = (sum(x) for x in zip(*(f.left() for f in files))) if files else (0, 0)
        if on_start is not None:
            on_start(records, size)
        try:
            if service_id is None:
                files = []  # nothing can be uploaded before the run has its id on the service
            for sync in files:
                try:
                    sync.run()
                except SyncStopped as err:
                    self.report.errors.append(str(err))
                    self.report.transient = err.transient
                    break
            if self.retry_rejected and service_id is not None and not self.report.errors:
                try:
                    self.report.retried = retry_rejected_records(
                        self.rundir.rejected_segments(),
                        self.client,
                        self.mine.setdefault("retried", {}),
                        context=context,
                        save=self.save,
                        restamp=functools.partial(_restamp, stamp) if stamp is not None else None,
                    )
                except SyncStopped as err:
                    self.report.errors.append(str(err))
                    self.report.transient = err.transient
            if lifecycle and service_id is not None and not self.report.errors:
                self._sync_metrics(service_id, kind)
        except (PrimeTracesError, PrimeRunsError) as err:
            self.report.errors.append(f"the service at {self.url} failed: {describe_error(err)}")
            self.report.transient = isinstance(err, (RetryableAPIError, TransportError))
        finally:
            rejected.close()
            for sync in files:
                self.report.uploaded += sync.outcome.uploaded
                if sync.line_format == "episode":
                    self.mine["episodes_uploaded"] = self.mine.get("episodes_uploaded", 0) + sync.outcome.uploaded
                self.report.uploaded_bytes += sync.outcome.uploaded_bytes
                self.report.rejected_now += sync.outcome.rejected
                left, left_bytes = sync.left()
                self.report.left += left
                self.report.left_bytes += left_bytes
                self.report.unreadable += sync.p.unreadable_lines()
        if lifecycle and service_id is not None and self.report.uploaded_all:
            self._finish_run(service_id)
        set_aside = sum(scan(p, verify_last=False).lines for p in self.rundir.rejected_segments())
        self.report.rejected_total = set_aside - retried_count(self.mine.get("retried"))
        self.mine["last_sync"] = {
            "at": time.time(),
            "complete": self.report.complete,
            "uploaded": self.report.uploaded,
            "left": self.report.left,
        }
        self.save()
        return self.report

    def _platform_url(self) -> str:
        return self.platform.config.origin if self.platform is not None else self.url

    def _service_id(self, kind: str) -> str:
        """The run's id on the platform: recorded, the directory's (a run that lives there), or new (created now)."""
        known = self.mine.get("platform_id")
        if known:
            return str(known)
        doc = self.document or {}
        if doc.get("mode") == "online" or self.runs is None:
            found = self.run_id  # an online run's directory is named by its id on the platform
        else:
            handle = self.runs.create(spec_from_document(doc, kind))
            found = check_run_id(handle.id, f"the platform at {self._platform_url()}")
            self.mine["platform_url"] = handle.url
        self.mine["platform_id"] = found
        self.save()  # before any record is stamped with it: every later sync sends the same bytes
        return found

    def _sync_metrics(self, service_id: str, kind: str) -> None:
        """Send the rows of each metrics file not yet sent whole to this service (a training run's history)."""
        if self.runs is None or kind != "train":
            return  # the platform keeps no history for an evaluation: its rows stay in the run directory
        sent = self.mine.setdefault("metrics_sent", {})
        for path in self.rundir.metrics_segments():
            name = os.path.basename(path)
            found = scan(path, verify_last=False)
            if sent.get(name) == found.lines:
                continue
            rows: list[Any] = []
            for _entry, lines in iter_entry_lines(path, found.entries, on_corrupt=lambda *_: None):
                rows.extend(orjson.loads(line) for line in lines)
            self.runs.send_metrics(service_id, rows, 60.0)
            self.report.metric_rows += len(rows)
            sent[name] = found.lines
            self.save()

    def _finish_run(self, service_id: str) -> None:
        """Send the run's config, summary and (terminal) status, once per change."""
        if self.runs is None:
            return
        doc = self.document or {}
        status, error = doc.get("status"), doc.get("error")
        if status not in TERMINAL_STATUSES:
            if self.rundir.owner_alive():
                status, error = None, None  # still running: its own finish() records the status
            else:
                status, error = "crashed", DIED_UNFINISHED
        summary = dict(doc.get("summary") or {})
        if doc.get("kind") == "eval" and doc.get("mode") == "offline":
            # How many episodes Prime Traces holds: what the platform checks an evaluation's completion by.
            earlier = summary.get("prime_runs")
            written = {"traces_episodes_written": int(self.mine.get("episodes_uploaded", 0))}
            summary["prime_runs"] = {**(earlier if isinstance(earlier, dict) else {}), **written}
        update: dict[str, Any] = {
            "config": doc.get("config") or {},
            "summary": summary,
            "status": status,
            "error": error,
        }
        digest = hashlib.sha256(orjson.dumps(update, option=orjson.OPT_SORT_KEYS, default=str)).hexdigest()
        self.report.status = status
        if self.mine.get("lifecycle_sent") == digest:
            return
        attached = bool(doc.get("attached"))
        try:
            if status is None:
                self.runs.send_changes(service_id, None if attached else update["config"], update["summary"], 60.0)
            else:
                self.runs.close(
                    service_id,
                    RunStatus(status),
                    error,
                    config=update["config"],
                    summary=update["summary"],
                    attached=attached,
                    deadline_s=60.0,
                )
        except (PrimeTracesError, PrimeRunsError) as err:
            self.report.errors.append(
                f"could not record the run's status on {self._platform_url()}: {describe_error(err)}"
            )
            return
        self.mine["lifecycle_sent"] = digest
