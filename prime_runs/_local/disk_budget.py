"""The run's disk budget: how many bytes its record files may take (``max_spool_bytes``).

A slow link costs disk space instead of records, so the space must be
bounded too: past the budget a write is refused the way a full disk
refuses it (``ENOSPC``, so what fits is still kept, frame by frame), with
an error that says it was the budget, not the disk. The budget counts the
compressed entries this process wrote to its segment files; it never
shrinks (a sync that uploads them does not delete them).

The default is a share of the space free on the run directory's
filesystem when the run starts (:data:`DEFAULT_FREE_SHARE`): a run never
fills a disk other jobs need, and never stops short of space it has.
"""

from __future__ import annotations

import errno
import os
import threading

from prime_traces.threads import call_in_forked_child

#: The default budget: this share of the space free where the run directory is, when the run starts.
DEFAULT_FREE_SHARE = 0.9


class SpoolBudgetSpent(OSError):
    """A write past the run's ``max_spool_bytes``; ``errno`` is ``ENOSPC`` so it is handled as a full disk."""

    def __init__(self, limit_bytes: int, used_bytes: int, path: str | None) -> None:
        super().__init__(
            errno.ENOSPC,
            f"the run's disk budget is spent: max_spool_bytes={limit_bytes}, {used_bytes} bytes written; "
            "what does not fit is not kept (raise init(max_spool_bytes=...))",
            path,
        )
        self.limit_bytes = limit_bytes
        self.used_bytes = used_bytes


class DiskBudget:
    """Bytes this process's record files may still take; shared by its segment writers, thread-safe."""

    def __init__(self, limit_bytes: int) -> None:
        if limit_bytes < 0:
            raise ValueError(f"max_spool_bytes must be at least 0, got {limit_bytes}")
        self.limit_bytes = limit_bytes
        self.used_bytes = 0
        self._lock = threading.Lock()
        call_in_forked_child(self._reset_lock)

    def _reset_lock(self) -> None:
        # After fork: a parent's thread may have held the lock; the child's own is free.
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"DiskBudget({self.used_bytes} of {self.limit_bytes} bytes)"

    def charge(self, size_bytes: int, path: str | None) -> None:
        """Take ``size_bytes`` of the budget, or raise :class:`SpoolBudgetSpent` (nothing taken)."""
        with self._lock:
            if self.used_bytes + size_bytes > self.limit_bytes:
                raise SpoolBudgetSpent(self.limit_bytes, self.used_bytes, path)
            self.used_bytes += size_bytes

    def refund(self, size_bytes: int) -> None:
        """Give back what a write that failed had taken."""
        with self._lock:
            self.used_bytes = max(0, self.used_bytes - size_bytes)


def default_max_spool_bytes(directory: str) -> int | None:
    """:data:`DEFAULT_FREE_SHARE` of the space free where ``directory`` is (or would be); None if unknown."""
    path = os.path.abspath(directory)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent
    try:
        stats = os.statvfs(path)
    except (OSError, AttributeError):  # no statvfs (Windows), or the path went away
        return None
    return int(stats.f_bavail * stats.f_frsize * DEFAULT_FREE_SHARE)
