"""A line of JSONL as the encoder hands it to the batcher: whole, or in pieces never joined on their own."""

from __future__ import annotations

#: The longest line the contract allows (§2), its newline not counted.
MAX_LINE_BYTES = 64 * 1024**2


class LineParts(tuple):
    """One line given as consecutive pieces of bytes, never joined on their own.

    The encoder hands a large record over this way, so its JSON is copied only
    once, into the batch body. The pieces hold no newline (the encoder
    guarantees it); ``size`` is the line's length.
    """

    __slots__ = ()

    @property
    def size(self) -> int:
        return sum(map(len, self))


LineLike = bytes | bytearray | memoryview | str | LineParts


def line_size(line: bytes | LineParts) -> int:
    """The length of a line, given whole or in parts."""
    return line.size if isinstance(line, LineParts) else len(line)
