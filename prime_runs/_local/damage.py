"""Damage is not a tear: a record file that lost what its writer had made durable.

A torn tail is the last entry of a file whose writer died while writing it:
cutting it off loses nothing that was ever kept. A file its writer closed
whole is another matter. The writer records each such file's size and line
count (``sealed_files`` in ``run.json``); when the file later reads fewer
lines than that (the disk lost its end, a byte flipped in an entry's
metadata), records were lost after they were kept. That is damage:

- the lines lost are counted (written, less what still reads);
- the bytes past the last whole entry are set aside in a file next to it,
  ``<file>.damaged`` (never deleted), and the file is cut back to its whole
  entries so that a sync can read them;
- ``prime-runs sync`` reports it at every run with a distinct exit status
  (running it again cannot bring those records back).

An entry whose frame no longer decodes (its checksum fails) is counted by
the sync itself (``unreadable`` in ``sync.json``), and is damage too. Even a
tear's bytes are kept, in ``<file>.torn``, before they are cut off: whether
a tail was torn or damaged, no byte a writer wrote is deleted.

Records the run itself never kept anywhere (:func:`lost_by_run`) are the
other loss a sync reports: no file holds them, so it can only count them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prime_runs._local.segment_reader import scan
from prime_runs._local.segments import fsync_directory
from prime_runs._records import reasons

#: Bytes copied at a time when setting a damaged tail aside.
_COPY_BYTES = 1024**2


@dataclass(frozen=True)
class Damage:
    """One record file that reads fewer lines than its writer closed it with."""

    path: str
    written_lines: int
    written_bytes: int
    kept_lines: int
    found_bytes: int
    #: Where the bytes that do not read were set aside (``None``: there were none left to keep).
    aside: str | None = None

    @property
    def lost(self) -> int:
        return self.written_lines - self.kept_lines

    def describe(self) -> str:
        text = (
            f"{self.path} is damaged: {self.written_lines} records were written to it ({self.written_bytes} bytes), "
            f"{self.kept_lines} can be read ({self.found_bytes} bytes found); {self.lost} are lost"
        )
        if self.aside is not None:
            text += f"; the bytes that do not read are kept in {self.aside}"
        return text


def sealed_sizes(document: Mapping[str, Any] | None) -> dict[str, tuple[int, int]]:
    """``run.json``'s record of files closed whole: ``{file name: (bytes, lines)}`` (malformed entries skipped)."""
    raw = (document or {}).get("sealed_files")
    found: dict[str, tuple[int, int]] = {}
    if not isinstance(raw, Mapping):
        return found
    for name, value in raw.items():
        if (
            isinstance(name, str)
            and isinstance(value, (list, tuple))
            and len(value) == 2
            and all(isinstance(v, int) and v >= 0 for v in value)
        ):
            found[name] = (value[0], value[1])
    return found


def check_sealed(path: str, written_bytes: int, written_lines: int, *, repair: bool = True) -> Damage | None:
    """The damage of a file closed whole with ``written_lines``; ``None`` when every line still reads.

    With ``repair``, bytes past the last whole entry are copied aside first,
    then cut off (so the whole entries can be uploaded); without it nothing
    is changed (``prime-runs ls``).
    """
    found = scan(path, verify_last=True)
    if found.live or found.lines >= written_lines:
        return None
    total = os.path.getsize(path)
    aside = None
    if repair and total > found.size:
        aside = _set_aside(path, found.size, total)
        with open(path, "rb+") as handle:
            handle.truncate(found.size)
            handle.flush()
            os.fsync(handle.fileno())
    return Damage(path, written_lines, written_bytes, found.lines, total, aside)


def set_torn_tail_aside(path: str) -> str | None:
    """Before a torn tail is cut off: its bytes copied to ``<path>.torn`` (never deleted); ``None``: no tail."""
    found = scan(path, verify_last=True)
    if found.live or not found.torn_bytes:
        return None
    return _set_aside(path, found.size, found.size + found.torn_bytes, suffix="torn")


def _set_aside(path: str, start: int, end: int, *, suffix: str = "damaged") -> str:
    """Copy bytes ``[start, end)`` of ``path`` to a new ``<path>.<suffix>`` (``-2``, ``-3``... if taken)."""
    for n in range(1, 1000):
        aside = f"{path}.{suffix}" if n == 1 else f"{path}.{suffix}-{n}"
        try:
            fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue
        break
    else:
        raise FileExistsError(f"no free name to set the damaged part of {path} aside")
    try:
        with open(path, "rb") as source, os.fdopen(fd, "wb") as target:
            source.seek(start)
            left = end - start
            while left > 0:
                chunk = source.read(min(_COPY_BYTES, left))
                if not chunk:
                    break
                target.write(chunk)
                left -= len(chunk)
            target.flush()
            os.fsync(target.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(aside)
        raise
    fsync_directory(os.path.dirname(path) or ".")
    return aside


def lost_by_run(document: dict[str, Any] | None) -> dict[str, int]:
    """What ``run.json``'s counters say the run lost for good, by reason: dropped at its queue, or failed for no
    fault of the record's in a sink of record (not the ``local`` copy); rejections are kept aside, not lost."""
    counters = (document or {}).get("counters")
    if not isinstance(counters, dict):
        return {}
    lost: dict[str, int] = {}
    places = [counters.get("dropped")]
    sinks = counters.get("sinks")
    if isinstance(sinks, dict):
        places += [sink.get("failed") for name, sink in sinks.items() if name != "local" and isinstance(sink, dict)]
    for counts in places:
        for reason, count in (counts if isinstance(counts, dict) else {}).items():
            if isinstance(count, int) and count > 0 and not reasons.is_own_fault(str(reason)):
                lost[str(reason)] = lost.get(str(reason), 0) + count
    return lost
