"""Encode upload records as compact, strict JSON without holding the GIL for long.

A record at most ``CHUNK_THRESHOLD_BYTES`` is one ``orjson.dumps``; a larger one
is cut into pieces by ``prime_traces._lines.chunker``, whose docstring says how it
hands the GIL over between them. A record is sized value by value
(:func:`~prime_traces._lines.chunker.item_sizes`), as the pieces are: a short list
whose guessed size is over the whole threshold (an episode's traces) makes it
chunked without a scan, so its start is not walked twice. orjson writes NaN and
±Infinity as ``null``, so sizing a value checks its floats too
(``prime_traces._lines.sizing``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import orjson

from prime_traces._lines.chunker import (
    OPTIONS,
    PIECE_BYTES,
    YIELD_INTERVAL_S,
    Chunker,
    Unencodable,
    default,
    item_sizes,
)
from prime_traces._lines.locate import describe_located
from prime_traces._lines.parts import LineParts
from prime_traces._lines.sizing import NonFinite, keys_bytes, scan

CHUNK_THRESHOLD_BYTES = 256_000  # estimated output size above which a record is chunked (~0.5 ms of dumps)
SMALL_RECORD_BYTES = 4_000  # a record scanned within this is one dumps at once (most metrics rows)


def _from_to_json(record: object, index: int, call: Any = None) -> bytes:
    method = record.to_json  # type: ignore[attr-defined]
    data = call(method, "to_json()") if call is not None else method()
    if isinstance(data, (str, bytearray, memoryview)):
        data = data.encode() if isinstance(data, str) else bytes(data)
    if not isinstance(data, bytes):
        raise TypeError(f"record {index}: to_json() returned {type(data).__name__}, expected bytes or str")
    data = data[:-1] if data.endswith(b"\n") else data
    if not data.startswith(b"{") or not data.endswith(b"}") or b"\n" in data or b"\r" in data:
        raise ValueError(f"record {index}: to_json() must return one JSON object on one line, got {data[:40]!r}")
    return data


def _call(method: Any, _name: str) -> Any:
    return method()


def record_form(record: object, index: int, call: Any = _call) -> Mapping[str, Any] | bytes:
    """The one rule for what a record is, wherever it is logged or uploaded.

    A mapping is itself; otherwise its ``to_json()`` (bytes or str: one JSON
    object on one line), returned as bytes to be used as they are; otherwise
    its ``to_record()``, which must return a mapping; otherwise a pydantic
    model's ``model_dump(mode="json")``. An object that offers its own bytes
    is never re-encoded. ``call(method,
    name)`` invokes the record's method (a caller may wrap what it raises).
    """
    if isinstance(record, Mapping):
        return record
    if callable(getattr(record, "to_json", None)):
        return _from_to_json(record, index, call)
    to_record = getattr(record, "to_record", None)
    if callable(to_record):
        mapped = call(to_record, "to_record()")
        if not isinstance(mapped, Mapping):
            raise TypeError(f"record {index}: to_record() returned {type(mapped).__name__}, expected a mapping")
        return mapped
    model_dump = getattr(record, "model_dump", None)
    if callable(model_dump):
        dumped = call(functools.partial(model_dump, mode="json"), "model_dump()")
        if not isinstance(dumped, Mapping):
            raise TypeError(f"record {index}: model_dump() returned {type(dumped).__name__}, expected a mapping")
        return dumped
    kind = type(record).__name__
    raise TypeError(f"record {index}: {kind} is not a mapping and has no to_record(), to_json() or model_dump()")


def is_episode(record: Any) -> bool:
    """A mapping with a ``traces`` key, or an object with a ``traces`` attribute (contract §7)."""
    if isinstance(record, Mapping):
        return "traces" in record
    if hasattr(record, "keys"):
        try:
            return "traces" in record
        except TypeError:
            return False
    return hasattr(record, "traces")


class RecordEncoder:
    """Encode one record as the compact strict JSON of a line (without the newline).

    A record is a mapping, else an object whose ``to_json()`` returns its JSON
    object as bytes or str (used as-is), else an object whose ``to_record()``
    returns a mapping: :func:`record_form`, the rule ``prime_runs`` follows
    too. ``encode`` blocks for about one ``orjson.dumps`` of the record, and
    above ``chunk_threshold_bytes`` releases the GIL about every
    ``yield_interval_s``. An encoder holds only settings: share it between threads.
    A chunked record is checked for depth piece by piece (orjson counts the
    levels of each piece from its own root): below values larger than a
    piece it may nest deeper than the 254 levels one ``orjson.dumps`` accepts.

        encoder = RecordEncoder()
        line = encoder.encode({"id": "t-1", "timing": {"start": 1.75e9}}, 0) + b"\\n"
        assert line == b'{"id":"t-1","timing":{"start":1750000000.0}}\\n'
    """

    def __init__(
        self,
        *,
        chunk_threshold_bytes: int = CHUNK_THRESHOLD_BYTES,
        piece_bytes: int = PIECE_BYTES,
        yield_interval_s: float = YIELD_INTERVAL_S,
    ) -> None:
        if chunk_threshold_bytes < 0:
            raise ValueError("chunk_threshold_bytes must be at least 0")
        if piece_bytes < 1:
            raise ValueError("piece_bytes must be greater than 0")
        if yield_interval_s < 0:
            raise ValueError("yield_interval_s must be at least 0")
        self.chunk_threshold_bytes = chunk_threshold_bytes
        self.piece_bytes = piece_bytes
        self.yield_interval_s = yield_interval_s

    def encode(self, record: object, index: int) -> bytes:
        """Return ``record`` as compact UTF-8 JSON, byte-identical to ``orjson.dumps``.

        Raises ``ValueError`` for NaN or ±Infinity and ``TypeError`` for a value
        JSON cannot hold; both messages start with ``record {index}:``.
        """
        line = self.encode_parts(record, index)
        # A join of bytes objects over 1 MiB copies with the GIL released.
        return b"".join(line) if isinstance(line, LineParts) else line

    def encode_parts(self, record: object, index: int) -> bytes | LineParts:
        """As :meth:`encode`, but a chunked record comes back as its pieces, unjoined.

        The batcher copies the pieces straight into the batch body, so a large
        record's JSON is written to memory once less.
        """
        if not isinstance(record, dict):
            form = record_form(record, index)
            if isinstance(form, bytes):
                return form
            record = form if isinstance(form, dict) else dict(form)
        try:
            threshold = self.chunk_threshold_bytes
            # A small record is scanned, never guessed (a guess can overshoot tenfold), and stays one dumps.
            first = min(threshold, SMALL_RECORD_BYTES)
            if scan(record, first) <= first:
                return orjson.dumps(record, default=default, option=OPTIONS)
            # Sized value by value, as the chunker sizes them anyway: scanning the whole record up to the
            # threshold first would walk a large record's first quarter MB twice. A short list that a guess
            # puts over the threshold makes the record chunked, whatever its real size.
            sizes = item_sizes(record, self.piece_bytes, threshold)
            if sum(sizes) + keys_bytes(record) <= threshold:
                return orjson.dumps(record, default=default, option=OPTIONS)
            chunker = Chunker(self.piece_bytes, self.yield_interval_s)
            chunker.dict_of(record, 0, sizes)
            return chunker.parts()
        except NonFinite as err:
            where = describe_located(record) or f"{err.args[0]!r} is not JSON (NaN and Infinity are refused)"
            raise ValueError(f"record {index}: {where}") from None
        except orjson.JSONEncodeError as err:
            located = describe_located(record)
            if located is not None:
                raise TypeError(f"record {index}: {located}") from err
            if isinstance(err.__cause__, Unencodable):
                kind = type(err.__cause__.args[0]).__name__
                raise TypeError(f"record {index}: cannot encode value of type {kind}") from err
            raise TypeError(f"record {index}: {err}") from err


_default_encoder = RecordEncoder()


def encode_record(record: object, index: int) -> bytes:
    """``RecordEncoder().encode(record, index)``: ``index`` names the record in errors."""
    return _default_encoder.encode(record, index)


def encode_record_parts(record: object, index: int) -> bytes | LineParts:
    """``RecordEncoder().encode_parts(record, index)``: for the batcher, unjoined."""
    return _default_encoder.encode_parts(record, index)
