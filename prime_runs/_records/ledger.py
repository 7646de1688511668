"""The ledger through which a sink accounts for each record of a write.

A sink (:mod:`prime_runs._records.sink`) stores the records of one write somewhere (the Traces service, a
local directory) and reports, record by record, what became of them into a
:class:`Ledger`: stored; rejected for its own fault (kept aside on disk,
never retried); failed for good; or undelivered, when the sink could not
store it for a reason that is not the record's (the service failed, the
deadline came). Undelivered records are what the worker spools to the run
directory, so a later ``prime-runs sync`` uploads them.

The ledger is what makes the accounting identity hold even at the deadline:
once the worker gives up on a write, it closes the ledger, the records not
yet accounted for are counted with their reason, and anything the sink
reports later is ignored.
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from prime_runs._records.accounting import Accounting

_OPEN, _SETTLED, _UNDELIVERED = 0, 1, 2


@dataclass(frozen=True)
class Rejection:
    """A record refused for its own fault: its index in the write, the reason and the message."""

    index: int
    reason: str
    message: str
    #: The service refused it (``prime-runs sync --retry-rejected`` sends it again), not a local rule.
    by_service: bool = False


@dataclass(frozen=True)
class Undelivered:
    """Records a sink could not store, not for their own fault.

    ``batch``: they went out as one upload whose fate is unknown, with the
    idempotency ``key`` it had (when the sink knows it).
    """

    indexes: tuple[int, ...]
    reason: str
    batch: bool = False
    key: str | None = None


#: The caller's method, by line format, for messages that say which call a record came from.
METHODS = {"episode": "log_episodes", "trace": "log_traces"}


class Origins:
    """Which call, and which item of the caller's list, each record of a write came from.

    Writes are merged before they reach a sink; ``add`` records where each
    one starts, so a message can say ``log_episodes call 12, item 3``.
    """

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._calls: list[tuple[str, int, int]] = []

    def add(self, start: int, line_format: str | None, call: int, first_item: int = 0) -> None:
        """Records from ``start`` on are ``call``'s, from its item ``first_item`` on."""
        self._starts.append(start)
        self._calls.append((METHODS.get(line_format or "", "submit"), call, first_item))

    def where(self, index: int) -> str | None:
        at = bisect.bisect_right(self._starts, index) - 1
        if at < 0:
            return None
        method, call, first_item = self._calls[at]
        return f"{method} call {call}, item {index - self._starts[at] + first_item}"


