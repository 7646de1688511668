"""Every error the Traces client raises, and every code the service speaks.

One root, :class:`PrimeTracesError`. HTTP answers become :class:`APIError`
subclasses chosen by status and code (contract §6); transport failures become
:class:`TransportError` or :class:`APITimeoutError`; a 2xx body of the wrong
shape is :class:`ResponseFormatError`. Messages never carry an
API key: they are built from status, code and the service's own message, which
the transport redacts first (a gateway may echo the request's headers back).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

__all__ = [
    "SERVICE_REFUSAL_CODES",
    "APIError",
    "APITimeoutError",
    "AmbiguousDeleteError",
    "ErrorCode",
    "ForbiddenError",
    "LineFormatConflictError",
    "LineRejection",
    "NotFoundError",
    "PrimeTracesError",
    "ResponseFormatError",
    "RetryableAPIError",
    "RunFinishedError",
    "TraceTooLargeError",
    "TransportError",
    "UnauthorizedError",
    "UploadError",
    "ValidationRejectedError",
]


class ErrorCode(str, enum.Enum):
    """The codes of the error envelope ``{"error": {"code": ..., "message": ...}}``."""

    # 400, about the upload or one of its lines
    UPLOAD_TOO_LARGE = "upload_too_large"
    TRACE_TOO_LARGE = "trace_too_large"
    TOO_MANY_TRACES_IN_EPISODE = "too_many_traces_in_episode"
    EPISODE_ID_TOO_LONG = "episode_id_too_long"
    ENVIRONMENT_ID_TOO_LONG = "environment_id_too_long"
    TOO_MANY_TRACES_IN_UPLOAD = "too_many_traces_in_upload"
    DUPLICATE_TRACE_ID = "duplicate_trace_id"
    DUPLICATE_EPISODE_ID = "duplicate_episode_id"
    DIGEST_MISMATCH = "digest_mismatch"
    LINE_FORMAT_MISMATCH = "line_format_mismatch"
    MALFORMED_ENCODING = "malformed_encoding"
    INVALID_TRACE = "invalid_trace"
    INVALID_METADATA = "invalid_metadata"
    CREATED_AT_OUT_OF_WINDOW = "created_at_out_of_window"
    UNSUPPORTED_SCHEMA_VERSION = "unsupported_schema_version"
    UNKNOWN_EPISODE_REFERENCE = "unknown_episode_reference"
    # 400, about the request
    INVALID_IDEMPOTENCY_KEY = "invalid_idempotency_key"
    INVALID_CURSOR = "invalid_cursor"
    INVALID_FILTER = "invalid_filter"
    SEARCH_LIMIT_EXCEEDED = "search_limit_exceeded"
    INVALID_RUN = "invalid_run"
    # 401 / 403
    UNAUTHENTICATED = "unauthenticated"
    FORBIDDEN = "forbidden"
    SERVICE_NOT_ENABLED = "service_not_enabled"
    # 404
    TRACE_NOT_FOUND = "trace_not_found"
    RUN_NOT_FOUND = "run_not_found"
    EPISODE_NOT_FOUND = "episode_not_found"
    EXPORT_JOB_NOT_FOUND = "export_job_not_found"
    NOT_FOUND = "not_found"
    # 409
    LINE_FORMAT_CONFLICT = "line_format_conflict"
    TRACE_NOT_INDEXED = "trace_not_indexed"
    RUN_FINISHED = "run_finished"
    # 415
    UNSUPPORTED_CONTENT_ENCODING = "unsupported_content_encoding"
    # 429 / 503
    RATE_LIMITED = "rate_limited"
    WRITER_POOL_SATURATED = "writer_pool_saturated"
    INGEST_CAPACITY_EXCEEDED = "ingest_capacity_exceeded"
    INGEST_UNAVAILABLE = "ingest_unavailable"
    STORAGE_UNAVAILABLE = "storage_unavailable"
    AUTH_UNAVAILABLE = "auth_unavailable"

    def __str__(self) -> str:
        return self.value


#: 503 codes that mean "the service refused before doing anything" (contract §6).
SERVICE_REFUSAL_CODES = frozenset(
    {
        ErrorCode.RATE_LIMITED.value,
        ErrorCode.WRITER_POOL_SATURATED.value,
        ErrorCode.INGEST_CAPACITY_EXCEEDED.value,
        ErrorCode.INGEST_UNAVAILABLE.value,
        ErrorCode.STORAGE_UNAVAILABLE.value,
        ErrorCode.AUTH_UNAVAILABLE.value,
    }
)


class PrimeTracesError(Exception):
    """Root of every error raised by ``prime_traces``."""


@dataclass(frozen=True)
class LineRejection:
    """One rejected line of an upload: its 1-based number in the body, code, message and id."""

    line: int
    code: str | None
    message: str
    record_id: str | None = None


class APIError(PrimeTracesError):
    """The service answered with a status that is not success.

    ``code`` is the envelope's code (``None`` when the service sent none),
    ``line`` and ``record_id`` locate a line-level rejection when the service
    says where it is, and ``errors`` lists every rejected line when it sends
    them all (contract §9; empty otherwise).
    """

    def __init__(
        self,
        status_code: int,
        code: str | None,
        message: str,
        *,
        line: int | None = None,
        record_id: str | None = None,
        errors: tuple[LineRejection, ...] = (),
    ) -> None:
        #: The answer's status; ``None`` for a :class:`TransportError` (no answer came).
        self.status_code: int | None = status_code
        self.code = code
        self.message = message
        self.line = line
        self.record_id = record_id
        self.errors = errors
        where = ""
        if line is not None:
            where = f" (line {line}" + (f", id {record_id!r}" if record_id else "") + ")"
        label = f" {code}" if code else ""
        super().__init__(f"HTTP {status_code}{label}: {message}{where}")


class UnauthorizedError(APIError):
    """401: the API key is missing or not accepted. Check ``PRIME_API_KEY``."""


class ForbiddenError(APIError):
    """403: the key lacks the scope, or the service is not enabled for the team."""


class NotFoundError(APIError):
    """404: the trace, episode or run does not exist (or no longer does)."""


class ValidationRejectedError(APIError):
    """400: the service rejected the request; retrying the same bytes cannot help."""


class LineFormatConflictError(APIError):
    """409 on the trace endpoints: the same bytes were committed under the other line format."""


class RunFinishedError(APIError):
    """409 ``run_finished`` on the run endpoints: the run already finished with another status.

    A run in a terminal status keeps it (contract §9); the local service's
    message names the status it kept. Setting that same status again, or
    merging config and summary into a finished run, is no error.
    """


class RetryableAPIError(APIError):
    """429, 502, 503 or 504: the service may accept the same request later.

    ``retry_after`` is the wait the service asked for, in seconds (``None``
    when it gave none).
    """

    def __init__(self, *args: Any, retry_after: float | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.retry_after = retry_after


class ResponseFormatError(PrimeTracesError, ValueError):
    """A response body does not have the shape its model or endpoint requires; ``path`` says where."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}")


