"""Where every submitted record went: per-sink counters and submit latency.

The identity the tests check after ``finish()``, per sink:
``submitted = stored + dropped + failed + spooled``. ``dropped`` counts
records refused at the queue (they reach no sink); ``failed`` is keyed by
reason (``invalid_record``, ``rejected:<code>``, ``transient``,
``sink_retired``, ``deadline``...); ``spooled`` counts what was written to the
run directory instead of the service, by why (``transient``, ``deadline``...);
what the run uploads from there itself once the service is back moves from
``spooled`` to ``stored`` (and is counted in ``resynced``).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: ``(kind, sink, reason, records, detail)``: kind is ``dropped``, ``failed`` or ``spooled``; sink is None for drops.
LossListener = Callable[[str, str | None, str, int, str | None], Any]

# Submit latencies are kept in a fixed ring: p99 over the most recent calls,
# constant memory however long the run.
_LATENCY_RING = 4096


@dataclass
class SinkCounts:
    """The counters of one sink."""

    stored: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    #: Records written to the run directory for ``prime-runs sync``, by why they were not delivered.
    spooled: Counter[str] = field(default_factory=Counter)
    #: The first record lost for each reason, named with its call, position and cause.
    details: dict[str, str] = field(default_factory=dict)
    #: Spooled records the run itself uploaded later (counted in ``stored``, no longer in ``spooled``).
    resynced: int = 0
    #: Records the run uploaded from disk before their spill was counted (the drain reads each entry as
    #: soon as it is durable, the ledger counts the write once it is whole): moved to ``stored`` then.
    resync_credit: int = 0
    bytes_sent: int = 0

    @property
    def spooled_total(self) -> int:
        return sum(self.spooled.values()) - self.resynced

    @property
    def failed_total(self) -> int:
        return sum(self.failed.values())


class Accounting:
    """Thread-safe counters of one worker. Updating never blocks for long.

    ``on_loss``, when set, hears of every record dropped, failed or spooled,
    outside the lock; it must return at once (it may run on the caller's thread).
    """

    def __init__(self, sink_names: list[str], on_loss: LossListener | None = None) -> None:
        self._lock = threading.Lock()
        self.submitted = 0
        self.dropped: Counter[str] = Counter()
        self.drop_details: dict[str, str] = {}
        self.on_loss = on_loss
        self.sinks = {name: SinkCounts() for name in sink_names}
        self._latencies = [0.0] * _LATENCY_RING
        self._latency_count = 0
        self._latency_max = 0.0

    def count_submit(self, records: int, latency_s: float) -> None:
        with self._lock:
            self.submitted += records
            self._latencies[self._latency_count % _LATENCY_RING] = latency_s
            self._latency_count += 1
            if latency_s > self._latency_max:
                self._latency_max = latency_s

    def _tell_loss(self, kind: str, sink: str | None, reason: str, records: int, detail: str | None) -> None:
        listener = self.on_loss
        if listener is not None:
            listener(kind, sink, reason, records, detail)

    def count_drop(self, records: int, reason: str, detail: str | None = None) -> None:
        with self._lock:
            self.dropped[reason] += records
            if detail:
                self.drop_details.setdefault(reason, detail)
        self._tell_loss("dropped", None, reason, records, detail)

    def count_stored(self, sink: str, records: int, bytes_sent: int = 0) -> None:
        with self._lock:
            counts = self.sinks[sink]
            counts.stored += records
            counts.bytes_sent += bytes_sent

    def count_failed(self, sink: str, records: int, reason: str, detail: str | None = None) -> None:
        if records:
            with self._lock:
                counts = self.sinks[sink]
                counts.failed[reason] += records
                if detail:
                    counts.details.setdefault(reason, detail)
            self._tell_loss("failed", sink, reason, records, detail)

    def count_spooled(self, sink: str, records: int, reason: str) -> None:
        if records:
            with self._lock:
                counts = self.sinks[sink]
                counts.spooled[reason] += records
                uploaded = min(counts.resync_credit, records)  # already uploaded from disk by the run
                counts.resync_credit -= uploaded
                counts.resynced += uploaded
                counts.stored += uploaded
            self._tell_loss("spooled", sink, reason, records, None)

    def count_resynced(self, sink: str, records: int, bytes_sent: int = 0) -> None:
        """``records`` spooled earlier are stored now: moved from ``spooled`` to ``stored``.

        Those whose spill is not counted yet wait as a credit, moved when it is.
        """
        if records:
            with self._lock:
                counts = self.sinks[sink]
                moved = min(records, counts.spooled_total)
                counts.resync_credit += records - moved
                counts.resynced += moved
                counts.stored += moved
                counts.bytes_sent += bytes_sent

    @property
    def dropped_total(self) -> int:
        with self._lock:
            return sum(self.dropped.values())

    def failed_by_sink(self) -> dict[str, int]:
        with self._lock:
            return {name: c.failed_total for name, c in self.sinks.items() if c.failed_total}

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            count = min(self._latency_count, _LATENCY_RING)
            recent = sorted(self._latencies[:count])
            p99 = recent[min(count - 1, int(count * 0.99))] if count else 0.0
            return {
                "submitted": self.submitted,
                "dropped": dict(self.dropped),
                "drop_details": dict(self.drop_details),
                "sinks": {
                    name: {
                        "stored": c.stored,
                        "failed": dict(c.failed),
                        "failure_details": dict(c.details),
                        "spooled": c.spooled_total,
                        "spooled_reasons": dict(c.spooled),
                        "resynced": c.resynced,
                        "bytes_sent": c.bytes_sent,
                    }
                    for name, c in self.sinks.items()
                },
                "submit_latency_max_s": self._latency_max,
                "submit_latency_p99_s": p99,
            }

    def unaccounted(self, sink: str) -> int:
        """``submitted - (stored + dropped + failed + spooled)`` for ``sink``: 0 when all is known."""
        with self._lock:
            c = self.sinks[sink]
            return self.submitted - (c.stored + sum(self.dropped.values()) + c.failed_total + c.spooled_total)
