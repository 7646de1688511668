"""Finishing a run: drain (bounded), record the status and ``run.json``, and tell the user.

Every wait is bounded by the deadline it is given (plus the spill bound when
records must go to disk), and runs on the main thread in slices so a second
Ctrl-C is handled at once (see :mod:`prime_runs._finish.interrupt`).
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from prime_runs._console.console import Console
from prime_runs._console.summary import FinishProgress, record_counts, summary_lines
from prime_runs._finish import interrupt
from prime_runs._finish.exit_hooks import ShutdownHooks
from prime_runs._history.lane import MetricsLane
from prime_runs._history.sparkline import metric_line
from prime_runs._history.values import History
from prime_runs._local.run_file import RunFile
from prime_runs._service.state import RunState
from prime_runs._service.updates import STATUS_MIN_TIMEOUT_S, RunUpdates
from prime_runs._upload.worker import UploadWorker
from prime_runs.models import RunStatus
from prime_traces.threads import run_in_daemon, wait_event

logger = logging.getLogger(__name__)

# Of finish()'s budget, what is kept back for recording the terminal status.
_STATUS_RESERVE_FRACTION = 0.2
_STATUS_RESERVE_MAX_S = 2.0
# What finish() waits for the status request beyond its own deadline (thread hand-off).
_STATUS_GRACE_S = 0.5
# What finish() waits at least for run.json when the status request took all the time there was.
_RUN_FILE_MIN_WAIT_S = 0.1

# The runs of this process that are not finished: a second init() beside one is worth a warning.
live_runs: weakref.WeakSet[Finisher] = weakref.WeakSet()


class Finisher:
    """Finishes one run, once: ``finish()`` is idempotent and thread-safe, and bounded by its timeout.

    The first call finishes; later ones wait for it (within their own
    timeout) and return. It owns the run's exit and signal hooks
    (:class:`~prime_runs._finish.exit_hooks.ShutdownHooks`), which finish a
    run nobody finished through ``on_hook``; a first Ctrl-C makes it say what
    it waits for (:meth:`interrupted`), a second stops the waiting
    (:meth:`stop_waiting`): what is left goes to disk.

    Usage::

        finisher = Finisher(run_id, ..., on_hook=run_finish_from_hook)
        finisher.install()
        finisher.finish(status="completed", error=None, timeout_s=60)
    """

    def __init__(
        self,
        run_id: str,
        *,
        name: str | None,
        mode: str,
        directory: str | None,
        kind: str = "eval",
        state: RunState,
        stats: Callable[[], dict[str, Any]],
        console: Console,
        timeout_s: float,
        on_hook: Callable[[str], Any],
        handle_signals: bool,
        owner: bool,
        worker: UploadWorker | None = None,
        metrics: MetricsLane | None = None,
        updates: RunUpdates | None = None,
        run_file: RunFile | None = None,
        history: History | None = None,
        release: Callable[[], Any] | None = None,
    ) -> None:
        self.run_id = run_id
        self.name = name
        self.mode = mode
        self.kind = kind
        self.directory = directory
        self.state = state
        self.stats = stats
        self.console = console
        self.timeout_s = timeout_s
        #: Whether this process records the run's terminal status (a forked child does not).
        self.owner = owner
        self.worker = worker
        self.metrics = metrics
        self.updates = updates
        self.run_file = run_file
        self.history = history if history is not None else History()
        #: Called once everything is done (closes the run's platform client).
        self.release = release
        self.started = time.monotonic()
        #: Set as the first finish() begins: from then on records are refused.
        self.finishing = False
        self.finished = threading.Event()
        #: A second Ctrl-C: stop waiting for the service.
        self.stop_requested = False
        #: Finishing on a signal: what is not stored goes to disk before anything else.
        self.disk_first = False
        self._lock = threading.Lock()
        self._status_answered: threading.Event | None = None
        self.hooks = ShutdownHooks(
            on_hook,
            handle_signals=handle_signals,
            timeout_s=timeout_s,
            notice=self.interrupted,
            stop=self.stop_waiting,
            spill_timeout_s=worker.spill_timeout_s if worker is not None else 0.0,
        )

    def install(self) -> None:
        """Install the exit and signal hooks; warn when another run of this process is still live."""
        self.hooks.install()
        others = [finisher for finisher in list(live_runs) if not finisher.finishing]
        if others:
            self.console.warn_once(
                "second-init",
                "init() was called while run %s is still live in this "
                "process: both log side by side; finish() the first one when it is done",
                others[0].run_id,
            )
        live_runs.add(self)

    def finish(
        self,
        status: RunStatus,
        error: str | None,
        timeout_s: float | None,
        before: Callable[[], Any] | None = None,
    ) -> bool:
        """Finish the run once, within ``timeout_s`` (+1 s); ``before`` runs first, in the first call only.

        Returns whether this call did the finishing (a later one only waited for it).
        """
        timeout = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + max(0.0, timeout)
        if not self._lock.acquire(blocking=False):
            self.finished.wait(max(0.0, deadline - time.monotonic()) + 1.0)
            return False
        try:
            if self.finishing:
                return False
            if before is not None:
                before()
            self.finishing = True
            # Terminal from the start: the first finish() decides, whoever reads the status meanwhile.
            self.state.status = status
            self._finish_run(status, error, deadline, timeout)
        finally:
            self.finished.set()
            self._lock.release()
        if self.stop_requested and threading.current_thread() is threading.main_thread():
            interrupt.end_now()  # a second Ctrl-C: what was left is on disk; end as the signal would
        return True

    def interrupted(self) -> None:
        """A Ctrl-C: say what finishing waits for, and that a second one stops waiting.

        A method: the shutdown hooks hold it weakly.
        """
        left = self.worker.stats() if self.worker is not None else {}
        records = int(left.get("queued_records", 0)) + int(left.get("in_flight_records", 0))
        where = f" in {os.path.abspath(self.directory)}" if self.directory else ""
        waiting = (
            f"waiting up to {self.timeout_s:.0f} s for {records} records to upload"
            if records
            else ("recording its status")
        )
        self.console.say(
            "interrupted: finishing run %s, %s; press Ctrl-C again to stop waiting (what is left is "
            "kept on disk%s for `prime-runs sync`)",
            self.run_id,
            waiting,
            where,
        )

    def stop_waiting(self) -> None:
        """A second Ctrl-C: stop waiting for the service; what is left goes to disk."""
        if not self.finishing or self.finished.is_set():
            return
        self.stop_requested = True
        if self.worker is not None:
            self.worker.stop_waiting()
        answered = self._status_answered
        if answered is not None:
            answered.set()

    def after_fork_in_child(self) -> None:
        # The child logs its own records but never finishes the parent's run.
        self.owner = False
        self.run_file = None
        self._lock = threading.Lock()
        self.hooks.after_fork_in_child()

    def _finish_run(self, status: RunStatus, error: str | None, deadline: float, timeout: float) -> None:
        reserve = min(_STATUS_RESERVE_MAX_S, timeout * _STATUS_RESERVE_FRACTION)
        self.console.finishing = True
        if self.disk_first and self.worker is not None:
            # A SIGTERM's grace period may end any moment: durable first, uploaded from disk after.
            self.worker.spill_first()
        metrics = self.metrics
        if metrics is not None:
            metrics.finish_by(deadline - reserve)  # its rows go out beside the records' drain
        if self.worker is not None:
            deadline = self._drain(self.worker, deadline, reserve, timeout)
        if metrics is not None:
            # What the lane did not send by now is written to the run directory (bounded by the disk).
            metrics.close(deadline - reserve if not self.stop_requested else time.monotonic())
        if self.stop_requested:
            status, error = RunStatus.CANCELLED, "interrupted: finish() stopped waiting for the service (Ctrl-C)"
            self.console.say("stopped waiting (Ctrl-C): what was not uploaded is being written to disk")
        state = self.state
        state.status = status
        state.error = error
        state.finished_at = time.time()
        # The status request and the last run.json write share one end: finish() waits for neither past it.
        end = time.monotonic() + max(STATUS_MIN_TIMEOUT_S, deadline - time.monotonic()) + _STATUS_GRACE_S
        run_file = self.run_file
        written = run_file.close() if run_file is not None and run_file.active else None
        recorded = True
        if self.updates is not None and self.owner:
            # Stopped by the user: no waiting on the service; run.json keeps the status for the sync.
            recorded = False if self.stop_requested else self._record_status(status, state.error, deadline)
        if written is None and run_file is not None and not recorded:
            written = run_file.close(activate=True)  # kept for the sync: online, the directory appears now
        if written is not None and not written.wait(max(_RUN_FILE_MIN_WAIT_S, end - time.monotonic())):
            logger.warning(
                "run %s: %s/run.json was not written in time (is the disk stalled?)", self.run_id, self.directory
            )
        self._say_what_is_left(recorded)
        self._tell_the_user()
        live_runs.discard(self)
        self.hooks.uninstall()
        if self.release is not None:
            self.release()

    def _drain(self, worker: UploadWorker, deadline: float, reserve: float, timeout: float) -> float:
        """Close the worker by the deadline, less the status's reserve; the deadline the status then has."""
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
            logger.warning("run %s: finish() ran out of time after %.1f s", self.run_id, timeout)
            # The spill took its own bound: the status still gets its reserve.
            deadline = max(deadline, time.monotonic() + reserve)
        if self.owner:
            # The status alone would hide losses: the summary carries the counts.
            stats = worker.stats()
            counts: dict[str, Any] = dict(record_counts(stats, self.mode))
            if self.kind == "eval" and self.mode == "online":
                # How many episodes Prime Traces holds: what the platform checks an evaluation's completion by.
                written = sum(int(c.get("episodes_written", 0)) for c in stats["sinks"].values())
                earlier = self.state.summary.get("prime_runs")
                counts["prime_runs"] = {
                    **(earlier if isinstance(earlier, Mapping) else {}),
                    "traces_episodes_written": written,
                }
            self.state.merge_summary(counts)
        return deadline

    def _record_status(self, status: RunStatus, error: str | None, deadline: float) -> bool:
        """Send the terminal status, waiting until ``deadline``; whether the service confirmed it.

        The request runs on a daemon thread: requests' timeouts bound each socket
        read, not a whole answer, so a service that trickles its reply would
        otherwise hold ``finish()`` (and exit) past its deadline.
        """
        updates = self.updates
        assert updates is not None
        confirmed: list[bool] = []

        def send() -> None:
            try:
                confirmed.append(updates.send_status(status, error, deadline))
            finally:
                answered.set()

        # Set when the request ends, or when a second Ctrl-C stops the waiting.
        answered = self._status_answered = threading.Event()
        run_in_daemon(send, f"prime-runs-status-{self.run_id}")
        if not wait_event(answered, max(STATUS_MIN_TIMEOUT_S, deadline - time.monotonic()) + _STATUS_GRACE_S):
            logger.warning(
                "run %s: the service did not confirm status %r within finish()'s timeout; it may not be recorded",
                self.run_id,
                status,
            )
        return bool(confirmed and confirmed[0])

    def _tell_the_user(self) -> None:
        console = self.console
        console.close()
        if not console.enabled or self.worker is None:
            return
        history = self.history
        charts = [metric_line(name, *history.series(name)) for name in history.points]
        lines = summary_lines(
            name=self.name,
            run_id=self.run_id,
            mode=self.mode,
            status=self.state.status,
            stats=self.stats(),
            elapsed_s=time.monotonic() - self.started,
            directory=self.directory,
            charts=charts,
        )
        for line in lines:
            console.say("%s", line)

    def _say_what_is_left(self, recorded: bool) -> None:
        """Where the records that are not on the service are, and the command that uploads them."""
        if self.worker is None or self.directory is None:
            return
        stats = self.worker.stats()
        sinks: Mapping[str, Any] = {name: c for name, c in stats["sinks"].items() if name != "local"}
        spooled = sum(c["spooled"] for c in sinks.values())
        where = os.path.abspath(self.directory)
        if self.mode == "offline":
            stored = sum(c["stored"] for c in sinks.values())
            logger.info(
                "run %s: %d records saved in %s; upload them with: prime-runs sync %s",
                self.run_id,
                stored + spooled,
                where,
                where,
            )
        elif spooled or (not recorded and self.run_file is not None and self.run_file.active):
            reasons = collections.Counter[str]()
            for counts in sinks.values():
                reasons.update(counts["spooled_reasons"])
            why = f" ({', '.join(f'{r}: {n}' for r, n in reasons.most_common())})" if reasons else ""
            logger.warning(
                "run %s: %d records were not delivered%s and are saved in %s; upload them with: prime-runs sync %s",
                self.run_id,
                spooled,
                why,
                where,
                where,
            )
