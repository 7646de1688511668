"""Adaptive zstd levels: on a slow link, spare CPU buys fewer bytes on the wire.

Every zstd request tells :class:`AdaptiveLevel` how long its body took to
compress (CPU time of the sending thread) and then to send (the request's wall
time). When the wire takes many times longer than compressing at the next
level would, the link is the limit: the level steps up, one rung of
:data:`ZSTD_LADDER` at a time. When compressing takes more than half as long
as sending, the CPU is the limit: it steps back down. On a fast link (a local
service, a data-centre network) the level stays at 1, where it always starts.

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
#: Requests seen at a rung before it may change again.
SETTLE_REQUESTS = 2


class AdaptiveLevel:
    """The zstd level of one client's requests; thread-safe, starts afresh after ``fork``.

    Usage::

        levels = AdaptiveLevel()
        level = levels.current()
        ... compress at ``level`` (cpu_s), send (wire_s) ...
        levels.observe(level, cpu_s, wire_s)
    """

    def __init__(self, ladder: tuple[int, ...] = ZSTD_LADDER, cost: tuple[float, ...] = LADDER_COST) -> None:
        if len(ladder) != len(cost) or not ladder:
            raise ValueError("ladder and cost must be of the same, non-zero length")
        self.ladder = ladder
        self.cost = cost
        self._reset()
        call_in_forked_child(self._reset)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._rung = 0
        self._cpu_s: float | None = None
        self._wire_s: float | None = None
        self._seen = 0
        self.steps_up = 0
        self.steps_down = 0

    def current(self) -> int:
        """The level the next request compresses at."""
        return self.ladder[self._rung]

    def observe(self, level: int, cpu_s: float, wire_s: float) -> None:
        """One request at ``level``: ``cpu_s`` compressing, ``wire_s`` sending; may move the level."""
        with self._lock:
            if level != self.ladder[self._rung]:
                return  # sent before the last change: says nothing of this rung
            self._cpu_s = cpu_s if self._cpu_s is None else self._cpu_s + (cpu_s - self._cpu_s) * SMOOTHING
            self._wire_s = wire_s if self._wire_s is None else self._wire_s + (wire_s - self._wire_s) * SMOOTHING
            self._seen += 1
            if self._seen < SETTLE_REQUESTS or self._wire_s <= 0:
                return
            rung = self._rung
            if rung + 1 < len(self.ladder):
                next_cpu_s = self._cpu_s * self.cost[rung + 1] / self.cost[rung]
                if next_cpu_s < STEP_UP_BELOW * self._wire_s:
                    self._move(rung + 1)
                    self.steps_up += 1
                    return
            if rung > 0 and self._cpu_s > STEP_DOWN_ABOVE * self._wire_s:
                self._move(rung - 1)
                self.steps_down += 1

    def _move(self, rung: int) -> None:
        # Under the lock. The averages belong to the old rung: the new one measures afresh.
        self._rung = rung
        self._cpu_s = self._wire_s = None
        self._seen = 0

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"zstd_level": self.ladder[self._rung], "steps_up": self.steps_up, "steps_down": self.steps_down}
