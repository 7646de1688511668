"""The run's config, summary and terminal status, sent to the platform: on a timer, and once at finish."""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from prime_runs._service.platform_runs import PlatformRuns
from prime_runs._service.state import RunState
from prime_runs.models import RunStatus
from prime_traces.errors import APIError, PrimeTracesError
from prime_traces.threads import run_in_daemon

logger = logging.getLogger(__name__)

# The shortest timeout a status request is given, however little of finish()'s budget is left.
STATUS_MIN_TIMEOUT_S = 0.2

#: Told ``(what, error)`` of a request that failed, for ``run.errors``.
OnFailure = Callable[[str, BaseException], Any]


def describe_error(err: BaseException) -> str:
    """A short, key-free description of a failed request for a log line."""
    if isinstance(err, APIError) and err.status_code is not None:
        return f"HTTP {err.status_code} {err.code or ''}".strip()
    if isinstance(err, PrimeTracesError):
        return str(err)
    return f"{type(err).__name__}: {err}"


class RunUpdates:
    """Sends what changed of a run's :class:`RunState` to the platform, one request at a time.

    Each request sends a snapshot taken while it holds the lock, so an older
    snapshot can never land last. ``send_changes`` skips when another request
    is on its way (what is pending stays pending); ``send_status`` waits for
    it, half the time left at most. Nothing here raises: a run's updates must
    never break training; a failure is logged and told to ``on_failure``.

    Usage::

        updates = RunUpdates(state, runs_for("eval", PlatformClient()), attached=False)
        updates.send_changes(timeout_s=10)
        updates.send_status(RunStatus.COMPLETED, None, deadline=time.monotonic() + 5)
    """

    def __init__(
        self, state: RunState, runs: PlatformRuns, *, attached: bool, on_failure: OnFailure | None = None
    ) -> None:
        self.state = state
        self.runs = runs
        self.attached = attached
        self.on_failure = on_failure
        self._lock = threading.Lock()

    def send_changes(self, timeout_s: float | None = None) -> None:
        """Send the config and summary changed since the last send (the update timer's work)."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            config, summary = self.state.changes(everything=False)
            if config is None and summary is None:
                return
            try:
                # An attached run's config is its launcher's.
                self.runs.send_changes(self.state.run_id, None if self.attached else config, summary, timeout_s or 60.0)
            except Exception as err:  # noqa: BLE001  (metrics must never break training)
                self.state.unsent(config=config is not None, summary=summary is not None)
                logger.warning("could not send run updates (%s); will retry", describe_error(err))
        finally:
            self._lock.release()

    def send_changes_in_background(self, interval_s: float) -> None:
        """``send_changes`` on a helper thread, bounded by ``interval_s``; skipped while one still waits."""
        if self._lock.locked():
            return
        # Never on the worker thread: a slow answer must not hold uploads back.
        run_in_daemon(
            functools.partial(self.send_changes, timeout_s=interval_s), f"prime-runs-update-{self.state.run_id}"
        )

    def send_status(self, status: RunStatus, error: str | None, deadline: float) -> bool:
        """Send the terminal status with the whole config and summary; whether the platform has it now.

        An update still waiting for its answer holds the lock: this waits for it
        half the time left, then sends the status alone, which carries nothing
        that update could overwrite.
        """
        run_id = self.state.run_id
        try:
            locked = self._lock.acquire(timeout=max(0.0, (deadline - time.monotonic()) / 2))
            try:
                if locked:
                    config, summary = self.state.changes(everything=True)
                else:
                    config = summary = None
                    logger.warning(
                        "run %s: an earlier update is still waiting for an answer; "
                        "sending status %r without the latest config and summary",
                        run_id,
                        status.value,
                    )
                return self.runs.close(
                    run_id,
                    status,
                    error,
                    config=config,
                    summary=summary,
                    attached=self.attached,
                    deadline_s=max(STATUS_MIN_TIMEOUT_S, deadline - time.monotonic()),
                )
            finally:
                if locked:
                    self._lock.release()
        except Exception as err:  # noqa: BLE001  (finish must return, whatever the platform does)
            logger.warning("run %s: could not record status %r (%s)", run_id, status.value, describe_error(err))
            if self.on_failure is not None:
                self.on_failure("finalizing the run", err)
            return False

    def after_fork_in_child(self) -> None:
        self._lock = threading.Lock()
