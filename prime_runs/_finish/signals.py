"""The handler every run shares: SIGTERM and SIGINT finish the live runs, then the signal goes on.

Installed only from the main thread and only over the default handlers (a
framework's own is left alone), so a run finished off the main thread leaves
nothing stale behind: the next run joins the handler that is already there.

The handler interrupts the main thread wherever it was, possibly holding a
lock that finishing needs (the record queue's, the accounting's, logging's,
threading's, an import's) until the handler returns. So it looks at the
interrupted stack. With no frame of this package, ``threading``, ``logging``
or the import system, it finishes every live run on helper threads, waits for
them (bounded) and chains to the previous handler: a SIGTERM ends the process
by that signal and a SIGINT raises ``KeyboardInterrupt`` before training can
go on into a long native call (a collective whose peers died of the same
SIGTERM) that would hold the signal off. With such a frame it starts the
finishing and returns; once the runs are finished, or their bounded time is
up, the signal is delivered to the main thread again and the handler chains.
Should that go unhandled for a few seconds (a native call), a SIGTERM with
the default action behind ours ends the process with ``os._exit(128 + 15)``.

Called by a framework's handler that wraps ours, it always waits: a signal
delivered again would run the wrapper twice. If the main thread reaches exit
before the signal is chained, an exit hook waits for the finishing (bounded),
finishes on the main thread any run whose finisher could not start (Python
3.12+ starts no thread once the interpreter is shutting down) and ends the
process by the signal; so does the exit finish of a run that the signal
interrupted. A second signal while the runs are being finished chains
at once.
"""

from __future__ import annotations

import _thread
import atexit
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from prime_runs._finish import interrupt
from prime_traces.threads import call_in_forked_child, wait_event

logger = logging.getLogger(__name__)


class ShutdownHooks(Protocol):
    """What the handler needs of a run's hooks (:class:`~prime_runs._finish.exit_hooks.ShutdownHooks`)."""

    _timeout_s: float

    @property
    def _live_run(self) -> bool: ...

    def _finish_on_signal(self, status: str, deadline: float) -> None: ...


# What each signal finishes the run as.
SIGNAL_STATUS = {signal.SIGTERM: "crashed", signal.SIGINT: "cancelled"}
# Past the longest finish timeout, the signal is chained anyway: finish() returns
# within its timeout plus about a second, so this only bounds a hung finish.
_HARD_MARGIN_S = 2.0
# On the deferred path: how long the signal delivered again may go unhandled (the
# main thread in a native call) before a SIGTERM ends the process from the helper.
_CHAIN_GRACE_S = 2.0

# Code that may hold a lock finishing needs, were the handler to interrupt it.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep
_THREADING_FILE = os.path.realpath(threading.__file__)
_LOGGING_DIR = os.path.dirname(os.path.realpath(logging.__file__)) + os.sep

# State shared by the handler and the hooks, with no lock: the handler may
# interrupt the main thread anywhere, this module included, so it could never
# take one safely. ``_live`` only changes by append/remove (atomic under the
# GIL), and only the main thread (the handler, the exit hook) rebinds the rest.
_live: list[ShutdownHooks] = []  # the runs a signal finishes
_previous: dict[int, Any] = {}  # the default handler ours replaced, per signal
_handling: _Handling | None = None  # the signal being handled
_exiting = False  # the exit hook is ending the process by the signal
_exit_finishing = False  # an exit hook is finishing a run on the main thread


def enlist(hooks: ShutdownHooks) -> None:
    """A run for a signal to finish; from the main thread, the shared handler is installed too."""
    _live.append(hooks)
    if threading.current_thread() is threading.main_thread():
        _install_handler()


def finish_at_exit(hooks: ShutdownHooks, finish: Callable[[], Any]) -> None:
    """The exit hook of ``hooks``' run: ``finish()`` it (after a signal finishing it), then end by that signal."""
    global _exit_finishing
    handling = _handling
    if handling is not None and hooks in handling.runs:
        handling.wait()  # not racing it to the finish: its status, not "crashed", is the one to record
    _exit_finishing = True
    try:
        finish()
    finally:
        _exit_finishing = False
    # A signal that came during this finish registered its exit hook while the
    # hooks were running (Python 3.11 never calls such a hook): end by it here.
    end_by_signal_at_exit()


