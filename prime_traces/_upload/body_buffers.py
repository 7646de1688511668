"""Reused memory for batch bodies, so that the allocator does not keep what they freed.

A batch's body (up to 30 MiB) is joined from its lines on a request thread,
hashed and compressed there, and dropped once the batch commits. Joined into a
fresh ``bytes`` it comes from that thread's malloc arena, and glibc keeps a
freed chunk of that size: freeing a mapped chunk of up to 32 MiB raises the
process's mmap threshold to its size and the trim threshold to twice that
(``mallopt(3)``), so the next bodies come from the arenas, and each request
thread's arena keeps its high-water mark. The load test measured most of the
memory above its workload there (``docs/benchmarks.md``).

A batch the client uploads (``iter_batches(reuse_buffers=True)``) whose body
is at least :data:`MIN_POOLED_BYTES`, at most :data:`BUFFER_BYTES` and made of
``bytes`` pieces of :data:`MIN_MEAN_PART_BYTES` on average (records of episode
size, not many small lines, which ``bytes.join`` copies faster than a Python
loop) is joined instead into a private anonymous memory map from a
process-wide free list, and given back when the batch commits. A reused map
is already in memory, so a body costs no page faults; at most
:data:`MAX_IDLE_BUFFERS` wait unused, the rest are unmapped at once, and
:meth:`BodyBuffers.trim` unmaps the idle ones (a client does when it closes).
The copy goes in slices of :data:`COPY_SLICE_BYTES`, so no single step holds
the GIL for long.
"""

from __future__ import annotations

import mmap
import threading
from collections.abc import Sequence

from prime_traces.threads import call_in_forked_child

#: The size of a reused buffer: the default batch target (``_batching.DEFAULT_TARGET_BATCH_BYTES``).
BUFFER_BYTES = 30 * 1024**2
#: A smaller body is joined as bytes: a map would cost a system call for little.
MIN_POOLED_BYTES = 1024**2
#: Bodies of many small lines are joined as bytes: one slice assignment per line costs more than the copy.
MIN_MEAN_PART_BYTES = 64 * 1024
#: Unused buffers kept for the next bodies; any more are unmapped when given back.
MAX_IDLE_BUFFERS = 4
#: The most copied in one step with the GIL held (~0.1 ms).
COPY_SLICE_BYTES = 1024**2


class BodyBuffers:
    """A free list of anonymous memory maps that batch bodies are joined into.

    Thread-safe. The maps are private: after ``fork`` the child writes to its
    own copies, and starts with an empty list. A body joined here is a
    read-only view that stays valid until its buffer is given back: only give
    back a buffer whose views nobody reads any more.

        buffers = BodyBuffers()
        joined = buffers.join([b"x" * 99_999 + b"\\n"] * 20, 2_000_000)  # None: join it as bytes
        if joined is not None:
            buffer, body = joined  # ... hash and send body ...
            body.release()
            buffers.give_back(buffer)
    """

    def __init__(self, buffer_bytes: int = BUFFER_BYTES, max_idle: int = MAX_IDLE_BUFFERS) -> None:
        if buffer_bytes < 1:
            raise ValueError(f"buffer_bytes must be at least 1, not {buffer_bytes}")
        if max_idle < 0:
            raise ValueError(f"max_idle must be at least 0, not {max_idle}")
        self.buffer_bytes = buffer_bytes
        self.max_idle = max_idle
        self._reset()
        call_in_forked_child(self._reset)

    def _reset(self) -> None:
        # A lock a parent thread held at fork time would stay held in the child.
        self._lock = threading.Lock()
        self._idle: list[mmap.mmap] = []
        self.created = 0  # buffers mapped so far, for tests and stats

    @property
    def idle(self) -> int:
        """How many buffers wait unused."""
        return len(self._idle)

    def fits(self, size: int, parts: int) -> bool:
        """Whether a body of ``size`` bytes in ``parts`` pieces is joined here (they must be ``bytes`` too)."""
        return MIN_POOLED_BYTES <= size <= self.buffer_bytes and parts * MIN_MEAN_PART_BYTES <= size

    def join(self, parts: Sequence[bytes], size: int) -> tuple[mmap.mmap, memoryview] | None:
        """Copy ``parts`` (``size`` bytes in all) into a buffer: the buffer and a read-only view of the body.

        ``None`` when the body is not joined here (:meth:`fits`, or a piece
        that is not ``bytes``); ``ValueError`` when the pieces do not hold
        ``size`` bytes, ``OSError`` when no memory could be mapped.
        """
        if not self.fits(size, len(parts)) or not all(type(part) is bytes for part in parts):
            return None
        buffer = self._take()
        view = memoryview(buffer)
        position = 0
        try:
            for part in parts:
                n = len(part)
                if position + n > size:
                    raise ValueError(f"the parts hold more than the {size} bytes given")
                if n <= COPY_SLICE_BYTES:
                    view[position : position + n] = part
                else:
                    source = memoryview(part)
                    for start in range(0, n, COPY_SLICE_BYTES):
                        piece = source[start : start + COPY_SLICE_BYTES]
                        view[position + start : position + start + len(piece)] = piece
                position += n
            if position != size:
                raise ValueError(f"the parts hold {position} bytes, not the {size} given")
            body = view[:size].toreadonly()
        except BaseException:
            view.release()
            self.give_back(buffer)
            raise
        view.release()
        return buffer, body

    def give_back(self, buffer: mmap.mmap) -> None:
        """Keep ``buffer`` for the next body, or unmap it when enough wait already."""
        with self._lock:
            if any(idle is buffer for idle in self._idle):
                return  # given back twice (a copied batch released twice): two bodies must never share it
            if len(self._idle) < self.max_idle:
                self._idle.append(buffer)
                return
        _unmap(buffer)

    def trim(self) -> None:
        """Unmap every idle buffer (the memory goes back to the system)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for buffer in idle:
            _unmap(buffer)

    def _take(self) -> mmap.mmap:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        buffer = _map(self.buffer_bytes)
        with self._lock:
            self.created += 1
        return buffer

    def __repr__(self) -> str:
        return f"BodyBuffers(buffer_bytes={self.buffer_bytes}, idle={self.idle}, created={self.created})"


def _map(size: int) -> mmap.mmap:
    # Private: mmap's own default on POSIX is a shared map, which a forked child would write into.
    private = getattr(mmap, "MAP_PRIVATE", None)
    return mmap.mmap(-1, size) if private is None else mmap.mmap(-1, size, flags=private)


def _unmap(buffer: mmap.mmap) -> None:
    try:
        buffer.close()
    except BufferError:  # a view is still read somewhere: the map goes when the last view does
        pass


#: The process's buffers, shared by every client.
BODY_BUFFERS = BodyBuffers()
