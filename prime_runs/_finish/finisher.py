"""Finishing a run: drain (bounded), record the status and ``run.json``, and tell the user.

``Run.finish()`` takes the lock and the deadline; the work is here, in
:class:`Finishing`, which ``Run`` inherits. Every wait is bounded by the
deadline it is given (plus the spill bound when records must go to disk), and
runs on the main thread in slices so a second Ctrl-C is handled at once (see
``interrupt``).
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from prime_runs._console.console import Console
from prime_runs._console.summary import FinishProgress, record_counts, summary_lines
from prime_runs._finish import interrupt
from prime_runs._finish.exit_hooks import ShutdownHooks
from prime_runs._history.lane import MetricsLane
from prime_runs._history.sparkline import metric_line
from prime_runs._history.values import History
from prime_runs._local.run_file import RunFile
from prime_runs._service.ownership import describe
from prime_runs._upload.worker import UploadWorker
from prime_traces.client import TracesClient
from prime_traces.errors import RunFinishedError
from prime_traces.threads import run_in_daemon

logger = logging.getLogger("prime_runs.run")

# Of finish()'s budget, what is kept back for recording the terminal status.
_STATUS_RESERVE_FRACTION = 0.2
_STATUS_RESERVE_MAX_S = 2.0
_STATUS_MIN_TIMEOUT_S = 0.2
# What finish() waits for the status request beyond its own deadline (thread hand-off).
_STATUS_GRACE_S = 0.5
# What finish() waits at least for run.json when the status request took all the time there was.
_RUN_FILE_MIN_WAIT_S = 0.1

# The runs of this process that are not finished: a second init() beside one is worth a warning.
live_runs: weakref.WeakSet[Finishing] = weakref.WeakSet()


class Finishing:
    """The body of ``Run.finish()``, a base of :class:`~prime_runs.run.Run`, which sets every attribute below."""

    id: str
    name: str | None
    mode: str
    dir: str | None
    status: str
    error: str | None
    summary: dict[str, Any]
    history: History
    console: Console
    finish_timeout_s: float
    _worker: UploadWorker | None
    _metrics: MetricsLane | None
    _lifecycle: TracesClient | None
    _run_file: RunFile | None
    _hooks: ShutdownHooks
    _owner: bool
    _lock: threading.Lock
    _patch_lock: threading.Lock
    _dirty: dict[str, bool]
    _started: float
    _finishing: bool
    _finished_at: float | None
    _stop_requested: bool
    _status_answered: threading.Event | None

    if TYPE_CHECKING:  # Run's methods

        def stats(self) -> dict[str, Any]: ...

        def _snapshot(self, *, everything: bool) -> tuple[dict[str, Any] | None, dict[str, Any] | None]: ...

    def _interrupted(self) -> None:
        """A Ctrl-C: say what finishing waits for, and that a second one stops waiting.

        A method: the shutdown hooks hold it weakly.
        """
        left = self._worker.stats() if self._worker is not None else {}
        records = int(left.get("queued_records", 0)) + int(left.get("in_flight_records", 0))
        where = f" in {os.path.abspath(self.dir)}" if self.dir else ""
        waiting = (
            f"waiting up to {self.finish_timeout_s:.0f} s for {records} records to upload"
            if records
            else ("recording its status")
        )
        self.console.say(
            "interrupted: finishing run %s, %s; press Ctrl-C again to stop waiting (what is left is "
            "kept on disk%s for `prime-runs sync`)",
            self.id,
            waiting,
            where,
        )

    def _finish_run(self, status: str, error: str | BaseException | None, deadline: float, timeout: float) -> None:
        """Flush (bounded), record the terminal status and ``run.json``, tell the user; ``finish()``'s body."""
        reserve = min(_STATUS_RESERVE_MAX_S, timeout * _STATUS_RESERVE_FRACTION)
        self.console.finishing = True
        metrics = self._metrics
        if metrics is not None:
            metrics.finish_by(deadline - reserve)  # its rows go out beside the records' drain
        if self._worker is not None:
            worker = self._worker
            progress = FinishProgress(
                self.console,
                worker.stats,
                lambda: worker.meter.mean_bytes,
                action="write" if self.mode == "offline" else "upload",
            )
            progress.start()
            try:
                flushed = worker.close(max(0.0, deadline - reserve - time.monotonic()))
            finally:
                progress.stop()
            if not flushed:
                logger.warning("run %s: finish() ran out of time after %.1f s", self.id, timeout)
                # The spill took its own bound: the status still gets its reserve.
                deadline = max(deadline, time.monotonic() + reserve)
            if self._owner:
                # The status alone would hide losses: the summary carries the counts.
                with self._lock:
                    self.summary.update(record_counts(worker.stats(), self.mode))
                    self._dirty["summary"] = True
        if metrics is not None:
            # What the lane did not send by now is written to the run directory (bounded by the disk).
            metrics.close(deadline - reserve if not self._stop_requested else time.monotonic())
        if self._stop_requested:
            status, error = "cancelled", "interrupted: finish() stopped waiting for the service (Ctrl-C)"
            self.console.say("stopped waiting (Ctrl-C): what was not uploaded is being written to disk")
        self.status = status
        self.error = str(error) if error is not None else None
        self._finished_at = time.time()
        # The status request and the last run.json write share one end: finish() waits for neither past it.
        end = time.monotonic() + max(_STATUS_MIN_TIMEOUT_S, deadline - time.monotonic()) + _STATUS_GRACE_S
        run_file = self._run_file
        written = run_file.close() if run_file is not None and run_file.active else None
        recorded = True
        if self._lifecycle is not None and self._owner:
            # Stopped by the user: no waiting on the service; run.json keeps the status for the sync.
            recorded = False if self._stop_requested else self._record_status(status, self.error, deadline)
        if written is None and run_file is not None and not recorded:
            written = run_file.close(activate=True)  # kept for the sync: online, the directory appears now
        if written is not None and not written.wait(max(_RUN_FILE_MIN_WAIT_S, end - time.monotonic())):
            logger.warning("run %s: %s/run.json was not written in time (is the disk stalled?)", self.id, self.dir)
        self._say_what_is_left(recorded)
        self._tell_the_user()
        live_runs.discard(self)
        self._hooks.uninstall()

    def _tell_the_user(self) -> None:
        console = self.console
        console.close()
        if not console.enabled or self._worker is None:
            return
        history = self.history
        charts = [metric_line(name, *history.series(name)) for name in history.points]
        lines = summary_lines(
            name=self.name,
            run_id=self.id,
            mode=self.mode,
            status=self.status,
            stats=self.stats(),
            elapsed_s=time.monotonic() - self._started,
            directory=self.dir,
            charts=charts,
        )
        for line in lines:
            console.say("%s", line)

    def _say_what_is_left(self, recorded: bool) -> None:
        """Where the records that are not on the service are, and the command that uploads them."""
        if self._worker is None or self.dir is None:
            return
        stats = self._worker.stats()
        sinks = {name: c for name, c in stats["sinks"].items() if name != "local"}
        spooled = sum(c["spooled"] for c in sinks.values())
        where = os.path.abspath(self.dir)
        if self.mode == "offline":
            stored = sum(c["stored"] for c in sinks.values())
            logger.info(
                "run %s: %d records saved in %s; upload them with: prime-runs sync %s",
                self.id,
                stored + spooled,
                where,
                where,
            )
        elif spooled or (not recorded and self._run_file is not None and self._run_file.active):
            reasons = collections.Counter[str]()
            for counts in sinks.values():
                reasons.update(counts["spooled_reasons"])
            why = f" ({', '.join(f'{r}: {n}' for r, n in reasons.most_common())})" if reasons else ""
            logger.warning(
                "run %s: %d records were not delivered%s and are saved in %s; upload them with: prime-runs sync %s",
                self.id,
                spooled,
                why,
                where,
                where,
            )

    def _record_status(self, status: str, error: str | None, deadline: float) -> bool:
        """Send the terminal status with the whole config and summary, waiting until ``deadline``.

        Returns whether the service confirmed it.

        The request runs on a daemon thread: requests' timeouts bound each socket
        read, not a whole answer, so a service that trickles its reply would
        otherwise hold ``finish()`` (and exit) past its deadline. PATCH merges,
        so sending everything again is harmless, and nothing logged before
        ``finish()`` is left behind by an update still in flight.
        """
        lifecycle = self._lifecycle
        assert lifecycle is not None
        confirmed: list[bool] = []

        def send() -> None:
            try:
                # An update still waiting for its answer holds the lock: wait for it
                # half the time left, then send the status alone, which carries
                # nothing that update could overwrite.
                locked = self._patch_lock.acquire(timeout=max(0.0, (deadline - time.monotonic()) / 2))
                try:
                    if locked:
                        config, summary = self._snapshot(everything=True)
                    else:
                        config = summary = None
                        logger.warning(
                            "run %s: an earlier update is still waiting for an answer; "
                            "sending status %r without the latest config and summary",
                            self.id,
                            status,
                        )
                    lifecycle.update_run(
                        self.id,
                        config=config,
                        summary=summary,
                        status=status,
                        error=error,
                        timeout_s=max(_STATUS_MIN_TIMEOUT_S, deadline - time.monotonic()),
                    )
                    confirmed.append(True)
                finally:
                    if locked:
                        self._patch_lock.release()
            except Exception as err:  # noqa: BLE001  (finish must return, whatever the service does)
                if isinstance(err, RunFinishedError):
                    confirmed.append(True)  # someone finished it first: nothing is left to record
                logger.warning("run %s: could not record status %r (%s)", self.id, status, describe(err))
            finally:
                answered.set()

        # Set when the request ends, or when a second Ctrl-C stops the waiting.
        answered = self._status_answered = threading.Event()
        run_in_daemon(send, f"prime-runs-status-{self.id}")
        if not interrupt.wait_event(
            answered, max(_STATUS_MIN_TIMEOUT_S, deadline - time.monotonic()) + _STATUS_GRACE_S
        ):
            logger.warning(
                "run %s: the service did not confirm status %r within finish()'s timeout; it may not be recorded",
                self.id,
                status,
            )
        return bool(confirmed)
