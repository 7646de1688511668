"""What the service keeps of a run besides its records: config, summary, status, and what changed since sent."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from prime_runs.models import RunStatus

logger = logging.getLogger(__name__)

#: The longest a copy waits for the lock: a signal's finisher may have interrupted
#: the main thread inside ``run.log()`` while it held it.
LOCK_TIMEOUT_S = 0.5


class RunState:
    """The run's config, summary, status and error, shared by the caller, the update timer and ``finish()``.

    ``config`` and ``summary`` change under :attr:`lock` (``run.log()`` also
    keeps its step counter under it); the copies taken to send or to write
    wait for it at most :data:`LOCK_TIMEOUT_S`. Which of the two changed
    since the last send is tracked, so a periodic update sends only that.

    Usage::

        state = RunState("run-1", {"lr": 1e-6})
        state.merge_summary({"reward": 0.7})
        config, summary = state.changes(everything=False)   # (None, {"reward": 0.7})
    """

    def __init__(self, run_id: str, config: Mapping[str, Any]) -> None:
        self.run_id = run_id
        self.config: dict[str, Any] = dict(config)
        self.summary: dict[str, Any] = {}
        #: ``RUNNING`` until ``finish()`` starts, then the terminal status it was given.
        self.status = RunStatus.RUNNING
        self.error: str | None = None
        #: Wall-clock time of the terminal status, for ``run.json``.
        self.finished_at: float | None = None
        self.lock = threading.Lock()
        self._dirty = {"config": False, "summary": False}

    def merge_summary(self, values: Mapping[str, Any]) -> None:
        with self.lock:
            self.summary.update(values)
            self._dirty["summary"] = True

    def merge_config(self, values: Mapping[str, Any]) -> None:
        with self.lock:
            self.config.update(values)
            self._dirty["config"] = True

    def summary_changed(self) -> None:
        """The summary was changed in place under :attr:`lock` (``run.log()``)."""
        self._dirty["summary"] = True

    def unsent(self, *, config: bool, summary: bool) -> None:
        """A send failed: what it carried is pending again.

        Plain flag writes, no lock: this may run from a signal's finisher.
        """
        self._dirty["config"] |= config
        self._dirty["summary"] |= summary

    def changes(self, *, everything: bool) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """Copies of the config and summary to send (only what changed, unless ``everything``)."""
        if not self.lock.acquire(timeout=LOCK_TIMEOUT_S):
            logger.warning("run %s: summary busy; sending the status without the latest metrics", self.run_id)
            return None, None
        try:
            config = dict(self.config) if everything or self._dirty["config"] else None
            summary = dict(self.summary) if everything or self._dirty["summary"] else None
            self._dirty = {"config": False, "summary": False}
        finally:
            self.lock.release()
        return config, summary

    def copies(self) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """Copies of the config and summary, or None when the lock stays taken (see :data:`LOCK_TIMEOUT_S`)."""
        if not self.lock.acquire(timeout=LOCK_TIMEOUT_S):
            return None
        try:
            return dict(self.config), dict(self.summary)
        finally:
            self.lock.release()

    def after_fork_in_child(self) -> None:
        self.lock = threading.Lock()
