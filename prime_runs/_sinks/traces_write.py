"""One write of the Traces sink: every record stored, rejected, or left for the spool.

Each record is first checked against the contract's line rules
(``prime_traces.encoding``, the rules the local service applies): one that
breaks them is rejected here and costs no request. What becomes of the
records of a refused or failed upload:

- The service lists every rejected line (``errors``, contract §9): each is
  rejected as ``rejected:<code>`` (and set aside), and the rest of the batch
  is sent again: one extra request per batch, whatever the number of bad
  records.
- The service names only the first rejected line: that record is rejected;
  the other records of its batch, and the records never sent, are uploaded
  again, at most as many per request as there were good lines before the
  bad one, doubling as requests commit. Records with no bad one among them
  go through in a few requests; when every record is bad, each costs one
  small request, and the bytes sent stay within about twice the write's.
- The service names no line: the batch is bisected. Each half is uploaded in
  its own ``upload_lines`` call, recursively, until the bad records are
  isolated. A single record refused is that record's rejection. This takes
  about ``2 * log2(n)`` extra requests per bad record, and at most ``2n - 1``
  for a batch of ``n``. Size refusals (``upload_too_large``,
  ``too_many_traces_in_upload``) are bisected even when a line is named,
  since the line is not at fault there. A 500 is the service's fault until
  a bisection locates one record while its neighbours are stored; when both
  halves of a split fail with 500 it is an outage (``server_errors.py``).
- The refusal is about the sink, not the records (401, 402, 403, 404, 409 or
  any other 4xx but 400/413/422, or a 400 about the request itself such as
  ``invalid_metadata``): every later request would be refused the same way.
  The write's records not yet accounted for are left undelivered as
  ``refused:<code>``. For 401, 402, 403 and 404 the write returns
  ``PERMANENT`` (the worker retires the sink at once, and spools the rest of
  the run); otherwise ``TRANSIENT``, a strike. Going on would spend a request
  per record and store nothing.
- Refusals (429, 503 with a refusal code) never end an upload while the run
  is live: the client waits them out, spending no attempt, until ``cancel``.
- A batch that failed after the client's retries (5xx without a refusal
  code, transport errors) is left undelivered as ``transient``, as one batch
  (it may have been stored: a resync sends the same bytes, which the service
  replays). With a spool, the sink then enters an outage
  (:class:`~prime_runs._sinks.outage.Outage`): the rest of the write, and every
  write until a probe sees the service back, is left undelivered as
  ``outage`` without being sent, so the worker spools it at disk speed; once
  the service answers, what was spooled is uploaded in the background. No
  strike. Without a spool the write returns ``TRANSIENT``, and after
  ``max_transient_failures`` such uploads in a row the rest of the write is
  left undelivered without being sent.
- Once ``cancel`` is set (the worker's deadline), nothing new is sent.
  Batches in flight are left undelivered as ``deadline`` batches; records
  never sent are left open.

The worker spools what is left undelivered or open to the run directory.
:mod:`~prime_runs._sinks.settle` sorts a failed call's batches; this module
acts on what it says.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from prime_runs._records import reasons
from prime_runs._records.faults import outcome_text, refusal_reason
from prime_runs._records.ledger import Ledger
from prime_runs._records.lines import EncodedWrite, id_of
from prime_runs._records.sink import SinkStatus
from prime_runs._sinks.server_errors import ServerErrors
from prime_runs._sinks.settle import Rejected, sort_outcomes
from prime_traces.encoding import check_record
from prime_traces.errors import UploadError
from prime_traces.report import UploadReport

if TYPE_CHECKING:
    from prime_runs._sinks.upload_sink import UploadSink

logger = logging.getLogger(__name__)

#: The 403 code that says the account has no Prime Traces (contract §10): the legacy tables take over.
SERVICE_NOT_ENABLED = "service_not_enabled"
#: Refusals that no later request can get past: the sink retires at once.
PERMANENT_STATUSES = frozenset({401, 402, 403, 404})


def _then(lines: Iterable[Any], call: Callable[[], Any]) -> Iterator[Any]:
    """``lines``, then ``call()`` once they ran out (not when the upload stops pulling before)."""
    yield from lines
    call()


def _keep_in_write(_position: int) -> None:
    """An encoded record stays in its write's list, for a resend, until it is stored."""