class Ledger:
    """Per write and sink: the fate of each record (by its index in the write), until closed. Thread-safe.

    With ``origins``, the messages of records refused for their own fault
    say which call and item of the caller's list each record was.
    """

    def __init__(self, accounting: Accounting, sink: str, records: int, origins: Origins | None = None) -> None:
        self._accounting = accounting
        self.sink = sink
        self.records = records
        self.origins = origins
        #: The first message of a record lost for its own fault (for errors raised to the caller).
        self.first_detail: str | None = None
        #: Records not yet stored, rejected, failed or spooled.
        self.remaining = records
        #: What this write lost in this sink, by reason (for error reporting).
        self.failures: Counter[str] = Counter()
        #: Records refused for their own fault, to be kept aside.
        self.rejections: list[Rejection] = []
        self._undelivered: list[Undelivered] = []
        self._state = bytearray(records)
        self._lock = threading.Lock()
        self._closed = False
        #: Called by a sink (at most once) when every record of its write is encoded and only the
        #: write's last uploads are left to wait for: the worker may start the next write then.
        self.on_encoded: Callable[[], Any] | None = None
        #: Set by the worker on the last sink's ledger: no sink reads the write's records after this one,
        #: so it lets go of each record once it is stored or encoded onto disk (the caller's objects are
        #: freed then, not when the whole write is done).
        self.last_reader = False
        #: The records below this index have been measured by the run's size meter (an upload's first
        #: pass measures a prefix of its write): whoever encodes them again (the spool, when they are kept
        #: on disk) does not measure them twice, so the meter keeps following the newest records.
        self.measured = 0

    def encoded(self) -> None:
        """Tell the worker that this write needs no more encoding for now (see :attr:`on_encoded`)."""
        on_encoded, self.on_encoded = self.on_encoded, None
        if on_encoded is not None:
            on_encoded()

    def _settle(self, indexes: Iterable[int], accept: tuple[int, ...] = (_OPEN,)) -> list[int]:
        # Under the lock: the indexes that were in one of ``accept``, now settled.
        taken: list[int] = []
        if self._closed:
            return taken
        state = self._state
        for index in indexes:
            if 0 <= index < self.records and state[index] in accept:
                state[index] = _SETTLED
                taken.append(index)
        self.remaining -= len(taken)
        return taken

    def stored(self, indexes: Iterable[int], bytes_sent: int = 0) -> None:
        with self._lock:
            taken = self._settle(indexes)
        if taken:
            self._accounting.count_stored(self.sink, len(taken), bytes_sent)

    def locate(self, index: int, record_id: str | None = None) -> str:
        """``record 'ep-7' (log_episodes call 12, item 3)``: the record, as the caller knows it."""
        where = self.origins.where(index) if self.origins is not None else None
        where = where or f"item {index} of the write"
        return f"record {record_id!r} ({where})" if record_id else f"the record at {where}"

    def failed(self, indexes: Iterable[int], reason: str, message: str | None = None) -> None:
        """Lost for good (there is nowhere to keep them); ``message`` says why, about the first."""
        with self._lock:
            taken = self._settle(indexes, (_OPEN, _UNDELIVERED))
            if taken:
                self.failures[reason] += len(taken)
        if taken:
            detail = f"{self.locate(taken[0])}: {message}" if message else None
            self.first_detail = self.first_detail or detail
            self._accounting.count_failed(self.sink, len(taken), reason, detail)

    def rejected(
        self, index: int, reason: str, message: str, record_id: str | None = None, *, by_service: bool = False
    ) -> None:
        """Refused for its own fault (invalid, or refused by the service): counted failed, kept aside.

        ``message`` says why (``traces[0].logprobs[17] is NaN...``); the ledger
        prefixes it with the record's id, call and position.
        """
        detail = f"{self.locate(index, record_id)}: {message}"
        with self._lock:
            taken = self._settle((index,))
            if taken:
                self.failures[reason] += 1
                self.rejections.append(Rejection(index, reason, detail, by_service))
                self.first_detail = self.first_detail or detail
        if taken:
            self._accounting.count_failed(self.sink, 1, reason, detail)

    def undelivered(self, indexes: Iterable[int], reason: str, *, batch: bool = False, key: str | None = None) -> None:
        """Not stored, not for the records' fault: to be spooled (or failed with ``reason``)."""
        with self._lock:
            if self._closed:
                return
            marked = []
            for index in indexes:
                if 0 <= index < self.records and self._state[index] == _OPEN:
                    self._state[index] = _UNDELIVERED
                    marked.append(index)
            if marked:
                self._undelivered.append(Undelivered(tuple(marked), reason, batch, key if batch else None))

    def spooled(self, indexes: Iterable[int], reason: str) -> None:
        """Written to the run directory, for ``prime-runs sync`` to upload; ``reason`` says why."""
        with self._lock:
            taken = self._settle(indexes, (_OPEN, _UNDELIVERED))
        if taken:
            self._accounting.count_spooled(self.sink, len(taken), reason)

    def take_rejections(self) -> list[Rejection]:
        """The rejections not taken yet (each is handed out once)."""
        with self._lock:
            taken, self.rejections = self.rejections, []
            return taken

    def take_undelivered(self, reason: str) -> list[Undelivered]:
        """What is left to spool: what the sink marked undelivered, then every open record (as ``reason``)."""
        with self._lock:
            if self._closed:
                return []
            left = []
            for group in self._undelivered:
                still = tuple(i for i in group.indexes if self._state[i] == _UNDELIVERED)
                if still:
                    whole = group.batch and still == group.indexes
                    left.append(Undelivered(still, group.reason, whole, group.key if whole else None))
            opened = tuple(i for i in range(self.records) if self._state[i] == _OPEN)
            if opened:
                left.append(Undelivered(opened, reason))
            return left

    def close(self, reason: str, *, keep_reasons: bool = True) -> int:
        """Count every record not yet accounted for as failed, and ignore later reports.

        Undelivered records keep the reason they were marked with, unless
        ``keep_reasons`` is false; the others get ``reason``.
        """
        with self._lock:
            if self._closed:
                return 0
            lost: Counter[str] = Counter()
            if keep_reasons:
                for group in self._undelivered:
                    for index in group.indexes:
                        if self._state[index] == _UNDELIVERED:
                            self._state[index] = _SETTLED
                            lost[group.reason] += 1
            lost[reason] += self.records - self._state.count(_SETTLED)
            self._closed = True
            self.remaining = 0
            lost = +lost
            self.failures.update(lost)
        for why, count in lost.items():
            self._accounting.count_failed(self.sink, count, why)
        return sum(lost.values())

    @property
    def closed(self) -> bool:
        return self._closed
