"""Client for the Prime Traces service, and a local Traces service.

The client lives in this package's top level; the local service that speaks
the same wire contract is :mod:`prime_traces.server` (``prime-traces serve``).
"""

import logging

from prime_traces._batching import (
    DEFAULT_TARGET_BATCH_BYTES,
    MAX_BATCH_BYTES,
    MAX_BATCH_LINES,
    MAX_LINE_BYTES,
    Batch,
)
from prime_traces._compress import GZIP_LEVEL
from prime_traces._models import UploadReceipt
from prime_traces.report import BatchOutcome, BatchStatus, LineStatus, UploadReport
from prime_traces.version import __version__
from prime_traces.client import DEFAULT_MAX_IN_FLIGHT, TracesClient
from prime_traces.errors import (
    AmbiguousDeleteError,
    APIError,
    APITimeoutError,
    ErrorCode,
    ForbiddenError,
    LineFormatConflictError,
    NotFoundError,
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

logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "__version__",
    "Batch",
    "BatchOutcome",
    "BatchStatus",
    "DEFAULT_MAX_IN_FLIGHT",
    "DEFAULT_TARGET_BATCH_BYTES",
    "GZIP_LEVEL",
    "LineStatus",
    "MAX_BATCH_BYTES",
    "MAX_BATCH_LINES",
    "MAX_LINE_BYTES",
    "TracesClient",
    "UploadError",
    "UploadReceipt",
    "UploadReport",
    "AmbiguousDeleteError",
    "APIError",
    "APITimeoutError",
    "ErrorCode",
    "ForbiddenError",
    "LineFormatConflictError",
    "NotFoundError",
    "PrimeTracesError",
    "ResponseFormatError",
    "RetryableAPIError",
    "RunFinishedError",
    "TraceTooLargeError",
    "TransportError",
    "UnauthorizedError",
    "ValidationRejectedError",
]
