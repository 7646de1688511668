"""Why a record was not stored: every reason ``run.stats()`` counts, named in one place.

Each record the run could not store is counted once, under one reason, in one
of three places (``submitted = stored + dropped + failed + spooled`` per sink):

- **dropped**, refused at the queue before any sink saw it:
  :data:`CLOSED` (logged after ``finish()``), :data:`QUEUE_FULL_RECORDS`,
  :data:`QUEUE_FULL_BYTES`.
- **failed**, lost for good, per sink:

  - for the record's own fault, and kept aside in ``rejected-*.jsonl.zst``:
    :data:`INVALID_RECORD` (JSON cannot hold it), :data:`RECORD_TOO_LARGE`,
    ``rejected:<code>`` (a line rule, or the service refused it: :func:`rejected`);
  - not kept by the platform's legacy sample tables (a run whose account has
    no Prime Traces): :data:`NO_SAMPLE_ROW`, :data:`SAMPLED_OUT`,
    :data:`LEGACY_UNAVAILABLE`;
  - for no fault of the record's, with nowhere to keep it: :data:`DEADLINE`,
    :data:`SPILL_TIMEOUT`, :data:`DISK_ERROR`, :data:`SPOOL_FULL`, :data:`SINK_RETIRED`,
    :data:`SINK_INCOMPLETE`, ``sink_error:<exception>``,
    ``spool_error:<exception>``, ``worker_error:<exception>`` (:func:`crash`).

- **spooled**, written to the run directory for ``prime-runs sync``, by why
  the service did not take it: :data:`TRANSIENT`, :data:`OUTAGE`,
  :data:`BACKLOG`, :data:`DEADLINE`, ``refused:<code>`` (the service refused the sink, not the
  record: :func:`refused`), or any reason of a failed record above that the
  spool could keep instead.
"""

from __future__ import annotations

# -- dropped at the queue ---------------------------------------------------

CLOSED = "closed"
QUEUE_FULL_RECORDS = "queue_full_records"
QUEUE_FULL_BYTES = "queue_full_bytes"

# -- the record's own fault -------------------------------------------------

INVALID_RECORD = "invalid_record"
RECORD_TOO_LARGE = "record_too_large"
REJECTED = "rejected"

# -- not the record's fault ---------------------------------------------------

#: The service failed after the client's retries (5xx without a refusal code, transport errors).
TRANSIENT = "transient"
#: Not sent: the service was down (kept on disk, uploaded when it is back).
OUTAGE = "outage"
#: Not sent yet: uploads were slower than the run logged (kept on disk, uploaded from there, oldest first).
BACKLOG = "backlog"
#: Sent or waiting when ``finish()``'s deadline came.
DEADLINE = "deadline"
#: Not written to disk within ``spill_timeout_s`` after the deadline.
SPILL_TIMEOUT = "spill_timeout"
DISK_ERROR = "disk_error"
#: The run's disk budget (``max_spool_bytes``) is spent.
SPOOL_FULL = "spool_full"
#: The sink was retired earlier in the run (refused for good, or failing write after write).
SINK_RETIRED = "sink_retired"
#: The sink returned without accounting for every record.
SINK_INCOMPLETE = "sink_incomplete"
#: The legacy sample tables hold episode objects only: this record has no row there.
NO_SAMPLE_ROW = "no_sample_row"
#: The legacy training table keeps every tenth step's episodes.
SAMPLED_OUT = "sampled_out"
#: The legacy training table needs pyarrow, which is not installed.
LEGACY_UNAVAILABLE = "legacy_unavailable"
REFUSED = "refused"
SINK_ERROR = "sink_error"
SPOOL_ERROR = "spool_error"
WORKER_ERROR = "worker_error"

#: Reasons of records refused for their own fault, besides ``rejected:<code>``.
_OWN_FAULT = frozenset({INVALID_RECORD, RECORD_TOO_LARGE})


def rejected(code: str | None = None, status: int | None = None) -> str:
    """``rejected:<code>`` (or ``rejected:http_<status>``): refused for the record's own fault."""
    return _qualified(REJECTED, code, status)


def refused(code: str | None = None, status: int | None = None) -> str:
    """``refused:<code>`` (or ``refused:http_<status>``): the service refused the sink, not the record."""
    return _qualified(REFUSED, code, status)


def crash(where: str, err: BaseException) -> str:
    """``sink_error:OSError``: a component (:data:`SINK_ERROR`, :data:`SPOOL_ERROR`, ...) crashed."""
    return f"{where}:{type(err).__name__}"


def disk_failure(err: OSError) -> str:
    """:data:`SPOOL_FULL` for a write past the run's disk budget, else :data:`DISK_ERROR`."""
    return SPOOL_FULL if getattr(err, "limit_bytes", None) is not None else DISK_ERROR


def is_own_fault(reason: str) -> bool:
    """Whether ``reason`` is a record's own fault (it is kept aside, and resending it cannot help)."""
    return reason in _OWN_FAULT or reason == REJECTED or reason.startswith(REJECTED + ":")


def _qualified(kind: str, code: str | None, status: int | None) -> str:
    if code:
        return f"{kind}:{code}"
    return f"{kind}:http_{status}" if status is not None else kind
