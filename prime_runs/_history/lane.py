"""The run's metrics history: a lane of its own, so large episode uploads never delay a row.

``run.log()`` appends a row here (O(1), never blocks). A daemon thread of
the lane sends the rows in batches, at most every ``flush_interval_s`` or as
soon as ``batch_rows`` are waiting, on its own HTTP session: it never waits
behind the episodes' request pool. Memory is bounded: past
``max_queued_rows`` a new row is dropped (and counted). A batch the service
did not take (down, refusing) is kept and sent again, backing off up to
``MAX_BACKOFF_S``; a batch it refuses for its content is failed and counted,
never retried forever.

Offline, rows are written to the run directory (``metrics-*.jsonl.zst``)
instead of sent, a batch at a time. Online, what is not sent by ``close()``'s
deadline, or what a failed send leaves once the run is finishing, is written
there too (``spooled``), for ``prime-runs sync`` to upload. Every row carries
a step, so a replayed request changes nothing on the service (contract §9).

Accounting, as for records: ``logged = stored + dropped + failed + spooled +
queued``.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import orjson

from prime_runs._local.segments import Frame, SegmentWriter
from prime_traces.errors import APIError, RetryableAPIError
from prime_traces.threads import call_in_forked_child, start_daemon, wait_slice

logger = logging.getLogger(__name__)

DEFAULT_FLUSH_INTERVAL_S = 1.0
DEFAULT_BATCH_ROWS = 1_000
DEFAULT_MAX_QUEUED_ROWS = 100_000
MAX_BACKOFF_S = 30.0
_FIRST_BACKOFF_S = 1.0
_DISK_GRACE_S = 5.0  # offline, close() waits this long past its deadline for a batch being written
# Refusals that say nothing about the rows: the batch is kept and sent again.
_NOT_THE_ROWS = frozenset({401, 403, 404, 408, 409, 429})

Send = Callable[[list[dict[str, Any]], "float | None"], Any]


class MetricsLane:
    """Rows of one run's history on their way to the service (``send``) or to disk (``writer()``).

    ``add`` is thread-safe and never blocks for long. ``close(deadline)`` sends
    what it can until the monotonic ``deadline``, writes what is left with
    ``writer()`` (called only when something must be written: online, the run
    directory appears only then), and returns.

    Usage::

        lane = MetricsLane(send=post_rows, writer=lambda: files.writer("metrics"))
        lane.add({"step": 3, "time": time.time(), "metrics": {"reward": 0.5}})
        lane.close(time.monotonic() + 10)
    """

    def __init__(
        self,
        *,
        send: Send | None,
        writer: Callable[[], SegmentWriter] | None,
        flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S,
        batch_rows: int = DEFAULT_BATCH_ROWS,
        max_queued_rows: int = DEFAULT_MAX_QUEUED_ROWS,
        name: str = "prime-runs-metrics",
        on_closed: Callable[[], Any] | None = None,
    ) -> None:
        if send is None and writer is None:
            raise ValueError("a metrics lane needs send or writer")
        if batch_rows < 1 or max_queued_rows < 1:
            raise ValueError("batch_rows and max_queued_rows must be greater than 0")
        self.send = send
        self.writer = writer
        self.flush_interval_s = flush_interval_s
        self.batch_rows = batch_rows
        self.max_queued_rows = max_queued_rows
        self.name = name
        self.on_closed = on_closed
        #: Told the rows that will never be kept (dropped, or refused by the service, or the disk failed).
        self.on_lost: Callable[[list[dict[str, Any]]], Any] | None = None
        self._setup()
        call_in_forked_child(self._setup)

    def _setup(self) -> None:
        # Also the after-fork hook: a child starts with an empty lane and no thread.
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._wake = threading.Event()
        self._rows: collections.deque[dict[str, Any]] = collections.deque()
        self._sending = 0  # rows taken from the queue and not yet accounted for
        self._inflight: list[dict[str, Any]] | None = None  # the batch the thread is sending, until it claims it
        self._thread: threading.Thread | None = None
        self._closed = False
        self._collected = False  # close() takes what is left: the thread takes no more
        self._deadline: float | None = None
        self.counts: collections.Counter[str] = collections.Counter()
        self.last_error: str | None = None
        self._failing = False  # the last send failed: rows wait for a retry, flush() does not

    def add(self, row: dict[str, Any]) -> bool:
        """Queue one row; False when it was dropped (the lane is full or closed)."""
        with self._lock:
            self.counts["logged"] += 1
            dropped = self._closed or len(self._rows) >= self.max_queued_rows
            if dropped:
                self.counts["dropped"] += 1
            else:
                self._rows.append(row)
                self._ensure_thread()
                full = len(self._rows) >= self.batch_rows
        if dropped:
            self._lost([row])  # the row just logged: the history's last point, forgotten in O(1)
            return False
        if full:
            self._wake.set()
        return True

    def _ensure_thread(self) -> None:
        # Under self._lock.
        if self._thread is not None:
            return
        # None while the interpreter exits: close() writes the rows to disk.
        self._thread = start_daemon(self._run, self.name)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            counts = dict(self.counts)
            queued = len(self._rows) + self._sending
        stats = {k: counts.get(k, 0) for k in ("logged", "stored", "dropped", "failed", "spooled")}
        return {**stats, "queued": queued, "last_error": self.last_error}

    # -- the lane's thread -------------------------------------------------------

    def _take(self) -> list[dict[str, Any]]:
        with self._lock:
            if self._collected:
                return []
            batch = [self._rows.popleft() for _ in range(min(self.batch_rows, len(self._rows)))]
            self._sending += len(batch)
            self._inflight = batch or None
            return batch

    def _claim(self, batch: list[dict[str, Any]]) -> bool:
        """The thread's send returned: True if the batch is still its to account for, False if close() took it."""
        with self._lock:
            if self._inflight is not batch:
                return False
            self._inflight = None
            return True

    def _settle(self, batch: list[dict[str, Any]], outcome: str | None) -> None:
        """Count a batch, or (``None``) put it back at the front to be sent again."""
        with self._lock:
            self._sending -= len(batch)
            self._failing = outcome is None
            if outcome is None:
                self._rows.extendleft(reversed(batch))
            else:
                self.counts[outcome] += len(batch)
            self._changed.notify_all()
        if outcome == "failed":
            self._lost(batch)

    def _lost(self, rows: list[dict[str, Any]]) -> None:
        if self.on_lost is not None:
            try:
                self.on_lost(rows)
            except Exception:  # the sparklines matter less than the lane
                logger.warning("could not forget %d rows that were not kept", len(rows), exc_info=True)

    def _run(self) -> None:
        backoff = 0.0
        while True:
            self._wake.wait(backoff or self.flush_interval_s)
            self._wake.clear()
            while batch := self._take():
                outcome = self._deliver(batch)
                if not self._claim(batch):
                    return  # close() wrote the batch to disk at its deadline; a late success is a harmless replay
                if outcome is None and self._closed:
                    outcome = self._write(batch)  # finishing: what the service did not take goes to disk
                self._settle(batch, outcome)
                if outcome is None:
                    backoff = min(MAX_BACKOFF_S, max(_FIRST_BACKOFF_S, backoff * 2))
                    break
                backoff = 0.0
            with self._lock:
                if self._closed and (self._collected or not self._rows):
                    return

    def _deliver(self, batch: list[dict[str, Any]]) -> str | None:
        if self.send is None:
            return self._write(batch)
        deadline = self._deadline
        timeout = None if deadline is None else max(0.1, deadline - time.monotonic())
        try:
            self.send(batch, timeout)
            return "stored"
        except Exception as err:  # noqa: BLE001  (any failure keeps the rows for the next try)
            self.last_error = f"{type(err).__name__}: {err}"
            status = getattr(err, "status_code", None)
            if (
                isinstance(err, APIError)
                and not isinstance(err, RetryableAPIError)
                and status is not None
                and 400 <= status < 500
                and status not in _NOT_THE_ROWS
            ):
                logger.warning("the service refused %d metrics rows (%s); they are not stored", len(batch), err)
                return "failed"
            logger.debug("metrics upload failed (%s); will retry", self.last_error)
            return None

    def _write(self, batch: list[dict[str, Any]]) -> str:
        """Write rows to the run directory: ``stored`` offline, ``spooled`` online, ``failed`` without a disk."""
        if self.writer is None:
            return "failed"
        try:
            writer = self.writer()
            writer.append([Frame([orjson.dumps(row) for row in batch])])
        except Exception as err:  # noqa: BLE001  (a disk that fails loses these rows, never the lane)
            self.last_error = f"could not write {len(batch)} metrics rows to disk: {err}"
            logger.warning("%s", self.last_error)
            return "failed"
        return "spooled" if self.send is not None else "stored"

    def flush(self, deadline: float | None) -> bool:
        """Wait until every row added before the call is accounted for; False at once while sends fail."""
        self._wake.set()
        with self._lock:
            while self._rows or self._sending:
                if self._failing:
                    return False
                remaining = None if deadline is None else deadline - time.monotonic()
                if (remaining is not None and remaining <= 0) or self._thread is None or not self._thread.is_alive():
                    return False
                self._changed.wait(wait_slice(remaining))
            return True

    # -- finishing ---------------------------------------------------------------

    def finish_by(self, deadline: float) -> None:
        """From now on no row is taken, and what is queued is sent now; returns at once."""
        with self._lock:
            self._closed = True
            self._deadline = deadline
        self._wake.set()

    def close(self, deadline: float) -> None:
        """Send until ``deadline`` (monotonic); then write what is left to disk. Bounded.

        A send still in flight at the deadline is not waited for: its rows are
        written to disk with the rest (the service may still take them; every
        row has a step, so the sync's replay changes nothing). A batch the
        thread is writing to disk is waited for, up to ``_DISK_GRACE_S`` more.
        """
        self.finish_by(deadline)
        with self._lock:
            self._wait(deadline, lambda: self._rows or self._sending)
            self._collected = True
            taken = self._inflight if self.send is not None else None
            if taken is not None:
                self._inflight = None  # already counted in _sending; the thread will not account for it
            # A batch the thread is writing to disk now is its own: let it finish (a disk is quick or broken).
            writing = len(taken) if taken is not None else 0
            self._wait(time.monotonic() + _DISK_GRACE_S, lambda: self._sending > writing)
            left = list(self._rows)
            self._rows.clear()
            self._sending += len(left)
            if taken is not None:
                left[:0] = taken
        if left:
            self._settle(left, self._write(left))
        if self.on_closed is not None:
            try:
                self.on_closed()
            except Exception:
                logger.warning("closing the metrics lane failed", exc_info=True)

    def _wait(self, deadline: float, busy: Callable[[], Any]) -> None:
        # Under self._lock: while busy(), until the deadline passes or the thread is gone.
        while busy():
            remaining = deadline - time.monotonic()
            alive = self._thread is not None and self._thread.is_alive()
            if remaining <= 0 or not alive:
                return
            self._changed.wait(wait_slice(remaining))
