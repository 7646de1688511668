"""The estimates of a record's size that bound the run's memory: encoded, and held in memory.

The worker's encoder feeds it as it measures records; the record queue reads
it in ``put`` to turn a count of held records into bytes. It sits apart from
both so that neither stage imports the other for it.
"""

from __future__ import annotations

from typing import Any

from prime_runs._records.held_size import held_bytes

#: Records from this size on are "large": each class keeps its own ratio of memory to JSON.
LARGE_FROM_BYTES = 4096
#: One record in this many of each class is measured in memory, and every record larger than the
#: estimate (growth is bounded from its first record); the others are taken at their class's ratio.
MEASURE_EVERY = 8
#: Memory per JSON byte assumed until a record of the class is measured (one is, at once).
RATIO_AT_START = 4.0


class SizeMeter:
    """Estimates of the size of the run's next records, fed by the worker, read by ``put``.

    ``estimate_bytes`` is a record's encoded (JSON) size and ``held_bytes``
    the memory a queued record holds as the caller's Python objects (1.2
    times its JSON for long strings, 2.8 for generated episodes, 3.7 for
    lists of floats, 5.4 for token ids: see ``held_size``, measured on one
    record in ``MEASURE_EVERY`` and on each larger than any before it);
    the queue's byte bound counts
    ``held_bytes``, so it is the memory the run really holds.

    Each reacts to growth at once (a record larger than the estimate becomes
    the estimate) and decays toward smaller sizes by ``DECAY`` per record, so
    a run whose records grow tenfold is bounded by their new size from the
    first one the worker sees, and one outlier does not shrink the queue for
    long. ``mean_bytes`` is the plain running mean of the encoded sizes, for
    reports. Only the thread encoding a write's first pass writes it (one at
    a time: the next write starts once the last one's first pass ended), and
    a float read is atomic under the GIL, so it needs no lock (and a fork can
    never catch one held).
    """

    DECAY = 0.1

    def __init__(self) -> None:
        self.mean_bytes = 0.0
        self.estimate_bytes = 0.0
        self.held_bytes = 0.0
        #: Memory per JSON byte last measured, for small and for large records.
        self.ratios = [RATIO_AT_START, RATIO_AT_START]
        self._count = 0
        self._count_at_check = 0
        self._seen = [0, 0]

    def observe(self, size_bytes: int, record: Any = None) -> None:
        """Learn one record: its encoded size, and (when given) the object it was encoded from."""
        grew = size_bytes > self.estimate_bytes
        self._count += 1
        self.mean_bytes += (size_bytes - self.mean_bytes) / self._count
        self.estimate_bytes = self._next(self.estimate_bytes, size_bytes)
        if record is None:
            held = float(size_bytes)
        else:
            large = int(size_bytes >= LARGE_FROM_BYTES)
            self._seen[large] += 1
            if grew or self._seen[large] % MEASURE_EVERY == 1:
                held = float(held_bytes(record))
                self.ratios[large] = held / max(1, size_bytes)
            else:
                held = size_bytes * self.ratios[large]
        self.held_bytes = self._next(self.held_bytes, max(held, float(size_bytes)))

    def lagging(self) -> bool:
        """Whether no record was observed since the last call that said so (or ever): the encoder lags."""
        seen = self._count
        lagging = seen == self._count_at_check
        self._count_at_check = seen
        return lagging

    def observe_held(self, record: Any) -> None:
        """Learn the memory ``record`` holds before it is encoded (a caller's ``put`` while the encoder lags).

        A race with the worker's ``observe`` can only lose one update, which
        the next measurement corrects; the estimate never falls here.
        """
        self.held_bytes = max(self.held_bytes, float(held_bytes(record)))

    def _next(self, estimate: float, size: float) -> float:
        return max(float(size), estimate + (size - estimate) * self.DECAY)
