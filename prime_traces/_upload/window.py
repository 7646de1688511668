"""The adaptive in-flight window: how many upload requests a client keeps going at once.

The hosted service allows 8 uploads in flight per credential, but a service
may allow fewer, or be busy: it then refuses the extra requests with 429 or a
503 refusal code (contract §6). A client that keeps sending at its configured
concurrency turns its own requests into refusals. The window adapts, as TCP's
congestion window does (slow start, then additive increase and
multiplicative decrease):

- it starts at 1 and grows by one with each success (doubling each round)
  until ``max_in_flight`` or the first refusal, so a service that allows
  fewer requests than we would send is not first sent a burst of bodies it
  must refuse;
- a refusal halves the limit (at least 1), once per round: refusals of
  requests that started before the last decrease say nothing new;
- a limit's worth of successes raises it by one, up to ``max_in_flight``;
- growing back to the size that was last refused takes ``penalty`` times as
  many successes, and ``penalty`` doubles (up to :data:`MAX_PROBE_PENALTY`)
  each time that size is refused again, so a service whose limit sits just
  below ours sees a refusal rarely, not every other round.

Every attempt of every upload of a client takes a slot (:meth:`acquire`) and
gives it back with its outcome (:meth:`release`); a request waiting out a
``Retry-After`` holds no slot. ``snapshot`` is what ``stats()`` shows.
"""

from __future__ import annotations

import threading
from typing import Any

from prime_traces.threads import call_in_forked_child

#: The most a refused size's growth is slowed: 256 rounds of successes per probe.
MAX_PROBE_PENALTY = 256
# How often a waiter looks at its cancel event.
_CANCEL_CHECK_S = 0.05

OK = "ok"
REFUSED = "refused"
OTHER = "other"


class InFlightWindow:
    """An AIMD limit on the requests in flight, shared by every upload of one client.

    Thread-safe. After ``fork`` the child starts afresh, in slow start, with
    nothing in flight.

    Usage::

        window = InFlightWindow(8)
        ticket = window.acquire(cancel)      # None: cancelled while waiting
        try:
            send()
        finally:
            window.release(ticket, REFUSED if refused else OK)
    """

    def __init__(self, max_in_flight: int) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, not {max_in_flight}")
        self.max_in_flight = max_in_flight
        self._reset()
        call_in_forked_child(self._reset)

    def _reset(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self.limit = 1
        self._slow_start = True
        self.active = 0
        # Reserved by uploads that will call acquire() soon, or blocked in it.
        self.waiting = 0
        self._round = 0  # bumped by each decrease
        self._successes = 0  # since the limit last changed
        self._refused_at: int | None = None  # the limit when the last decrease came
        self._penalty = 1
        self.refusals = 0
        self.decreases = 0
        self._listeners: set[threading.Event] = set()

    def __repr__(self) -> str:
        return f"InFlightWindow(limit={self.limit}, active={self.active}, max_in_flight={self.max_in_flight})"

    def try_reserve(self) -> bool:
        """Reserve a place for a request about to be queued, if the window has room for it."""
        with self._cond:
            if self.active + self.waiting >= self.limit:
                return False
            self.waiting += 1
            return True

    def unreserve(self) -> None:
        """Give back a reservation that will never reach :meth:`acquire`."""
        with self._cond:
            self.waiting = max(0, self.waiting - 1)
            self._notify()

    def acquire(self, cancel: threading.Event | None = None, *, reserved: bool = False) -> int | None:
        """Wait for a slot; return its ticket, or ``None`` when ``cancel`` was set first.

        ``reserved`` says the caller holds a reservation from :meth:`try_reserve`,
        which this call consumes either way.
        """
        with self._cond:
            if not reserved:
                self.waiting += 1
            try:
                while self.active >= self.limit:
                    if cancel is not None and cancel.is_set():
                        return None
                    self._cond.wait(_CANCEL_CHECK_S if cancel is not None else None)
                if cancel is not None and cancel.is_set():
                    return None
                self.active += 1
                return self._round
            finally:
                self.waiting -= 1
                self._notify()

    def release(self, ticket: int, outcome: str) -> None:
        """Give a slot back: ``OK`` (2xx), ``REFUSED`` (429 or a 503 refusal) or ``OTHER``."""
        with self._cond:
            self.active = max(0, self.active - 1)
            if outcome == REFUSED:
                self.refusals += 1
                if ticket == self._round:
                    self._decrease()
            elif outcome == OK and self._slow_start:
                self.limit = min(self.max_in_flight, self.limit + 1)
                self._slow_start = self.limit < self.max_in_flight
            elif outcome == OK:
                self._successes += 1
                if self._successes >= self._needed() and self.limit < self.max_in_flight:
                    self.limit += 1
                    self._successes = 0
                    if self._refused_at is not None and self.limit > self._refused_at:
                        # Past the size last refused without a refusal: the service has room again.
                        self._refused_at = None
                        self._penalty = 1
            self._notify()

    def _needed(self) -> int:
        growing_to_refused = self._refused_at is not None and self.limit + 1 == self._refused_at
        return self.limit * (self._penalty if growing_to_refused else 1)

    def _decrease(self) -> None:
        if self._refused_at is not None and self.limit >= self._refused_at:
            self._penalty = min(MAX_PROBE_PENALTY, self._penalty * 2)
        self._slow_start = False
        self._refused_at = self.limit
        self.limit = max(1, self.limit // 2)
        self._round += 1
        self._successes = 0
        self.decreases += 1

    def _notify(self) -> None:
        self._cond.notify_all()
        for event in self._listeners:
            event.set()

    def subscribe(self, event: threading.Event) -> None:
        """Set ``event`` whenever a slot or a reservation is given back."""
        with self._cond:
            self._listeners.add(event)

    def unsubscribe(self, event: threading.Event) -> None:
        with self._cond:
            self._listeners.discard(event)

    def snapshot(self) -> dict[str, Any]:
        """The current limit, the requests in flight, and the refusals seen so far."""
        with self._cond:
            return {
                "window": self.limit,
                "max_in_flight": self.max_in_flight,
                "in_flight": self.active,
                "refusals": self.refusals,
                "window_decreases": self.decreases,
            }
