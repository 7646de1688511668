"""What a run tells its user on the terminal: where it goes, what it lost and why.

Console lines go to stderr, prefixed ``prime-runs:``, through the
``prime_runs.console`` logger and a handler of its own (attached when the
package is imported, not propagating), so a script with no logging set up
still sees them and ``logging`` configuration can silence or redirect them:
``logging.getLogger("prime_runs.console").setLevel(logging.ERROR)``. The
package's other loggers keep their ``NullHandler``.

The first record lost for each reason is shown at once, with its id, call,
position and cause; after that at most one line per reason every
``REPEAT_INTERVAL_S`` with counts. The losses are heard on whatever thread
counted them (a dropped write is counted on the caller's): hearing one only
updates counters under a small lock and wakes the console's own daemon
thread, which does the writing, so a slow terminal never slows the training
loop.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from prime_runs._records.reasons import BACKLOG
from prime_traces.threads import call_in_forked_child, start_daemon

CONSOLE_LOGGER = "prime_runs.console"
ENV_CONSOLE = "PRIME_RUNS_CONSOLE"
CONSOLE_CHOICES = ("auto", "on", "off")
#: After the first line about a reason, at most one more (with counts) per this many seconds.
REPEAT_INTERVAL_S = 30.0
PREFIX = "prime-runs: "
#: How long close() waits for lines the console's thread is writing.
CLOSE_WAIT_S = 1.0

logger = logging.getLogger(CONSOLE_LOGGER)
# The console's own troubles: never on the console logger, whose lines the user reads.
_internal = logging.getLogger(__name__)

_VERBS = {"failed": "not stored", "dropped": "dropped", "spooled": "kept on disk for a later upload"}


def _verb(kind: str, reason: str) -> str:
    if kind == "spooled" and reason == BACKLOG:
        return "waited on disk for the link (the run uploads them from there)"
    return _VERBS.get(kind, kind)


class ConsoleHandler(logging.StreamHandler):
    """Writes to the current ``sys.stderr``; a ``progress`` record is redrawn in place on a terminal."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)
        self.setFormatter(logging.Formatter(PREFIX + "%(message)s"))
        self._open_line = False

    @property
    def stream(self) -> Any:
        return sys.stderr  # resolved at each line: a test or a wrapper may replace it

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            stream = sys.stderr
            tty = _isatty(stream)
            if getattr(record, "progress", False) and tty:
                stream.write("\r\x1b[K" + text)
                self._open_line = True
            else:
                if self._open_line:
                    stream.write("\r\x1b[K")
                    self._open_line = False
                stream.write(text + "\n")
            stream.flush()
        except Exception:  # noqa: BLE001  (a closed or broken stderr must never break the run)
            pass


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except Exception:  # noqa: BLE001
        return False


def stderr_is_terminal() -> bool:
    return _isatty(sys.stderr)


def _install() -> None:
    if not any(isinstance(h, ConsoleHandler) for h in logger.handlers):
        logger.addHandler(ConsoleHandler())
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    logger.propagate = False


_install()


def console_on(choice: str | None, *, mode: str, owner: bool, environ: Mapping[str, str] | None = None) -> bool:
    """Argument, else ``PRIME_RUNS_CONSOLE``, else ``auto``: on for the run's owner, off for other ranks."""
    env = os.environ if environ is None else environ
    chosen = (choice or env.get(ENV_CONSOLE) or "auto").strip().lower()
    if chosen not in CONSOLE_CHOICES:
        where = "console" if choice else ENV_CONSOLE
        raise ValueError(f"{where} must be one of {', '.join(CONSOLE_CHOICES)}, not {chosen!r}")
    if mode == "disabled":
        return False
    return owner if chosen == "auto" else chosen == "on"


@dataclass
class _Tally:
    total: int = 0
    shown: int = 0  # the total when a line last said it
    shown_at: float = 0.0


