"""When uploads cannot keep up: writes go to the spool, and the run uploads them from there, oldest first.

Two things put the Traces sink's writes on disk instead of on the wire:

- an *outage*: an upload failed for good (transport errors, or 5xx without
  a refusal code, after its retries). A probe on a daemon thread pings the
  service (:meth:`~prime_traces.TracesClient.ping`, one cheap read), backing
  off exponentially (with jitter, at most :data:`MAX_PROBE_INTERVAL_S`
  apart). Any answer but a 429 or a 5xx ends the outage.
- a *backlog*: the service answers, but uploads are slower than the run logs
  (a slow link): the worker's queue passed its pressure mark
  (:attr:`~prime_runs._upload.queue.RecordQueue.pressure`). Rather than fill
  the queue and drop, writes go to disk at disk speed.

Either way the worker spools the writes, and a *drain* on a daemon thread
uploads what this process spooled, with ``prime-runs sync``'s own machinery
(its progress in ``sync.json``, batches resent as the same uploads), so
nothing is stored twice and a later sync sends only what is left. During a
backlog the drain has the link to itself (every write goes to disk, so the
order stays oldest first); it passes over the spool until a pass finds
nothing new, and then writes go straight to the service again. After an
outage, live uploads resume at once and the drain follows them, one upload
at a time.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from prime_runs._local.rundir import RunDirectory
from prime_runs._local.spool import Spool
from prime_runs._local.sync_run import sync_run
from prime_runs.errors import PrimeRunsError
from prime_traces import TracesClient
from prime_traces.errors import PrimeTracesError
from prime_traces.threads import call_in_forked_child, start_daemon

logger = logging.getLogger(__name__)

#: The longest wait between two probes of a service that is down.
MAX_PROBE_INTERVAL_S = 30.0
FIRST_PROBE_S = 1.0
PROBE_TIMEOUT_S = 10.0
#: Uploads at once from disk while the run is behind a slow link. The link is the limit there: more at
#: once only split it, so each ends later (fewer stored by a deadline) and each holds its body in memory.
#: 60 episodes of 10 MB over 1 MB/s, a 10 s finish: 2 to 11 stored with 8 at once, 11 with 2.
BEHIND_IN_FLIGHT = 2

OnResynced = Callable[[int, int], Any]


class Outage:
    """The link state of one sink (live, behind, down), its probe, and the drain of its spool.

    ``enter()`` and ``fall_behind()`` are called by the threads that write to
    the sink (two writes may be in progress at once); ``down``, ``behind``
    and ``diverting`` may be read from any thread. ``on_resynced(records,
    bytes)`` is told what the drain stored, ``on_episodes(n)`` how many of
    those were episodes. ``close()`` stops the probe and abandons a drain in
    progress (what it did not send stays for ``prime-runs sync``); it never
    waits.
    """

    def __init__(
        self,
        client: TracesClient,
        spool: Spool,
        on_resynced: OnResynced | None = None,
        *,
        max_probe_interval_s: float = MAX_PROBE_INTERVAL_S,
        first_probe_s: float = FIRST_PROBE_S,
    ) -> None:
        self.client = client
        self.spool = spool
        #: Told ``(records, bytes)`` as the drain stores them (the worker counts them stored).
        self.on_resynced = on_resynced
        #: Told how many episodes each drained batch held.
        self.on_episodes: Callable[[int], Any] | None = None
        self.max_probe_interval_s = max_probe_interval_s
        self.first_probe_s = first_probe_s
        self._reset()
        call_in_forked_child(self._reset)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._down = threading.Event()
        self._behind = threading.Event()
        #: Behind because the run finishes on a signal (not a slow link): the drain gets every slot.
        self._signalled = False
        self._closed = threading.Event()
        self._probe: threading.Thread | None = None
        self._resync: threading.Thread | None = None
        # A drain is running and has not decided to end: a spill now makes it pass again. Cleared under
        # the lock where it decides, so a spill after that starts a new drain (never a wake-up lost to
        # a thread on its way out).
        self._draining = False
        self._resync_client: TracesClient | None = None
        # A spill came while a drain was running: it passes over the spool once more before it ends.
        self._more = False
        self.outages = 0
        self.backlogs = 0
        self.drained_bytes = 0
        self._drain_s = 0.0
        self._drain_started: float | None = None

    @property
    def down(self) -> bool:
        return self._down.is_set()

    @property
    def behind(self) -> bool:
        return self._behind.is_set()

    @property
    def diverting(self) -> bool:
        """Whether writes go to the spool now (the service is down, or uploads are behind)."""
        return self._down.is_set() or self._behind.is_set()

    def enter(self, why: str) -> None:
        """The service failed for good: keep writes on disk until the probe sees it back."""
        with self._lock:
            if self._down.is_set() or self._closed.is_set():
                return
            self._down.set()
            self.outages += 1
            logger.warning(
                "the Traces service at %s is not answering (%s); records are kept in %s until it "
                "is back, then uploaded",
                self.client.config.base_url,
                why,
                self.spool.directory,
            )
            self._probe = start_daemon(self._watch, "prime-runs-probe")

    def fall_behind(self, why: str, *, finishing: bool = False) -> None:
        """Uploads are slower than the run logs: keep writes on disk and upload them from there, oldest first.

        ``finishing``: the run finishes on a signal, and what it holds goes to disk first for that reason.
        """
        with self._lock:
            if self._behind.is_set() or self._closed.is_set():
                return
            self._behind.set()
            self._signalled = finishing
            self.backlogs += 0 if finishing else 1
        if finishing:
            logger.warning(
                "%s: what is not stored goes to %s first, then is uploaded from there",
                why,
                self.spool.directory,
            )
            return
        logger.warning(
            "uploads to %s are slower than the run logs (%s); records wait in %s and are uploaded from there",
            self.client.config.base_url,
            why,
            self.spool.directory,
        )

    def spilled(self) -> None:
        """The worker wrote records to the spool: while behind (and the service up), a drain uploads them.

        Other spills (the deadline's, at close) wait for ``wait_for_resync`` or a sync.
        """
        if self._behind.is_set() and not self._down.is_set():
            self.resync()

    def _watch(self) -> None:
        wait = self.first_probe_s
        while not self._closed.wait(wait * random.uniform(0.5, 1.0)):
            if not self.down or self._answers():
                self._back()
                return
            wait = min(self.max_probe_interval_s, wait * 2)

    def _back(self) -> None:
        with self._lock:
            if not self._down.is_set():
                return
            self._down.clear()
        logger.warning(
            "the Traces service at %s answers again; uploading resumes, and what was kept in %s is uploaded",
            self.client.config.base_url,
            self.spool.directory,
        )
        self.resync()

    def _answers(self) -> bool:
        # A 4xx counts as an answer: the service is up, and says something about us.
        return self.client.ping(timeout_s=PROBE_TIMEOUT_S)

    def resync(self, *, alone: bool = False) -> None:
        """Upload what this process spooled, on a daemon thread; one that is running passes over it again.

        ``alone``: nothing else is uploading (``finish()`` has flushed), so the drain may use every slot.
        """
        with self._lock:
            if self._closed.is_set():
                return
            if self._draining:
                self._more = True
                return
            if not self.spool.files.own_files():
                return
            config = self.client.config
            # Its own client, so close() can abandon it. Behind a slow link, BEHIND_IN_FLIGHT at a time; on a
            # signal or at finish, every slot; after an outage, one at a time, behind the live uploads.
            if self._behind.is_set() and not self._signalled:
                in_flight = min(BEHIND_IN_FLIGHT, self.client.max_in_flight)
            elif self._behind.is_set() or alone:
                in_flight = self.client.max_in_flight
            else:
                in_flight = 1
            self._resync_client = TracesClient(config.api_key, config.base_url, config.team_id, max_in_flight=in_flight)
            self._more = False
            self._draining = True
            try:
                self._resync = start_daemon(self._drain, "prime-runs-resync")
            except RuntimeError as err:  # no new threads (interpreter shutdown): the files wait for a sync
                self._draining = False
                logger.warning(
                    "cannot upload what was kept in %s now (%s); `prime-runs sync %s` will",
                    self.spool.directory,
                    err,
                    self.spool.directory,
                )
                self._resync_client.close()
                self._resync_client = None

    def _drain(self) -> None:
        client = self._resync_client
        assert client is not None
        started = time.monotonic()
        with self._lock:
            self._drain_started = started
        caught_up = False
        try:
            while True:
                uploaded = None if self._closed.is_set() else self._pass(client)
                with self._lock:
                    if uploaded is not None and (uploaded or self._more):
                        self._more = False
                        continue
                    if uploaded is not None:
                        caught_up = self._behind.is_set()
                        self._behind.clear()  # nothing new came during a pass that sent nothing: writes go live
                    self._drained(started)
                    break
        except BaseException:
            with self._lock:
                self._drained(started)
            raise
        finally:
            client.close()
        if caught_up:
            logger.warning("the uploads caught up with the run; records go straight to the service again")

    def _drained(self, started: float) -> None:
        # Under the lock: the drain ends here, and a spill from now on starts the next one.
        self._drain_s += time.monotonic() - started
        self._drain_started = None
        self._draining = False

    def _pass(self, client: TracesClient) -> int | None:
        """One pass over this process's spool files; the records it uploaded, or None if it must stop."""
        names = {os.path.basename(path) for path in self.spool.files.own_files()}
        try:
            report = sync_run(
                RunDirectory(self.spool.directory),
                client,
                only=names,
                on_progress=self._progress,
                on_file_progress=self._file_progress,
                cancel=self._closed,  # close() at finish: the drain lets go of the run's sync lock within a second
            )
        except (PrimeRunsError, PrimeTracesError, OSError, RuntimeError) as err:
            if not self._closed.is_set():
                logger.warning(
                    "could not upload what was kept in %s (%s); `prime-runs sync %s` will",
                    self.spool.directory,
                    err,
                    self.spool.directory,
                )
            return None
        if report.errors:
            if not self._closed.is_set():
                logger.warning(
                    "uploading what was kept in %s stopped: %s; it goes on when the service answers, and "
                    "`prime-runs sync %s` sends what is left",
                    self.spool.directory,
                    report.errors[0],
                    self.spool.directory,
                )
                if report.transient:
                    self.enter(report.errors[0])  # the probe starts the drain again once the service answers
            return None
        return report.uploaded

    def _progress(self, records: int, size: int) -> None:
        self.drained_bytes += size
        if self.on_resynced is not None:
            self.on_resynced(records, size)

    def _file_progress(self, line_format: str, records: int, _size: int) -> None:
        if line_format == "episode" and self.on_episodes is not None:
            self.on_episodes(records)

    def wait_for_resync(self, deadline: float | None) -> bool:
        """At finish: upload what was kept, until ``deadline`` (monotonic); False if some is left.

        A service still marked down is asked once more at once, rather than
        at the probe's next turn (up to 30 s away).
        """
        if self.down and not self._closed.is_set() and self._answers():
            self._back()
        self.resync(alone=True)  # what was spooled since the last drain, or a drain that stopped for an error
        thread = self._resync
        if thread is None or self.down:
            return not self.down and (thread is None or not thread.is_alive())
        thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not thread.is_alive()

    def close(self) -> None:
        """Stop probing; abandon a drain in progress. Never waits."""
        with self._lock:
            self._closed.set()
            client = self._resync_client
        if client is not None:
            client.close()

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            draining = self._draining
            started = self._drain_started
            drain_s = self._drain_s + (time.monotonic() - started if started is not None else 0.0)
        return {
            "outage": self.down,
            "outages": self.outages,
            "behind": self.behind,
            "backlogs": self.backlogs,
            "resyncing": draining,
            "drained_bytes": self.drained_bytes,
            "drain_bytes_per_s": self.drained_bytes / drain_s if drain_s > 0 else 0.0,
        }
