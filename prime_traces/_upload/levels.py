"""Adaptive zstd levels: on a slow link, spare CPU buys fewer bytes on the wire.

Every zstd request tells :class:`AdaptiveLevel` how long its body took to
compress (CPU time of the sending thread) and then to send (the request's wall
time). When the wire takes many times longer than compressing at the next
level would, the link may be the limit: the level steps up, one rung of
:data:`ZSTD_LADDER` at a time, and keeps the rung only if raw bytes then move
faster. When compressing takes more than half as long as sending, the CPU is
the limit: it steps back down. On a fast link (a local service, a data-centre
network) the level stays at 1, where it always starts.

What the rungs cost and give, on this project's workload (4 episodes of
6.4 MB, one core; ``tools/bench_compress.py``): level 1 ratio 5.2, level 3
6.3 at about 1.5 times level 1's CPU, level 6 7.0 at about 3.5 times, level 9
8.6 at about 7 times. Every rung's window is at most 4 MiB (``window_log``
22 for a 30 MiB batch), within the 8 MiB any conforming decoder must accept.
The idempotency key hashes the uncompressed batch, so a batch sent again at
another level is still the same upload.

gzip is left at one level: ISA-L's levels 1 to 3 give 3.65 to 3.75 for
twice the CPU, not worth a ladder.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from prime_traces.threads import call_in_forked_child

#: The zstd levels tried, in order.
ZSTD_LADDER = (1, 3, 6, 9)
#: CPU per byte of each rung relative to level 1 (measured as above, rounded up).
LADDER_COST = (1.0, 1.5, 3.5, 7.0)
#: Step up while compressing at the next rung would take under this share of the wire time.
STEP_UP_BELOW = 0.25
#: Step down once compressing takes over this share of the wire time.
STEP_DOWN_ABOVE = 0.5
#: Weight of the newest request in the running averages.
SMOOTHING = 0.3
#: Requests seen at a rung before it may change again (the first is not counted in its averages).
SETTLE_REQUESTS = 6
#: A step up is kept only if it moves raw bytes this much faster than the rung it left.
MIN_GAIN = 0.03
#: After a step up that did not pay, requests before another is tried.
HOLD_REQUESTS = 16


class AdaptiveLevel:
    """The zstd level of one client's requests; thread-safe, starts afresh after ``fork``.

    A step up is a trial: once the new rung has settled, it is kept only if
    raw bytes were answered faster there (uncompressed bytes of the answers
    since the rung's first, over the time since: requests overlap, so this
    is the client's throughput) by :data:`MIN_GAIN`, or if each request's wire
    time fell by at least half of what its smaller body promised (the mark of
    a link, and less noisy than throughput over a few requests); otherwise the level
    goes back and no step up is tried for :data:`HOLD_REQUESTS` requests. A
    slow service looks like a slow link from here (its time is in the wire
    time too), but fewer bytes do not make it faster: the trial tells them apart.

    Usage::

        levels = AdaptiveLevel()
        level = levels.current()
        ... compress ``raw_bytes`` at ``level`` (cpu_s), send (wire_s) ...
        levels.observe(level, raw_bytes, cpu_s, wire_s)
    """

    def __init__(
        self,
        ladder: tuple[int, ...] = ZSTD_LADDER,
        cost: tuple[float, ...] = LADDER_COST,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if len(ladder) != len(cost) or not ladder:
            raise ValueError("ladder and cost must be of the same, non-zero length")
        self.ladder = ladder
        self.cost = cost
        self.clock = clock
        self._reset()
        call_in_forked_child(self._reset)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._rung = 0
        self._cpu_s: float | None = None
        self._wire_s: float | None = None
        self._rate: float | None = None
        self._shrunk: float | None = None  # body bytes over raw bytes at this rung
        self._since: float | None = None
        self._bytes = 0
        self._seen = 0
        # A step up on trial: the rung it left, and that rung's rate, wire time and compression.
        self._trial: tuple[int, float, float, float | None] | None = None
        self._hold = 0
        self.steps_up = 0
        self.steps_down = 0
        self.trials_failed = 0

    def current(self) -> int:
        """The level the next request compresses at."""
        return self.ladder[self._rung]

    def observe(self, level: int, raw_bytes: int, cpu_s: float, wire_s: float, body_bytes: int | None = None) -> None:
        """One request at ``level``: ``raw_bytes`` compressed to ``body_bytes`` in ``cpu_s``, sent in ``wire_s``."""
        with self._lock:
            self._hold = max(0, self._hold - 1)
            if level != self.ladder[self._rung]:
                return  # sent before the last change: says nothing of this rung
            self._seen += 1
            now = self.clock()
            if self._seen == 1:
                # A rung's first answer shared the link with requests of the rung before (or with none):
                # the rung's throughput is counted from its end.
                self._since = now
                return
            self._cpu_s = _smooth(self._cpu_s, cpu_s)
            self._wire_s = _smooth(self._wire_s, wire_s)
            if body_bytes is not None and raw_bytes > 0:
                self._shrunk = _smooth(self._shrunk, body_bytes / raw_bytes)
            self._bytes += raw_bytes
            assert self._since is not None
            # Raw bytes answered per second since: requests overlap, so this is the client's throughput.
            self._rate = self._bytes / max(now - self._since, 1e-6)
            if self._seen < SETTLE_REQUESTS or self._wire_s <= 0:
                return
            rung = self._rung
            if self._trial is not None:
                left, left_rate, left_wire_s, left_shrunk = self._trial
                self._trial = None
                # On a link, the wire time falls with the body; a busy service answers no sooner for fewer bytes.
                expected = self._shrunk / left_shrunk if self._shrunk and left_shrunk else 1.0
                wire_fell = self._wire_s < left_wire_s * (1 + expected) / 2
                if self._rate < left_rate * (1 + MIN_GAIN) and not wire_fell:
                    self.trials_failed += 1
                    self._hold = HOLD_REQUESTS
                    self._move(left)
                    return
            if rung + 1 < len(self.ladder) and not self._hold:
                next_cpu_s = self._cpu_s * self.cost[rung + 1] / self.cost[rung]
                if next_cpu_s < STEP_UP_BELOW * self._wire_s:
                    self._trial = (rung, self._rate, self._wire_s, self._shrunk)
                    self._move(rung + 1)
                    self.steps_up += 1
                    return
            if rung > 0 and self._cpu_s > STEP_DOWN_ABOVE * self._wire_s:
                self._move(rung - 1)
                self.steps_down += 1

    def _move(self, rung: int) -> None:
        # Under the lock. The averages belong to the old rung: the new one measures afresh.
        self._rung = rung
        self._cpu_s = self._wire_s = self._rate = self._since = self._shrunk = None
        self._bytes = self._seen = 0

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "zstd_level": self.ladder[self._rung],
                "steps_up": self.steps_up,
                "steps_down": self.steps_down,
                "trials_failed": self.trials_failed,
            }


def _smooth(average: float | None, value: float) -> float:
    return value if average is None else average + (value - average) * SMOOTHING
