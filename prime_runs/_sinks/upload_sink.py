"""What one write of the Traces sink needs of its sink, and the sink's warnings about records not delivered.

:class:`~prime_runs._sinks.traces_write.SinkWrite` uploads a write's records
and settles each; it reads its sink's client and knobs, its outage and
backlog state, and reports to it, through :class:`UploadSink` (which
:class:`~prime_runs._sinks.traces.TracesSink` is). What a write could not
deliver is told through the sink's :class:`FailureWarnings`: one warning a
minute, however many writes fail in it.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from prime_runs._records.ledger import Ledger
    from prime_runs._records.lines import RunStamp
    from prime_runs._records.sink import SinkStatus
    from prime_runs._records.size_meter import SizeMeter
    from prime_runs._sinks.link_gauge import Behind, LinkGauge
    from prime_runs._sinks.outage import Outage
    from prime_traces.client import TracesClient

logger = logging.getLogger(__name__)

#: At most one warning about records not stored per this many seconds; the rest go to debug.
WARNING_INTERVAL_S = 60.0


class FailureWarnings:
    """At most one warning about records not delivered per ``interval_s``; the rest go to debug.

    One warning per write would flood a long run that logs a bad record every step.
    """

    def __init__(self, interval_s: float = WARNING_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._warned_at: float | None = None
        self._suppressed = 0

    def warn(self, records: int, failures: collections.Counter[str], sample: str | None) -> None:
        now = time.monotonic()
        if self._warned_at is not None and now - self._warned_at < self.interval_s:
            self._suppressed += 1
            level = logging.DEBUG
        else:
            level = logging.WARNING
        if not logger.isEnabledFor(level):
            return
        suppressed = ""
        if level == logging.WARNING:
            self._warned_at = now
            if self._suppressed:
                suppressed = f" ({self._suppressed} similar writes since the last warning)"
                self._suppressed = 0
        why = ", ".join(f"{r}: {n}" for r, n in failures.items())
        first = f"; first: {sample}" if sample else ""
        logger.log(
            level,
            "traces sink: %d of %d records not delivered (%s)%s%s",
            sum(failures.values()),
            records,
            why,
            first,
            suppressed,
        )


class UploadSink(Protocol):
    """What a write needs of its sink (:class:`~prime_runs._sinks.traces.TracesSink`)."""

    client: TracesClient
    stamp: RunStamp | None
    context: dict[str, str] | None
    meter: SizeMeter | None
    max_attempts: int
    target_batch_bytes: int
    max_transient_failures: int
    outage: Outage | None
    #: Set while uploads are slower than the run logs (the worker's queue pressure); None without a spool.
    behind: Behind | None
    link: LinkGauge
    #: Set by a write refused for good.
    permanent_refusal: str | None
    warnings: FailureWarnings

    def committed(self, indexes: Sequence[int], records: Sequence[Any], line_format: str) -> None: ...

    def route_to_legacy(self) -> bool: ...

    def write_legacy(self, records: Sequence[Any], indexes: Sequence[int], ledger: Ledger) -> SinkStatus: ...