class SinkWrite:
    """One call of ``write``: the groups of records still to upload, and the tallies."""

    def __init__(
        self, sink: UploadSink, records: Sequence[Any], line_format: str, ledger: Ledger, cancel: threading.Event
    ) -> None:
        self.sink = sink
        self.records = records
        self.line_format = line_format
        self.ledger = ledger
        self.cancel = cancel
        # Record indexes into ``records``, each group uploaded by one upload_lines call.
        self.groups: collections.deque[list[int]] = collections.deque([list(range(len(records)))])
        self.status = SinkStatus.OK
        self.transient_in_row = 0
        self.first_pass = True
        self.failures: collections.Counter[str] = collections.Counter()
        self.sample: str | None = None
        # Once the service has located a rejection without listing them all,
        # at most this many records go in one request, doubling as requests
        # commit: resending everything after each bad record would cost O(N²).
        self.probe: int | None = None
        # Batches answered 500 (by their records' indexes): replayed, bisected, or an outage.
        self.server_errors = ServerErrors()

    def run(self) -> SinkStatus:
        while self.groups and not self.cancel.is_set():
            outage = self.sink.outage
            if outage is not None and not outage.diverting and self._pressed():
                outage.fall_behind("the upload queue passed half its bounds")
            if outage is not None and outage.diverting:
                self._wait_out_outage()
                break
            if self.transient_in_row >= self.sink.max_transient_failures:
                self._undeliver([i for g in self.groups for i in g], reasons.TRANSIENT)
                self.groups.clear()
                break
            group = self.groups.popleft()
            if self.probe is not None and len(group) > self.probe:
                self.groups.appendleft(group[self.probe :])
                group = group[: self.probe]
            if group:
                self._send(group)
        if self.failures:
            self.sink.warnings.warn(len(self.records), self.failures, self.sample)
        return self.status

    def _reject(self, index: int, reason: str, detail: str) -> None:
        self.ledger.rejected(
            index, reason, f"refused by the service: {detail}", id_of(self.records[index]), by_service=True
        )
        self.failures[reason] += 1
        self.sample = self.sample or detail

    def _undeliver(
        self, indexes: list[int], reason: str, detail: str | None = None, *, batch: bool = False, key: str | None = None
    ) -> None:
        # Not the records' fault: the worker spools them for ``prime-runs sync``.
        if not indexes:
            return
        self.ledger.undelivered(indexes, reason, batch=batch, key=key)
        self.failures[reason] += len(indexes)
        if detail:
            self.sample = self.sample or detail

    def _let_go(self, stored: list[int]) -> None:
        # Stored records are never read again; the last sink to read them frees the caller's objects now.
        if self.ledger.last_reader and isinstance(self.records, list):
            for index in stored:
                self.records[index] = None

    def _pressed(self) -> bool:
        behind = self.sink.behind
        return behind is not None and behind.is_set()

    def _wait_out_outage(self) -> None:
        # Not sent, not a failure: the worker spools them; they go up from there (once the service is back).
        outage = self.sink.outage
        reason = reasons.OUTAGE if outage is None or outage.down else reasons.BACKLOG
        self.ledger.undelivered([i for g in self.groups for i in g], reason)
        self.groups.clear()

    def _strike(self, reason: str) -> None:
        self.status = SinkStatus.TRANSIENT
        logger.debug("traces sink strike: %s", reason)

    def _send(self, group: list[int]) -> None:
        subset = [self.records[i] for i in group]  # references only: no record is copied
        # The meter learns each record's size once, not again when it is resent.
        meter = self.sink.meter if self.first_pass else None
        first_pass, self.first_pass = self.first_pass, False
        # The contract's line rules, checked here: a record the service would refuse costs no request.
        check = functools.partial(check_record, line_format=self.line_format, now=time.time())
        # The last reader of the records holds each only in ``self.records`` while it is encoded, and
        # lets go of it there once stored (see Ledger.last_reader); a resend takes it from there again.
        release = _keep_in_write if self.ledger.last_reader else None
        encoded = EncodedWrite(
            subset, self.line_format, self.sink.stamp, meter, self.ledger, indexes=group, check=check, release=release
        )
        del subset
        announced: set[int] = set()
        # Once the first pass has encoded every record, the worker may start encoding the next
        # write while this one's last batches upload.
        lines = self.sink.link.timed(_then(encoded, self.ledger.encoded) if first_pass else encoded)

        def on_batch(batch: Any, _receipt: Any) -> None:
            announced.add(batch.index)
            positions = encoded.line_records
            stored = [group[positions[j]] for j in batch.line_indexes]
            self.ledger.stored(stored, batch.size_bytes)
            self.server_errors.stored(tuple(stored))
            self.sink.committed(stored, self.records, self.line_format)
            self._let_go(stored)

        try:
            self.sink.client.upload_lines(
                lines,
                line_format=self.line_format,
                context=self.sink.context,
                target_batch_bytes=self.sink.target_batch_bytes,
                max_attempts=self.sink.max_attempts,
                max_refused_s=None,  # refusals are backpressure: waited out until the deadline
                on_batch=on_batch,
                cancel=self.cancel,
                # Uploads falling behind the run: what is not sent yet goes to disk, not into a longer wait.
                stop=self.sink.behind.latch()
                if self.sink.behind is not None and self.sink.outage is not None
                else None,
            )
        except UploadError as err:
            self._settle(group, encoded, err.report, announced)
            return
        except Exception as err:
            # Not a record's fault (EncodedWrite absorbs those) and not an
            # upload's (a closed client, a bug): nothing more of this write can be sent.
            logger.warning("traces sink: write failed: %r", err, exc_info=True)
            reason = reasons.crash(reasons.SINK_ERROR, err)  # as the worker names a sink's crash
            rejected = {position for position, _ in encoded.errors}
            left = [i for p, i in enumerate(group) if p not in rejected] + [i for g in self.groups for i in g]
            self._undeliver(left, reason, repr(err))
            self.groups.clear()
            self._strike(reason)
            return
        # Returned normally: every produced line was announced, except lines
        # abandoned at a cancel that came after the input ran out; those stay
        # open, and the worker spools them.
        self.transient_in_row = 0
        if self.probe is not None:
            self.probe *= 2

    def _settle(self, group: list[int], encoded: EncodedWrite, report: UploadReport, announced: set[int]) -> None:
        """Account for one failed upload call; queue what must be sent again."""
        cancelled = self.cancel.is_set()
        outcomes = sort_outcomes(
            report,
            group,
            encoded.line_records,
            [position for position, _ in encoded.errors],
            announced,
            self.server_errors,
            cancelled=cancelled,
            # Stopped because the uploads fell behind: abandoned batches wait on disk as they are, no failure.
            stopped=report.stopped and not cancelled,
        )
        for batch in outcomes.stored:
            self.ledger.stored([group[p] for p in batch])
            self._let_go([group[p] for p in batch])
        for loss in outcomes.losses:
            if isinstance(loss, Rejected):
                self._reject(group[loss.position], loss.reason, loss.detail)
            else:
                indexes = [group[p] for p in loss.positions]
                self._undeliver(indexes, loss.reason, loss.detail, batch=True, key=loss.key)
        if outcomes.probe is not None:
            self.probe = outcomes.probe
        resend, splits, behind, transient = outcomes.resend, outcomes.splits, outcomes.behind, outcomes.transient
        sink_refusal = outcomes.sink_refusal
        if sink_refusal is not None:
            # Every later request would be refused alike: the rest of the write is kept for a sync.
            left = outcomes.refused + outcomes.waiting()
            if sink_refusal.code == SERVICE_NOT_ENABLED and self.sink.route_to_legacy():
                # The account has no Prime Traces: this write's records, and every later one, go to the legacy tables.
                rest = sorted([group[p] for p in left] + [i for g in self.groups for i in g])
                self.groups.clear()
                self.status = self.sink.write_legacy([self.records[i] for i in rest], rest, self.ledger)
                return
            reason = refusal_reason(sink_refusal)
            self._undeliver(
                [group[p] for p in left] + [i for g in self.groups for i in g], reason, outcome_text(sink_refusal)
            )
            self.groups.clear()
            self._strike(reason)
            if getattr(sink_refusal.error, "status_code", None) in PERMANENT_STATUSES:
                self.status = SinkStatus.PERMANENT
                self.sink.permanent_refusal = f"{reason}: {outcome_text(sink_refusal)}"
            return
        if transient and self.sink.outage is not None:
            # The service failed for good: the rest of the write waits on disk, not in a retry cycle
            # per batch, and so does every write until the probe sees the service back. No strike.
            self.sink.outage.enter(self.sample or "uploads failed after their retries")
            self.groups.extendleft([[group[p] for p in sorted(outcomes.waiting())]])
            self._wait_out_outage()
            return
        if transient:
            self._strike(reasons.TRANSIENT)
        if outcomes.committed:
            self.transient_in_row = 0
        elif transient:
            self.transient_in_row += 1
        if cancelled:
            return
        if report.stopped:
            # The uploads fell behind: what was not sent goes back in line, and the next turn keeps it on disk.
            follow = [[group[p] for p in s] for s in splits + behind]
            follow += [[group[p] for p in resend]] if resend else []
            self.groups.extendleft(reversed(follow))
            return
        if resend and not report.batches:
            # No batch went out and no record is to blame: resending would loop.
            self._undeliver([group[p] for p in resend], reasons.SINK_ERROR, "upload stopped before sending anything")
            self._strike(reasons.SINK_ERROR)
            resend = []
        # Halves first, so a bad record is isolated before the rest moves on.
        follow = [[group[p] for p in s] for s in splits]
        if resend:
            follow.append([group[p] for p in resend])
        self.groups.extendleft(reversed(follow))
        for batch in behind:
            self._queue_behind_sibling([group[p] for p in batch])

    def _queue_behind_sibling(self, indexes: list[int]) -> None:
        # Right after the group of the other half of its split; first in line if that is not queued.
        sibling = self.server_errors.sibling(tuple(indexes))
        at = next((n for n, g in enumerate(self.groups) if sibling is not None and tuple(g) == sibling), None)
        if at is None:
            self.groups.appendleft(indexes)
        else:
            self.groups.insert(at + 1, indexes)
