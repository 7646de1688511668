"""The estimate of a record's encoded size that bounds the run's memory.

The worker's encoder feeds it as it measures records; the record queue reads
it in ``put`` to turn a count of held records into bytes. It sits apart from
both so that neither stage imports the other for it.
"""

from __future__ import annotations

import time


class SizeMeter:
    """An estimate of the encoded size of the run's next records, fed by the worker, read by ``put``.

    It reacts to growth at once (a record larger than the estimate becomes
    the estimate) and decays toward smaller sizes by ``DECAY`` per record, so
    a run whose records grow tenfold is bounded by their new size from the
    first one the worker sees, and one outlier does not shrink the queue for
    long. ``mean_bytes`` is the plain running mean, for reports. The
    threads encoding a write's first pass (for the upload, or for the disk
    when the uploads are behind) write it, at most two at once; a float read
    is atomic under the GIL, and an update lost between two writers only
    delays the estimate by one record, so it needs no lock (and a fork can
    never catch one held). ``expansion`` is what the records' Python objects
    take per byte of their JSON, measured now and then
    (:mod:`~prime_runs._records.footprint`).
    """

    DECAY = 0.1
    #: The encoder measures one record's memory (footprint.expansion) at most this often.
    EXPANSION_EVERY_S = 0.2
    #: ... and the expansion decays toward a smaller measurement by this much per measurement.
    EXPANSION_DECAY = 0.25

    def __init__(self) -> None:
        self.mean_bytes = 0.0
        self.estimate_bytes = 0.0
        self._count = 0
        #: Bytes of Python objects per byte of JSON in the records logged lately (1.0 until measured).
        self.expansion = 1.0
        self._expansion_measured = False
        self._expansion_due = 0.0

    def expansion_due(self) -> bool:
        """Whether the encoder should measure the next record's memory (:mod:`~prime_runs._records.footprint`)."""
        return time.monotonic() >= self._expansion_due

    def observe_expansion(self, ratio: float) -> None:
        """A record's objects took ``ratio`` times its JSON: a larger one counts at once, a smaller one decays in."""
        self._expansion_due = time.monotonic() + self.EXPANSION_EVERY_S
        if not self._expansion_measured:
            self._expansion_measured = True
            self.expansion = ratio
            return
        decayed = self.expansion + (ratio - self.expansion) * self.EXPANSION_DECAY
        self.expansion = max(ratio, decayed)

    @property
    def observed(self) -> int:
        """How many records it has measured."""
        return self._count

    def observe(self, size_bytes: int) -> None:
        self._count += 1
        self.mean_bytes += (size_bytes - self.mean_bytes) / self._count
        decayed = self.estimate_bytes + (size_bytes - self.estimate_bytes) * self.DECAY
        self.estimate_bytes = max(float(size_bytes), decayed)
