"""What a refused or failed upload means for its records: whose fault, and the reason to count.

Shared by the Traces sink (records logged in this process) and ``prime-runs
sync`` (records read back from a run directory), so both treat every answer
of the service alike.
"""

from __future__ import annotations

from prime_runs._records import reasons
from prime_traces.errors import APIError, RetryableAPIError, TransportError
from prime_traces.report import BatchOutcome, BatchStatus

# A 400 with one of these codes is about the request, not a record: no subset
# of the records would be accepted, so bisecting would only multiply requests.
REQUEST_CODES = frozenset(
    {
        "invalid_metadata",
        "unsupported_schema_version",
        "invalid_idempotency_key",
        "digest_mismatch",
        "malformed_encoding",
    }
)
# A refusal for the request's size names the line where the limit was crossed,
# but that record is not at fault. Halving the batch cures it.
SIZE_CODES = frozenset({"upload_too_large", "too_many_traces_in_upload"})
# Statuses that are about the content of the request (413/422 are not in the
# contract, but a proxy may send them for an oversized or odd body).
CONTENT_STATUSES = frozenset({400, 413, 422})

# Whose fault a failed upload is (fault_of).
RECORD = "record"
SINK = "sink"
TRANSIENT = reasons.TRANSIENT


def fault_of(outcome: BatchOutcome, *, server_error_is_record: bool = False) -> str:
    """``record`` (bisect or blame a line), ``sink`` (every request would fail) or ``transient``.

    A 500 is ``transient`` unless ``server_error_is_record``: then it is about
    something in the request, to be isolated like a rejection without a line.
    """
    if outcome.status is BatchStatus.FAILED:
        return TRANSIENT
    err = outcome.error
    if not isinstance(err, APIError) or isinstance(err, (RetryableAPIError, TransportError)) or err.status_code is None:
        return TRANSIENT
    if err.status_code in CONTENT_STATUSES:
        return SINK if outcome.code in REQUEST_CODES else RECORD
    if 400 <= err.status_code < 500:
        return SINK
    if err.status_code == 500 and server_error_is_record:
        return RECORD
    return TRANSIENT  # other statuses the client does not retry


def is_server_error(outcome: BatchOutcome) -> bool:
    """The upload was answered 500 (a crashed handler: no code, no line): the service's fault until located."""
    return getattr(outcome.error, "status_code", None) == 500


def refusal_reason(outcome: BatchOutcome) -> str:
    """The reason of a refusal about the sink (the key, the scope), not about a record."""
    return reasons.refused(outcome.code, getattr(outcome.error, "status_code", None))


def rejection_reason(outcome: BatchOutcome) -> str:
    """The reason of a record the service refused for its own fault."""
    return reasons.rejected(outcome.code, getattr(outcome.error, "status_code", None))


def listed_rejections(outcome: BatchOutcome) -> list[tuple[int, str, str]]:
    """``(input line, reason, detail)`` of every line the service listed as rejected (contract §9)."""
    listed = []
    for line, entry in sorted(outcome.rejected_lines.items()):
        reason = reasons.rejected(entry.code) if entry.code else rejection_reason(outcome)
        listed.append((line, reason, f"HTTP 400 {entry.code or ''}: {entry.message}"))
    return listed


def outcome_text(outcome: BatchOutcome) -> str:
    """The service's words, and the record they are about when it named one."""
    where = f" (record {outcome.record_id!r})" if outcome.record_id else ""
    return f"{outcome.error}{where}"
