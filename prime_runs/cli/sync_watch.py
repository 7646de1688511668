"""``prime-runs sync`` bounded and loud: it says when it waits, and gives up after ``--timeout-s`` without progress.

A service that accepts the connection and never answers would hold a sync
for as long as the client's read timeouts and retries allow (minutes per
request). The sync runs each run directory on a daemon thread; the command's
own thread watches it: every ``say_every_s`` without progress it prints one
line (``no answer from URL for 30 s; still waiting``), and after
``timeout_s`` it gives up. Giving up leaves nothing half written:
``sync.json`` is replaced atomically as each batch commits, and a sync run
again sends the very same batches, so a batch that was in flight is answered
as a replay if the service stored it.

Progress is anything that moves the sync on: the run known on the platform
and the files read (``started``), or a batch stored (``advanced``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from prime_runs.errors import PrimeRunsError
from prime_traces.threads import start_daemon

T = TypeVar("T")

#: Without progress for this long, ``prime-runs sync`` gives up (``--timeout-s``).
DEFAULT_SYNC_TIMEOUT_S = 300.0
#: How often a waiting sync says so, at most (and at least twice before it gives up).
SAY_EVERY_S = 30.0


class SyncTimedOut(PrimeRunsError):
    """No progress for ``timeout_s``: the sync gave up (run it again; nothing is stored twice)."""


class SyncWatch:
    """Runs a call on a daemon thread and waits for it, saying so while nothing moves, until ``timeout_s``.

    ``say(text)`` prints a line (the CLI's stderr). ``progress()`` is called
    from the sync's thread whenever it moves on; it only stores a monotonic
    time, so it costs the sync nothing.
    """

    def __init__(self, timeout_s: float, say: Callable[[str], Any]) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be greater than 0, not {timeout_s}")
        self.timeout_s = timeout_s
        self.say_every_s = min(SAY_EVERY_S, timeout_s / 2)
        self.say = say
        self._last = time.monotonic()

    def progress(self, *_args: Any) -> None:
        """The sync moved on (any arguments are ignored: it fits any progress callback)."""
        self._last = time.monotonic()

    def run(self, call: Callable[[], T], url: str) -> T:
        """``call()``'s result; raises :class:`SyncTimedOut` after ``timeout_s`` without progress."""
        done = threading.Event()
        box: dict[str, Any] = {}

        def work() -> None:
            try:
                box["result"] = call()
            except BaseException as err:  # noqa: BLE001  (handed to the waiting thread as it is)
                box["error"] = err
            finally:
                done.set()

        self.progress()
        said = 0.0  # the silence already reported
        start_daemon(work, "prime-runs-sync")
        while True:
            silent = time.monotonic() - self._last
            if silent < said:
                said = 0.0  # it moved since the last line
            if silent >= self.timeout_s:
                raise SyncTimedOut(f"no progress uploading to {url} for {_s(silent)} s: gave up")
            if silent >= said + self.say_every_s:
                said = silent - silent % self.say_every_s
                self.say(f"no answer from {url} for {_s(said)} s; still waiting (gives up at {_s(self.timeout_s)} s)")
            wake = min(self.timeout_s, said + self.say_every_s) - silent
            if done.wait(max(0.05, wake)):
                break
        if "error" in box:
            raise box["error"]
        result: T = box["result"]
        return result


def _s(seconds: float) -> str:
    return f"{round(seconds, 1):g}"
