"""An executor of daemon threads that never hold up exit, and after-fork callbacks that die with their object.

:class:`DaemonPool` is a ``concurrent.futures.Executor`` but not the stdlib's
``ThreadPoolExecutor``: that one joins its workers at interpreter exit, so one
hung request would keep a finished training job alive. This pool hands out
the same ``Future`` objects and honours ``submit``, ``map``, ``shutdown`` and
``with``, but its workers are daemon threads that nothing joins: at exit,
work still running is abandoned. As in the stdlib pool, a worker holds its
pool only weakly, so a pool nobody shut down still ends its threads once it
is garbage.

:func:`call_in_forked_child` keeps every after-fork callback in one weak
registry behind a single ``os.register_at_fork`` hook: the interpreter never
forgets a registered hook, so one hook per object would grow memory and the
time of every ``fork()`` with each object ever made.

:func:`wait_event` and :func:`wait_slice` keep the main thread's waits short
enough for a signal handler (a Ctrl-C, a SIGTERM) to run during them.
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
from concurrent.futures import Executor, Future
from concurrent.futures import TimeoutError as FuturesTimeoutError
from typing import Any, Literal, TypeVar

__all__ = [
    "DEFAULT_EXIT_TIMEOUT_S",
    "SIGNAL_SLICE_S",
    "DaemonPool",
    "call_in_forked_child",
    "run_in_daemon",
    "start_daemon",
    "wait_event",
    "wait_slice",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_SHUTDOWN = object()
_pool_ids = itertools.count(1)

#: How long leaving a ``with DaemonPool(...)`` block waits for its work: slow
#: work finishes, a hung call is reported instead of blocking the caller for ever.
DEFAULT_EXIT_TIMEOUT_S: float | None = None

#: The after-fork callbacks of live objects, in registration order; an entry leaves as its object dies.
_in_forked_child: dict[int, tuple[Callable[[], Any], Callable[[Any], Any]]] = {}
_registration_ids = itertools.count()


def call_in_forked_child(method: Callable[[], Any]) -> None:
    """Run the bound ``method`` in every child this process forks, while its object lives.

    The object is held weakly (the function apart): the registration never
    keeps it alive, and goes away with it. A plain function (a module's state
    to reset) is held for good, as its module is. Callbacks run in
    registration order; one that raises is logged and stops none of the others.
    """
    key = next(_registration_ids)
    if not hasattr(method, "__self__"):
        _in_forked_child[key] = (lambda: method, lambda function: function())
        return

    def forget(_ref: object, key: int = key, registry: dict[int, Any] = _in_forked_child) -> None:
        # Bound as defaults: at interpreter teardown module globals may already be gone.
        registry.pop(key, None)

    # No lock: one dict operation is atomic under the GIL, forget() runs from
    # the garbage collector on any thread, and a lock a parent thread held at
    # fork time would stay held in the child. Not a WeakMethod with a callback:
    # its callback fails noisily when both die together at interpreter exit.
    owner = method.__self__
    _in_forked_child[key] = (weakref.ref(owner, forget), method.__func__)  # type: ignore[attr-defined]


def _run_in_forked_child() -> None:
    # Iterate a copy (made in one C call): a callback, or the collector, may drop entries meanwhile.
    for ref, func in list(_in_forked_child.copy().values()):
        owner = ref()
        if owner is None:
            continue
        try:
            func(owner)
        except Exception:
            logger.exception("after-fork callback %r failed in the child", func)
        del owner


os.register_at_fork(after_in_child=_run_in_forked_child)


def start_daemon(target: Callable[[], Any], name: str) -> threading.Thread | None:
    """Start ``target`` on a named daemon thread; None when no thread can start (the interpreter is exiting).

    The caller keeps what the thread would have done for its own bounded
    close (a queue it drains, rows it writes, lines it prints).
    """
    thread = threading.Thread(target=target, name=name, daemon=True)
    try:
        thread.start()
    except RuntimeError:
        return None
    return thread


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


#: The longest the main thread blocks at once in :func:`wait_event`: a signal the kernel hands
#: to another thread runs its Python handler only when the main thread wakes up.
SIGNAL_SLICE_S = 0.2


def wait_slice(remaining: float | None) -> float | None:
    """How long to block at once: ``remaining``, but at most :data:`SIGNAL_SLICE_S` on the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return remaining
    return SIGNAL_SLICE_S if remaining is None else min(remaining, SIGNAL_SLICE_S)


def wait_event(event: threading.Event, timeout_s: float) -> bool:
    """``event.wait(timeout_s)`` that lets the main thread handle a signal meanwhile."""
    deadline = time.monotonic() + timeout_s
    while not event.wait(wait_slice(max(0.0, deadline - time.monotonic()))):
        if time.monotonic() >= deadline:
            return False
    return True


