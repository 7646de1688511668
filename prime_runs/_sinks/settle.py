"""What one failed upload call of a Traces sink write leaves: each batch's outcome sorted into what to do.

:func:`sort_outcomes` reads the call's :class:`~prime_traces.report.UploadReport`
and says, for each batch, whether its records were stored (committed while
the call was being abandoned), are rejected (the lines the service named,
or a record a bisection located), wait undelivered as the very batch that
was sent (its fate unknown), go back in line (the rest of a batch with a
bad line, halves of a split, a half answered 500 behind its sibling), or
were refused with the whole sink. The write
(:class:`~prime_runs._sinks.traces_write.SinkWrite`) acts on it: it tells
the ledger, enters an outage, strikes, or queues the groups to send again.
Positions are indexes into the group the call uploaded; the
:class:`~prime_runs._sinks.server_errors.ServerErrors` of the write, keyed by
the records' indexes in the write, is consulted and updated in batch order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from prime_runs._records import reasons
from prime_runs._records.faults import (
    SINK,
    SIZE_CODES,
    TRANSIENT,
    fault_of,
    is_server_error,
    listed_rejections,
    outcome_text,
    rejection_reason,
)
from prime_runs._sinks.server_errors import ServerErrors, Verdict
from prime_traces.report import BatchOutcome, BatchStatus, UploadReport


@dataclasses.dataclass
class Rejected:
    """A record (its position) refused for its own fault."""

    position: int
    reason: str
    detail: str


@dataclasses.dataclass
class Unsettled:
    """A batch sent whose fate is unknown: it waits as that very batch (its key), to be replayed."""

    positions: list[int]
    reason: str
    detail: str
    key: str | None


@dataclasses.dataclass
class Settlement:
    """One failed upload call, sorted (positions into its group)."""

    #: Committed while the call was abandoned: stored, but never announced by ``on_batch``.
    stored: list[list[int]] = dataclasses.field(default_factory=list)
    #: In batch order, so the first loss told is the first that happened.
    losses: list[Rejected | Unsettled] = dataclasses.field(default_factory=list)
    #: Sent again as one group (sorted): the good lines of a batch with a bad one, and what was never sent.
    resend: list[int] = dataclasses.field(default_factory=list)
    #: Halves (or replays) to send again, each its own group, before the rest.
    splits: list[list[int]] = dataclasses.field(default_factory=list)
    #: Answered 500 while their split's other half was not answered yet: sent again right after it.
    behind: list[list[int]] = dataclasses.field(default_factory=list)
    #: Refused with the sink (every later request would be refused alike), and the first such outcome.
    refused: list[int] = dataclasses.field(default_factory=list)
    sink_refusal: BatchOutcome | None = None
    #: A batch failed after its retries while the run was live: an outage, or a strike.
    transient: bool = False
    committed: bool = False
    #: Where the service named the first bad line only: how many good lines preceded it.
    probe: int | None = None

    def waiting(self) -> list[int]:
        """Every position still to send: the groups to resend, split, or queued behind a sibling."""
        return self.resend + [p for s in self.splits + self.behind for p in s]


def sort_outcomes(
    report: UploadReport,
    group: Sequence[int],
    positions: Sequence[int],
    unlined: Sequence[int],
    announced: set[int],
    server_errors: ServerErrors,
    *,
    cancelled: bool,
    stopped: bool,
) -> Settlement:
    """Sort ``report``'s batches; ``positions[j]`` is line ``j``'s position in ``group``.

    ``unlined``: positions that never became a line (rejected as they were
    encoded). ``announced``: the batches ``on_batch`` was told of.
    ``stopped``: the uploads fell behind (abandoned batches wait on disk,
    not a failure).
    """
    out = Settlement()
    accounted: set[int] = set(unlined)
    for outcome in report.batches:
        batch = [positions[j] for j in outcome.line_indexes]
        accounted.update(batch)
        if outcome.status is BatchStatus.COMMITTED:
            out.committed = True
            if outcome.index not in announced:  # committed during the abandon wait: never announced
                out.stored.append(batch)
                server_errors.stored(tuple(group[p] for p in batch))
            continue
        if outcome.status is BatchStatus.UNSENT:
            continue  # nothing sent: left open, spooled by the worker
        kind = TRANSIENT if outcome.status is BatchStatus.ABANDONED else fault_of(outcome, server_error_is_record=True)
        if kind != TRANSIENT and is_server_error(outcome):
            # The service's fault until a bisection locates a record (server_errors.py).
            verdict = server_errors.verdict(tuple(group[p] for p in batch))
            if verdict is Verdict.REPLAY:
                out.splits.append(batch)
                continue
            if verdict is Verdict.BEHIND_SIBLING:
                out.behind.append(batch)
                continue
            if verdict is Verdict.SPLIT:
                first, _ = server_errors.halves(tuple(group[p] for p in batch))
                out.splits += [batch[: len(first)], batch[len(first) :]]
                continue
            if verdict is Verdict.OUTAGE:
                kind = TRANSIENT
        if kind == TRANSIENT:
            # Sent, fate unknown (the answer never came, or retries ran out or were cut
            # short): kept as this very batch, so a later sync replays it if it was stored.
            reason = reasons.DEADLINE if cancelled else reasons.BACKLOG if stopped else reasons.TRANSIENT
            out.losses.append(Unsettled(batch, reason, str(outcome.error or "abandoned"), outcome.key))
            out.transient = out.transient or not (cancelled or stopped)
        elif kind == SINK:
            out.sink_refusal = out.sink_refusal or outcome
            out.refused += batch
        elif outcome.rejected_lines and outcome.code not in SIZE_CODES:
            # Every bad line listed: all are set aside at once, the rest sent again.
            bad_lines = set()
            for line, reason, detail in listed_rejections(outcome):
                bad_lines.add(positions[line])
                out.losses.append(Rejected(positions[line], reason, detail))
            out.resend += [p for p in batch if p not in bad_lines]
        elif outcome.rejected_line is not None and outcome.code not in SIZE_CODES:
            bad = positions[outcome.rejected_line]
            out.losses.append(Rejected(bad, rejection_reason(outcome), outcome_text(outcome)))
            out.resend += [p for p in batch if p != bad]
            # The lines before it passed; how many is a guess of how far the next bad one is.
            out.probe = max(1, batch.index(bad))
        elif len(batch) == 1:
            out.losses.append(Rejected(batch[0], rejection_reason(outcome), outcome_text(outcome)))
        else:
            half = len(batch) // 2
            out.splits += [batch[:half], batch[half:]]
    out.resend += [p for p in range(len(group)) if p not in accounted]
    out.resend.sort()
    return out
