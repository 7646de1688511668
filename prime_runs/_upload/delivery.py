"""What becomes of one group of records at the sinks: stored, spooled, set aside, or counted as lost.

The upload worker owns the queue and the thread; this owns the policy toward
the sinks. Each group goes to every sink that is not retired; what a sink
leaves undelivered goes to its spool (if it has one) and what it refuses for
the records' own fault is set aside there, so that every record of the group
ends in exactly one of the ledger's outcomes. A sink retires on a
``PERMANENT`` refusal or, without a spool, after ``STRIKES_TO_RETIRE``
transient failures in a row.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from prime_runs._records import reasons
from prime_runs._records.ledger import Ledger, Origins
from prime_runs._records.sink import Sink, SinkStatus
from prime_runs._upload.queue import Write
from prime_runs.errors import SinkError

logger = logging.getLogger(__name__)

STRIKES_TO_RETIRE = 3


@dataclass
class Group:
    """Consecutive writes of one line format, handed to the sinks together (keyed by the first's seq)."""

    key: int
    records: list[Any]
    line_format: str
    count: int
    origins: Origins

    def add(self, write: Write) -> None:
        self.origins.add(self.count, write.line_format, write.call)
        self.records.extend(write.records)  # submit()'s own copy: exactly ``count`` records
        write.records = ()  # the group holds them now, and its last sink lets go of each as it settles
        self.count += write.count

    @classmethod
    def of(cls, writes: list[Write]) -> list[Group]:
        """Consecutive writes of one line format as one group: many small calls still fill batches."""
        groups: list[Group] = []
        for write in writes:
            if not (groups and groups[-1].line_format == write.line_format):
                groups.append(cls(write.seq, [], write.line_format, 0, Origins()))
            groups[-1].add(write)
        return groups


class Delivery:
    """Hands groups of records to the sinks and settles each record's outcome (worker threads only).

    ``cancel`` is set (:meth:`cancel_all`) when ``close()`` gives up waiting;
    from then on nothing is written, and what is left is spooled until
    ``spill_deadline``. :meth:`halt` does the same for one sink: finishing on
    a signal, an uploading sink's records go to its spool at once.
    """

    def __init__(self, sinks: Sequence[Sink], on_error: Callable[[SinkError], Any] | None) -> None:
        self.sinks = list(sinks)
        self.on_error = on_error
        self.cancel = threading.Event()
        # Each sink's own: set by cancel_all(), or for that sink alone by halt().
        self._cancels = {s.name: threading.Event() for s in self.sinks}
        self.spill_deadline: float | None = None
        self.retired: set[str] = set()
        self._strikes = {s.name: 0 for s in self.sinks}
        self._spool_noted: set[str] = set()
        # Two writes may end at once (see prime_runs._upload.lanes): strikes, retirements and notes change under it.
        self._lock = threading.Lock()

    def cancel_all(self) -> None:
        """The deadline: every sink stops writing; what is left is spooled until ``spill_deadline``."""
        self.cancel.set()
        for event in self._cancels.values():
            event.set()

    def halt(self, sink: Sink) -> None:
        """``sink`` stops writing now (what it holds is abandoned and spooled), and is handed nothing more."""
        self._cancels[sink.name].set()

    def deliver(self, records: Sequence[Any], line_format: str, ledgers: Sequence[Ledger]) -> None:
        """Write ``records`` to every sink (one ledger each), then keep or count what is left."""
        for sink, ledger in zip(self.sinks, ledgers):
            status = None
            cancel = self._cancels[sink.name]
            if sink.name in self.retired:
                reason = reasons.SINK_RETIRED
            elif cancel.is_set():
                reason = reasons.DEADLINE
            else:
                try:
                    status = sink.write(records, line_format, ledger, cancel)
                except Exception as err:  # a broken sink loses its write, not the worker
                    logger.warning("sink %s failed on a write of %d records", sink.name, len(records), exc_info=True)
                    ledger.undelivered(range(len(records)), reasons.crash(reasons.SINK_ERROR, err))
                    status = SinkStatus.TRANSIENT
                reason = reasons.DEADLINE if cancel.is_set() else reasons.SINK_INCOMPLETE
            self.keep(sink, records, line_format, ledger, reason)
            if status is not None:
                self._after_write(sink, ledger, status)

    def keep(self, sink: Sink, records: Sequence[Any], line_format: str, ledger: Ledger, reason: str) -> None:
        """Spool what ``sink`` left undelivered (open records as ``reason``), set aside what it refused."""
        spool = sink.spool
        if spool is None:
            ledger.close(reason)
            return
        groups = ledger.take_undelivered(reason)
        lost = reasons.SPILL_TIMEOUT
        if groups:
            spooled = 0
            try:
                spooled = spool.spill(records, line_format, ledger, groups, self.spill_deadline)
            except Exception as err:  # a failed spill loses those records, never the worker
                logger.warning(
                    "spooling %d records to %s failed",
                    sum(len(g.indexes) for g in groups),
                    spool.directory,
                    exc_info=True,
                )
                lost = reasons.crash(reasons.SPOOL_ERROR, err)
            if spooled:
                sink.spilled()
            with self._lock:
                first = bool(spooled) and sink.name not in self._spool_noted
                if first:
                    self._spool_noted.add(sink.name)
            if first:
                why = ", ".join(sorted({g.reason for g in groups}))
                logger.warning(
                    "%s sink: records not delivered (%s) are kept in %s; `prime-runs sync %s` uploads them",
                    sink.name,
                    why,
                    spool.directory,
                    spool.directory,
                )
        else:
            spool.keep_rejected(records, line_format, ledger)
        ledger.close(lost, keep_reasons=False)

    def _after_write(self, sink: Sink, ledger: Ledger, status: SinkStatus) -> None:
        with self._lock:
            retired_now = self._count(sink, status)
        if retired_now and status is SinkStatus.PERMANENT:
            kept = "kept on disk for `prime-runs sync`" if sink.spool is not None else "counted as failed"
            why = sink.permanent_refusal or ", ".join(sorted(ledger.failures)) or "refused"
            logger.error(
                "sink %s was refused in a way no later request can get past (%s): it is retired for the "
                "rest of the run, and its records are %s (%s)",
                sink.name,
                why,
                kept,
                reasons.SINK_RETIRED,
            )
        elif retired_now:
            logger.error(
                "sink %s failed %d writes in a row and is retired for the rest of the run; "
                "its records are counted as failed (%s)",
                sink.name,
                STRIKES_TO_RETIRE,
                reasons.SINK_RETIRED,
            )
        if ledger.failures:
            self.report_failures({sink.name: dict(ledger.failures)}, ledger)

    def _count(self, sink: Sink, status: SinkStatus) -> bool:
        """Count a write's outcome toward retirement (under the lock); whether the sink retires now."""
        if sink.name in self.retired:
            return False
        if status is SinkStatus.PERMANENT:
            self.retired.add(sink.name)
            return True
        if status is SinkStatus.TRANSIENT and sink.spool is None:
            # With a spool nothing is lost by going on (an outage waits on disk): only a sink without
            # one is retired after failing writes in a row (in the order they end), to stop spending requests.
            self._strikes[sink.name] += 1
            if self._strikes[sink.name] >= STRIKES_TO_RETIRE:
                self.retired.add(sink.name)
                return True
            return False
        self._strikes[sink.name] = 0
        return False

    def report_failures(self, failures: dict[str, dict[str, int]], ledger: Ledger | None = None) -> None:
        """Tell ``on_error`` about records that failed, one ``SinkError`` per sink; it may not raise into us."""
        if self.on_error is None:
            return
        for sink, counts in failures.items():
            try:
                self.on_error(SinkError(sink, counts, ledger.first_detail if ledger is not None else None))
            except Exception:
                logger.warning("on_error callback failed", exc_info=True)
