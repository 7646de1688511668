"""A pool of daemon threads that run requests and never hold up exit.

``concurrent.futures.ThreadPoolExecutor`` joins its workers at interpreter
exit, so one hung request would keep a finished training job alive. This pool
hands out the same ``Future`` objects, but its workers are daemon threads
that nothing joins: at exit, work still running is abandoned.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")

_SHUTDOWN = object()
_pool_ids = itertools.count(1)


def call_in_forked_child(method: Callable[[], Any]) -> None:
    """Run the bound ``method`` in every child this process forks, while its object lives.

    Held through a ``weakref.WeakMethod``: the hook never keeps the object alive.
    """
    ref = weakref.WeakMethod(method)  # type: ignore[arg-type]

    def after_fork_in_child() -> None:
        bound = ref()
        if bound is not None:
            bound()

    os.register_at_fork(after_in_child=after_fork_in_child)


def run_in_daemon(target: Callable[[], Any], name: str) -> threading.Event:
    """Run ``target`` on a named daemon thread; the event is set once it returns, however it ends.

    For work a caller waits on only until a deadline: nothing joins the
    thread, so a stalled service or disk never holds up exit. While the
    interpreter shuts down (no new threads), ``target`` runs on the caller.
    """
    done = threading.Event()

    def run() -> None:
        try:
            target()
        finally:
            done.set()

    try:
        threading.Thread(target=run, name=name, daemon=True).start()
    except RuntimeError:
        run()
    return done


class DaemonPool:
    """Run callables on up to ``max_workers`` daemon threads.

    ``submit`` never blocks: work waits in an unbounded queue (callers bound
    what they submit, as the uploader does with its window). Threads start
    lazily, one per submit until ``max_workers``. ``shutdown`` is idempotent
    and only waits as long as it is told to. After ``fork`` the child gets a
    fresh, empty pool: it never runs or waits on the parent's work.

    Usage::

        pool = DaemonPool(8, name="prime-traces-upload")
        future = pool.submit(send, batch)
        receipt = future.result(timeout=120)
    """

    def __init__(self, max_workers: int, *, name: str = "prime-traces-pool") -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be greater than 0, not {max_workers}")
        self.max_workers = max_workers
        self._name = f"{name}-{next(_pool_ids)}"
        self._lock = threading.Lock()
        self._reset()
        call_in_forked_child(self._reset)

    def _reset(self) -> None:
        # In a forked child the parent's threads do not exist and its lock may
        # be held by one of them: replace everything, never acquire the old lock.
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._shutdown = False

    def submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> Future[T]:
        """Queue ``fn(*args, **kwargs)``; returns its Future at once."""
        future: Future[T] = Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot submit to a pool that was shut down")
            self._queue.put((future, fn, args, kwargs))
            if self._idle > 0:
                self._idle -= 1
            elif len(self._threads) < self.max_workers:
                self._start_thread()
        return future

    def _start_thread(self) -> None:
        thread = threading.Thread(
            target=_work, args=(self._queue, self), name=f"{self._name}-{len(self._threads) + 1}", daemon=True
        )
        try:
            thread.start()
        except RuntimeError:  # interpreter shutting down: the work is lost with it
            logger.debug("could not start a pool thread during shutdown")
            return
        self._threads.append(thread)

    def _mark_idle(self) -> None:
        with self._lock:
            self._idle += 1

    def shutdown(self, timeout_s: float | None = 0.0) -> bool:
        """Stop the workers after the queued work; wait up to ``timeout_s``.

        Returns True when every worker ended in time. Work still running after
        that is abandoned (the threads are daemons).
        """
        with self._lock:
            self._shutdown = True
            threads = list(self._threads)
            for _ in threads:
                self._queue.put(_SHUTDOWN)
        if not timeout_s:
            return all(not t.is_alive() for t in threads)
        deadline = time.monotonic() + timeout_s
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return all(not t.is_alive() for t in threads)

    @property
    def threads(self) -> list[threading.Thread]:
        """The worker threads started so far (for tests and diagnostics)."""
        return list(self._threads)


def _work(work_queue: queue.SimpleQueue[Any], pool: DaemonPool) -> None:
    while True:
        item = work_queue.get()
        if item is _SHUTDOWN:
            return
        future, fn, args, kwargs = item
        if future.set_running_or_notify_cancel():
            try:
                result = fn(*args, **kwargs)
            except BaseException as err:
                future.set_exception(err)
            else:
                future.set_result(result)
        del item, future, fn, args, kwargs
        pool._mark_idle()
