"""The allocator of a ``prime-traces serve`` process: freed request memory kept for the next requests.

An upload needs its body, the traces part decoded from it (up to 30 MiB),
and for a moment a decoded copy of each slice the UTF-8 check reads. With
glibc's defaults each request thread takes these from an arena of its own,
and freed chunks of that size go back to the system: a mapped chunk is
unmapped, and a thread's heap is trimmed or dropped. The next request then
touches fresh pages, and the kernel zeroes each 4 KiB page as it is first
touched. Under the load test's scenario (e), 16 slow uploads at once, a
profile of the service put two thirds of its CPU in that zeroing (2026-12-03;
on this virtual machine a fresh page can cost far more than it would on bare
metal, and the cost moved from hour to hour).

:func:`keep_freed_memory` tunes glibc's malloc for the whole process, so the
command line calls it for ``serve`` only: that process is its own, while a
library must never do this to the process that imports it. It sets one arena
for every thread, so what one request frees the next can reuse whichever
thread runs it; chunks of up to 32 MiB (a batch decoded) from the heap rather
than mapped apart; and memory given back only past ``keep_bytes`` free at
the heap's top (the service's body-memory budget: it may hold that much for
bodies at once anyway). Elsewhere than on glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import logging
import sys
from collections.abc import Callable

logger = logging.getLogger(__name__)

#: glibc's ceiling for ``M_MMAP_THRESHOLD`` on 64-bit (``HEAP_MAX_SIZE / 2``): a 30 MiB batch fits under it.
HEAP_CHUNK_MAX_BYTES = 32 * 1024**2

# mallopt(3) parameters, from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
_INT_MAX = 2**31 - 1


def keep_freed_memory(keep_bytes: int) -> bool:
    """Keep freed memory for reuse in this process (see the module); True when glibc took every setting.

    Call it before the process starts any thread: an arena a thread already
    has stays its own. ``keep_bytes`` is capped at what ``mallopt`` accepts
    (2 GiB). False, changing nothing, where there is no glibc.
    """
    if keep_bytes < 0:
        raise ValueError(f"keep_bytes must be at least 0, not {keep_bytes}")
    mallopt = _glibc_mallopt()
    if mallopt is None:
        return False
    settings = (
        ("M_ARENA_MAX", _M_ARENA_MAX, 1),
        ("M_MMAP_THRESHOLD", _M_MMAP_THRESHOLD, HEAP_CHUNK_MAX_BYTES),
        ("M_TRIM_THRESHOLD", _M_TRIM_THRESHOLD, min(keep_bytes, _INT_MAX)),
    )
    refused = [name for name, param, value in settings if mallopt(param, value) != 1]
    if refused:
        logger.debug("glibc refused %s; freed memory may go back to the system", ", ".join(refused))
        return False
    logger.debug(
        "allocator: one arena, chunks of up to %d bytes from the heap, up to %d bytes kept free",
        HEAP_CHUNK_MAX_BYTES,
        min(keep_bytes, _INT_MAX),
    )
    return True


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
