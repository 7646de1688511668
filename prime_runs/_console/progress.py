"""Progress of a long upload on a terminal: done of total, rate and time left.

On a terminal one line is rewritten in place, a few times a second; anywhere
else (a log file, CI) a plain line is printed now and then, so logs stay
readable.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

TTY_INTERVAL_S = 0.2
PLAIN_INTERVAL_S = 10.0


def human_bytes(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(size) < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


def backlog_status(stats: Mapping[str, Any], sink: str = "traces") -> str:
    """What waits where while the uploads are behind, from ``run.stats()``: on disk, its drain rate, in memory."""
    counts = stats["sinks"].get(sink, {})
    return (
        f"{counts.get('spooled', 0)} wait on disk, uploaded from there at "
        f"{human_bytes(counts.get('drain_bytes_per_s', 0.0))}/s; {stats['queued_records']} in memory "
        f"(~{human_bytes(stats['held_memory_bytes'])})"
    )


def human_duration(seconds: float) -> str:
    seconds = max(0, int(seconds + 0.5))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class Progress:
    """Records and bytes done of a total; ``advance`` from one thread.

    Usage::

        progress = Progress("run-1", stream=sys.stderr)
        progress.start(records=300, size=2_000_000)
        progress.advance(100, 700_000)
        progress.close()
    """

    def __init__(
        self, label: str, *, stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock
        isatty = getattr(self.stream, "isatty", None)
        self.tty = bool(isatty and isatty())
        self.interval_s = TTY_INTERVAL_S if self.tty else PLAIN_INTERVAL_S
        self.records_total = self.size_total = 0
        self.records = self.size = 0
        self._started = self._shown = clock()
        self._drawn = False
        self._last: str | None = None

    def start(self, records: int, size: int) -> None:
        self.records_total, self.size_total = records, size
        self._started = self._shown = self.clock()
        if records and self.tty:
            self._show()

    def advance(self, records: int, size: int) -> None:
        self.records += records
        self.size += size
        if self.clock() - self._shown >= self.interval_s:
            self._show()

    def line(self) -> str:
        elapsed = max(1e-9, self.clock() - self._started)
        rate = self.size / elapsed
        text = (
            f"{self.label}: {self.records}/{self.records_total} records, "
            f"{human_bytes(self.size)}/{human_bytes(self.size_total)}, {human_bytes(rate)}/s"
        )
        if 0 < self.size < self.size_total and rate > 0:
            text += f", {human_duration((self.size_total - self.size) / rate)} left"
        return text

    def _show(self) -> None:
        self._shown = self.clock()
        self._last = self.line()
        if self.tty:
            self.stream.write("\r\x1b[K" + self._last)
            self._drawn = True
        else:
            self.stream.write(self._last + "\n")
        self.stream.flush()

    def close(self) -> None:
        """Show the final count (a terminal's line is left showing it)."""
        if self.tty and self._drawn:
            self.stream.write("\r\x1b[K" + self.line() + "\n")
            self.stream.flush()
        elif not self.tty and self.records and self.line() != self._last:
            self._show()
