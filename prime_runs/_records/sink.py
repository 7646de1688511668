"""The sink contract: everything the upload worker and ``finish()`` use of a sink, declared in one place.

A sink stores the records of one write somewhere (the Traces service, a run
directory) and reports what became of each into the write's
:class:`~prime_runs._records.ledger.Ledger`. What it could not deliver, and
what was refused for its own fault, goes to its :attr:`Sink.spool` when it
has one; without one, those records are counted as failed. Every member the
worker calls has a default here, so a sink overrides only what it does.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from prime_runs._records.ledger import Ledger, Undelivered

#: Told ``(records, bytes)`` as a sink uploads later what it had spooled.
OnResynced = Callable[[int, int], Any]


class SinkStatus(str, enum.Enum):
    """How a write went for a sink, as far as retiring the sink is concerned."""

    OK = "ok"  # stored, or lost only to the records' own faults
    TRANSIENT = "transient"  # the service failed (after retries): a strike
    PERMANENT = "permanent"  # refused in a way no later request gets past (401/402/403/404): retire now


class Keeper(Protocol):
    """Where a sink's undelivered and refused records are kept: the run directory's spool."""

    directory: str

    def spill(
        self,
        records: Sequence[Any],
        line_format: str,
        ledger: Ledger,
        groups: Sequence[Undelivered],
        deadline: float | None,
    ) -> int:
        """Write the ``groups`` of ``records`` to disk by ``deadline``; how many were kept."""
        ...

    def keep_rejected(self, records: Sequence[Any], line_format: str, ledger: Ledger) -> None:
        """Keep the records the ledger says were refused for their own fault, with the reason."""
        ...


class Sink:
    """Where records go. ``write`` runs on the worker's threads; the rest may be called from any thread.

    One write at a time per sink, unless the sink calls ``ledger.encoded()``
    (see :attr:`Ledger.on_encoded`): the worker may then hand it the next
    write while the last one still waits for its uploads.

    Usage::

        class PrintSink(Sink):
            name = "print"

            def write(self, records, line_format, ledger, cancel):
                print(*records)
                ledger.stored(range(len(records)))
                return SinkStatus.OK
    """

    #: Unique among a run's sinks; names its counters in ``run.stats()``.
    name: str = "sink"
    #: Keeps what the sink could not deliver, and what was refused (None: those records are failed).
    spool: Keeper | None = None
    #: Why the sink was refused for good, once a write returned ``PERMANENT``.
    permanent_refusal: str | None = None

    def write(self, records: Sequence[Any], line_format: str, ledger: Ledger, cancel: threading.Event) -> SinkStatus:
        """Store ``records``, reporting each one (by its index) into ``ledger``.

        Must return promptly once ``cancel`` is set (the deadline has come);
        records it could not store by then are left for the worker to spool.
        """
        raise NotImplementedError

    def watch_pressure(self, pressure: threading.Event, memory: threading.Event | None = None) -> None:
        """Learn the worker's queue pressure: set while uploads are slower than the run logs.

        A sink with a spool may then keep writes on disk (and upload them from
        there) rather than let the queue fill and drop; the default ignores it.
        ``memory`` is the same mark counted in the records' memory, for a sink
        that can tell when its uploads are the limit.
        """

    def spill_first(self) -> bool:
        """Finishing on a signal: whether this sink's records should go to its spool now, not upload.

        A sink that uploads says True (and then uploads from the spool); the
        default, a sink that writes to disk itself, says False and goes on.
        """
        return False

    def spilled(self) -> None:
        """The worker just wrote records of this sink to its spool (a sink that uploads them later starts now)."""

    def count_resynced(self, on_resynced: OnResynced) -> None:
        """Tell ``on_resynced`` what the sink uploads later from its spool (the worker counts it stored)."""

    def wait_for_resync(self, deadline: float | None) -> None:
        """At ``finish()``: upload what was spooled (an outage, a backlog), until ``deadline`` (monotonic)."""

    def stop_waiting(self) -> None:
        """Stop anything that waits for the service (a probe, a resync); never blocks."""

    def stats(self) -> dict[str, Any]:
        """The sink's own figures, added to its counters in ``run.stats()``."""
        return {}

    def close(self) -> None:
        """Release what the sink holds (connections, files). Must not block for long."""
