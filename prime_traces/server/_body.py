"""Request bodies: read as their bytes arrive, charged to one memory budget.

Nothing is allocated for a body before its bytes arrive. It is read in
chunks of at most :data:`READ_CHUNK_BYTES`, each charged to the service's
:class:`MemoryBudget` before it is read, so a client that declares 256 MiB
and sends 1 KiB costs about 1 KiB. Decompression charges its output to the
same budget (``_decode``). Past the budget, :class:`MemoryRefused` is raised
and the dispatcher answers 503 ``ingest_capacity_exceeded`` with a
``Retry-After``: the contract's refusal, which every client retries.

Each read from the socket waits at most the service's read timeout (set per
connection in ``_http``); a client that stops sending is cut off, and what
its request held (an in-flight slot, its charge) is given back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

DEFAULT_READ_TIMEOUT_S = 30.0
DEFAULT_MAX_BODY_MEMORY_BYTES = 1 << 30
READ_CHUNK_BYTES = 1 << 20
_MIN_THROTTLED_CHUNK_BYTES = 16 * 1024


class MemoryRefused(Exception):
    """The budget cannot hold ``wanted`` more bytes now; a retry later may fit."""

    def __init__(self, wanted: int, held: int, limit: int) -> None:
        super().__init__(
            f"the service holds {held} bytes of request bodies, and {wanted} more would pass "
            f"its limit of {limit}; retry later"
        )
        self.wanted = wanted


class MemoryBudget:
    """Bytes held by request bodies and their decompression, across all requests.

    Thread-safe. ``try_take`` never blocks: a request that does not fit is
    refused at once rather than queued, so a slow client cannot hold others.

        budget = MemoryBudget(1 << 30)
        charge = budget.charge()
        try: charge.take(n) ... finally: charge.release()
    """

    def __init__(self, limit_bytes: int = DEFAULT_MAX_BODY_MEMORY_BYTES) -> None:
        if limit_bytes < 1:
            raise ValueError(f"max_body_memory_bytes must be greater than 0, not {limit_bytes}")
        self.limit_bytes = limit_bytes
        self._lock = threading.Lock()
        self._held = 0
        self._peak = 0

    def try_take(self, n: int) -> bool:
        with self._lock:
            if self._held + n > self.limit_bytes:
                return False
            self._held += n
            self._peak = max(self._peak, self._held)
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self._held -= n

    def charge(self) -> MemoryCharge:
        """A new, empty charge for one request."""
        return MemoryCharge(self)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {"body_memory_bytes": self._held, "peak_body_memory_bytes": self._peak}


class MemoryCharge:
    """What one request holds of the budget. Used by the request's own thread only."""

    def __init__(self, budget: MemoryBudget) -> None:
        self._budget = budget
        self.held = 0

    def take(self, n: int) -> None:
        """Hold ``n`` more bytes, or raise :class:`MemoryRefused` and hold nothing more."""
        if n <= 0:
            return
        if not self._budget.try_take(n):
            raise MemoryRefused(n, self._budget.snapshot()["body_memory_bytes"], self._budget.limit_bytes)
        self.held += n

    def give(self, n: int) -> None:
        """Give back ``n`` bytes (at most what is held)."""
        n = min(n, self.held)
        if n > 0:
            self.held -= n
            self._budget.give(n)

    def release(self) -> None:
        """Give back everything; the request is over."""
        self.give(self.held)


def read_body(
    read: Callable[[int], bytes],
    length: int,
    charge: MemoryCharge,
    bandwidth_mb_s: float | None = None,
    link: Callable[[int], float] | None = None,
    link_rate_b_s: float | None = None,
) -> bytearray:
    """Read exactly ``length`` bytes with ``read(n)``, no faster than ``bandwidth_mb_s``.

    ``link(n)``: how long to wait before ``n`` more bytes have passed a link
    shared with other requests (:class:`~prime_traces.server._faults.Link`),
    whose rate is ``link_rate_b_s`` bytes a second.

    Memory grows with the bytes received; each chunk is charged before it is
    read. Raises ``ConnectionError`` when the peer closes early, whatever
    ``read`` raises on a timeout, and :class:`MemoryRefused`.
    """
    buf = bytearray()
    chunk_bytes = READ_CHUNK_BYTES
    rate = bandwidth_mb_s * 1e6 if bandwidth_mb_s else None
    slowest = min(r for r in (rate, link_rate_b_s) if r) if rate or link_rate_b_s else None
    if slowest is not None:  # chunks of 10 ms at the slowest rate: waits stay short, a shared link fair
        chunk_bytes = max(_MIN_THROTTLED_CHUNK_BYTES, min(chunk_bytes, int(slowest / 100)))
    start = time.monotonic()
    while len(buf) < length:
        want = min(chunk_bytes, length - len(buf))
        charge.take(want)
        chunk = read(want)
        charge.give(want - len(chunk))
        if not chunk:
            raise ConnectionError(f"client closed the connection after {len(buf)} of {length} bytes")
        buf += chunk
        if link is not None:
            wait_s = link(len(chunk))
            if wait_s > 0:
                time.sleep(wait_s)
        del chunk  # before the next read, so a chunk and its copy never pile up
        if rate is not None:
            ahead_s = len(buf) / rate - (time.monotonic() - start)
            if ahead_s > 0:
                time.sleep(ahead_s)
    return buf
