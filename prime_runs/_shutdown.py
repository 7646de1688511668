"""Finishing a run that nobody finished: at exit, and on SIGTERM / SIGINT.

The hooks hold the run weakly, so they never keep it alive, and they are
removed by an explicit ``finish()``. Signal handlers are installed only from
the main thread and only over the default handlers (a framework's own
handler is left alone); after finishing the run they chain to the previous
handler, so a SIGTERM still ends the process by that signal.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
import weakref
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

# What each signal finishes the run as.
SIGNAL_STATUS = {signal.SIGTERM: "crashed", signal.SIGINT: "cancelled"}


class ShutdownHooks:
    """The ``atexit`` hook and signal handlers of one run."""

    def __init__(self, finish: Callable[[str], Any], *, handle_signals: bool, timeout_s: float = 60.0) -> None:
        ref = weakref.WeakMethod(finish) if hasattr(finish, "__self__") else (lambda: finish)
        self._finish_ref = ref
        self._handle_signals = handle_signals
        self._timeout_s = timeout_s
        self._previous: dict[int, Any] = {}
        self._installed = False

    def _finish(self, status: str) -> None:
        finish = self._finish_ref()
        if finish is not None:
            finish(status)

    def install(self) -> None:
        atexit.register(self._at_exit)
        self._installed = True
        if not self._handle_signals or threading.current_thread() is not threading.main_thread():
            return
        for signum in SIGNAL_STATUS:
            current = signal.getsignal(signum)
            if current in (signal.SIG_DFL, signal.default_int_handler):
                self._previous[signum] = current
                signal.signal(signum, self._on_signal)

    def uninstall(self) -> None:
        """Remove the hooks (after an explicit finish). Safe to call twice, from any thread."""
        if not self._installed:
            return
        self._installed = False
        atexit.unregister(self._at_exit)
        if threading.current_thread() is not threading.main_thread():
            return  # handlers stay; they find the run finished and only chain
        for signum, previous in list(self._previous.items()):
            if signal.getsignal(signum) == self._on_signal:
                signal.signal(signum, previous)
            del self._previous[signum]

    def after_fork_in_child(self) -> None:
        # The child does not own the run: its exit must not finish it.
        if self._installed:
            atexit.unregister(self._at_exit)
            self._installed = False

    def _finish_logged(self, status: str) -> None:
        try:
            self._finish(status)
        except Exception:  # noqa: BLE001  (a signal must still end the process)
            logger.warning("finishing the run as %s on a signal failed", status, exc_info=True)

    def _at_exit(self) -> None:
        self._finish("crashed")

    def _on_signal(self, signum: int, frame: Any) -> None:
        status = SIGNAL_STATUS.get(signal.Signals(signum), "crashed")
        # Finish on another thread: this handler interrupts the main thread
        # wherever it was, possibly holding a lock that finishing needs. The
        # wait is bounded, so the signal still ends the process.
        finisher = threading.Thread(target=self._finish_logged, args=(status,), name="prime-runs-signal", daemon=True)
        finisher.start()
        finisher.join(self._timeout_s + 2.0)
        previous = self._previous.get(signum, signal.SIG_DFL)
        signal.signal(signum, previous)
        if previous is signal.SIG_DFL:
            os.kill(os.getpid(), signum)  # end by the signal, as if we were never here
        elif callable(previous):
            previous(signum, frame)
