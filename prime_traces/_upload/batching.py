"""Deterministic, content-addressed batching of JSONL lines (contract §2).

A :class:`Batcher` cuts a stream of lines into :class:`Batch` es of at most
``target_batch_bytes`` uncompressed bytes and ``max_batch_lines`` lines. The
cut depends on the bytes alone, so the same input always gives the same
batches and therefore the same idempotency keys: re-running an upload replays
instead of duplicating. Nothing here does I/O except :func:`iter_file_lines`.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import threading
from collections.abc import Iterable, Iterator

from prime_traces._lines.parts import MAX_LINE_BYTES, LineLike, LineParts
from prime_traces._upload.body_buffers import BODY_BUFFERS, BUFFER_BYTES
from prime_traces.errors import TraceTooLargeError

DEFAULT_TARGET_BATCH_BYTES = BUFFER_BYTES  # 30 MiB: a body this size is joined into a reused buffer
MAX_BATCH_BYTES = 256 * 1024**2
MAX_BATCH_LINES = 1_000_000

_LF = b"\n"
_READ_BUFFER_BYTES = 1024**2


class Batch:
    """One upload's worth of JSONL: the exact body and where its lines came from.

    The body is joined and ``key`` hashed lazily, once, on the first thread
    that asks (an upload pool thread, not the producer). Both are safe to read
    from several threads. After the join the per-line pieces are released, so
    a queued batch holds one copy of its bytes. With ``reuse_buffers`` (the
    client's uploads) a large body is joined into a buffer reused from batch
    to batch (``prime_traces._upload.body_buffers``) and given back by
    :meth:`release`; a batch never released frees it when collected::

        batch = next(iter_batches([b'{"id": "a"}']))
        batch.body   # b'{"id": "a"}\\n'
        batch.key    # 'sha256:...' of batch.body
    """

    __slots__ = (
        "index",
        "first_line",
        "line_indexes",
        "size_bytes",
        "_parts",
        "_body",
        "_key",
        "_buffer",
        "_reuse",
        "_lock",
        "_released",
    )

    def __init__(
        self, index: int, parts: list[bytes], line_indexes: list[int], size_bytes: int, reuse_buffers: bool = False
    ):
        if not line_indexes:
            raise ValueError("a batch holds at least one line")
        #: 0-based number of this batch within its upload.
        self.index = index
        #: 0-based input index of the first line.
        self.first_line = line_indexes[0]
        #: Input index of each line; blank input lines are skipped, so gaps occur.
        self.line_indexes = line_indexes
        #: Uncompressed length of ``body``, newlines included.
        self.size_bytes = size_bytes
        self._parts: list[bytes] | None = parts
        self._body: bytes | memoryview | None = None
        self._buffer: mmap.mmap | None = None
        self._reuse = reuse_buffers
        self._key: str | None = None
        self._lock = threading.Lock()
        self._released = False

    @property
    def line_count(self) -> int:
        """How many lines the body holds."""
        return len(self.line_indexes)

    @property
    def body(self) -> bytes:
        """The exact uncompressed bytes to upload, each line ending in ``\\n`` (a copy when :attr:`data` is a view)."""
        data = self.data
        return data if isinstance(data, bytes) else data.tobytes()

    @property
    def data(self) -> bytes | memoryview:
        """:attr:`body` in place, to hash and compress: bytes, or, with ``reuse_buffers``, a read-only view.

        A view is valid until :meth:`release`, which gives its buffer back for
        another batch: read it only while the batch is being sent, and keep
        no slice of it.
        """
        body = self._body
        if body is None:
            with self._lock:
                if self._released:
                    raise RuntimeError(f"batch {self.index} was committed and its bytes released")
                if self._body is None:
                    assert self._parts is not None
                    joined = None
                    if self._reuse:
                        # Sizes that do not add up, no memory to map: joined as bytes.
                        with contextlib.suppress(ValueError, OSError):
                            joined = BODY_BUFFERS.join(self._parts, self.size_bytes)
                    if joined is None:
                        self._body = b"".join(self._parts)
                    else:
                        self._buffer, self._body = joined
                    self._parts = None
                body = self._body
        return body

    @property
    def key(self) -> str:
        """``sha256:<hex>`` of :attr:`body`: the upload's idempotency key."""
        key = self._key
        if key is None:
            digest = hashlib.sha256(self.data).hexdigest()
            # Two threads may race to hash; both get the same value, so the
            # plain assignment needs no lock.
            key = self._key = f"sha256:{digest}"
        return key

    def release(self) -> None:
        """Drop the bytes (the key, indexes and size stay): the batch is committed."""
        if self._key is None:  # never hashed, so never sent: keep the bytes
            return
        with self._lock:
            self._released = True
            body, buffer = self._body, self._buffer
            self._body = self._buffer = self._parts = None
        if buffer is not None:
            assert isinstance(body, memoryview)
            try:
                body.release()
            except BufferError:  # still being read (it should not be): that buffer is not reused
                return
            BODY_BUFFERS.give_back(buffer)

    @property
    def lines(self) -> list[bytes]:
        """The lines of :attr:`body`, each with its ``\\n`` (a fresh copy)."""
        return [line + _LF for line in self.body.split(_LF)[:-1]]

    def input_index_of(self, body_line: int) -> int | None:
        """Map a 1-based line number inside the body (contract §9) to its input index."""
        if 1 <= body_line <= len(self.line_indexes):
            return self.line_indexes[body_line - 1]
        return None

    def __repr__(self) -> str:
        return (
            f"Batch(index={self.index}, first_line={self.first_line}, "
            f"line_count={self.line_count}, size_bytes={self.size_bytes})"
        )


class Batcher:
    """Cut lines into batches, closing a batch *before* the line that would overflow it.

    A batch closes when the next line would push it past ``target_batch_bytes``
    (uncompressed, newline included) or when it already holds
    ``max_batch_lines`` lines. A single line larger than the target still
    travels, alone; one whose content exceeds :data:`MAX_LINE_BYTES` raises
    :class:`TraceTooLargeError`. Not thread-safe: one producer feeds it::

        batcher = Batcher(target_batch_bytes=1024**2)
        ready = [b for i, line in enumerate(lines) if (b := batcher.add(line, i))]
        ready += [b] if (b := batcher.close()) else []
    """

    def __init__(
        self,
        target_batch_bytes: int = DEFAULT_TARGET_BATCH_BYTES,
        max_batch_lines: int = MAX_BATCH_LINES,
        *,
        reuse_buffers: bool = False,
    ) -> None:
        if isinstance(target_batch_bytes, bool) or not isinstance(target_batch_bytes, int):
            raise TypeError("target_batch_bytes must be an int")
        if not 0 < target_batch_bytes <= MAX_BATCH_BYTES:
            raise ValueError(
                f"target_batch_bytes must be between 1 and {MAX_BATCH_BYTES} "
                f"(256 MiB, the service's limit per upload), got {target_batch_bytes}"
            )
        if isinstance(max_batch_lines, bool) or not isinstance(max_batch_lines, int):
            raise TypeError("max_batch_lines must be an int")
        if not 0 < max_batch_lines <= MAX_BATCH_LINES:
            raise ValueError(f"max_batch_lines must be between 1 and {MAX_BATCH_LINES}, got {max_batch_lines}")
        self.target_batch_bytes = target_batch_bytes
        self.max_batch_lines = max_batch_lines
        self.reuse_buffers = reuse_buffers
        self._next_index = 0
        self._parts: list[bytes] = []
        self._line_indexes: list[int] = []
        self._size = 0

    def add(self, line: bytes | LineParts, input_index: int) -> Batch | None:
        """Add one line; return the batch it closed, if any.

        ``line`` is one JSONL record; one trailing ``\\n`` is allowed, any other
        ``\\n`` is refused with :class:`ValueError`. Whitespace-only lines are
        skipped. The returned batch never contains ``line`` itself.
        """
        if isinstance(line, LineParts):
            return self._add_parts(line, input_index)
        # isspace() is False for b"" and stops at the first non-space byte, so
        # blank detection costs nothing on real records (strip() would copy).
        if not line or line.isspace():
            return None
        has_lf = line.endswith(_LF)
        content_size = len(line) - 1 if has_lf else len(line)
        if content_size > MAX_LINE_BYTES:
            raise TraceTooLargeError(input_index, content_size, MAX_LINE_BYTES)
        if line.find(_LF, 0, content_size) != -1:
            raise ValueError(
                f"line {input_index + 1} contains a newline inside it; "
                "pass one JSON record per line (json.dumps never emits one)"
            )
        line_size = content_size + 1
        closed = self._close_before(line_size)
        # The newline goes in as its own part so no line is ever copied here;
        # Batch.body joins everything once.
        self._parts.append(line)
        if not has_lf:
            self._parts.append(_LF)
        self._line_indexes.append(input_index)
        self._size += line_size
        return closed

    def _add_parts(self, line: LineParts, input_index: int) -> Batch | None:
        content_size = line.size
        if content_size > MAX_LINE_BYTES:
            raise TraceTooLargeError(input_index, content_size, MAX_LINE_BYTES)
        closed = self._close_before(content_size + 1)
        self._parts.extend(line)
        self._parts.append(_LF)
        self._line_indexes.append(input_index)
        self._size += content_size + 1
        return closed

    def _close_before(self, line_size: int) -> Batch | None:
        if self._line_indexes and (
            self._size + line_size > self.target_batch_bytes or len(self._line_indexes) >= self.max_batch_lines
        ):
            return self._take()
        return None

    def close(self) -> Batch | None:
        """Return the last, partly filled batch, or ``None`` when it is empty."""
        return self._take() if self._line_indexes else None

    def _take(self) -> Batch:
        batch = Batch(self._next_index, self._parts, self._line_indexes, self._size, self.reuse_buffers)
        self._next_index += 1
        self._parts = []
        self._line_indexes = []
        self._size = 0
        return batch


def _as_bytes(line: LineLike, input_index: int) -> bytes | LineParts:
    if isinstance(line, (bytes, LineParts)):
        return line
    if isinstance(line, str):
        return line.encode("utf-8")
    if isinstance(line, (bytearray, memoryview)):
        return bytes(line)
    raise TypeError(f"line {input_index + 1} is a {type(line).__name__}; expected bytes or str")


def iter_batches(
    lines: Iterable[LineLike],
    *,
    target_batch_bytes: int = DEFAULT_TARGET_BATCH_BYTES,
    max_batch_lines: int = MAX_BATCH_LINES,
    first_batch_bytes: int | None = None,
    reuse_buffers: bool = False,
) -> Iterator[Batch]:
    """Yield the batches of ``lines`` (bytes or ``str``, UTF-8 encoded), lazily.

    A line's input index is its position in ``lines``. Zero non-blank lines
    yield nothing. An oversized line raises :class:`TraceTooLargeError` before
    the batch that would hold it is yielded. With ``first_batch_bytes`` the
    first batch closes at that size instead (a small first request), the
    rest at ``target_batch_bytes``. With ``reuse_buffers`` a large body is
    joined into a buffer reused from batch to batch, given back by
    :meth:`Batch.release` (what the client's uploads do; see :class:`Batch`).
    """
    first = min(first_batch_bytes, target_batch_bytes) if first_batch_bytes else target_batch_bytes
    batcher = Batcher(target_batch_bytes=first, max_batch_lines=max_batch_lines, reuse_buffers=reuse_buffers)
    for input_index, line in enumerate(lines):
        closed = batcher.add(_as_bytes(line, input_index), input_index)
        if closed is not None:
            batcher.target_batch_bytes = target_batch_bytes
            yield closed
    last = batcher.close()
    if last is not None:
        yield last


def iter_file_lines(path: str | os.PathLike[str]) -> Iterator[bytes]:
    """Stream the lines of a JSONL file as bytes, split on ``\\n`` only.

    Each line keeps its ``\\n`` (and any ``\\r`` before it, which counts toward
    its size); the last line may lack one. The file is read in buffered
    chunks, never whole.
    """
    # Binary mode: readline splits on b"\n" alone, so a stray \r or \x85 inside
    # a record never cuts it in two as text mode's universal newlines would.
    with open(path, "rb", buffering=_READ_BUFFER_BYTES) as handle:
        yield from handle
