"""Whether the uploads, not the encoder, are what holds the run's records back.

Records wait in the upload queue for one of two reasons: the encoder cannot
keep up with the producer (the CPU is the limit), or the encoder waits for
the uploads to take what it made (the link is the limit). Only the second is
helped by keeping writes on disk: a record spooled must still be encoded, so
on a fast link spooling adds a disk round trip and takes nothing off the
CPU. A write's lines are made one at a time as its upload pulls them;
:class:`LinkGauge` counts the writes making a line right now. When none has
for :data:`IDLE_S` while records are held past the mark in memory, the
encoder is idle because the uploads cannot take more: the link is the limit.
:class:`Behind` is the sink's flag for that, read by each write and by its
upload (``upload_lines(stop=...)``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

#: The encoder idle this long while records wait: the uploads are the limit.
IDLE_S = 0.25

T = TypeVar("T")


class LinkGauge:
    """How many of a sink's writes are encoding now, and since when none is; shared by its writes' threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._encoding = 0
        self._idle_since: float | None = time.monotonic()

    def timed(self, lines: Iterable[T]) -> Iterator[T]:
        """``lines``, counted as encoding from each request for a line until the line is handed over."""
        self._begin()
        try:
            for line in lines:
                self._end()
                try:
                    yield line
                finally:
                    self._begin()
        finally:
            self._end()

    def idle_s(self) -> float:
        """How long no write has been encoding (0 while one is)."""
        with self._lock:
            since = self._idle_since
        return 0.0 if since is None else time.monotonic() - since

    def link_bound(self) -> bool:
        """Whether the encoder has been idle for :data:`IDLE_S` (with records held, the uploads are the limit)."""
        with self._lock:
            since = self._idle_since
        return since is not None and time.monotonic() - since >= IDLE_S

    def _begin(self) -> None:
        with self._lock:
            self._encoding += 1
            self._idle_since = None

    def _end(self) -> None:
        with self._lock:
            self._encoding -= 1
            if self._encoding == 0:
                self._idle_since = time.monotonic()


class Behind:
    """Set while the run's uploads are behind it: a ``stop`` flag for uploads, and each write's cue for disk.

    Either the queue holds half a bound (records or JSON bytes), or it holds
    half of ``max_queued_bytes`` in memory and the link is the limit.
    """

    def __init__(self, pressure: threading.Event, memory: threading.Event | None, link: LinkGauge) -> None:
        self.pressure = pressure
        self.memory = memory
        self.link = link

    def is_set(self) -> bool:
        if self.pressure.is_set():
            return True
        return self.memory is not None and self.memory.is_set() and self.link.link_bound()

    def latch(self) -> Latch:
        """A ``stop`` flag for one upload: once it has seen the run behind, it stays set.

        An upload reads its ``stop`` several times on its way out; the link's
        state may change between two reads, and an upload must not stop and
        then find it was not stopped.
        """
        return Latch(self)


class Latch:
    """:class:`Behind` for one upload, set for good the first time it is."""

    def __init__(self, behind: Behind) -> None:
        self._behind = behind
        self._set = False

    def is_set(self) -> bool:
        if not self._set and self._behind.is_set():
            self._set = True
        return self._set
