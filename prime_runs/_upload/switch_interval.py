"""While a run uploads, the caller's threads get the GIL back sooner: the switch interval, lowered and restored.

CPython lets a thread that wants the GIL ask its holder to drop it only after
waiting the interpreter's switch interval, 5 ms by default. The upload
worker encodes records in Python between calls that release the GIL, so
without this the training loop's ``log_episodes()`` or an asyncio event loop
on the main thread waited up to 5 ms for the GIL, several times in a row
(measured in the load test: ``log_episodes()`` at most 2.3–2.5 ms, event-loop
lag p99 8.8–9.1 ms at 5 ms; 0.7 ms and 4.1–5.2 ms at 0.5 ms, same throughput).

:func:`hold` lowers the interval while at least one worker uploads and puts
back the value it found when the last one stops, unless someone else changed
it meanwhile. It never raises an interval the process had set lower itself.
A forked child starts with no holds and the value the parent had found.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

from prime_traces.threads import call_in_forked_child

__all__ = ["DEFAULT_SWITCH_INTERVAL_S", "BusyHold", "hold"]

#: What a run lowers ``sys.getswitchinterval()`` to while it uploads; ``None`` leaves it alone.
DEFAULT_SWITCH_INTERVAL_S = 0.0005

_lock = threading.Lock()
_holds = 0
_found: float | None = None  # the interval before the first hold
_ours: float | None = None  # the interval as set by the holds, to tell whether someone changed it since
_generation = 0  # bumped in a forked child: a release taken before the fork ends nothing there


def hold(interval_s: float | None) -> Callable[[], None]:
    """Lower the switch interval to ``interval_s`` (if lower) until the returned function is called.

    The returned release is idempotent; ``interval_s=None`` holds nothing.
    """
    global _holds, _found, _ours
    if interval_s is None:
        return _nothing
    if not interval_s > 0:
        raise ValueError(f"the switch interval must be greater than 0 s, not {interval_s}")
    with _lock:
        current = sys.getswitchinterval()
        if _holds == 0 or current != (_ours if _ours is not None else _found):
            _found, _ours = current, None  # the first hold, or someone set the interval since the holds did
        _holds += 1
        if interval_s < current:
            sys.setswitchinterval(interval_s)
            _ours = sys.getswitchinterval()  # as the interpreter rounds it
        elif _holds == 1:
            _ours = None  # the process already runs at this interval or lower: nothing to restore
    released = [False]
    generation = _generation

    def release() -> None:
        global _holds, _found, _ours
        with _lock:
            if released[0] or generation != _generation:
                return
            released[0] = True
            _holds -= 1
            if _holds == 0:
                if _ours is not None and _found is not None and sys.getswitchinterval() == _ours:
                    sys.setswitchinterval(_found)
                _found = _ours = None

    return release


class BusyHold:
    """One upload thread's hold: taken while it has work, dropped while it waits, dropped for good at close.

    Thread-safe; :meth:`take` and :meth:`drop` may be called any number of times.
    """

    def __init__(self, interval_s: float | None) -> None:
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._release: Callable[[], None] | None = None
        self._closed = False

    def take(self) -> None:
        with self._lock:
            if self._release is None and not self._closed:
                self._release = hold(self.interval_s)

    def drop(self, *, for_good: bool = False) -> None:
        with self._lock:
            release, self._release = self._release, None
            self._closed = self._closed or for_good
        if release is not None:
            release()


def _nothing() -> None:
    return None


def _after_fork_in_child() -> None:
    # The parent's workers are not in the child: their holds are gone with them.
    global _lock, _holds, _found, _ours, _generation
    _lock = threading.Lock()
    _generation += 1
    if _holds and _ours is not None and _found is not None and sys.getswitchinterval() == _ours:
        sys.setswitchinterval(_found)
    _holds, _found, _ours = 0, None, None


call_in_forked_child(_after_fork_in_child)