class TransportError(APIError):
    """The request did not get an HTTP answer (connection refused, reset, dropped).

    An :class:`APIError` without a status: ``status_code`` and ``code`` are
    ``None`` (the published SDK's classes have the same bases, so code that
    catches ``APIError`` catches this too).
    """

    def __init__(self, message: str) -> None:
        PrimeTracesError.__init__(self, message)
        self.status_code = None
        self.code = None
        self.message = message
        self.line = None
        self.record_id = None
        self.errors = ()


class APITimeoutError(TransportError):
    """The service did not answer within the timeout."""


class PaymentRequiredError(APIError):
    """402: the account's billing does not allow the request. Check its billing status."""


class AmbiguousDeleteError(APIError):
    """A delete failed in a way that leaves unknown whether it happened.

    It is not retried automatically: list or get the target to find out.
    ``status_code`` is the answer's status when there was one.
    """

    def __init__(self, message: str, status_code: int | None = None) -> None:
        PrimeTracesError.__init__(self, message)
        self.status_code = status_code
        self.code = None
        self.message = message
        self.line = None
        self.record_id = None
        self.errors = ()


class TraceTooLargeError(PrimeTracesError, ValueError):
    """One line is larger than the service accepts; raised before any request."""

    def __init__(self, line_index: int, size_bytes: int, limit_bytes: int) -> None:
        self.line_index = line_index
        self.size_bytes = size_bytes
        self.limit_bytes = limit_bytes
        super().__init__(
            f"line {line_index + 1} is {size_bytes} bytes, over the limit of "
            f"{limit_bytes} bytes per line; split the record or drop large fields"
        )


class UploadError(PrimeTracesError):
    """An upload stopped (fail-stop) or was cancelled; ``report`` says what became of every line.

    ``report`` is a :class:`prime_traces.UploadReport`: per batch, committed
    (with its receipt), rejected (with the code, and the line and record id
    when known), failed transiently, abandoned at cancellation, or never sent.
    ``error`` is the first failure (also the ``__cause__``); ``receipts`` are
    those of every committed batch, in batch order.
    """

    def __init__(self, message: str, report: Any, error: BaseException | None = None) -> None:
        super().__init__(message)
        self.report = report
        self.error = error

    @property
    def receipts(self) -> list[Any]:
        return list(self.report.receipts)
