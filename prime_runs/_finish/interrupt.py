"""A second Ctrl-C while runs are being finished: stop waiting, keep what is left, end by SIGINT.

The first SIGINT finishes every live run (or lets an explicit ``finish()``
go on), and each run says that a second Ctrl-C stops waiting. The second
asks every run being finished to stop waiting for the service: what is
left is spooled to the run directory (bounded by ``spill_timeout_s``), and
the process ends by SIGINT as soon as the runs are done, rather than by a
``KeyboardInterrupt`` unwinding through a half-finished ``finish()`` and an
exit hook that would wait for it all over again.

Called from the signal handler, which may have interrupted any lock's
holder: the handler only sets a flag and starts a raw thread; the waiting
and the runs' own work happen there. ``deliver_again`` and ``warn_bounded``
serve every signal's end (:mod:`~prime_runs._finish.signals`).
"""

from __future__ import annotations

import _thread
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from prime_traces.threads import call_in_forked_child

logger = logging.getLogger(__name__)

# How long past the runs' spill bound the stopper waits for them before ending the process anyway.
_STOP_MARGIN_S = 2.0
# How long the main thread may take to handle the SIGINT sent to it (a native call may hold it off).
_END_GRACE_S = 2.0

# Read by the signal handler, written once: no lock (see signals).
_stopping = False


def stopping() -> bool:
    """Whether the user asked to stop waiting (the process is ending by SIGINT)."""
    return _stopping


def tell(runs: Sequence[Any]) -> None:
    """Each run says what it is waiting for, and that a second Ctrl-C stops waiting (a raw thread)."""
    for hooks in runs:
        hooks._notice()


def stop_waiting(runs: Sequence[Any], deliver: Callable[[int], None]) -> None:
    """The second SIGINT: runs stop waiting on a raw thread, then ``deliver`` sends SIGINT to the main thread."""
    global _stopping
    _stopping = True
    try:
        _thread.start_new_thread(_stop, (list(runs), deliver))
    except RuntimeError:  # no new threads (the interpreter is shutting down)
        end_now()


def _stop(runs: list[Any], deliver: Callable[[int], None]) -> None:
    for hooks in runs:
        hooks._stop()
    bound = max((hooks._spill_timeout_s for hooks in runs), default=0.0) + _STOP_MARGIN_S
    deadline = time.monotonic() + bound
    for hooks in runs:
        hooks._finished.wait(max(0.0, deadline - time.monotonic()))
    deliver(signal.SIGINT)
    # The main thread ends the process when it handles that; a native call may hold it off.
    time.sleep(_END_GRACE_S)
    os._exit(128 + signal.SIGINT)


def end_now() -> None:
    """End the process by SIGINT, as if nothing had caught it (main thread only)."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    except ValueError:  # not the main thread
        os._exit(128 + signal.SIGINT)
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(_END_GRACE_S)  # the default action ends the process on delivery; this is never reached
    os._exit(128 + signal.SIGINT)


def deliver_again(signum: int) -> None:
    """Send ``signum`` to the main thread again (its handler chains this time)."""
    # To the main thread itself, so that a blocking call there is interrupted
    # and the handler runs now.
    try:
        signal.pthread_kill(threading.main_thread().ident or 0, signum)
    except (OSError, ValueError):
        os.kill(os.getpid(), signum)


def warn_bounded(message: str, *args: Any) -> None:
    """Log a warning, waiting a second at most: a process about to end must not hang on a logging lock."""
    # Logged on a raw thread and waited for a second at most: the stuck main
    # thread may hold a logging lock, and the process must end regardless.
    logged = _thread.allocate_lock()
    logged.acquire()

    def warn() -> None:
        logger.warning(message, *args)  # logging reports its own errors
        logged.release()

    try:
        _thread.start_new_thread(warn, ())
        logged.acquire(timeout=1.0)
    except RuntimeError:  # no new threads (the interpreter is shutting down)
        pass


def _after_fork_in_child() -> None:
    global _stopping
    _stopping = False


call_in_forked_child(_after_fork_in_child)
