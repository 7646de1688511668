"""Fault injection, counters and the per-credential in-flight limit.

Everything here can be changed while the service runs: tests and benchmarks
hold the :class:`Faults` object of a running service and set its fields; each
request reads them afresh.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

DEFAULT_MAX_UPLOADS_IN_FLIGHT = 8
DEFAULT_SATURATED_RETRY_AFTER_S = 1.0
#: What an injected failure may answer.
FAIL_STATUSES = (429, 500, 502, 503, 504)


@dataclass
class Faults:
    """What the service does wrong on purpose.

    - ``latency_ms``: added to every request before it is answered.
    - ``bandwidth_mb_s``: cap on how fast each request body is read.
    - ``link_mb_s``: cap on how fast all request bodies together are read,
      an uplink every upload shares (``None``: no cap); see :class:`Link`.
    - ``fail_fraction`` / ``fail_count``: uploads answered ``fail_status``
      with ``Retry-After: fail_retry_after_s`` — the next ``fail_count``
      uploads, then a ``fail_fraction`` of the rest (seeded). 429
      (``rate_limited``) and 503 (``ingest_capacity_exceeded``) are refusals;
      500, 502 and 504 carry no code, as a crashed handler or a gateway's would.
    - ``reject_marker``: any line containing it is 400 ``invalid_trace``;
      ``reject_omit_line`` leaves the line number and id out of the answer;
      ``reject_first_only`` names the first rejected line but not the
      ``errors`` list of all of them (as the hosted service may).
    - ``hang_uploads``: read the body, then never answer (until stop).
    - ``drop_after_body``: the next N uploads have their connection closed
      after the body is read; with ``drop_after_commit`` the upload is
      committed first (the answer is lost, the data is not).
    - ``trickle_run_update_byte_s``: answers to ``PATCH /api/v1/runs/{id}`` and to the
      platform's run updates (``PUT /evaluations/{id}``, ``PUT /rft/external-runs/{id}/status``)
      are sent a byte every this many seconds (after the update applied).
      ``on_run_update`` (in-process only) is called before each such answer.
    - ``before_upload``: in-process only; called on the request thread after
      the body is read (a ``threading.Barrier(n).wait`` or ``Event.wait``
      gates uploads in tests). ``on_upload`` is the same, called with the
      upload's ``Idempotency-Key``, to single out one batch.
    """

    latency_ms: float = 0.0
    bandwidth_mb_s: float | None = None
    link_mb_s: float | None = None
    fail_fraction: float = 0.0
    fail_count: int = 0
    fail_status: int = 503
    fail_retry_after_s: float | None = 1.0
    fail_seed: int = 0
    reject_marker: str | None = None
    reject_omit_line: bool = False
    reject_first_only: bool = False
    hang_uploads: bool = False
    drop_after_body: int = 0
    drop_after_commit: bool = True
    trickle_run_update_byte_s: float = 0.0
    on_run_update: Callable[[], Any] | None = None
    before_upload: Callable[[], Any] | None = None
    on_upload: Callable[[str], Any] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    _rng: random.Random | None = field(default=None, repr=False, compare=False)
    #: The shared uplink's clock, whatever its rate is now.
    link: Link = field(default_factory=lambda: Link(), repr=False, compare=False)

    def validate(self) -> None:
        if self.fail_status not in FAIL_STATUSES:
            raise ValueError(f"fail_status must be one of {FAIL_STATUSES}, not {self.fail_status}")
        if not 0.0 <= self.fail_fraction <= 1.0:
            raise ValueError(f"fail_fraction must be within 0..1, not {self.fail_fraction}")
        if self.bandwidth_mb_s is not None and self.bandwidth_mb_s <= 0:
            raise ValueError(f"bandwidth_mb_s must be greater than 0, not {self.bandwidth_mb_s}")
        if self.link_mb_s is not None and self.link_mb_s <= 0:
            raise ValueError(f"link_mb_s must be greater than 0, not {self.link_mb_s}")
        if self.latency_ms < 0:
            raise ValueError(f"latency_ms must be at least 0, not {self.latency_ms}")

    def take_failure(self) -> bool:
        """Whether this upload is to be refused with ``fail_status``."""
        with self._lock:
            if self.fail_count > 0:
                self.fail_count -= 1
                return True
            if self.fail_fraction <= 0.0:
                return False
            if self._rng is None:
                self._rng = random.Random(self.fail_seed)
            return self._rng.random() < self.fail_fraction

    def take_drop(self) -> bool:
        """Whether this upload's connection is to be dropped after its body."""
        with self._lock:
            if self.drop_after_body > 0:
                self.drop_after_body -= 1
                return True
            return False


