"""Synchronisation helpers for threaded tests."""

from __future__ import annotations

import threading


class NotedWaitEvent(threading.Event):
    """An Event that notes, through ``waiting``, that a thread has started waiting on it."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting.set()
        return super().wait(timeout)