def finishing_at_exit() -> bool:
    """Whether the exit hook is finishing a run now (the interpreter is shutting down, not a signal)."""
    return _exit_finishing


class _Handling:
    """One signal being handled: the runs it finishes on helper threads, within a bound."""

    def __init__(self, signum: int, runs: list[ShutdownHooks], *, deliver_again: bool) -> None:
        self.signum = signum
        self.status = SIGNAL_STATUS.get(signal.Signals(signum), "crashed")
        self.runs = runs
        self.deadline = time.monotonic() + max(r._timeout_s for r in runs) + _HARD_MARGIN_S
        self.done = threading.Event()
        # Runs whose finisher thread could not start, until the helper has finished them itself.
        self.unfinished: list[ShutdownHooks] = []
        self.chained = False
        # The handler returned at once: the helper delivers the signal again once
        # the runs are finished. Otherwise the handler waits and chains itself.
        self.deliver_again = deliver_again

    def start(self) -> bool:
        # A raw thread: threading.Thread.start() takes the threading module's
        # lock, which the interrupted main thread may hold.
        try:
            _thread.start_new_thread(self._finish_runs, ())
        except RuntimeError:  # no new threads (the interpreter is shutting down)
            return False
        return True

    def _finish_runs(self) -> None:
        try:
            if self.signum == signal.SIGINT:
                interrupt.tell(self.runs)
            finishers = []
            for hooks in self.runs:
                finisher = threading.Thread(
                    target=hooks._finish_on_signal,
                    args=(self.status, self.deadline),
                    name="prime-runs-signal",
                    daemon=True,
                )
                try:
                    finisher.start()
                except RuntimeError:  # out of threads, or (Python 3.12+) the main thread reached shutdown first
                    self.unfinished.append(hooks)
                    continue
                finishers.append(finisher)
            # Finished here, or the signal delivered again would end the process with them
            # unfinished; what is left when the exit hook stops waiting, it finishes itself.
            for hooks in list(self.unfinished):
                hooks._finish_on_signal(self.status, self.deadline)
                self.unfinished.remove(hooks)
            for finisher in finishers:
                finisher.join(max(0.0, self.deadline - time.monotonic()))
        finally:
            self.done.set()
            if self.deliver_again and not self.chained and not _exiting:
                interrupt.deliver_again(self.signum)
                self._end_if_unhandled()

    def _end_if_unhandled(self) -> None:
        # The main thread runs the handler only between Python instructions: a
        # native call can hold the signal off for minutes. A SIGTERM meant to end
        # the process (the default action behind ours) ends it from here; a SIGINT
        # waits, as without us, for the main thread to get back to Python.
        if self.signum != signal.SIGTERM or _previous.get(self.signum) is not signal.SIG_DFL:
            return
        limit = time.monotonic() + _CHAIN_GRACE_S
        # Polled rather than an Event: the handler sets ``chained``, and a signal
        # handler must take no lock (it may have interrupted that lock's holder).
        while not self.chained and not _exiting and time.monotonic() < limit:
            time.sleep(0.05)
        if self.chained or _exiting or signal.getsignal(self.signum) is not _on_signal:
            return
        interrupt.warn_bounded(
            "the main thread did not handle %s within %.0f s of finishing the runs (in a native "
            "call?): ending the process",
            signal.Signals(self.signum).name,
            _CHAIN_GRACE_S,
        )
        os._exit(128 + self.signum)

    def wait(self) -> None:
        # In slices on the main thread: a second Ctrl-C must get its handler run (see interrupt).
        wait_event(self.done, max(0.0, self.deadline - time.monotonic()) + 0.5)


