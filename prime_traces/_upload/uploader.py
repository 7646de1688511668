"""Concurrent, ordered, fail-stop uploads of JSONL batches.

The calling thread batches lines (and encodes records, lazily) and keeps a
window of at most ``max_in_flight`` batches on the request pool; pool threads
hash, compress and send, with retries. Receipts and ``on_batch`` calls come
back on the calling thread in batch order, as soon as the head-of-line batch
commits. Once any batch fails, no new request starts; the ones in flight
finish; then :class:`UploadError` reports every line.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from typing import Any, Protocol

from prime_traces._api.models import UploadReceipt
from prime_traces._upload.batching import (
    Batch,
    iter_batches,
)
from prime_traces._upload.sender import Sender, UploadSettings
from prime_traces.errors import (
    APIError,
    RetryableAPIError,
    TransportError,
    UploadError,
)
from prime_traces.report import BatchOutcome, BatchStatus, UploadReport
from prime_traces.threads import DaemonPool

logger = logging.getLogger(__name__)


class Flag(Protocol):
    """What an upload's ``stop`` needs: a ``threading.Event``, or anything that says whether it is set now."""

    def is_set(self) -> bool: ...


#: How long a cancelled upload waits for requests already in flight.
DEFAULT_ABANDON_AFTER_S = 1.0
# How often a cancellable upload looks at its cancel event while it waits.
_CANCEL_CHECK_S = 0.02
# The most batches an upload keeps in order behind its head-of-line batch.
_MAX_WAITING_BATCHES = 512
#: While "auto" coding has not learnt the service's codings, the first batch asks with at most this
#: much: it goes alone, in gzip, and the rest wait for its answer.
PROBE_BATCH_BYTES = 1024**2

OnBatch = Callable[[Batch, UploadReceipt], Any]


def outcome_of(batch: Batch, future: Future[UploadReceipt] | None) -> BatchOutcome:
    """The outcome of a batch from its finished future (``None``: abandoned)."""
    outcome = functools.partial(BatchOutcome, index=batch.index, line_indexes=batch.line_indexes, key=batch.key)
    if future is None or not future.done():
        return outcome(status=BatchStatus.ABANDONED)
    err = future.exception()
    if err is None:
        return outcome(status=BatchStatus.COMMITTED, receipt=future.result())
    if isinstance(err, (RetryableAPIError, TransportError)) or not isinstance(err, APIError):
        return outcome(status=BatchStatus.FAILED, error=err, code=getattr(err, "code", None))
    rejected = batch.input_index_of(err.line) if err.line is not None else None
    listed = {index: entry for entry in err.errors if (index := batch.input_index_of(entry.line)) is not None}
    return outcome(
        status=BatchStatus.REJECTED,
        error=err,
        code=err.code,
        rejected_line=rejected,
        record_id=err.record_id,
        rejected_lines=listed,
    )