class Link:
    """One uplink shared by every request body: bytes pass it one after another, at its rate.

    Each chunk read reserves its time on the link after everything reserved
    before it (a virtual clock), and its reader sleeps until then: however
    many uploads run at once, together they get the rate, as on a real link.
    Idle time is not banked. Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free_at = 0.0

    def pass_bytes(self, n: int, rate_mb_s: float | None) -> float:
        """Reserve ``n`` bytes' time on the link; how long the caller must wait (0 with no cap)."""
        if not rate_mb_s or n <= 0:
            return 0.0
        now = time.monotonic()
        with self._lock:
            self._free_at = max(self._free_at, now) + n / (rate_mb_s * 1e6)
            return self._free_at - now


class Stats:
    """Counters served at ``GET /api/v1/_stats``. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.uploads = 0
        self.lines = 0
        self.uncompressed_bytes = 0
        self.wire_bytes = 0
        self.replays = 0
        self.requests = 0
        self.rejections: Counter[str] = Counter()
        self.upload_attempts = 0
        self.read_timeouts = 0

    def count_request(self) -> None:
        with self._lock:
            self.requests += 1

    def count_upload_attempt(self, wire_bytes: int) -> None:
        with self._lock:
            self.upload_attempts += 1
            self.wire_bytes += wire_bytes

    def count_commit(self, lines: int, uncompressed_bytes: int) -> None:
        with self._lock:
            self.uploads += 1
            self.lines += lines
            self.uncompressed_bytes += uncompressed_bytes

    def count_replay(self) -> None:
        with self._lock:
            self.replays += 1

    def count_read_timeout(self) -> None:
        with self._lock:
            self.read_timeouts += 1

    def count_rejection(self, code: str) -> None:
        with self._lock:
            self.rejections[code] += 1

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "uploads": self.uploads,
                "upload_attempts": self.upload_attempts,
                "lines": self.lines,
                "uncompressed_bytes": self.uncompressed_bytes,
                "wire_bytes": self.wire_bytes,
                "replays": self.replays,
                "requests": self.requests,
                "rejections": dict(self.rejections),
                "read_timeouts": self.read_timeouts,
            }


class InFlightLimiter:
    """Counts uploads in flight per credential and refuses past the limit."""

    def __init__(self, limit: int = DEFAULT_MAX_UPLOADS_IN_FLIGHT) -> None:
        if limit < 1:
            raise ValueError(f"max_uploads_in_flight must be greater than 0, not {limit}")
        self.limit = limit
        self._lock = threading.Lock()
        self._now: Counter[str] = Counter()
        self._peak: Counter[str] = Counter()

    def try_acquire(self, producer: str) -> bool:
        with self._lock:
            if self._now[producer] >= self.limit:
                return False
            self._now[producer] += 1
            self._peak[producer] = max(self._peak[producer], self._now[producer])
            return True

    def release(self, producer: str) -> None:
        with self._lock:
            self._now[producer] -= 1
            if self._now[producer] <= 0:
                del self._now[producer]

    def snapshot(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return {"in_flight": dict(self._now), "max_in_flight": dict(self._peak)}
