"""The segment format: file names, entries, frames of lines (what a writer writes and a reader reads).

A segment file ``<kind>-<host>-<pid>-<seq>.jsonl.zst`` is a sequence of entries::

    [skippable frame: {"lines": n, "bytes": raw, "zbytes": z, "batch": true?}] [zstd frame: n lines]

``zstdcat`` reads the lines of any segment (it skips the metadata); the
metadata lets a reader count and skip lines without decompressing. Writing
is :mod:`prime_runs._local.segments`, reading and repair
:mod:`prime_runs._local.segment_reader`.
"""

from __future__ import annotations

import os
import re
import socket
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import orjson
import zstandard

from prime_traces.encoding import LineParts

SUFFIX = ".jsonl.zst"
#: Kinds of segment: records to upload (by line format), and records set aside.
DATA_KINDS = ("episode", "trace")
REJECTED = "rejected"
#: A run's metrics history rows (``{step, time, metrics}``), kept offline or when the service did not take them.
METRICS = "metrics"
#: Lines are cut into frames of about this many uncompressed bytes, or this many lines, whichever comes
#: first (a batch entry is never cut): a byte the disk changes loses one frame, so frames stay small. Against
#: 16 MiB frames, 1 MiB / 100 lines cost 1-2 % of zstd's ratio on generated episodes, and no speed.
MAX_FRAME_BYTES = 1024**2
MAX_FRAME_LINES = 100
ZSTD_LEVEL = 1

META_MAGIC = 0x184D2A5E  # a zstd skippable frame: decoders pass over it
SKIPPABLE = range(0x184D2A50, 0x184D2A60)
ZSTD_MAGIC = 0xFD2FB528
FRAME_HEADER = struct.Struct("<II")
MAX_META_BYTES = 4096
_NAME_RE = re.compile(r"^(?P<kind>[a-z]+)-(?P<host>.+)-(?P<pid>\d+)-(?P<seq>\d{6,})" + re.escape(SUFFIX) + "$")
_HOST_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def host_label() -> str:
    """This machine's name, safe inside a file name."""
    return _HOST_UNSAFE.sub("_", socket.gethostname() or "host")[:64] or "host"


@dataclass(frozen=True)
class SegmentName:
    """``<kind>-<host>-<pid>-<seq>.jsonl.zst``."""

    kind: str
    host: str
    pid: int
    seq: int

    @classmethod
    def parse(cls, filename: str) -> SegmentName | None:
        match = _NAME_RE.match(filename)
        if match is None:
            return None
        return cls(match["kind"], match["host"], int(match["pid"]), int(match["seq"]))

    def __str__(self) -> str:
        return f"{self.kind}-{self.host}-{self.pid}-{self.seq:06d}{SUFFIX}"


def segment_files(directory: str, kinds: Iterable[str]) -> list[str]:
    """Paths of the segments of ``kinds`` in ``directory``, in name order (missing directory: none)."""
    wanted = set(kinds)
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = [(n, SegmentName.parse(n)) for n in names]
    return sorted(os.path.join(directory, n) for n, parsed in found if parsed is not None and parsed.kind in wanted)


@dataclass
class Frame:
    """Lines to write as one entry; ``batch`` marks lines that must travel as one upload."""

    lines: list[bytes | LineParts]
    batch: bool = False


def encode_entry(compressor: zstandard.ZstdCompressor, frame: Frame) -> tuple[bytes, bytes]:
    """The metadata frame and the zstd frame of ``frame``'s lines."""
    raw = sum(len(line) if isinstance(line, (bytes, bytearray)) else line.size for line in frame.lines)
    raw += len(frame.lines)
    stream = compressor.compressobj(size=raw)
    chunks = []
    for line in frame.lines:
        for part in (line,) if isinstance(line, (bytes, bytearray)) else line:
            chunks.append(stream.compress(part))
        chunks.append(stream.compress(b"\n"))
    chunks.append(stream.flush())
    data = b"".join(chunks)
    meta: dict[str, object] = {"lines": len(frame.lines), "bytes": raw, "zbytes": len(data)}
    if frame.batch:
        meta["batch"] = True
    payload = orjson.dumps(meta)
    return FRAME_HEADER.pack(META_MAGIC, len(payload)) + payload, data


def frame_bytes(frame: Frame) -> int:
    """The uncompressed bytes of ``frame``'s lines, a newline after each."""
    return sum(len(line) if isinstance(line, (bytes, bytearray)) else line.size for line in frame.lines) + len(
        frame.lines
    )


def frames_of(
    lines: Iterable[bytes | LineParts], max_frame_bytes: int = MAX_FRAME_BYTES, max_frame_lines: int = MAX_FRAME_LINES
) -> Iterator[Frame]:
    """Cut a stream of lines into frames of about ``max_frame_bytes`` or ``max_frame_lines``, never splitting one."""
    pending: list[bytes | LineParts] = []
    size = 0
    for line in lines:
        pending.append(line)
        size += (len(line) if isinstance(line, (bytes, bytearray)) else line.size) + 1
        if size >= max_frame_bytes or len(pending) >= max_frame_lines:
            yield Frame(pending)
            pending, size = [], 0
    if pending:
        yield Frame(pending)
