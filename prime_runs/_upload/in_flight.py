"""What the upload worker has taken from its queue and not yet accounted for.

A claim is one ledger per sink, keyed by the seq of the first write it
covers. The worker registers a claim for each part of a take (under the
queue's lock, so that ``close()`` sees the records the moment they leave
the queue), swaps those for one claim per group of one line format before
it hands them to the sinks, and lets go of each once the sinks have settled
its records. At its deadline ``close()`` closes every claim still held:
nothing taken is ever in limbo. Thread-safe: two writes may be in progress
at once (:mod:`prime_runs._upload.lanes`), and ``close()`` runs on the caller's
thread.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Sequence

from prime_runs._records.accounting import Accounting
from prime_runs._records.ledger import Ledger, Origins
from prime_runs._upload.delivery import Group
from prime_runs._upload.queue import Write


class InFlight:
    """The ledgers of the records taken and not yet settled, by the key of their write or group."""

    def __init__(self, sinks: Sequence[str], accounting: Accounting) -> None:
        self._sinks = list(sinks)
        self._accounting = accounting
        self._lock = threading.Lock()
        self._held: dict[int, list[Ledger]] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)

    def keys(self) -> list[int]:
        with self._lock:
            return list(self._held)

    def _ledgers(self, records: int, origins: Origins | None) -> list[Ledger]:
        return [Ledger(self._accounting, sink, records, origins) for sink in self._sinks]

    def claim(self, writes: list[Write]) -> None:
        """Claim one part of a take (the queue's ``on_take``: under its lock, no user code)."""
        # A claim only counts the records (close() or abandon() closes it, regroup() swaps it
        # for ledgers that know each record's origin), so it needs no Origins.
        records = sum(w.count for w in writes)
        with self._lock:
            self._held[writes[0].seq] = self._ledgers(records, None)

    def regroup(self, writes: list[Write]) -> list[Group]:
        """Swap the claims on ``writes`` for one per group; [] when close() took them meanwhile."""
        groups = Group.of(writes)
        with self._lock:
            # One claim per part the queue handed over, keyed by its first write; close() clears all at once.
            claims = [self._held.pop(w.seq, None) for w in writes]
            if all(claim is None for claim in claims):
                return []
            for group in groups:
                self._held[group.key] = self._ledgers(group.count, group.origins)
        return groups

    def register(self, groups: list[Group]) -> list[tuple[Group, list[Ledger]]]:
        """Claim groups that were never taken (the writes left queued at close), each with its ledgers."""
        with self._lock:
            for group in groups:
                self._held[group.key] = self._ledgers(group.count, group.origins)
            return [(group, self._held[group.key]) for group in groups]

    def get(self, key: int) -> list[Ledger] | None:
        """The ledgers of a claim; None once ``close()`` closed it."""
        with self._lock:
            return self._held.get(key)

    def release(self, key: int) -> None:
        """The claim's records are settled: let go of it."""
        with self._lock:
            self._held.pop(key, None)

    def abandon(self, writes: list[Write], reason: str) -> collections.Counter[str]:
        """Close the claims on ``writes`` (by their seqs) as lost for ``reason``; what each sink lost."""
        with self._lock:
            claims = [self._held.pop(w.seq) for w in writes if w.seq in self._held]
        lost: collections.Counter[str] = collections.Counter()
        for ledgers in claims:
            for ledger in ledgers:
                lost[ledger.sink] += ledger.close(reason)
        return lost

    def close_all(self, reasons: Sequence[str]) -> None:
        """Close every claim still held, each sink's ledger for its reason in ``reasons`` (by sink)."""
        with self._lock:
            for ledgers in self._held.values():
                for ledger, reason in zip(ledgers, reasons):
                    ledger.close(reason, keep_reasons=False)
            self._held.clear()

    def in_flight_records(self) -> int:
        """Records taken and not yet settled (in the first sink)."""
        with self._lock:
            return sum(ledger.remaining for ledgers in self._held.values() for ledger in ledgers[:1])
