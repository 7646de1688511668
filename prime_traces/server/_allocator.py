"""The allocator of a ``prime-traces serve`` process: freed request memory kept for the next requests.

An upload needs its body, the traces part decoded from it (up to 30 MiB),
and for a moment a decoded copy of each slice the UTF-8 check reads. With
glibc's defaults each request thread takes these from an arena of its own,
and freed memory of that size goes back to the system: a mapped chunk is
unmapped (glibc then raises its mapping threshold, so later chunks come from
the thread's arena), and a thread's heap is trimmed or dropped. The next
request then touches fresh pages, and the kernel zeroes each 4 KiB page as it
is first touched. Under the load test's scenario (e), 16 slow uploads at
once, a profile of the service put two thirds of its CPU in that zeroing
(2026-12-03; on this virtual machine a fresh page can cost far more than it
would on bare metal, and the cost moved from hour to hour).

:func:`keep_freed_memory` tunes glibc's malloc for the whole process, so the
command line calls it for ``serve`` only: that process is its own, while a
library must never do this to the process that imports it. It sets one arena
for every thread, so what one request frees the next can reuse whichever
thread runs it; chunks of up to 32 MiB (a batch decoded) from the heap rather
than mapped apart; and free memory at the heap's top given back only past
``keep_bytes`` (the service's body-memory budget: it may hold that much for
bodies at once anyway). A setting the environment already makes
(``MALLOC_ARENA_MAX``, ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``
or its ``GLIBC_TUNABLES`` name) is left as the user set it. Other C
libraries (musl, macOS, Windows) are left alone.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from collections.abc import Callable

logger = logging.getLogger(__name__)

#: A 30 MiB batch decoded fits under it; glibc before 2.35 accepts no more than this (``HEAP_MAX_SIZE / 2``).
HEAP_CHUNK_MAX_BYTES = 32 * 1024**2

# mallopt(3) parameters from glibc's <malloc.h>, with the environment variable and tunable that also set them.
_SETTINGS = (
    ("M_ARENA_MAX", -8, "MALLOC_ARENA_MAX", "glibc.malloc.arena_max"),
    ("M_MMAP_THRESHOLD", -3, "MALLOC_MMAP_THRESHOLD_", "glibc.malloc.mmap_threshold"),
    ("M_TRIM_THRESHOLD", -1, "MALLOC_TRIM_THRESHOLD_", "glibc.malloc.trim_threshold"),
)
_INT_MAX = 2**31 - 1  # mallopt takes a C int


def keep_freed_memory(keep_bytes: int) -> bool:
    """Keep freed memory for reuse in this process (see the module); True when glibc took every setting made.

    Call it before the process starts any thread: an arena a thread already
    has stays its own. ``keep_bytes`` is capped at what ``mallopt`` takes
    (2 GiB). Without glibc it changes nothing and returns False; a setting
    glibc refuses is logged, and the others stay made.
    """
    if keep_bytes < 0:
        raise ValueError(f"keep_bytes must be at least 0, not {keep_bytes}")
    mallopt = _glibc_mallopt()
    if mallopt is None:
        return False
    values = (1, HEAP_CHUNK_MAX_BYTES, min(keep_bytes, _INT_MAX))  # in _SETTINGS' order
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    made: list[str] = []
    refused: list[str] = []
    for (name, param, variable, tunable), value in zip(_SETTINGS, values):
        if variable in os.environ or tunable in tunables:
            continue  # the user's choice for this process
        (made if mallopt(param, value) == 1 else refused).append(f"{name}={value}")
    if refused:
        logger.warning("glibc refused %s; freed request memory may go back to the system", ", ".join(refused))
    logger.debug("allocator: %s", ", ".join(made) or "left as the environment sets it")
    return not refused


def _glibc_mallopt() -> Callable[[int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - present in glibc only (musl has a mallopt that ignores these)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt
