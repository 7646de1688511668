"""Encode upload records as compact, strict JSON without holding the GIL for long.

One ``orjson.dumps`` of a 35 MB episode holds the GIL for ~100 ms, stalling
the caller's event loop and every other thread for as long. Records whose
estimated encoding passes ``CHUNK_THRESHOLD_BYTES`` are therefore encoded piece
by piece: runs of dict items and list elements of about ``PIECE_BYTES`` each,
descending into any value too big to be one piece, with ``time.sleep(0)``
about every ``YIELD_INTERVAL_S`` so that waiting threads get the GIL. The
pieces join into bytes identical to one ``orjson.dumps`` of the record, which
is what smaller records get.

The JSON is strict: orjson writes NaN and ±Infinity as ``null``, so floats
are checked on the way (a C-speed ``sum`` per list of numbers, ``isfinite``
per numpy float array) and refused.
"""

from __future__ import annotations

import io
import math
import sys
import time
from collections.abc import Mapping
from typing import Any

import orjson

CHUNK_THRESHOLD_BYTES = 1_000_000
PIECE_BYTES = 128 * 1024
YIELD_INTERVAL_S = 0.001

_OPTIONS = orjson.OPT_SERIALIZE_NUMPY
_MAX_DEPTH = 254  # orjson's own nesting limit; also stops a cycle in the chunked path
_FLOAT_BYTES = 22  # a float32 logprob prints as ~20 characters, a float64 up to 24
_INT_BYTES = 8
_SPLIT_ITEMS = 256  # chunked: a list of numbers this long is checked through its own pieces


class _NonFinite(ValueError):
    def __init__(self, value: object) -> None:
        super().__init__(value)
        self.value = value


class _Unencodable(TypeError):
    def __init__(self, value: object) -> None:
        super().__init__(type(value).__name__)
        self.value = value


def _default(obj: object) -> object:
    np = sys.modules.get("numpy")
    if np is not None and isinstance(obj, np.ndarray):
        return obj.tolist()  # not C-contiguous, or a dtype orjson has no native path for
    raise _Unencodable(obj)


def _check_numbers(seq: Any) -> bool:
    """Whether seq holds only ints and floats; raises _NonFinite on NaN or ±Infinity."""
    try:
        total = sum(seq)  # C speed, and NaN or ±Infinity anywhere makes the total non-finite
    except (TypeError, ValueError, OverflowError):  # not all numbers; numpy arrays inside may broadcast
        return False
    if type(total) is int:
        return True
    if not isinstance(total, float):
        return False  # numpy scalars, Decimals, arrays: let the element-wise scan judge them
    if not math.isfinite(total):
        for x in seq:
            if isinstance(x, float) and not math.isfinite(x):
                raise _NonFinite(x)
    return True  # an overflowing sum of finite floats


def _scan(value: object, limit: int, split_items: int = 0) -> int:
    """Estimate value's encoded size and check its floats, returning once past limit.

    A return of at most limit means every float in value was checked, and
    _NonFinite raised for NaN or ±Infinity; lists of numbers are summed only
    then, so a scan that stops early wastes no sums. With split_items, a list
    of numbers (or numpy array) of at least that many items makes the scan
    return more than limit: the caller gives it pieces of its own, whose
    output it checks at memchr speed instead.
    """
    np = sys.modules.get("numpy")
    size = 0
    stack = [value]
    numbers: list[list | tuple] = []
    while True:
        while stack:
            v = stack.pop()
            t = type(v)
            if t is str:
                size += len(v) + 2 if v.isascii() else 3 * len(v) + 2
            elif t is dict or (t is not list and isinstance(v, dict)):
                size += 2 + 12 * dict.__len__(v)  # keys: quotes, colon, comma and ~8 characters
                for x in dict.values(v):  # a subclass's own storage, as orjson reads it
                    tx = type(x)
                    if tx is str:
                        size += len(x) if x.isascii() else 3 * len(x)
                    elif tx is float:
                        if not math.isfinite(x):
                            raise _NonFinite(x)
                        size += _FLOAT_BYTES
                    elif tx is int or tx is bool or x is None:
                        size += _INT_BYTES
                    else:
                        stack.append(x)
            elif t is list or t is tuple or isinstance(v, list):
                if t is not list and t is not tuple:
                    v = list.__getitem__(v, slice(None))
                n = len(v)
                kind, last = (type(v[0]), type(v[-1])) if n else (None, None)
                if (kind is float or kind is int) and (last is float or last is int):
                    if split_items and n >= split_items:
                        return sys.maxsize
                    size += n * (_FLOAT_BYTES if kind is float else _INT_BYTES)
                    numbers.append(v)
                else:
                    size += n + 2
                    stack.extend(v)
            elif t is float or isinstance(v, float):
                if not math.isfinite(v):
                    raise _NonFinite(v)
                size += _FLOAT_BYTES
            elif np is not None and isinstance(v, np.ndarray):
                if split_items and v.size >= split_items:
                    return sys.maxsize
                size += v.size * _FLOAT_BYTES + 2
                if size > limit:
                    return size
                if v.dtype.kind in "fc" and not np.isfinite(v).all():
                    raise _NonFinite(v[~np.isfinite(v)].flat[0].item())
                if v.dtype.kind == "O":
                    stack.extend(v.ravel().tolist())
            elif np is not None and isinstance(v, np.floating):
                if not np.isfinite(v):
                    raise _NonFinite(v.item())
                size += _FLOAT_BYTES
            else:
                size += _INT_BYTES
            if size > limit:
                return size
        if not numbers:
            return size
        v = numbers.pop()
        if not _check_numbers(v):
            stack.extend(v)  # numbers at both ends only: look at every item


