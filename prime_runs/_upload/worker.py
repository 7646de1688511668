"""The UploadWorker: one daemon thread between ``log_episodes`` and the sinks."""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from prime_runs._records import reasons
from prime_runs._records.accounting import Accounting, LossListener
from prime_runs._records.ledger import METHODS
from prime_runs._records.sink import Sink
from prime_runs._records.size_meter import SizeMeter
from prime_runs._upload import switch_interval
from prime_runs._upload.delivery import Delivery, Group
from prime_runs._upload.in_flight import InFlight
from prime_runs._upload.lanes import Lane, Lanes
from prime_runs._upload.queue import RecordQueue, Write
from prime_runs._upload.settings import WorkerSettings
from prime_runs.errors import SinkError
from prime_traces.threads import call_in_forked_child, run_in_daemon, start_daemon

logger = logging.getLogger(__name__)

#: How long close() waits, past its deadline, for the write in progress to account for itself.
ACCOUNTING_GRACE_S = 0.8


class UploadWorker:
    """Hands submitted records to sinks on daemon threads; ``submit`` never blocks.

    ``submit`` costs O(1) in the size of the records: it takes a lock for
    bookkeeping only, and drops (and counts, with the reason) a write that
    does not fit the queue, which is bounded by records and by estimated
    bytes (:class:`~prime_runs._upload.settings.WorkerSettings` has the
    knobs). The worker takes up to ``write_cap_bytes`` at a time and hands it
    to the sinks through :class:`~prime_runs._upload.delivery.Delivery` (retirement,
    spooling, setting aside), each write on a thread of its own: the next
    write is encoded while the last one's final batches upload, two at most
    (:mod:`prime_runs._upload.lanes`). ``on_error`` hears of records that failed,
    ``on_loss`` of every record lost (see ``Accounting``), and ``tick`` runs
    every ``tick_interval_s`` on the worker thread. While the thread has
    writes to handle (not while it waits for them), the interpreter's switch
    interval is lowered to ``switch_interval_s`` if higher (``None``: left
    alone; see :mod:`prime_runs._upload.switch_interval`).
    ``flush`` and ``close`` wait up to their timeout; ``close`` then cancels
    the sinks, spools everything left within ``spill_timeout_s`` more, and
    accounts for the rest, so ``submitted = stored + dropped + failed +
    spooled`` holds per sink. The threads are daemons and are never joined:
    the process can always exit.

    Usage::

        worker = UploadWorker([TracesSink(client, stamp, context)])
        worker.submit(episodes, line_format="episode")   # never blocks
        worker.close(timeout_s=60)       # bounded
    """

    def __init__(
        self,
        sinks: Iterable[Sink],
        settings: WorkerSettings | None = None,
        *,
        size_meter: SizeMeter | None = None,
        on_error: Callable[[SinkError], Any] | None = None,
        on_loss: LossListener | None = None,
        tick: Callable[[], Any] | None = None,
        name: str = "prime-runs-upload",
    ) -> None:
        self.sinks = list(sinks)
        names = [s.name for s in self.sinks]
        if len(set(names)) != len(names):
            raise ValueError(f"sink names must be unique, got {names}")
        self.settings = settings if settings is not None else WorkerSettings()
        self.meter = size_meter or SizeMeter()
        self._on_error = on_error
        self._on_loss = on_loss
        self._tick = tick
        self.name = name
        self._setup()
        call_in_forked_child(self._setup)

    @property
    def spill_timeout_s(self) -> float:
        return self.settings.spill_timeout_s

    def _setup(self) -> None:
        # Also the after-fork hook: a child gets an empty queue, fresh locks and
        # no thread, so nothing the parent queued is uploaded twice.
        settings = self.settings
        self.accounting = Accounting([s.name for s in self.sinks], self._on_loss)
        self._queue = RecordQueue(settings.max_queued_records, settings.max_queued_bytes, self.meter)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._switch_hold = switch_interval.BusyHold(settings.switch_interval_s)
        self._lanes = Lanes(self.name, self._queue.done, self._queue.wake)
        self._in_flight = InFlight([s.name for s in self.sinks], self.accounting)
        self.delivery = Delivery(self.sinks, self._on_error)
        for sink in self.sinks:
            # What a sink uploads from its spool once the service is back counts as stored.
            sink.count_resynced(functools.partial(self.accounting.count_resynced, sink.name))
            sink.watch_pressure(self._queue.pressure, self._queue.memory_pressure)

    # -- the caller's side ---------------------------------------------------

    def submit(self, records: Sequence[Any] | Iterable[Any], *, line_format: str) -> bool:
        """Queue ``records`` (``line_format`` ``"episode"`` or ``"trace"``); ``False`` means dropped (counted).

        The records are copied (the references, not the objects), so the caller
        may clear or refill its list as soon as this returns.
        """
        started = time.perf_counter()
        # Even a list is copied: a training loop logs its buffer, then clears
        # it while the write still waits. O(count), never O(bytes).
        records = list(records)
        count = len(records)
        if not count:
            return True
        accepted, reason, call = self._queue.put(records, line_format)
        if accepted:
            self._ensure_thread()
        else:
            self.accounting.count_drop(count, reason or "dropped", self._drop_detail(count, reason, line_format, call))
        self.accounting.count_submit(count, time.perf_counter() - started)
        return accepted

    def _drop_detail(self, count: int, reason: str | None, line_format: str, call: int) -> str:
        what = f"{METHODS.get(line_format, 'submit')} call {call} ({count} records)"
        if reason == reasons.CLOSED:
            return f"{what} came after finish(): its records are not logged"
        queue = self._queue
        held = queue.queued_records + queue.taken_records
        return (
            f"{what} dropped: the upload queue is full ({queue.queued_records} records queued, {held} held, "
            f"~{queue.held_bytes / 1e6:.0f} MB; max_queued_records={queue.max_records}, "
            f"max_queued_bytes={queue.max_bytes}); the service is slower than the run logs"
        )

    def start(self) -> None:
        """Start the worker thread now (it otherwise starts with the first write)."""
        self._ensure_thread()

    def _ensure_thread(self) -> None:
        if self._thread is not None:
            return
        with self._lock:
            if self._thread is not None or self._queue.closed:
                return
            # None while the interpreter exits: close() accounts for the queue.
            self._thread = start_daemon(self._run, self.name)

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until everything submitted before the call is accounted for."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        return self._queue.wait_done(self._queue.last_seq(), deadline)

    def stop_waiting(self) -> None:
        """``flush`` and ``close`` stop waiting for the sinks now: ``close`` goes on to spool what is left."""
        self._queue.interrupt()
        for sink in self.sinks:
            sink.stop_waiting()

    def spill_first(self) -> None:
        """Finishing on a signal: what the uploading sinks have not stored goes to their spools now.

        Uploads in flight are abandoned (kept as the very batches they were, so
        re-sending them replays), the queue is written to disk at disk speed,
        and the sinks upload from there for what is left of ``close()``'s time.
        A sink that writes to disk itself goes on as it was.
        """
        if self.delivery.spill_deadline is None:
            self.delivery.spill_deadline = time.monotonic() + self.settings.spill_timeout_s
        for sink in self.sinks:
            if sink.spill_first():
                self.delivery.halt(sink)

    def close(self, timeout_s: float | None = None) -> bool:
        """Flush up to ``timeout_s``, then cancel, spool what is left and account for the rest.

        Returns True when everything was handled before the deadline. Returns
        within ``timeout_s``, plus ``spill_timeout_s`` when something is left
        to spool, plus about a second, whatever the sinks and the disk do: the
        spooling runs on the worker's threads and on a helper, never here.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        # From here on a write is refused (and counted): what this waits for cannot grow.
        self._queue.refuse()
        flushed = self._queue.wait_done(self._queue.last_seq(), deadline)
        if flushed:
            for sink in self.sinks:  # a sink still uploading what it kept during an outage gets the time left
                sink.wait_for_resync(deadline)
        spools = any(sink.spool is not None for sink in self.sinks)
        spill_deadline = time.monotonic() + (self.settings.spill_timeout_s if spools else 0.0)
        if not flushed:
            self.delivery.spill_deadline = spill_deadline  # spooling must end by then
            self.delivery.cancel_all()
        left = self._queue.close()
        kept = self._keep_left(left) if left else None
        waited_until = spill_deadline + ACCOUNTING_GRACE_S
        # Not cut short by stop_waiting(): this is the spooling, bounded by spill_timeout_s.
        self._queue.wait_done(self._queue.taken_seq(), waited_until, interruptible=False)
        if kept is not None:
            kept.wait(max(0.0, waited_until - time.monotonic()))
        self._in_flight.close_all(
            [reasons.SPILL_TIMEOUT if sink.spool is not None else reasons.DEADLINE for sink in self.sinks]
        )
        self._queue.mark_all_done()
        self._switch_hold.drop(for_good=True)
        self._report_drops()
        for sink in self.sinks:
            try:
                sink.close()
            except Exception:  # closing must never raise into finish()
                logger.warning("closing sink %s failed", sink.name, exc_info=True)
        return flushed

    def _keep_left(self, left: list[Write]) -> threading.Event:
        """Spool the writes still queued at close, on a daemon helper; the event is set when it is done."""
        # Grouped by line format: one fsync for many small writes.
        # Registered first: what the deadline finds unfinished, close() accounts for.
        entries = self._in_flight.register(Group.of(left))
        for _, ledgers in entries:
            ledgers[-1].last_reader = True

        def keep() -> None:
            try:
                for group, ledgers in entries:
                    for sink, ledger in zip(self.sinks, ledgers):
                        self.delivery.keep(sink, group.records, group.line_format, ledger, reasons.DEADLINE)
                    self._in_flight.release(group.key)
            except Exception:  # what is not kept is accounted for by close()
                logger.warning("keeping the writes left at close failed", exc_info=True)

        return run_in_daemon(keep, f"{self.name}-keep")

    def stats(self) -> dict[str, Any]:
        """Queued, stored, dropped, failed by sink and reason, submit latency; the bytes the held records take.

        ``held_bytes`` in JSON, ``held_memory_bytes`` as Python objects (by the meter's measured expansion).
        """
        snap = self.accounting.snapshot()
        queue = self._queue
        snap.update(
            queued_records=queue.queued_records,
            queued_bytes=int(queue.queued_bytes),
            held_bytes=int(queue.held_bytes),
            held_memory_bytes=int(queue.held_bytes * self.meter.expansion),
            peak_held_bytes=int(queue.peak_held_bytes),
            in_flight_records=self._in_flight.in_flight_records(),
            retired_sinks=sorted(self.delivery.retired),
        )
        for sink in self.sinks:
            snap["sinks"][sink.name].update(sink.stats())
        return snap

    @property
    def retired(self) -> set[str]:
        """The names of the sinks retired for the rest of the run."""
        return self.delivery.retired

    @property
    def dropped_records(self) -> int:
        return self.accounting.dropped_total

    @property
    def failed_records(self) -> dict[str, int]:
        """Records not stored, per sink (drops excluded)."""
        return self.accounting.failed_by_sink()

    # -- the worker thread -----------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            self._switch_hold.drop()

    def _loop(self) -> None:
        next_tick = time.monotonic() + self.settings.tick_interval_s
        while True:
            timeout = max(0.0, next_tick - time.monotonic()) if self._tick is not None else None
            writes: list[Write] = []
            handed = False
            self._lanes.wait_for_room()  # at most two writes' records are held, the queue's aside
            busy = self._lanes.busy()
            if not self._queue.queued_records and not busy:
                self._switch_hold.drop()  # nothing to encode until the next write: the caller's threads run as set
            try:
                # While a write is still in progress, the wait ends when it is done too: the hold is dropped then.
                idle = (lambda: not self._lanes.busy()) if busy else None
                writes = self._queue.take(
                    self.settings.write_cap_bytes, timeout, on_take=self._in_flight.claim, stop_waiting=idle
                )
                if writes:
                    self._switch_hold.take()
                self._report_drops()
                if writes:
                    handed = True  # from here on the lane accounts for the writes, and marks them done
                    self._lanes.run(writes, functools.partial(self._write, writes))
            except Exception as err:  # the thread must outlive any one write
                logger.exception("upload worker failed on a write; its records are counted as failed")
                if not handed:
                    self._abandon(reasons.crash(reasons.WORKER_ERROR, err), writes)
            if not handed:
                self._lanes.done_in_order(writes)
            if self._tick is not None and time.monotonic() >= next_tick:
                next_tick = time.monotonic() + self.settings.tick_interval_s
                self._run_tick()
            if not writes and self._queue.closed and not self._queue.queued_records:
                return

    def _write(self, writes: list[Write], lane: Lane) -> None:
        """Hand ``writes`` to the sinks, on their lane; the next write may start once the last group is encoded."""
        try:
            groups = self._in_flight.regroup(writes)
            for n, group in enumerate(groups):
                self._process(group, lane.encoded.set if n == len(groups) - 1 else None)
        except BaseException as err:
            logger.exception("upload worker failed on a write; its records are counted as failed")
            self._abandon(reasons.crash(reasons.WORKER_ERROR, err), writes)

    def _abandon(self, reason: str, writes: list[Write]) -> None:
        # The worker's claims are keyed by the seqs of the writes it took (a group by its first);
        # close()'s helper registers others, left alone here.
        lost = self._in_flight.abandon(writes, reason)
        self.delivery.report_failures({sink: {reason: n} for sink, n in lost.items() if n})

    def _run_tick(self) -> None:
        try:
            assert self._tick is not None
            self._tick()
        except Exception:  # a periodic hook must not kill the worker
            logger.warning("periodic run update failed", exc_info=True)

    def _process(self, group: Group, on_encoded: Callable[[], Any] | None) -> None:
        ledgers = self._in_flight.get(group.key)
        if ledgers is None:  # closed at the deadline meanwhile
            return
        # Only the last sink may let the next write start early: the sinks before it write in order.
        ledgers[-1].on_encoded = on_encoded
        ledgers[-1].last_reader = True
        self.delivery.deliver(group.records, group.line_format, ledgers)
        self._in_flight.release(group.key)

    def _report_drops(self) -> None:
        burst = self._queue.take_burst()
        if burst is not None:
            reasons = ", ".join(f"{n} ({r})" for r, n in burst.reasons.items())
            logger.warning(
                "dropped %d records in %d writes because the upload queue was full: %s; "
                "raise max_queued_records / max_queued_bytes or log less often",
                burst.records,
                burst.writes,
                reasons,
            )
