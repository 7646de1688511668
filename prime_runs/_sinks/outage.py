"""When the service is down: writes go to the spool, a probe watches, and the backlog goes up when it is back.

An upload that fails for good (transport errors, or 5xx without a refusal
code, after its retries) puts the Traces sink in an *outage*. While it lasts,
writes are not sent: the worker spools them at disk speed, so the queue keeps
draining and nothing is dropped. A probe on a daemon thread pings the service
(:meth:`~prime_traces.TracesClient.ping`, one cheap read), backing off
exponentially (with jitter, at most :data:`MAX_PROBE_INTERVAL_S` apart). Any
answer but a 429 or a 5xx ends the outage: live uploads resume, and the
records this process spooled are uploaded in the background behind them,
with ``prime-runs sync``'s own machinery (its progress in ``sync.json``,
batches resent as the same uploads), so nothing is stored twice and a later
sync sends only what is left.
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

OnResynced = Callable[[int, int], Any]


class Outage:
    """The outage state of one sink, its probe, and the resync of its spool.

    ``enter()`` is called by the threads that write to the sink (two writes may
    be in progress at once); ``down`` may be read from any thread.
    ``on_resynced(records, bytes)`` is told what the resync stored. ``close()``
    stops the probe and abandons a resync in progress (what it did not send
    stays for ``prime-runs sync``); it never waits.
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
        #: Told ``(records, bytes)`` as the resync stores them (the worker counts them stored).
        self.on_resynced = on_resynced
        self.max_probe_interval_s = max_probe_interval_s
        self.first_probe_s = first_probe_s
        self._reset()
        call_in_forked_child(self._reset)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._down = threading.Event()
        self._closed = threading.Event()
        self._probe: threading.Thread | None = None
        self._resync: threading.Thread | None = None
        self._resync_client: TracesClient | None = None
        self.outages = 0

    @property
    def down(self) -> bool:
        return self._down.is_set()

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
            "the Traces service at %s answers again; uploading resumes, and what was kept in %s is uploaded behind it",
            self.client.config.base_url,
            self.spool.directory,
        )
        self.resync()

    def _answers(self) -> bool:
        # A 4xx counts as an answer: the service is up, and says something about us.
        return self.client.ping(timeout_s=PROBE_TIMEOUT_S)

    def resync(self) -> None:
        """Upload what this process spooled, on a daemon thread, unless one is running already."""
        with self._lock:
            if self._closed.is_set() or (self._resync is not None and self._resync.is_alive()):
                return
            if not self.spool.files.own_files():
                return
            config = self.client.config
            # Its own client, so close() can abandon it; one request at a time, behind live uploads.
            self._resync_client = TracesClient(config.api_key, config.base_url, config.team_id, max_in_flight=1)
            self._resync = start_daemon(self._upload_backlog, "prime-runs-resync")

    def _upload_backlog(self) -> None:
        client = self._resync_client
        assert client is not None
        names = {os.path.basename(path) for path in self.spool.files.own_files()}
        try:
            report = sync_run(RunDirectory(self.spool.directory), client, only=names, on_progress=self.on_resynced)
        except (PrimeRunsError, PrimeTracesError, OSError, RuntimeError) as err:
            if not self._closed.is_set():
                logger.warning(
                    "could not upload what was kept in %s (%s); `prime-runs sync %s` will",
                    self.spool.directory,
                    err,
                    self.spool.directory,
                )
            return
        finally:
            client.close()
        if report.errors and not self._closed.is_set():
            logger.warning(
                "uploading what was kept in %s stopped: %s; `prime-runs sync %s` sends the rest",
                self.spool.directory,
                report.errors[0],
                self.spool.directory,
            )

    def wait_for_resync(self, deadline: float | None) -> bool:
        """At finish: upload what was kept, until ``deadline`` (monotonic); False if some is left.

        A service still marked down is asked once more at once, rather than
        at the probe's next turn (up to 30 s away).
        """
        if self.down and not self._closed.is_set() and self._answers():
            self._back()
        thread = self._resync
        if thread is None or self.down:
            return not self.down and (thread is None or not thread.is_alive())
        thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not thread.is_alive()

    def close(self) -> None:
        """Stop probing; abandon a resync in progress. Never waits."""
        with self._lock:
            self._closed.set()
            client = self._resync_client
        if client is not None:
            client.close()

    def snapshot(self) -> dict[str, Any]:
        resyncing = self._resync is not None and self._resync.is_alive()
        return {"outage": self.down, "outages": self.outages, "resyncing": resyncing}