class DaemonPool(Executor):
    """An ``Executor`` running callables on up to ``max_workers`` daemon threads.

    Not ``ThreadPoolExecutor``: the stdlib joins its workers at interpreter
    exit, so one hung request would keep a finished job alive. These workers
    are daemon threads that nothing joins: at exit, work still running is
    abandoned, and ``shutdown`` can be bounded (``timeout_s``, ``exit_timeout_s``).

    ``submit`` never blocks: work waits in an unbounded queue (callers bound
    what they submit, as the uploader does with its window). Threads start
    lazily, one per submit until ``max_workers``; when none can start (the
    interpreter is exiting) and none is alive, ``submit`` runs the work itself.
    ``map`` is the Executor's: it submits every call at once, yields results
    in order, re-raises the first exception met (cancelling the calls not yet
    started), counts ``timeout`` from the call to ``map``, and ignores
    ``chunksize`` as thread pools do.

    ``shutdown`` has the stdlib's semantics plus a bound (see there). Leaving
    a ``with`` block shuts down and waits as the stdlib does, for as long as
    the work takes; with ``exit_timeout_s``, at most that long, after which
    the work goes on in its daemon threads and ``concurrent.futures.TimeoutError``
    is raised, unless the block is already raising. A pool
    dropped without ``shutdown`` ends its threads too, once the work queued
    before runs: they hold it only weakly. After ``fork`` the child gets a
    fresh, empty, open pool: it never runs or waits on the parent's work. All
    methods are thread-safe.

    Usage::

        with DaemonPool(8, name="prime-traces-upload") as pool:
            receipts = list(pool.map(send, batches, timeout=120))
    """

    def __init__(
        self,
        max_workers: int,
        *,
        name: str = "prime-traces-pool",
        exit_timeout_s: float | None = DEFAULT_EXIT_TIMEOUT_S,
    ) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be greater than 0, not {max_workers}")
        if exit_timeout_s is not None and exit_timeout_s < 0:
            raise ValueError(f"exit_timeout_s must be 0 or more (or None), not {exit_timeout_s}")
        self.max_workers = max_workers
        self.exit_timeout_s = exit_timeout_s
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

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """Queue ``fn(*args, **kwargs)``; returns its Future at once.

        Raises RuntimeError once the pool is shut down.
        """
        future: Future[T] = Future()
        inline = False
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._queue.put((future, fn, args, kwargs))
            if self._idle > 0:
                self._idle -= 1
            elif len(self._threads) < self.max_workers and not self._start_thread():
                # No thread can start (Python 3.12+ refuses during interpreter shutdown): with none
                # alive to take the work, the caller runs it, or records logged just before exit are lost.
                inline = not any(t.is_alive() for t in self._threads)
        if inline:
            self._run_queued_here()
        return future

    def _run_queued_here(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is _SHUTDOWN:
                continue
            _run(*item)

    def _start_thread(self) -> bool:
        def wake_when_dropped(_ref: object, work_queue: queue.SimpleQueue[Any] = self._queue) -> None:
            # Runs when the pool is garbage: the thread waits on its queue, not on the pool.
            work_queue.put(_SHUTDOWN)

        # The thread gets a weak reference and the queue, never the pool: a
        # strong one would keep an unclosed pool, and its threads, alive forever.
        thread = threading.Thread(
            target=_work,
            args=(weakref.ref(self, wake_when_dropped), self._queue),
            name=f"{self._name}-{len(self._threads) + 1}",
            daemon=True,
        )
        try:
            thread.start()
        except RuntimeError:  # interpreter shutting down: submit() runs the work itself
            logger.debug("could not start a pool thread during shutdown")
            return False
        self._threads.append(thread)
        return True

    def _mark_idle(self) -> None:
        with self._lock:
            self._idle += 1

    def shutdown(  # type: ignore[override]  # returns whether the workers ended; Executor's returns None
        self,
        wait: bool = True,
        *,
        cancel_futures: bool = False,
        timeout_s: float | None = None,
    ) -> bool:
        """Take no more work; let the workers end once the queue is empty. Idempotent.

        ``cancel_futures=True`` first cancels every queued future that has not
        started. ``wait=True`` then blocks until the submitted work has
        finished, or at most ``timeout_s`` (None: no bound); ``wait=False``
        returns at once (``timeout_s`` is then unused). Returns True when every worker has ended; False means
        work still runs on daemon threads, abandoned at interpreter exit.
        """
        if timeout_s is not None and timeout_s < 0:
            raise ValueError(f"timeout_s must be 0 or more (or None), not {timeout_s}")
        with self._lock:
            wakeups = 0 if self._shutdown else len(self._threads)
            self._shutdown = True
            threads = list(self._threads)
            if cancel_futures:
                wakeups += self._cancel_queued()
            # Behind everything still queued: each worker finishes that work, then ends.
            for _ in range(wakeups):
                self._queue.put(_SHUTDOWN)
        if wait:
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            for thread in threads:
                thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return all(not t.is_alive() for t in threads)

    def _cancel_queued(self) -> int:
        """Cancel the queued futures; returns how many wake-ups were taken off the queue with them."""
        wakeups = 0
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return wakeups
            if item is _SHUTDOWN:
                wakeups += 1  # a worker still needs it: put back after the drain
            else:
                item[0].cancel()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Literal[False]:
        if not self.shutdown(wait=True, timeout_s=self.exit_timeout_s):
            if exc_type is None:
                raise FuturesTimeoutError(
                    f"{self._name}: work still running {self.exit_timeout_s} s after its with block"
                )
            # Raising here would replace the block's own exception, the more useful of the two.
            logger.warning("%s: work still running %s s after its with block", self._name, self.exit_timeout_s)
        return False

    @property
    def threads(self) -> list[threading.Thread]:
        """The worker threads started so far (for tests and diagnostics)."""
        return list(self._threads)


def _work(pool_ref: weakref.ref[DaemonPool], work_queue: queue.SimpleQueue[Any]) -> None:
    while True:
        item = work_queue.get()
        if item is _SHUTDOWN:
            return
        _run(*item)
        del item
        pool = pool_ref()
        if pool is not None:
            pool._mark_idle()
        # Never held across get(): a dropped pool's wake-up is queued after the
        # work it had, so that work still runs before the wake-up ends us.
        del pool


def _run(future: Future[Any], fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    if future.set_running_or_notify_cancel():
        try:
            result = fn(*args, **kwargs)
        except BaseException as err:  # noqa: BLE001  (the Future carries it to whoever waits)
            future.set_exception(err)
        else:
            future.set_result(result)
