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
from collections.abc import Mapping, Sequence
from typing import Any

from prime_runs._local.spool import Spool
from prime_runs._records.ledger import Ledger
from prime_runs._records.lines import RunStamp
from prime_runs._records.sink import OnResynced, Sink, SinkStatus
from prime_runs._records.size_meter import SizeMeter
from prime_runs._sinks.legacy import LegacySamples
from prime_runs._sinks.link_gauge import Behind, LinkGauge
from prime_runs._sinks.outage import Outage
from prime_runs._sinks.traces_write import SinkWrite
from prime_runs._sinks.upload_sink import FailureWarnings
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
        legacy: LegacySamples | None = None,
        opted_out: bool = False,
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
        #: With a spool, an outage or a backlog sends writes to disk, and they are uploaded from there.
        self.outage = Outage(client, spool) if spool is not None else None
        if self.outage is not None:
            self.outage.on_episodes = self._count_episodes
        #: Whether the encoder waits for the uploads (read by ``behind``).
        self.link = LinkGauge()
        #: Set while uploads are slower than the run logs (the worker's queue pressure), once watched.
        self.behind: Behind | None = None
        self.owns_client = owns_client
        #: Rate-limits the warnings about records not delivered, across this sink's writes.
        self.warnings = FailureWarnings()
        #: The platform's legacy sample tables, for an account without Prime Traces (``traces_opt_out`` too).
        self.legacy = legacy
        self._lock = threading.Lock()
        self._committed = False
        #: Records of this run the service stored: episodes with members (an evaluation's completion count).
        self.episodes_written = 0
        self.routed_to_legacy = False
        if opted_out:
            if legacy is None:
                raise ValueError("opted_out needs the legacy tables to write to")
            self.routed_to_legacy = True
            logger.info("traces sink: opted out of Prime Traces; records go to the legacy sample tables")

    def __repr__(self) -> str:
        return f"TracesSink(client={self.client!r}, stamp={self.stamp!r})"

    def write(self, records: Sequence[Any], line_format: str, ledger: Ledger, cancel: threading.Event) -> SinkStatus:
        """Upload ``records``, reporting each into ``ledger``; ``TRANSIENT`` is a strike."""
        if self.routed_to_legacy:
            return self.write_legacy(records, range(len(records)), ledger)
        return SinkWrite(self, records, line_format, ledger, cancel).run()

    def committed(self, indexes: Sequence[int], records: Sequence[Any], line_format: str) -> None:
        """A batch of the run's records was stored (a write tells it as each batch commits)."""
        episodes = 0
        if line_format == "episode":
            episodes = sum(1 for index in indexes if _has_members(records[index]))
        with self._lock:
            self._committed = True
            self.episodes_written += episodes

    def route_to_legacy(self) -> bool:
        """The account has no Prime Traces: route this and every later write to the legacy tables.

        Only before anything of the run was stored there, and only with legacy
        tables to write to; False otherwise (the refusal is then the sink's).
        """
        with self._lock:
            if self.legacy is None or self._committed:
                return False
            first = not self.routed_to_legacy
            self.routed_to_legacy = True
        if first:
            logger.info("traces sink: Prime Traces is not enabled for this account; records go to the legacy tables")
        return True

    def write_legacy(self, records: Sequence[Any], indexes: Sequence[int], ledger: Ledger) -> SinkStatus:
        assert self.legacy is not None
        return self.legacy.write(records, indexes, ledger)

    def _count_episodes(self, episodes: int) -> None:
        with self._lock:
            self._committed = True
            self.episodes_written += episodes

    def watch_pressure(self, pressure: threading.Event, memory: threading.Event | None = None) -> None:
        # Also called in a forked child (the worker's setup): a fresh gauge, whose lock no parent thread holds.
        self.link = LinkGauge()
        if self.outage is not None:
            self.behind = Behind(pressure, memory, self.link)

    def spilled(self) -> None:
        if self.outage is not None:
            self.outage.spilled()

    def spill_first(self) -> bool:
        if self.outage is None:
            return False
        self.outage.fall_behind("the run is finishing on a signal", finishing=True)  # the drain gets every slot
        return True

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
        """The client's in-flight window and refusals, whether the service is down, where records go."""
        stats = self.client.upload_stats()
        stats["episodes_written"] = self.episodes_written
        stats["routed"] = "legacy_samples" if self.routed_to_legacy else "traces"
        if self.outage is not None:
            stats.update(self.outage.snapshot())
        if self.spool is not None:
            stats.update(self.spool.files.disk_stats())
        return stats

    def close(self) -> None:
        if self.outage is not None:
            self.outage.close()
        if self.owns_client:
            self.client.close()
        if self.spool is not None:
            self.spool.close()


def _has_members(record: Any) -> bool:
    members = record.get("traces") if isinstance(record, Mapping) else getattr(record, "traces", None)
    return bool(members)
