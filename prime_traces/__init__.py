"""Client for the Prime Traces service, and a local Traces service.

The client lives in this package's top level; the local service that speaks
the same wire contract is :mod:`prime_traces.server` (``prime-traces serve``).
"""

import logging

from prime_traces._version import __version__
from prime_traces.errors import (
    AmbiguousDeleteError,
    APIError,
    APITimeoutError,
    ErrorCode,
    ForbiddenError,
    LineFormatConflictError,
    NotFoundError,
    PrimeTracesError,
    RetryableAPIError,
    TraceTooLargeError,
    TransportError,
    UnauthorizedError,
    ValidationRejectedError,
)

logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "__version__",
    "AmbiguousDeleteError",
    "APIError",
    "APITimeoutError",
    "ErrorCode",
    "ForbiddenError",
    "LineFormatConflictError",
    "NotFoundError",
    "PrimeTracesError",
    "RetryableAPIError",
    "TraceTooLargeError",
    "TransportError",
    "UnauthorizedError",
    "ValidationRejectedError",
]
