"""The bounded queue between ``log_episodes`` and the upload worker.

``put`` never blocks and costs O(1) in the size of the records: it takes a
lock only for bookkeeping, and refuses a write that does not fit, by record
count (queued records), or by estimated bytes once the worker has measured
some records: every record the run holds (queued, and taken by the worker
but not yet stored, spooled or failed), each write counted at the meter's
estimate when it was queued (an estimate that follows growth at once, so
records that grow are bounded by their new size from the first the worker
sees, and the smaller ones before them keep their own size). A write always
fits when nothing is held, so no single write is refused for its size
alone. ``take`` is the worker's side: it waits on a condition, never
polls.

Past :data:`SPILL_AT_FRACTION` of either bound the queue sets :attr:`RecordQueue.pressure`:
the uploads are slower than the run logs, and a sink with a spool then keeps
its writes on disk (uploading them from there) instead of letting the queue
fill; the event clears once the run holds less than :data:`CALM_BELOW_FRACTION`.
:attr:`RecordQueue.memory_pressure` is the same mark counted in memory: the
held records' JSON times what their Python objects take per byte of it
(:mod:`~prime_runs._records.footprint`, measured by the encoder); a sink
heeds it only while the link is the limit, where disk helps.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from prime_runs._records import reasons
from prime_runs._records.size_meter import SizeMeter
from prime_traces.client import DEFAULT_TARGET_BATCH_BYTES
from prime_traces.threads import wait_slice

DEFAULT_MAX_QUEUED_RECORDS = 10_000
DEFAULT_MAX_QUEUED_BYTES = 2 * 1024**3


#: At most this many batches per upload slot in one write (see write_cap_bytes).
WRITE_BATCHES_PER_SLOT = 4
#: Writes the worker takes per hold of the queue's lock: 0.1 ms, where taking 800 in one hold took 1.2 ms,
#: and every log_episodes() call meanwhile waited for the lock, then for the GIL.
TAKE_WRITES_PER_HOLD = 64
#: Holding this share of either bound sets the queue's pressure: the sinks go to disk rather than fill it.
SPILL_AT_FRACTION = 0.5
#: ... and the pressure clears once the run holds less than this share of both.
CALM_BELOW_FRACTION = 0.25


def write_cap_bytes(max_in_flight: int, max_queued_bytes: int, batch_bytes: int = DEFAULT_TARGET_BATCH_BYTES) -> int:
    """How many estimated bytes of records one write of the worker may take.

    The worker encodes a write's next batches while its earlier ones upload,
    and the next write while the last one's final batches upload; fewer,
    larger writes still cost fewer uploads' slow ends and starts. A write's
    records count as held until the whole write is done, though, and two
    writes may be in progress at once, so the cap stays within a quarter of
    ``max_queued_bytes`` (and never under one batch per slot), leaving the
    queue at least half of it for what the run logs meanwhile.
    """
    per_slot = max_in_flight * batch_bytes
    return min(WRITE_BATCHES_PER_SLOT * per_slot, max(per_slot, max_queued_bytes // 4))


@dataclass
class Write:
    """One accepted ``submit`` call: its records, and their count when it was queued.

    ``count`` is fixed at ``put``: the queue's counters and the ledgers must
    add and subtract the same number even if ``records`` changes afterwards.
    """

    seq: int
    records: Sequence[Any]
    line_format: str
    est_bytes: float
    count: int
    #: Which call of its method (per line format, from 1) this write was, for messages.
    call: int = 0
    #: Its records' estimated bytes when it was queued (in the byte bound until done).
    held_bytes: float = 0.0


@dataclass
class DropBurst:
    """Drops since the worker last reported them (warnings are one per burst)."""

    writes: int = 0
    records: int = 0
    reasons: collections.Counter[str] = field(default_factory=collections.Counter)


class RecordQueue:
    """Writes waiting for the worker, bounded by records and estimated bytes (checked by ``WorkerSettings``)."""

    def __init__(self, max_records: int, max_bytes: int, meter: SizeMeter) -> None:
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.meter = meter
        self._cond = threading.Condition(threading.Lock())
        self._writes: collections.deque[Write] = collections.deque()
        self.queued_records = 0
        self.queued_bytes = 0.0
        #: Records the worker took and has not accounted for yet (in the byte bound too).
        self.taken_records = 0
        self._next_seq = 1
        self._taken_seq = 0
        self._done_seq = 0
        self._closed = False
        self._interrupted = False
        self.burst = DropBurst()
        self._calls: collections.Counter[str | None] = collections.Counter()
        #: The estimated bytes of the held records (each write's estimate when it was queued), and its peak.
        self.held_bytes = 0.0
        self.peak_held_bytes = 0.0
        #: Set while the run holds more than SPILL_AT_FRACTION of a bound (read by sinks with a spool).
        self.pressure = threading.Event()
        #: Set while the held records take more than SPILL_AT_FRACTION of ``max_bytes`` in memory (their
        #: JSON times the meter's expansion); a sink with a spool heeds it when the link is the limit.
        self.memory_pressure = threading.Event()

    def put(self, records: Sequence[Any], line_format: str) -> tuple[bool, str | None, int]:
        """Queue a write; ``(False, reason, call)`` when it does not fit (never waits).

        ``call`` numbers the calls of each line format from 1, accepted or not.
        The byte bound covers every record the run holds: queued, and taken
        by the worker but not yet accounted for, each write at the meter's
        estimate when it was queued.
        """
        count = len(records)
        size = self.meter.estimate_bytes
        est = count * self.meter.mean_bytes
        with self._cond:
            self._calls[line_format] += 1
            call = self._calls[line_format]
            held = self.queued_records + self.taken_records
            if self._closed:
                reason = reasons.CLOSED
            elif self._writes and self.queued_records + count > self.max_records:
                reason = reasons.QUEUE_FULL_RECORDS
            elif held and self.held_bytes + count * size > self.max_bytes:
                reason = reasons.QUEUE_FULL_BYTES
            else:
                self._writes.append(Write(self._next_seq, records, line_format, est, count, call, count * size))
                self._next_seq += 1
                self.queued_records += count
                self.queued_bytes += est
                self.held_bytes += count * size
                self.peak_held_bytes = max(self.peak_held_bytes, self.held_bytes)
                if self._over(held + count, SPILL_AT_FRACTION):
                    self.pressure.set()
                if self._over_in_memory(SPILL_AT_FRACTION):
                    self.memory_pressure.set()
                # All: flush() and close() wait on this condition too, and must not take the worker's wake-up.
                self._cond.notify_all()
                return True, None, call
            self.burst.writes += 1
            self.burst.records += count
            self.burst.reasons[reason] += count
            return False, reason, call

    def take(
        self,
        max_bytes: float,
        timeout_s: float | None,
        on_take: Callable[[list[Write]], None] | None = None,
        stop_waiting: Callable[[], bool] | None = None,
    ) -> list[Write]:
        """Up to ``max_bytes`` (estimated) of writes, at least one; [] on timeout, close or :meth:`wake`.

        ``stop_waiting`` is asked under the queue's lock before it waits:
        when it says so, [] at once (what it reads is set before ``wake``).

        The writes are taken ``TAKE_WRITES_PER_HOLD`` at a time, the lock let
        go between: a caller's ``put`` never waits for more than that many.
        ``on_take`` runs under the queue's lock for each such part, so whatever
        it registers is visible to :meth:`close` (nothing taken is ever in limbo).
        """
        taken: list[Write] = []
        size = 0.0
        with self._cond:
            if not self._writes and not self._closed and not (stop_waiting is not None and stop_waiting()):
                self._cond.wait(timeout_s)
        while True:
            with self._cond:
                part: list[Write] = []
                while (
                    self._writes
                    and len(part) < TAKE_WRITES_PER_HOLD
                    and (not taken and not part or size + self._writes[0].est_bytes <= max_bytes)
                ):
                    write = self._writes.popleft()
                    size += write.est_bytes
                    self.queued_records -= write.count
                    self.queued_bytes -= write.est_bytes
                    self.taken_records += write.count
                    part.append(write)
                    self._taken_seq = write.seq
                if not self._writes:
                    self.queued_bytes = 0.0  # no drift from re-estimated sizes
                if part and on_take is not None:
                    on_take(part)
                taken += part
                if len(part) < TAKE_WRITES_PER_HOLD:
                    return taken

    def done(self, writes: list[Write]) -> None:
        """Mark writes finished (accounted for); wakes ``wait_done``."""
        if not writes:
            return
        records = sum(w.count for w in writes)  # outside the lock: a caller's put() may be waiting for it
        size = sum(w.held_bytes for w in writes)
        with self._cond:
            self._done_seq = max(self._done_seq, writes[-1].seq)
            self.taken_records = max(0, self.taken_records - records)
            self._release(size)
            self._calm_down()
            self._cond.notify_all()

    def _over(self, held: int, fraction: float) -> bool:
        return held >= self.max_records * fraction or self.held_bytes >= self.max_bytes * fraction

    def _over_in_memory(self, fraction: float) -> bool:
        # The held records' JSON times what their objects take per byte of it (as last measured).
        return self.held_bytes * self.meter.expansion >= self.max_bytes * fraction

    def _release(self, size: float) -> None:
        # Under the lock. Nothing held is nothing held: no drift from floating-point sums.
        nothing = not self.queued_records and not self.taken_records
        self.held_bytes = 0.0 if nothing else max(0.0, self.held_bytes - size)

    def _calm_down(self) -> None:
        # Under the lock.
        if self.pressure.is_set():
            held = self.queued_records + self.taken_records
            if not self._over(held, CALM_BELOW_FRACTION):
                self.pressure.clear()
        if self.memory_pressure.is_set() and not self._over_in_memory(CALM_BELOW_FRACTION):
            self.memory_pressure.clear()

    def wake(self) -> None:
        """End a ``take`` waiting for writes now (it returns [] if none came)."""
        with self._cond:
            self._cond.notify_all()

    def last_seq(self) -> int:
        with self._cond:
            return self._next_seq - 1

    def taken_seq(self) -> int:
        """The last write the worker took (later ones are still queued, or were handed back by close)."""
        with self._cond:
            return self._taken_seq

    def wait_done(self, seq: int, deadline: float | None, *, interruptible: bool = True) -> bool:
        """Wait until every write up to ``seq`` is done, or ``deadline`` (monotonic), or ``interrupt``."""
        with self._cond:
            while self._done_seq < seq:
                if self._interrupted and interruptible:
                    return False
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(wait_slice(remaining))
            return True

    def interrupt(self) -> None:
        """End every ``wait_done`` now, and later ones at once (the user stopped waiting)."""
        with self._cond:
            self._interrupted = True
            self._cond.notify_all()

    def refuse(self) -> None:
        """Refuse new writes from now on; the queued ones stay for the worker to take."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def close(self, on_close: Callable[[], None] | None = None) -> list[Write]:
        """Refuse new writes; return (and remove) every write still queued.

        ``on_close`` runs under the queue's lock (see :meth:`take`).
        """
        with self._cond:
            self._closed = True
            if on_close is not None:
                on_close()
            left = list(self._writes)
            self._writes.clear()
            self.queued_records = 0
            self.queued_bytes = 0.0
            self._cond.notify_all()
            return left

    def mark_all_done(self) -> None:
        """Every write so far is accounted for (used once the queue is closed)."""
        with self._cond:
            self._done_seq = self._next_seq - 1
            self.taken_records = 0
            self._release(0.0)
            self._calm_down()
            self._cond.notify_all()

    def take_burst(self) -> DropBurst | None:
        with self._cond:
            if not self.burst.writes:
                return None
            burst, self.burst = self.burst, DropBurst()
            return burst

    @property
    def closed(self) -> bool:
        return self._closed
