"""Two writes at once: the next write is encoded while the last one's final batches upload.

A write's upload ends with a tail: its records are all encoded, and its
last batches are being compressed, sent and ingested. Done one write after
another, the encoder (the one thread that turns records into lines) idles
through every tail; with 100 ms of network time per request that is a
batch's compression, its transfer and its ingest per write. So each write
runs on a daemon thread of its own (a lane), and the worker takes the next
write as soon as the sink says the last one is encoded
(:attr:`~prime_runs._records.ledger.Ledger.on_encoded`), or once it ended.

Bounds kept:

- at most two writes are in progress: a lane starts only once the write
  before the last one has finished, so at most two writes' records are
  held, which ``write_cap_bytes`` allows for;
- writes are marked done in the order they were taken, whatever order their
  uploads end in: ``flush()`` waits for a write and everything before it;
- the threads are daemons and nothing joins them; while the interpreter
  exits (no new threads), a write runs on the worker's own thread.

Usage::

    lanes = Lanes("prime-runs-upload", done=queue.done, wake=queue.wake)
    lanes.wait_for_room()
    writes = queue.take(...)
    lanes.run(writes, lambda lane: deliver(writes, on_encoded=lane.encoded.set))
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from prime_runs._upload.queue import Write
from prime_traces.threads import run_in_daemon


class Lane:
    """One write in progress: ``encoded`` once the next may start, ``finished`` once it is done."""

    def __init__(self, previous: Lane | None) -> None:
        #: Set once the write needs no more encoding for now (or has ended): the next write may start.
        self.encoded = threading.Event()
        #: Set once the write, and every write before it, is marked done.
        self.finished = threading.Event()
        # Cleared once finished, so that lanes never form a chain back to the first.
        self.previous = previous


class Lanes:
    """Runs each write on a lane of its own, two at most at once, and marks them done in order.

    Driven by one thread (the worker's): :meth:`run` and :meth:`done_in_order`
    are not for concurrent callers. ``done`` is the queue's: it runs on the
    lane's thread once the write and every write before it are accounted for;
    ``wake`` runs after it, once :meth:`busy` can say so (the worker may be
    waiting to see it).
    """

    def __init__(self, name: str, done: Callable[[list[Write]], None], wake: Callable[[], None]) -> None:
        self.name = name
        self._done = done
        self._wake = wake
        self._last: Lane | None = None

    def wait_for_room(self) -> None:
        """Wait until at most one write is in progress: the worker calls it before it takes the next.

        Taking first would hold a third write's records while two are in progress.
        """
        last = self._last
        if last is not None:
            earlier = last.previous  # None once finished (its lane let go of it)
            if earlier is not None:
                earlier.finished.wait()

    def run(self, writes: list[Write], work: Callable[[Lane], Any]) -> None:
        """Start ``work(lane)`` for ``writes``; return once it is encoded (or has ended).

        Waits first for room (:meth:`wait_for_room`). ``work`` accounts for
        every record of ``writes`` whatever happens (it must not raise); the
        lane only marks them done, after every write before them.
        """
        self.wait_for_room()
        last = self._last
        lane = Lane(last)
        self._last = lane
        job = functools.partial(self._work, lane, writes, work)
        try:
            run_in_daemon(job, self.name)  # on this thread while the interpreter exits
        except BaseException:  # noqa: BLE001  no thread could start: the write must still end, be marked done
            job()
        lane.encoded.wait()

    def done_in_order(self, writes: list[Write]) -> None:
        """Mark ``writes`` done once every write started before them is (for writes no lane ran)."""
        if not writes:
            return  # nothing to mark: the caller (the worker) must not wait out a write's tail for it
        last = self._last
        if last is not None:
            last.finished.wait()
        self._done(writes)

    def busy(self) -> bool:
        """Whether a write is still in progress (encoding, or waiting for its last batches)."""
        last = self._last
        return last is not None and not last.finished.is_set()

    def _work(self, lane: Lane, writes: list[Write], work: Callable[[Lane], Any]) -> None:
        try:
            work(lane)
        finally:
            lane.encoded.set()
            previous = lane.previous
            if previous is not None:
                previous.finished.wait()
            lane.previous = None
            try:
                self._done(writes)
            finally:
                lane.finished.set()
                self._wake()
