"""What the load test's producer measures about itself beside the calls: collector pauses, the upload thread's CPU, lag.

Only the standard library: the published SDK's producer imports this module
too, in a virtualenv that has none of this project's packages.
"""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import time
from collections.abc import Callable
from typing import Any

PROBE_INTERVAL_S = 0.001


async def probe_lag(lags: list[float], keep_going: Callable[[], bool]) -> None:
    """The event loop's lag: how late each ``PROBE_INTERVAL_S`` sleep wakes, appended to ``lags`` (seconds)."""
    loop = asyncio.get_running_loop()
    while keep_going():
        asked = loop.time()
        await asyncio.sleep(PROBE_INTERVAL_S)
        lags.append(max(0.0, loop.time() - asked - PROBE_INTERVAL_S))


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (0 for none): the load test's one definition of p99."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class GcPauses:
    """The garbage collector's pauses (``gc.callbacks``): a call that allocates may pay for one.

    Each pause is kept as its (start, stop) on ``perf_counter``. The GIL may
    change hands inside the callbacks themselves, so a pause can begin before
    a call it ends in: :meth:`inside` counts only the overlap.
    """

    def __init__(self) -> None:
        self.pauses: list[tuple[float, float, int]] = []  # (start, stop, generation)
        self._started: dict[int, float] = {}  # by thread: a callback may be interrupted by another thread's
        gc.callbacks.append(self._note)

    def _note(self, phase: str, info: dict[str, int]) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._started[threading.get_ident()] = now
        else:
            started = self._started.pop(threading.get_ident(), now)
            self.pauses.append((started, now, info["generation"]))

    def inside(self, first: int, started: float, ended: float) -> float:
        """Seconds of the pauses from ``first`` on that overlap [started, ended]."""
        return sum(max(0.0, min(stop, ended) - max(start, started)) for start, stop, _ in self.pauses[first:])

    def reset(self) -> None:
        self.pauses = []

    def report(self) -> dict[str, Any]:
        longest = max(((stop - start, generation) for start, stop, generation in self.pauses), default=(0.0, 0))
        return {"gc_max_ms": longest[0] * 1e3, "gc_max_generation": longest[1], "gc_collections": len(self.pauses)}


class UploadThreadCpu:
    """CPU seconds of the SDK's upload thread (``prime-runs-upload``, which encodes), read from ``/proc``.

    Linux only, in clock ticks. Read every ``interval_s``: one small read,
    which releases the GIL (each read disturbs what is measured, so only
    this thread's). Every thread of that name counts: the worker's, and each
    write's own (``prime_runs._upload.lanes``). A thread that ends loses its time
    since its last reading: at most one interval per write, and the
    worker's at ``finish()``. The main thread measures itself
    (``time.thread_time``); the rest of the process is the request threads
    and a few helpers.
    """

    NAME = "prime-runs-upload"

    def __init__(self, interval_s: float = 0.05) -> None:
        self._seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._interval_s = interval_s
        self._ticks = os.sysconf("SC_CLK_TCK")
        self._thread = threading.Thread(target=self._poll, name="loadtest-thread-cpu", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        for thread in threading.enumerate():
            if thread.name != self.NAME or thread.native_id is None:
                continue
            try:
                with open(f"/proc/self/task/{thread.native_id}/stat", "rb") as file:
                    fields = file.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue  # ended since enumerate()
            self._seen[thread.native_id] = (int(fields[11]) + int(fields[12])) / self._ticks  # utime + stime

    def _poll(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._sample()

    def report(self) -> float:
        self._stop.set()
        self._thread.join()
        self._sample()
        return sum(self._seen.values())
