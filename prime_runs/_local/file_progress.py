"""What ``sync.json`` records of one segment file, and what a sync would still send of it.

A sync's progress on a file is its leading lines ``done``, the lines set
aside, the points where a batch must end, and spans stored out of order or
unreadable; :class:`FileProgress` holds them, loads and dumps them, and
answers which lines are never to be sent (again). ``pending`` says what of a
scanned segment is left, for ``prime-runs ls`` and the sync's own summary.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prime_runs._local.segment_reader import Scan

Span = tuple[int, int]  # lines [start, end)


@dataclass
class FileProgress:
    """What ``sync.json`` records of one segment.

    ``done``: the leading lines uploaded or set aside. ``horizon``: where the
    current pass ends. ``excluded``: lines set aside (refused). ``cuts``: where
    a batch must end. ``uploaded``: spans past ``done`` that were stored out of
    order (a batch before them failed). ``unreadable``: spans of entries that
    do not decode.
    """

    done: int = 0
    horizon: int | None = None
    excluded: set[int] = field(default_factory=set)
    cuts: set[int] = field(default_factory=set)
    uploaded: list[Span] = field(default_factory=list)
    unreadable: list[Span] = field(default_factory=list)

    @classmethod
    def load(cls, raw: Any) -> FileProgress:
        if not isinstance(raw, dict):
            return cls()
        horizon = raw.get("horizon")
        return cls(
            int(raw.get("done", 0)),
            int(horizon) if isinstance(horizon, int) else None,
            {int(n) for n in raw.get("excluded", [])},
            {int(n) for n in raw.get("cuts", [])},
            [(int(a), int(b)) for a, b in raw.get("uploaded", [])],
            [(int(a), int(b)) for a, b in raw.get("unreadable", [])],
        )

    def dump(self) -> dict[str, Any]:
        return {
            "done": self.done,
            "horizon": self.horizon,
            "excluded": sorted(self.excluded),
            "cuts": sorted(self.cuts),
            "uploaded": sorted(self.uploaded),
            "unreadable": sorted(self.unreadable),
        }

    def skip_test(self) -> Callable[[int], bool]:
        """A test of whether a line is never to be sent (again), fixed at the time of the call."""
        spans = _merged([*self.uploaded, *self.unreadable])
        starts = [a for a, _ in spans]
        excluded = frozenset(self.excluded)

        def skipped(number: int) -> bool:
            at = bisect.bisect_right(starts, number) - 1
            return number in excluded or (at >= 0 and number < spans[at][1])

        return skipped

    def advance(self, done: int) -> None:
        self.done = max(self.done, done)
        self.excluded = {n for n in self.excluded if n >= self.done}
        self.cuts = {n for n in self.cuts if n > self.done}
        self.uploaded = [(a, b) for a, b in self.uploaded if b > self.done]

    def not_sent(self, total: int) -> int:
        """Lines from ``done`` to ``total`` that a sync would still send."""
        spans = _merged([*self.uploaded, *self.unreadable])
        starts = [a for a, _ in spans]
        skipped = sum(max(0, min(b, total) - max(a, self.done)) for a, b in spans)
        for n in self.excluded:
            at = bisect.bisect_right(starts, n) - 1
            if self.done <= n < total and not (at >= 0 and n < spans[at][1]):
                skipped += 1
        return max(0, total - self.done - skipped)

    def unreadable_lines(self) -> int:
        return sum(b - a for a, b in _merged(self.unreadable))


def _merged(spans: list[Span]) -> list[Span]:
    out: list[Span] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def pending(found: Scan, progress: FileProgress) -> tuple[int, int]:
    """Records of a segment not uploaded yet (unreadable ones excluded), and (about) their uncompressed bytes."""
    records = progress.not_sent(found.lines)
    size = first = 0
    for entry in found.entries:
        if first + entry.lines > progress.done:
            size += entry.raw_bytes
        first += entry.lines
    return records, size if records else 0
