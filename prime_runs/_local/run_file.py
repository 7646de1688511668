"""The owner's ``run.json``: created when the run directory is needed, rewritten as the run changes.

Only the process that owns the run writes it, and only while it holds the
directory's owner lock (:meth:`RunDirectory.hold_owner_lock`): two live
processes never both write one run's ``run.json``. Each write replaces the
file atomically; a write that fails is logged once and retried at the next
change, and never reaches the training loop.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from prime_runs._local.rundir import RunDirectory
from prime_runs._local.segments import host_label
from prime_runs.errors import PrimeRunsError
from prime_traces.threads import run_in_daemon

logger = logging.getLogger(__name__)


class RunFile:
    """Keeps ``run.json`` of one run up to date with ``document()``; thread-safe.

    Usage::

        run_file = RunFile(rundir, lambda: {"id": "run-1", "status": "running"})
        run_file.activate()          # takes the owner lock, writes run.json
        run_file.dirty = True        # something changed
        run_file.save_if_dirty()     # on the worker's timer
    """

    def __init__(self, rundir: RunDirectory, document: Callable[[], dict[str, Any] | None]) -> None:
        self.rundir = rundir
        self._document = document
        self.active = False
        #: Set when the run changed since the last write.
        self.dirty = False
        self.created_at = time.time()
        self._lock = threading.Lock()
        self._warned = False
        self._earlier_sealed: dict[str, Any] = {}

    def activate(self) -> bool:
        """Own the directory and write ``run.json``; False when another live process owns it."""
        with self._lock:
            if self.active:
                return True
            try:
                self.rundir.hold_owner_lock()
                earlier = self.rundir.read_run()
            except (PrimeRunsError, OSError) as err:
                logger.warning("run %s: not keeping run.json: %s", self.rundir.run_id, err)
                return False
            if earlier and isinstance(earlier.get("created_at"), (int, float)):
                self.created_at = float(earlier["created_at"])  # the same run, resumed
            if earlier and isinstance(earlier.get("sealed_files"), dict):
                self._earlier_sealed = dict(earlier["sealed_files"])  # an earlier process's files stay known
            self.active = True
        self.save()
        return True

    def save(self) -> None:
        """Write ``run.json`` now (when active); a failure is logged, never raised."""
        if not self.active:
            return
        self.dirty = False
        current = self._document()
        if current is None:  # not readable now: written at the next change or at finish
            self.dirty = True
            return
        document = {
            **current,
            "sealed_files": {**self._earlier_sealed, **(current.get("sealed_files") or {})},
            "created_at": self.created_at,
            "updated_at": time.time(),
            "owner": {"host": host_label(), "pid": os.getpid()},
        }
        try:
            self.rundir.write_run(document)
        except OSError as err:
            self.dirty = True
            if not self._warned:
                self._warned = True
                logger.warning("run %s: could not write %s/run.json: %s", self.rundir.run_id, self.rundir.path, err)

    def save_if_dirty(self) -> None:
        if self.dirty:
            self.save()

    def close(self, *, activate: bool = False) -> threading.Event:
        """Write ``run.json`` a last time and give up the owner lock; the event is set once done.

        With ``activate``, the file is started now if it was not kept yet (an
        online run whose final status the service did not confirm). The write
        runs on a daemon thread, waited for only until the caller's deadline:
        a disk that hangs must not hold ``finish()`` (or exit).
        """

        def finish() -> None:
            if not (activate and not self.active and self.activate()):
                self.save()  # (activate() has just written it)
            self.rundir.release_owner_lock()

        return run_in_daemon(finish, f"prime-runs-run-json-{self.rundir.run_id}")