def _on_signal(signum: int, frame: Any) -> None:
    """The handler of every run: finish them on helper threads; chain once they are done."""
    global _handling
    if _exiting:
        return  # the exit hook waits for the runs, then ends the process by the signal
    handling = _handling
    if (
        handling is not None
        and not handling.chained
        and signum == handling.signum == signal.SIGINT
        and not handling.done.is_set()
        and not interrupt.stopping()
    ):
        # A second Ctrl-C while the runs are being finished: stop waiting, keep the rest on disk, end.
        interrupt.stop_waiting(handling.runs, interrupt.deliver_again)
        return
    if handling is not None and not handling.chained:
        # Either the finisher delivered the signal again (the runs are done),
        # or a second signal came while they were being finished: chain now.
        # Another signal than the one being handled leaves that one pending.
        if signum == handling.signum:
            handling.chained = True
        _chain(signum, frame)
        return
    runs = [hooks for hooks in list(_live) if hooks._live_run]
    if not runs:
        _chain(signum, frame)
        return
    # A wrapper that called ours (it is not the installed handler) would run
    # again on a signal delivered again: wait here even under a lock (bounded).
    wait = signal.getsignal(signum) is not _on_signal or not _may_hold_a_lock(frame)
    handling = _Handling(signum, runs, deliver_again=not wait)
    _handling = handling
    # Last registered, so first to run: if the main thread gets to exit before
    # the signal is chained, the process still ends by the signal.
    atexit.unregister(end_by_signal_at_exit)
    atexit.register(end_by_signal_at_exit)
    started = handling.start()
    if not started and _exit_finishing:
        # No thread can start (Python 3.12 at exit) and the signal interrupted the
        # exit hook's finish on this thread: that finish goes on, then the hook
        # ends the process by the signal. Chaining now would lose the status.
        handling.done.set()
        return
    if started and not wait:
        return  # the helper delivers the signal again once the runs are finished
    if started:
        try:
            handling.wait()
        except BaseException:
            # Another signal chained during the wait (SIGINT: KeyboardInterrupt):
            # this one is left to the helper, or to the exit hook if it is done.
            handling.deliver_again = True
            raise
    if not handling.chained:  # a second one of this signal during the wait chained it
        handling.chained = True
        _chain(signum, frame)


def _may_hold_a_lock(frame: Any) -> bool:
    """Whether the interrupted stack runs code that may hold a lock finishing needs."""
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith("<frozen importlib"):
            return True  # a module being imported stays locked until it is imported
        if not filename.startswith("<"):
            path = os.path.realpath(filename)  # the package may be reached through a symlink
            if path == _THREADING_FILE or path.startswith((_PACKAGE_DIR, _LOGGING_DIR)):
                return True
        frame = frame.f_back
    return False


def _chain(signum: int, frame: Any) -> None:
    if signum == signal.SIGINT and interrupt.stopping():
        interrupt.end_now()  # the user stopped waiting: the process ends by the signal, no traceback
    default = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
    previous = _previous.get(signum, default)
    restore_if_idle()
    if callable(previous):
        previous(signum, frame)  # default_int_handler: KeyboardInterrupt
        return
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)  # end by the signal, as if we were never here


def end_by_signal_at_exit() -> None:
    global _exiting
    handling = _handling
    if handling is None or handling.chained:
        return
    _exiting = True
    handling.wait()
    for hooks in list(handling.unfinished):
        # Registered last, this hook runs before the runs' own: finish here what the helper
        # has not yet (no thread of its own), or the process would end by the signal with it unfinished.
        hooks._finish_on_signal(handling.status, time.monotonic() + hooks._timeout_s)
    handling.chained = True
    try:
        signal.signal(handling.signum, signal.SIG_DFL)
    except ValueError:  # not on the main thread: the process exits as it was about to
        return
    os.kill(os.getpid(), handling.signum)


def _install_handler() -> None:
    """Install the shared handler over default handlers (main thread only)."""
    for signum in SIGNAL_STATUS:
        current = signal.getsignal(signum)
        if current is _on_signal:
            continue  # an earlier run installed it; what it replaced is recorded
        if current in (signal.SIG_DFL, signal.default_int_handler):
            _previous[signum] = current
            signal.signal(signum, _on_signal)


def restore_if_idle() -> None:
    """Put the previous handlers back once no run needs ours (main thread only)."""
    if any(hooks._live_run for hooks in list(_live)):
        return
    if _handling is not None and not _handling.chained:
        return  # the signal being handled must still chain through ours
    for signum, previous in _previous.items():
        if signal.getsignal(signum) is _on_signal:
            signal.signal(signum, previous)


def forget(hooks: ShutdownHooks) -> None:
    try:
        _live.remove(hooks)
    except ValueError:
        pass


def _after_fork_in_child() -> None:
    global _handling, _exiting, _exit_finishing
    # The parent's finisher threads do not exist in the child: it handles its own signals afresh.
    _handling = None
    _exiting = False
    _exit_finishing = False


call_in_forked_child(_after_fork_in_child)
