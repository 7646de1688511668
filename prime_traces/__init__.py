"""Client for the Prime Traces service, and a local Traces service.

    from prime_traces import TracesClient

    with TracesClient() as client:                  # PRIME_API_KEY, PRIME_TRACES_URL
        client.upload_records(episodes)             # concurrent, ordered, fail-stop
        for trace in client.iter(run_id="run-1"):   # TraceSummary models
            print(trace.trace_id, trace.score.reward)

The public API is what ``__all__`` lists: the client, its errors (all in
:mod:`prime_traces.errors`, under :class:`PrimeTracesError`), the models its
reads return, :class:`LineFormat`, and :class:`LocalTracesService`, the local
service that speaks the same wire contract (``prime-traces serve``; imported
on first use). Public modules without a leading underscore serve code built
on the client: :mod:`~prime_traces.encoding` (records to lines and the line
rules), :mod:`~prime_traces.config` (where settings come from),
:mod:`~prime_traces.threads` (daemon threads, fork safety),
:mod:`~prime_traces.report` (what became of every line) and
:mod:`~prime_traces.cli_output`. Tuning constants stay in their modules.
"""

from __future__ import annotations

import logging
import warnings
from typing import TYPE_CHECKING, Any

from prime_traces._api.models import (
    EpisodeDetail,
    EpisodeError,
    EpisodeListPage,
    EpisodeSummary,
    EpisodeTraceAggregate,
    Execution,
    MetricRow,
    MetricsPage,
    ModelInfo,
    RunListPage,
    RunStep,
    RunStepList,
    RunSummary,
    Score,
    TraceListPage,
    TraceSummary,
    UploadReceipt,
)
from prime_traces._upload.batching import Batch
from prime_traces.client import TracesClient
from prime_traces.encoding import LineFormat
from prime_traces.errors import (
    AmbiguousDeleteError,
    APIError,
    APITimeoutError,
    ErrorCode,
    ForbiddenError,
    LineFormatConflictError,
    NotFoundError,
    PaymentRequiredError,
    PrimeTracesError,
    ResponseFormatError,
    RetryableAPIError,
    RunFinishedError,
    TraceTooLargeError,
    TransportError,
    UnauthorizedError,
    UploadError,
    ValidationRejectedError,
)
from prime_traces.report import BatchOutcome, BatchStatus, LineStatus, UploadReport
from prime_traces.version import __version__

if TYPE_CHECKING:
    from prime_traces.server import LocalTracesService

logging.getLogger(__name__).addHandler(logging.NullHandler())


# Top-level names of earlier releases, kept for one more release with a DeprecationWarning: where each lives now.
_MOVED = {
    "DEFAULT_MAX_IN_FLIGHT": "prime_traces.client",
    "DEFAULT_TARGET_BATCH_BYTES": "prime_traces.client",
    "MAX_BATCH_BYTES": "prime_traces.client",
    "MAX_BATCH_LINES": "prime_traces.client",
    "MAX_LINE_BYTES": "prime_traces.encoding",
    "GZIP_LEVEL": "prime_traces._upload.compress",  # an internal setting: no public home
}


def __getattr__(name: str) -> Any:
    # The local service (SQLite, the HTTP server) loads only when asked for: a client never pays for it.
    if name == "LocalTracesService":
        from prime_traces.server import LocalTracesService

        return LocalTracesService
    home = _MOVED.get(name)
    if home is not None:
        import importlib

        where = f"use {home}.{name}" if not home.rsplit(".", 1)[-1].startswith("_") else "it is internal"
        warnings.warn(
            f"prime_traces.{name} is deprecated and leaves the top level in the next release; {where}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(home), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"LocalTracesService"})


__all__ = [
    "__version__",
    # the client and what it returns
    "TracesClient",
    "Batch",
    "LineFormat",
    "UploadReceipt",
    "UploadReport",
    "BatchOutcome",
    "BatchStatus",
    "LineStatus",
    # read models
    "EpisodeDetail",
    "EpisodeError",
    "EpisodeListPage",
    "EpisodeSummary",
    "EpisodeTraceAggregate",
    "Execution",
    "MetricRow",
    "MetricsPage",
    "ModelInfo",
    "RunListPage",
    "RunStep",
    "RunStepList",
    "RunSummary",
    "Score",
    "TraceListPage",
    "TraceSummary",
    # errors
    "PrimeTracesError",
    "AmbiguousDeleteError",
    "APIError",
    "APITimeoutError",
    "ErrorCode",
    "ForbiddenError",
    "LineFormatConflictError",
    "NotFoundError",
    "PaymentRequiredError",
    "ResponseFormatError",
    "RetryableAPIError",
    "RunFinishedError",
    "TraceTooLargeError",
    "TransportError",
    "UnauthorizedError",
    "UploadError",
    "ValidationRejectedError",
    # the local service
    "LocalTracesService",
]
