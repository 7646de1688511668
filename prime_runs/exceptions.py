"""Every error a run can raise, under the published SDK's module name.

``PrimeRunsError`` is the root of this package's own errors
(:class:`ConfigurationError`, :class:`EnvironmentResolutionError`,
:class:`RunFinishedError`, :class:`SinkError`); the platform's and the Traces
service's answers are ``prime_traces``' errors, the same classes, under
:class:`APIError` (a :class:`TransportError` is one without a status).
"""

from __future__ import annotations

from prime_runs.errors import (
    ConfigurationError,
    EnvironmentResolutionError,
    PrimeRunsError,
    RunFinishedError,
    SinkError,
)
from prime_traces.errors import (
    APIError,
    APITimeoutError,
    ForbiddenError,
    LineFormatConflictError,
    NotFoundError,
    PaymentRequiredError,
    RetryableAPIError,
    TraceTooLargeError,
    TransportError,
    UnauthorizedError,
    ValidationRejectedError,
)

__all__ = [
    "APIError",
    "APITimeoutError",
    "ConfigurationError",
    "EnvironmentResolutionError",
    "ForbiddenError",
    "LineFormatConflictError",
    "NotFoundError",
    "PaymentRequiredError",
    "PrimeRunsError",
    "RetryableAPIError",
    "RunFinishedError",
    "SinkError",
    "TraceTooLargeError",
    "TransportError",
    "UnauthorizedError",
    "ValidationRejectedError",
    "is_record_rejection",
    "is_transient",
]


def is_record_rejection(error: BaseException) -> bool:
    """Whether ``error`` is about the records sent, so that other records can still be stored."""
    if isinstance(error, (TypeError, ValueError, TraceTooLargeError, ValidationRejectedError, LineFormatConflictError)):
        return True
    return isinstance(error, APIError) and error.status_code in (413, 422)


def is_transient(error: BaseException) -> bool:
    """Whether the same request may succeed later (429, 502, 503, 504, or no answer at all)."""
    return isinstance(error, (RetryableAPIError, TransportError))
