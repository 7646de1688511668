"""Finishing a run that nobody finished: at exit, and on SIGTERM / SIGINT.

Each run registers an ``atexit`` hook that holds the run weakly, so it never
keeps it alive, and that an explicit ``finish()`` removes. A forked child
keeps the hook: the child never owns the run (its finish only flushes), but
what it logged must still reach the sinks when it exits without ``finish()``.
A run that handles signals also enlists with the handler every run shares
(:mod:`~prime_runs._finish.signals`), which finishes it on SIGTERM or SIGINT.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from prime_runs._finish import signals
from prime_runs._finish.signals import finishing_at_exit

__all__ = ["ShutdownHooks", "finishing_at_exit"]

logger = logging.getLogger(__name__)


class ShutdownHooks:
    """The ``atexit`` hook of one run, and its place in the shared signal handling."""

    def __init__(
        self,
        finish: Callable[[str], Any],
        *,
        handle_signals: bool,
        timeout_s: float = 60.0,
        notice: Callable[[], Any] | None = None,
        stop: Callable[[], Any] | None = None,
        spill_timeout_s: float = 0.0,
    ) -> None:
        self._finish_ref = _weak(finish)
        # A SIGINT: the run says what it waits for (notice); a second one: it stops waiting (stop).
        self._notice_ref = _weak(notice)
        self._stop_ref = _weak(stop)
        self._spill_timeout_s = spill_timeout_s
        self._handle_signals = handle_signals
        self._timeout_s = timeout_s
        self._installed = False
        # Set at the end of every finish (it calls uninstall()), whoever started it:
        # a signal that finds a finish in progress waits on this.
        self._finished = threading.Event()

    @property
    def _live_run(self) -> bool:
        return self._finish_ref() is not None and not self._finished.is_set()

    def _finish(self, status: str) -> None:
        finish = self._finish_ref()
        if finish is not None:
            finish(status)

    def _call(self, ref: Callable[[], Any]) -> None:
        method = ref()
        if method is not None:
            try:
                method()
            except Exception:  # a signal must still end the process
                logger.warning("handling an interrupt failed", exc_info=True)

    def _notice(self) -> None:
        self._call(self._notice_ref)

    def _stop(self) -> None:
        self._call(self._stop_ref)

    def install(self) -> None:
        atexit.register(self._at_exit)
        self._installed = True
        if not self._handle_signals:
            return
        signals.enlist(self)

    def uninstall(self) -> None:
        """Remove the hooks (after an explicit finish). Safe to call twice, from any thread."""
        self._finished.set()
        if not self._installed:
            return
        self._installed = False
        atexit.unregister(self._at_exit)
        signals.forget(self)
        # Off the main thread the handler stays: with this run gone it only
        # chains, and the next run installed from the main thread reuses it.
        if threading.current_thread() is threading.main_thread():
            signals.restore_if_idle()

    def after_fork_in_child(self) -> None:
        # The child's finish only flushes (it does not own the run), so the
        # atexit hook stays: records the child logged still reach the sinks
        # when it exits without finish(). A parent thread may have held the
        # event's lock at fork time: the child gets a fresh one.
        finished = self._finished.is_set()
        self._finished = threading.Event()
        if finished:
            self._finished.set()

    def _finish_logged(self, status: str) -> None:
        try:
            self._finish(status)
        except Exception:  # a signal must still end the process
            logger.warning("finishing the run as %s on a signal failed", status, exc_info=True)

    def _finish_on_signal(self, status: str, deadline: float) -> None:
        self._finish_logged(status)
        # finish() returns at once when another thread is already finishing the
        # run (an explicit finish the signal interrupted): wait for that one.
        if self._finish_ref() is not None:
            self._finished.wait(max(0.0, deadline - time.monotonic()))

    def _at_exit(self) -> None:
        signals.finish_at_exit(self, lambda: self._finish("crashed"))


def _weak(method: Callable[..., Any] | None) -> Callable[[], Any]:
    if method is None:
        return lambda: None
    return weakref.WeakMethod(method) if hasattr(method, "__self__") else (lambda: method)