class Upload:
    """One call of ``upload_lines``: the window, the order, the stop."""

    def __init__(
        self,
        pool: DaemonPool,
        sender: Sender,
        settings: UploadSettings,
        *,
        max_in_flight: int,
        on_batch: OnBatch | None,
        cancel: threading.Event | None,
        abandon_after_s: float = DEFAULT_ABANDON_AFTER_S,
        stop: Flag | None = None,
    ) -> None:
        self.pool = pool
        self.sender = sender
        self.settings = settings
        self.max_in_flight = max_in_flight
        self.on_batch = on_batch
        self.cancel = cancel
        #: Once set, no new batch is sent; those in flight get ``abandon_after_s`` to finish, as at a cancel.
        self.stop = stop
        self.abandon_after_s = abandon_after_s
        self.window: collections.deque[tuple[Batch, Future[UploadReceipt]]] = collections.deque()
        self.report = UploadReport()
        self.receipts: list[UploadReceipt] = []
        self.failure: BaseException | None = None
        self.next_line = 0
        self._on_batch_failed = False
        self._wake = threading.Event()
        # The requests' own cancel: set with ``cancel``, and once batches are abandoned, so that none of them
        # goes on retrying after this call returned (a finished run keeps no thread busy).
        self._quit = threading.Event()
        # Batches sent and not committed (they hold their bytes), and the earliest failure.
        self._counts_lock = threading.Lock()
        self._holding = 0
        self._first_error: tuple[int, BaseException] | None = None

    def run(self, lines: Iterable[Any]) -> list[UploadReceipt]:
        # A slot given back anywhere in the client may make room here.
        self.sender.window.subscribe(self._wake)
        try:
            return self._run(lines)
        finally:
            self.sender.window.unsubscribe(self._wake)

    def _run(self, lines: Iterable[Any]) -> list[UploadReceipt]:
        probe = PROBE_BATCH_BYTES if self.sender.selector.probing and self.settings.learn_coding else None
        batches = iter_batches(
            lines, target_batch_bytes=self.settings.target_batch_bytes, first_batch_bytes=probe, reuse_buffers=True
        )
        exhausted = False
        # A batch pulled before it had a slot: with nothing of ours in flight, the
        # upload learns whether anything is left before it waits for a slot that
        # other uploads of the client hold. The only batch it holds then.
        pending: Batch | None = None
        while True:
            self._wake.clear()
            # Collect first: a failure seen now must stop the refill below.
            self._collect()
            while not exhausted and self.failure is None and not self._cancelled() and not self._stopped():
                if pending is None and not self.window:
                    pending, exhausted = self._pull(batches)
                    if pending is None:
                        break
                if not self._reserve():
                    break
                batch = pending
                if batch is None:
                    try:
                        batch, exhausted = self._pull(batches)
                    finally:
                        if batch is None:
                            self.sender.window.unreserve()
                    if batch is None:
                        break
                pending = None
                try:
                    future = self.pool.submit(self.sender.send, batch, self.settings, self._quit, True)
                except BaseException:
                    self.sender.window.unreserve()
                    raise
                with self._counts_lock:
                    self._holding += 1
                self.window.append((batch, future))
                future.add_done_callback(functools.partial(self._finished, batch))
                self.next_line = batch.line_indexes[-1] + 1
            # Done once nothing of ours is in flight and nothing more will go. With
            # lines left and the window full of other uploads' requests, wait for a slot.
            if not self.window and (exhausted or self.failure is not None or self._stopped()):
                break
            if self._cancelled() or self._stopped():
                if self._cancelled():
                    self._quit.set()  # a request waiting to retry stops now
                self._abandon()
                self._quit.set()  # what is still in flight ends with its request: no retry
                break
            watched = self.cancel is not None or self.stop is not None
            self._wake.wait(_CANCEL_CHECK_S if watched else None)
        abandoned = any(b.status is BatchStatus.ABANDONED for b in self.report.batches)
        cancelled_early = self._cancelled() and (not exhausted or abandoned)
        stopped_early = self._stopped() and (not exhausted or abandoned)
        if self.failure is None and not cancelled_early and not stopped_early:
            return self.receipts
        if not exhausted:
            self.report.unsent_from_line = self.next_line
        self.report.stopped = stopped_early and self.failure is None and not cancelled_early
        raise self._error(cancelled_early)

    def _pull(self, batches: Iterator[Batch]) -> tuple[Batch | None, bool]:
        """The next batch and whether the lines ran out; a line that cannot be sent stops the upload.

        The first such line raises (nothing was sent); a later one becomes the failure.
        """
        try:
            return next(batches), False
        except StopIteration:
            return None, True
        except Exception as err:  # a line or record that cannot be sent
            if not self.window and not self.report.batches:
                raise
            self.failure = err
            return None, False

    def _reserve(self) -> bool:
        """Whether another batch may be queued now; if so, its place in the window is reserved."""
        # Batches not yet committed hold their bytes: at most twice the window
        # of them. Committed ones waiting behind a slow head-of-line batch
        # (one waiting out a refusal) have released theirs and cost a few
        # bytes each, so many more may wait: the pipe keeps flowing.
        if self._holding >= 2 * self.max_in_flight or len(self.window) >= _MAX_WAITING_BATCHES:
            return False
        if self.sender.selector.probing and self.window and not any(f.done() for _, f in self.window):
            # "auto": one batch asks first, so the rest go in the coding the service advertises.
            return False
        return self.sender.window.try_reserve()

    def _finished(self, batch: Batch, future: Future[UploadReceipt]) -> None:
        # On the pool thread: counts kept here spare the loop a scan of the window.
        error = future.exception()
        if error is None:
            batch.release()  # committed: only its key, indexes and size are needed from here
            with self._counts_lock:
                self._holding -= 1
        else:
            with self._counts_lock:
                if self._first_error is None or batch.index < self._first_error[0]:
                    self._first_error = (batch.index, error)
        self._wake.set()

    def _cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    def _stopped(self) -> bool:
        return self.stop is not None and self.stop.is_set()

    def _collect(self) -> None:
        """Hand out receipts in order; note the first failure anywhere in the window."""
        while self.window and self.window[0][1].done():
            batch, future = self.window.popleft()
            outcome = outcome_of(batch, future)
            self.report.batches.append(outcome)
            if outcome.status is BatchStatus.COMMITTED:
                assert outcome.receipt is not None
                self._committed(batch, outcome.receipt)
            elif self.failure is None:
                self.failure = outcome.error
        if self.failure is None and self._first_error is not None:
            self.failure = self._first_error[1]

    def _committed(self, batch: Batch, receipt: UploadReceipt) -> None:
        # Its done-callback may not have run yet: released here, so its buffer is back before the upload returns.
        batch.release()
        self.receipts.append(receipt)
        # Committed batches are announced even after a failure elsewhere:
        # they are stored, and the caller's accounting must say so.
        if self.on_batch is not None and not self._on_batch_failed:
            try:
                self.on_batch(batch, receipt)
            except Exception as err:  # noqa: BLE001  (on_batch is user code)
                self._on_batch_failed = True
                self.failure = self.failure or err

    def _abandon(self) -> None:
        deadline = time.monotonic() + self.abandon_after_s
        for _, future in self.window:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                future.exception(timeout=remaining)
            except Exception:  # noqa: BLE001  concurrent.futures.TimeoutError: still in flight
                break
        # What finished in time is collected (and announced) in order; the rest is abandoned.
        self._collect()
        while self.window:
            batch, future = self.window.popleft()
            outcome = outcome_of(batch, future if future.done() else None)
            self.report.batches.append(outcome)
            if outcome.status is BatchStatus.COMMITTED:
                assert outcome.receipt is not None
                self._committed(batch, outcome.receipt)

    def _error(self, cancelled: bool) -> UploadError:
        first = self.report.first_failure
        cause = self.failure if self.failure is not None else (first.error if first else None)
        if cancelled and self.failure is None:
            message = "upload cancelled: " + self.report.summary()
        elif self.report.stopped:
            message = "upload stopped at the caller's request: " + self.report.summary()
        else:
            where = f" in batch {first.index}" if first is not None else ""
            message = f"upload stopped{where}: {cause}; {self.report.summary()}"
        error = UploadError(message, self.report, cause if isinstance(cause, BaseException) else None)
        if isinstance(cause, BaseException):
            error.__cause__ = cause
        return error