class Console:
    """One run's console: lines now (``say``), and losses as they are counted (``count_loss``).

    ``count_loss`` is the accounting's listener: O(1), no I/O, callable from any
    thread. A disabled console does nothing at all.

    Usage::

        console = Console(enabled=True, directory="prime-runs/r-1")
        accounting.on_loss = console.count_loss
        console.close()
    """

    def __init__(
        self,
        *,
        enabled: bool,
        directory: str | None = None,
        repeat_interval_s: float = REPEAT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        background: bool = True,
    ) -> None:
        self.enabled = enabled
        # Without the background thread, lines are written only by close() (tests drive _take_lines).
        self.background = background
        self.directory = directory
        self.repeat_interval_s = repeat_interval_s
        self.clock = clock
        #: Set when finish() starts: its summary says what the deadline left, line by line would be noise.
        self.finishing = False
        #: What waits where while the uploads are behind, added to the backlog's repeated line (set by
        #: ``init()``; called off the console's lock, and a failure only leaves it out).
        self.backlog_status: Callable[[], str | None] | None = None
        self._setup()
        call_in_forked_child(self._setup)

    def _setup(self) -> None:
        self._lock = threading.Lock()
        # Held while lines are written: close() waits for the thread's lines before the summary's.
        self._writing = threading.Lock()
        self._wake = threading.Event()
        self._tallies: dict[tuple[str, str], _Tally] = {}
        self._pending: list[str] = []
        self._warned: set[str] = set()
        self._thread: threading.Thread | None = None
        self._closed = False

    def say(self, message: str, *args: Any, progress: bool = False) -> None:
        """One console line, now, on this thread."""
        if self.enabled:
            logger.info(message, *args, extra={"progress": progress} if progress else None)

    def warn_once(self, key: str, message: str, *args: Any) -> None:
        """A misuse warning, once per ``key`` for the run."""
        if not self.enabled:
            return
        with self._lock:
            if key in self._warned:
                return
            self._warned.add(key)
        logger.warning(message, *args)

    # -- losses ---------------------------------------------------------------

    def count_loss(self, kind: str, sink: str | None, reason: str, records: int, detail: str | None) -> None:
        """Count a loss; the first of each reason is written at once by the console's thread."""
        if not self.enabled or sink == "local" or records <= 0:
            return
        if self.finishing and not detail:
            return  # the summary accounts for what the deadline left; a record's own fault is still named
        with self._lock:
            if self._closed:
                return
            tally = self._tallies.get((kind, reason))
            if tally is None:
                tally = self._tallies[(kind, reason)] = _Tally(shown_at=self.clock())
                tally.shown = records
                self._pending.append(self._first_line(kind, reason, records, detail))
            tally.total += records
            self._ensure_thread()
        self._wake.set()

    def _first_line(self, kind: str, reason: str, records: int, detail: str | None) -> str:
        if kind == "dropped" and detail:
            return f"{detail} ({reason})"
        if kind == "spooled" and reason == BACKLOG:
            where = f" in {self.directory}" if self.directory else ""
            return (
                f"uploads are slower than the run logs: records wait on disk{where} and are uploaded from "
                "there, oldest first, as the link allows (none is dropped; what is left at the end is "
                "uploaded by `prime-runs sync`)"
            )
        if kind == "spooled":
            where = f" in {self.directory}" if self.directory else ""
            return (
                f"{records} records could not be delivered ({reason}) and are kept on disk{where}; "
                "they are uploaded when the service answers again, or by `prime-runs sync`"
            )
        if detail:
            return f"not stored, {reason}: {detail}"
        return f"{records} records {_verb(kind, reason)} ({reason})"

    def _ensure_thread(self) -> None:
        # Under self._lock.
        if self._thread is not None or not self.background:
            return
        # None while the interpreter exits: close() writes what is pending.
        self._thread = start_daemon(self._run, "prime-runs-console")

    def _run(self) -> None:
        while True:
            due = self._due_in()
            self._wake.wait(due)
            self._wake.clear()
            with self._writing:
                for line in self._take_lines():
                    self.say("%s", line)
            with self._lock:
                if self._closed:
                    return

    def _due_in(self) -> float | None:
        with self._lock:
            waiting = [t.shown_at + self.repeat_interval_s for t in self._tallies.values() if t.total > t.shown]
        return max(0.0, min(waiting) - self.clock()) if waiting else None

    def _take_lines(self, *, counts: bool = True) -> list[str]:
        now = self.clock()
        backlog: int | None = None
        with self._lock:
            lines, self._pending = self._pending, []
            if not counts:
                return lines
            for (kind, reason), tally in self._tallies.items():
                if tally.total > tally.shown and now - tally.shown_at >= self.repeat_interval_s:
                    if (kind, reason) == ("spooled", BACKLOG):
                        backlog = len(lines)
                    lines.append(
                        f"{tally.total - tally.shown} more records {_verb(kind, reason)} ({reason}) "
                        f"in the last {now - tally.shown_at:.0f} s; {tally.total} in all"
                    )
                    tally.shown, tally.shown_at = tally.total, now
        status = self._backlog_status() if backlog is not None else None
        if backlog is not None and status:
            lines[backlog] += f"; {status}"
        return lines

    def _backlog_status(self) -> str | None:
        if self.backlog_status is None:
            return None
        try:
            return self.backlog_status()
        except Exception:  # noqa: BLE001  (a report must never cost the line it adds to)
            _internal.debug("the backlog's status failed", exc_info=True)
            return None

    def close(self) -> None:
        """Write what is pending (first lines, not counts: the summary has them) and stop the thread."""
        with self._lock:
            self._closed = True
        # Bounded: a stderr that blocks (a full pipe nobody reads) must not hold finish() forever.
        writing = self._writing.acquire(timeout=CLOSE_WAIT_S)
        try:
            for line in self._take_lines(counts=False):
                self.say("%s", line)
        finally:
            if writing:
                self._writing.release()
        self._wake.set()
