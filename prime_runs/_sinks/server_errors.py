"""What a 500 means for a batch: the service's fault until a bisection locates one record.

A 500 says the service failed; it does not say which record, if any, it
failed on. So a batch answered 500 is never rejected outright:

- The first 500 of a batch sends it once more as it was (a replay, if the
  service had stored it before failing).
- A second 500 splits it in two halves, each sent on its own. A half
  answered 500 while its sibling was not sent yet waits behind the sibling
  (that wait is its replay).
- Only a half answered 500 twice while its sibling was stored is about its
  records: it is split again, down to one record, which is then rejected
  (``rejected:http_500``): located, its neighbours stored.
- When both halves of a split are answered 500, or a batch of one record
  with no sibling is, the service is failing, whatever the records: an
  outage (the records wait on disk, the service is probed, the uploads
  resume), never a rejection.

Batches are named by their records' indexes in the write, so the
bookkeeping holds across the groups the write is uploaded in.
"""

from __future__ import annotations

import collections
import enum

Key = tuple[int, ...]


class Verdict(enum.Enum):
    """What to do with a batch just answered 500."""

    REPLAY = "replay"  # send it again as it was, now
    BEHIND_SIBLING = "behind_sibling"  # send it again after its sibling has been answered
    SPLIT = "split"  # send its two halves
    REJECT = "reject"  # one record, located: its sibling was stored
    OUTAGE = "outage"  # the service is failing: the records wait, as in any outage


class ServerErrors:
    """The 500s of one write: how often each batch got one, the halves of each split, which were stored."""

    def __init__(self) -> None:
        self._answers: collections.Counter[Key] = collections.Counter()
        self._sibling: dict[Key, Key] = {}
        self._stored: set[Key] = set()

    def stored(self, key: Key) -> None:
        """A batch was stored; if it was a half, its sibling's 500s now locate a record."""
        if key in self._sibling:
            self._stored.add(key)

    def verdict(self, key: Key) -> Verdict:
        """A batch (its records' indexes) was just answered 500."""
        self._answers[key] += 1
        sibling = self._sibling.get(key)
        if sibling is not None and sibling not in self._stored:
            if self._answers[sibling] == 0:
                return Verdict.BEHIND_SIBLING
            self._forget(key)  # both halves failed: whatever comes after the outage starts afresh
            return Verdict.OUTAGE
        if self._answers[key] < 2:
            return Verdict.REPLAY
        if len(key) > 1:
            return Verdict.SPLIT
        return Verdict.REJECT if sibling is not None else Verdict.OUTAGE

    def sibling(self, key: Key) -> Key | None:
        """The other half of the split ``key`` came from (``None``: not a half)."""
        return self._sibling.get(key)

    def halves(self, key: Key) -> tuple[Key, Key]:
        """Split a batch in two, each the other's sibling."""
        middle = len(key) // 2
        first, second = key[:middle], key[middle:]
        self._sibling[first], self._sibling[second] = second, first
        return first, second

    def _forget(self, key: Key) -> None:
        sibling = self._sibling.pop(key, None)
        if sibling is not None:
            self._sibling.pop(sibling, None)
            self._answers.pop(sibling, None)
        self._answers.pop(key, None)
