"""The sink that uploads to the Traces service, where a bad record loses only itself.

The client's uploads are fail-stop and all-or-nothing per batch: one bad line
refuses its whole batch and stops the batches behind it. This sink turns that
into per-record outcomes. It reads the client's :class:`~prime_traces.UploadReport`,
counts what was stored and what failed, and uploads again only the records
that still need it, re-encoded from the caller's objects. Encoding is
deterministic, so a resent record is byte-identical. Records of a committed
batch are never sent again.

What becomes of each record of a write (checked, uploaded, rejected, isolated,
kept for later) is :class:`~prime_runs._sinks.traces_write.SinkWrite`'s; the worker
spools what is left undelivered or open to the run directory.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from prime_runs._local.spool import Spool
from prime_runs._records.ledger import Ledger
from prime_runs._records.lines import RunStamp
from prime_runs._records.sink import OnResynced, Sink, SinkStatus
from prime_runs._records.size_meter import SizeMeter
from prime_runs._sinks.outage import Outage
from prime_runs._sinks.traces_write import FailureWarnings, SinkWrite
from prime_traces.client import DEFAULT_TARGET_BATCH_BYTES, DEFAULT_UPLOAD_ATTEMPTS, MAX_BATCH_BYTES, TracesClient

logger = logging.getLogger(__name__)

DEFAULT_MAX_TRANSIENT_FAILURES = 3


class TracesSink(Sink):
    """Uploads each write to the Traces service, accounting for every record.

    ``write`` runs on one of the worker's threads. It blocks while it
    uploads, and returns promptly once ``cancel`` is set. Once it has encoded
    every record of a write it says so (``ledger.encoded()``), and the
    worker may start the next write, on another thread, while this one's
    last batches upload: two writes may be in progress at once. It reports each record at most
    once into the ledger: ``stored`` as its batch commits, ``rejected`` with
    ``invalid_record`` or ``rejected:<code>``, or ``undelivered`` (``transient``,
    ``refused:<code>``, ``deadline``) for the worker to spool to ``spool``.
    Driven by one worker. A client passed with
    ``owns_client=True`` is closed by :meth:`close`.

    Usage::

        context = {"source": "prime-runs", "run_type": "eval"}
        sink = TracesSink(TracesClient(), RunStamp("run-1", "eval"), context)
        status = sink.write(episodes, "episode", ledger, cancel)
        sink.close()
    """

    name = "traces"

    def __init__(
        self,
        client: TracesClient,
        stamp: RunStamp | None,
        context: dict[str, str] | None,
        meter: SizeMeter | None = None,
        *,
        max_attempts: int = DEFAULT_UPLOAD_ATTEMPTS,
        target_batch_bytes: int = DEFAULT_TARGET_BATCH_BYTES,
        max_transient_failures: int = DEFAULT_MAX_TRANSIENT_FAILURES,
        owns_client: bool = False,
        spool: Spool | None = None,
    ) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, not {max_attempts}")
        if not 0 < target_batch_bytes <= MAX_BATCH_BYTES:
            raise ValueError(f"target_batch_bytes must be within 1..{MAX_BATCH_BYTES}, not {target_batch_bytes}")
        if max_transient_failures < 1:
            raise ValueError(f"max_transient_failures must be at least 1, not {max_transient_failures}")
        if context is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in context.items()):
            raise ValueError("context must map strings to strings")
        self.client = client
        self.stamp = stamp
        self.context = dict(context) if context else None
        self.meter = meter
        self.max_attempts = max_attempts
        self.target_batch_bytes = target_batch_bytes
        self.max_transient_failures = max_transient_failures
        #: Where the worker keeps what this sink could not deliver (and what the service refused).
        self.spool: Spool | None = spool
        #: With a spool, an outage sends writes to disk until the service is back (then uploads them).
        self.outage = Outage(client, spool) if spool is not None else None
        self.owns_client = owns_client
        #: Rate-limits the warnings about records not delivered, across this sink's writes.
        self.warnings = FailureWarnings()

    def __repr__(self) -> str:
        return f"TracesSink(client={self.client!r}, stamp={self.stamp!r})"

    def write(self, records: Sequence[Any], line_format: str, ledger: Ledger, cancel: threading.Event) -> SinkStatus:
        """Upload ``records``, reporting each into ``ledger``; ``TRANSIENT`` is a strike."""
        return SinkWrite(self, records, line_format, ledger, cancel).run()

    def count_resynced(self, on_resynced: OnResynced) -> None:
        if self.outage is not None:
            self.outage.on_resynced = on_resynced

    def wait_for_resync(self, deadline: float | None) -> None:
        if self.outage is not None:
            self.outage.wait_for_resync(deadline)

    def stop_waiting(self) -> None:
        if self.outage is not None:
            self.outage.close()

    def stats(self) -> dict[str, Any]:
        """The client's in-flight window and refusals, and whether the service is down."""
        stats = self.client.upload_stats()
        if self.outage is not None:
            stats.update(self.outage.snapshot())
        return stats

    def close(self) -> None:
        if self.outage is not None:
            self.outage.close()
        if self.owns_client:
            self.client.close()
        if self.spool is not None:
            self.spool.close()
