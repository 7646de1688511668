"""What a sink is, and the ledger through which it accounts for a write.

A sink stores the records of one write somewhere (the Traces service, a
local directory) and reports, record by record, what became of them into a
:class:`Ledger`. The ledger is what makes the accounting identity hold even
at the deadline: once the worker gives up on a write, it closes the ledger,
the records not yet accounted for are counted with the closing reason, and
anything the sink reports later is ignored.
"""

from __future__ import annotations

import enum
import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any, Protocol

from prime_runs._accounting import Accounting


class SinkStatus(str, enum.Enum):
    """How a write went for a sink, as far as retiring the sink is concerned."""

    OK = "ok"  # stored, or lost only to the records' own faults
    TRANSIENT = "transient"  # the service failed (after retries): a strike


class Ledger:
    """Per write and sink: counts ``stored`` and ``failed`` until closed. Thread-safe."""

    def __init__(self, accounting: Accounting, sink: str, records: int) -> None:
        self._accounting = accounting
        self.sink = sink
        self.remaining = records
        #: What this write lost in this sink, by reason (for error reporting).
        self.failures: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._closed = False

    def _take(self, records: int) -> int:
        with self._lock:
            if self._closed:
                return 0
            records = min(records, self.remaining)
            self.remaining -= records
            return records

    def stored(self, records: int, bytes_sent: int = 0) -> None:
        taken = self._take(records)
        if taken:
            self._accounting.count_stored(self.sink, taken, bytes_sent)

    def failed(self, records: int, reason: str) -> None:
        taken = self._take(records)
        if taken:
            self.failures[reason] += taken
            self._accounting.count_failed(self.sink, taken, reason)

    def spooled(self, records: int) -> None:
        taken = self._take(records)
        if taken:
            self._accounting.count_spooled(self.sink, taken)

    def close(self, reason: str) -> int:
        """Count every record not yet accounted for as failed with ``reason``; ignore later reports."""
        with self._lock:
            if self._closed:
                return 0
            self._closed = True
            left, self.remaining = self.remaining, 0
            if left:
                self.failures[reason] += left
        self._accounting.count_failed(self.sink, left, reason)
        return left

    @property
    def closed(self) -> bool:
        return self._closed


class Sink(Protocol):
    """Where records go. ``write`` runs on the worker thread only."""

    name: str

    def write(
        self,
        records: Sequence[Any],
        line_format: str,
        ledger: Ledger,
        cancel: threading.Event,
    ) -> SinkStatus:
        """Store ``records``, reporting each one into ``ledger``.

        Must return promptly once ``cancel`` is set (the deadline has come);
        records it could not store by then are left for the ledger to close.
        """
        ...

    def close(self) -> None:
        """Release what the sink holds (connections, files). Must not block for long."""
        ...
