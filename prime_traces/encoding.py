"""Records to lines: the encoder and the line rules, for code that batches records itself.

:class:`~prime_traces.TracesClient` encodes what it uploads with these; code
that queues records and hands them to the client later (``prime_runs``) uses
the same functions, so a record becomes the same bytes, and breaks the same
rules, whichever way it travels.

- :class:`LineFormat`: what a line is, a trace or an episode envelope (contract §7).
- :func:`record_form`: the one rule for what a record is (a mapping; else its
  ``to_json()`` bytes; else its ``to_record()``; else an error naming it).
- :func:`is_episode`: whether a record is an episode envelope (contract §7).
- :func:`encode_record_parts`: strict JSON for one record, as one line, whole
  (``bytes``) or in pieces (:class:`LineParts`) for large records, which the
  batcher copies once into the request body; :func:`line_size` measures both.
- :func:`check_record`: the local service's rules for one line (ids, sizes,
  the traces of an episode), raising :class:`LineError` with the contract's
  error code, so a record the service would refuse is known before it is sent.

Usage::

    from prime_traces.encoding import encode_record_parts, line_size

    line = encode_record_parts({"id": "t-1", "messages": []}, index=0)
    print(line_size(line))
"""

from __future__ import annotations

import enum

from prime_traces._lines.encoder import encode_record_parts, is_episode, record_form
from prime_traces._lines.parts import MAX_LINE_BYTES, LineParts, line_size
from prime_traces._lines.rules import LineError, LineFacts, check_record

__all__ = [
    "MAX_LINE_BYTES",
    "LineError",
    "LineFormat",
    "LineFacts",
    "LineParts",
    "check_record",
    "encode_record_parts",
    "is_episode",
    "line_size",
    "record_form",
]


class LineFormat(str, enum.Enum):
    """The two line formats of an upload (contract §7); each equals its string (``"trace"``, ``"episode"``)."""

    TRACE = "trace"
    EPISODE = "episode"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)