class _Chunker:
    """One chunked encoding: the output so far, and when the GIL was last released.

    Each piece is a run of items that _scan checked in full, or a run of
    numbers (list or numpy array) checked through its output. Pieces go
    without their brackets into a BytesIO, whose getvalue() hands over its
    buffer without a copy: the output is written once, as one dumps would.
    """

    def __init__(self, piece_bytes: int, yield_interval_s: float) -> None:
        self.piece = piece_bytes
        self.interval = yield_interval_s
        self.since = time.perf_counter()
        self.out = io.BytesIO()
        self.write = self.out.write

    def _emit(self, value: object, comma: bool, numbers: bool = False, whole: bool = False) -> None:
        data = orjson.dumps(value, default=_default, option=_OPTIONS)
        # orjson writes NaN and ±Infinity as null, and numbers have no "n" in
        # them (memchr speed), so a run of numbers without one needs no scan.
        if numbers and b"n" in data:
            _scan(value, sys.maxsize)
        if comma:
            self.write(b",")
        self.write(data if whole else memoryview(data)[1:-1])
        now = time.perf_counter()
        if now - self.since >= self.interval:
            time.sleep(0)  # releases the GIL, so a thread waiting for it can take it
            self.since = time.perf_counter()

    def value(self, value: object, depth: int) -> None:
        if depth > _MAX_DEPTH:
            raise orjson.JSONEncodeError("Recursion limit reached")
        np = sys.modules.get("numpy")
        if isinstance(value, dict):
            self._dict(value, depth)
        elif type(value) is list or type(value) is tuple:
            self._list(value, depth)
        elif isinstance(value, list):  # through list's own storage, as orjson reads it
            self._list(list.__getitem__(value, slice(None)), depth)
        elif np is not None and isinstance(value, np.ndarray) and value.ndim > 0 and len(value):
            self._array(value)
        else:
            self._emit(value, False, numbers=True, whole=True)

    def _dict(self, mapping: dict, depth: int) -> None:
        piece, write = self.piece, self.write
        write(b"{")
        batch: dict = {}
        batch_size, comma = 0, False
        for key, item in dict.items(mapping):  # a subclass's own storage, as orjson reads it
            kind = type(item)
            if kind is str:
                size = len(item) if item.isascii() else 3 * len(item)
            elif kind is int or kind is bool or item is None:
                size = _INT_BYTES
            else:
                size = _scan(item, piece, _SPLIT_ITEMS)
            if size <= piece:
                batch[key] = item
                batch_size += size
                if batch_size < piece:
                    continue
            if batch:
                self._emit(batch, comma)
                comma, batch, batch_size = True, {}, 0
            if size > piece:
                if type(key) is not str:
                    raise orjson.JSONEncodeError("Dict key must be str")
                write(b"," + orjson.dumps(key) + b":" if comma else orjson.dumps(key) + b":")
                comma = True
                self.value(item, depth + 1)
        if batch:
            self._emit(batch, comma)
        write(b"}")

    def _list(self, seq: list | tuple, depth: int) -> None:
        piece, n = self.piece, len(seq)
        self.write(b"[")
        kind, last = (type(seq[0]), type(seq[-1])) if n else (None, None)
        if (kind is float or kind is int) and (last is float or last is int):
            step = max(1, piece // (_FLOAT_BYTES if kind is float else _INT_BYTES))
            if n <= step:
                self._emit(seq, False, numbers=True)  # no slice: copying it costs more than encoding
            for i in range(0, n if n > step else 0, step):
                self._emit(seq[i : i + step], i > 0, numbers=True)
            self.write(b"]")
            return
        i = 0
        while i < n:
            j, batch_size = i, 0
            while j < n and batch_size < piece:
                size = _scan(seq[j], piece, _SPLIT_ITEMS)
                if size > piece:
                    break
                batch_size += size
                j += 1
            if j > i:
                self._emit(seq[i:j], i > 0)
                i = j
            else:
                if i > 0:
                    self.write(b",")
                self.value(seq[i], depth + 1)
                i += 1
        self.write(b"]")

    def _array(self, array: Any) -> None:
        rows = len(array)
        step = max(1, self.piece // (max(1, array.size // rows) * _FLOAT_BYTES))
        # A one-row slice of a strided array counts as contiguous; convert it the
        # way the default hook converts the whole array, so the bytes agree.
        as_list = not array.flags.c_contiguous
        self.write(b"[")
        for i in range(0, rows, step):
            part = array[i : i + step]
            self._emit(part.tolist() if as_list else part, i > 0, numbers=True)
        self.write(b"]")


def _from_to_json(record: object, index: int) -> bytes:
    data = record.to_json()  # type: ignore[attr-defined]
    if isinstance(data, str):
        data = data.encode("utf-8")
    elif isinstance(data, (bytearray, memoryview)):
        data = bytes(data)
    elif not isinstance(data, bytes):
        raise TypeError(f"record {index}: to_json() returned {type(data).__name__}, expected bytes or str")
    if data.endswith(b"\n"):
        data = data[:-2] if data.endswith(b"\r\n") else data[:-1]
    if not data.startswith(b"{") or not data.endswith(b"}"):
        raise ValueError(f"record {index}: to_json() must return one JSON object, got {data[:40]!r}")
    if b"\n" in data or b"\r" in data:
        raise ValueError(f"record {index}: to_json() returned JSON with a line break inside")
    return data


class RecordEncoder:
    """Encode one record as a compact strict JSON line body (no trailing newline).

    A record is a mapping, an object whose ``to_record()`` returns a mapping,
    or an object whose ``to_json()`` returns its JSON object as bytes or str
    (used as-is). ``encode`` blocks for about one ``orjson.dumps`` of the
    record; above ``chunk_threshold_bytes`` it releases the GIL about every
    ``yield_interval_s``. An encoder holds only settings, so it is thread-safe.

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
        if not isinstance(record, dict):
            if callable(getattr(record, "to_json", None)):
                return _from_to_json(record, index)
            if callable(getattr(record, "to_record", None)):
                mapped = record.to_record()  # type: ignore[attr-defined]
                if not isinstance(mapped, Mapping):
                    raise TypeError(f"record {index}: to_record() returned {type(mapped).__name__}, expected a mapping")
                record = mapped
            elif not isinstance(record, Mapping):
                raise TypeError(
                    f"record {index}: expected a mapping or an object with to_record() or to_json(), "
                    f"got {type(record).__name__}"
                )
            if not isinstance(record, dict):
                record = dict(record)
        try:
            if _scan(record, self.chunk_threshold_bytes) <= self.chunk_threshold_bytes:
                return orjson.dumps(record, default=_default, option=_OPTIONS)
            chunker = _Chunker(self.piece_bytes, self.yield_interval_s)
            chunker.value(record, 0)
            return chunker.out.getvalue()
        except _NonFinite as err:
            raise ValueError(f"record {index}: {err.value!r} is not valid JSON (NaN and Infinity are refused)") from None
        except orjson.JSONEncodeError as err:
            cause = err.__cause__
            if isinstance(cause, _Unencodable):
                raise TypeError(f"record {index}: cannot encode value of type {type(cause.value).__name__}") from err
            raise TypeError(f"record {index}: {err}") from err


_default_encoder = RecordEncoder()


def encode_record(record: object, index: int) -> bytes:
    """Encode ``record`` (number ``index`` in its batch, for error messages) with the default settings.

    See ``RecordEncoder.encode``.
    """
    return _default_encoder.encode(record, index)
