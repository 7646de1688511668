"""Encode a large record in pieces, none of which holds the GIL for long.

One ``orjson.dumps`` of a 35 MB episode holds the GIL for ~100 ms, stalling every
other thread. The chunker cuts a record into pieces of about ``PIECE_BYTES``
(runs of dict items and list elements, descending into values too big for one
piece), sized by :func:`item_sizes` and ``prime_traces._lines.sizing``; the pieces
join into the bytes of one ``orjson.dumps``. Between pieces, about every
``YIELD_INTERVAL_S``, a one-microsecond sleep hands the GIL to a thread waiting
for it: the ~55 µs it idles on Linux (the kernel's timer slack) are what let
the waiter take it, where ``os.sched_yield()`` returns before the waiter wakes
and takes the GIL straight back (and so does ``time.sleep(0)`` on Python 3.10).
When the interpreter's switch interval is no longer than the yield interval
(as while a ``prime_runs`` run uploads) it already hands the GIL over in time,
and the chunker yields with the cheaper ``sched_yield``, which still lets a
thread waiting for a core run. orjson writes NaN and ±Infinity as ``null``, so
the scan that sizes a value checks its floats too, and a long list of numbers
is checked through its output. ``prime_traces._lines.encoder`` decides which records
are chunked.
"""

from __future__ import annotations

import io
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import orjson

from prime_traces._lines.parts import LineParts
from prime_traces._lines.sizing import (
    FLOAT_BYTES,
    INT_BYTES,
    NUMBER,
    UNPROBED_ITEMS,
    estimate,
    keys_bytes,
    native_items,
    scan,
)

PIECE_BYTES = 64 * 1024
YIELD_INTERVAL_S = 0.001

# Dataclasses come to _default: orjson's own path crashes the process on a slot never set (3.13).
OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_PASSTHROUGH_DATACLASS
_MAX_DEPTH = 254  # orjson's own nesting limit; also ends a cycle in the chunked path
_OWN_PIECE_ITEMS = 1024  # chunked: a list of this many numbers is checked through its own pieces
_SEGMENT_BYTES = 4 << 20  # growing one buffer to the whole output would copy it all at times


#: Idles the thread for the kernel's timer slack (~55 µs): long enough for a thread waiting for the GIL to
#: take it. time.sleep(0) does the same from Python 3.11 on, but returns at once on 3.10 (it handed over 0-2 of 50).
_HANDOVER_SLEEP_S = 1e-6


def _yield() -> None:
    time.sleep(_HANDOVER_SLEEP_S)  # hands the GIL to a waiting thread (see the module's docstring)


_sched_yield: Callable[[], None] | None = getattr(os, "sched_yield", None)


class Unencodable(TypeError):
    """args[0] is the value neither orjson nor the default hook can encode."""


def default(obj: object) -> object:
    """orjson's ``default`` hook: a dataclass as orjson writes it, an array it has no native path for."""
    native = native_items(obj)
    if native is not None:
        return native  # what orjson writes of a dataclass, as the check walk reads it
    np = sys.modules.get("numpy")
    if np is not None and isinstance(obj, np.ndarray):
        return obj.tolist()  # not C-contiguous, or a dtype orjson has no native path for
    raise Unencodable(obj)


def item_sizes(mapping: dict, piece: int, limit: int = 0) -> list[int]:
    """The size of each of mapping's values as a piece holds it: more than a piece for one cut on its own.

    A size within a piece means the value was scanned whole, its floats checked.
    With ``limit`` (a record's own values, which may go in one dumps) each value
    is scanned up to what its keys and the values before it leave of ``limit``
    (at least a piece), so that a record within it is found to be; but a short
    list that a guess puts over all of ``limit`` is taken as too big, unscanned. Without
    it (the values of a dict cut into pieces), long lists and lists that look
    too big for a piece are taken as too big too.
    """
    sizes, left = [], limit - keys_bytes(mapping)
    for item in dict.values(mapping):  # a subclass's own storage, as orjson reads it
        kind = type(item)
        if kind is str:
            size = len(item) if item.isascii() else 2 * len(item)
        elif kind is int or kind is bool or item is None:
            size = INT_BYTES
        elif limit:
            # A few large values (an episode's traces): scanning them up to the limit first would be waste. A
            # guess over a piece is not enough: one long last message makes a 20 KB chat look like 90 KB.
            if kind is list and 0 < len(item) < UNPROBED_ITEMS and estimate(item, limit) > limit:
                size = sys.maxsize
            else:
                size = scan(item, max(left, piece))  # so a size within a piece is always a whole scan
        elif kind is list and len(item) >= _OWN_PIECE_ITEMS and type(item[0]) in NUMBER:
            size = sys.maxsize  # numbers (or not: its own pieces are checked either way)
        elif kind is list and (len(item) >= UNPROBED_ITEMS or len(item) > 1 and estimate(item, piece) > piece):
            size = sys.maxsize  # looks too big for a piece: scanning a piece of it first would be waste
        else:
            size = scan(item, piece, _OWN_PIECE_ITEMS)
        sizes.append(size)
        left -= size
    return sizes


class Chunker:
    """One chunked encoding: its output so far, and when it last released the GIL.

    A piece is items that scan checked in full, numbers checked through their
    output, or part of a string. BytesIO segments hand over their buffers uncopied.
    """

    def __init__(self, piece_bytes: int, yield_interval_s: float) -> None:
        self.piece, self.interval = piece_bytes, yield_interval_s
        # Under a switch interval no longer than the yield interval the interpreter hands the GIL over in
        # time; a sched_yield (~0.5 us) then only lets a thread waiting for a core run (lag p99 4.1 ms
        # against 5.2 without it, for 3% of throughput; the handing-over sleep cost 10%).
        fast = sys.getswitchinterval() <= yield_interval_s
        self.release_gil: Callable[[], None] = _sched_yield if fast and _sched_yield is not None else _yield
        self.since = time.perf_counter()
        self.segments: list[bytes] = []
        self.out = io.BytesIO()

    def _emit(self, value: object, comma: bool, numbers: bool = False, whole: bool = False) -> None:
        data = orjson.dumps(value, default=default, option=OPTIONS)
        if numbers and b"n" in data:  # NaN and ±Infinity came out as null; numbers have no "n"
            scan(value, sys.maxsize)
        out = self.out
        if comma:
            out.write(b",")
        out.write(data if whole else memoryview(data)[1:-1])
        if out.tell() >= _SEGMENT_BYTES:
            self.segments.append(out.getvalue())
            self.out = io.BytesIO()
        now = time.perf_counter()
        if now - self.since >= self.interval:
            self.release_gil()  # so a thread waiting for the GIL, or for a core, can run
            self.since = time.perf_counter()

    def parts(self) -> LineParts:
        self.segments.append(self.out.getvalue())
        return LineParts(self.segments)

    def value(self, value: object, depth: int) -> None:
        if depth > _MAX_DEPTH:
            raise orjson.JSONEncodeError("Recursion limit reached")
        np = sys.modules.get("numpy")
        if isinstance(value, dict):
            self.dict_of(value, depth)
        elif type(value) is list or type(value) is tuple:
            self._list(value, depth)
        elif isinstance(value, list):  # through list's own storage, as orjson reads it
            self._list(list.__getitem__(value, slice(None)), depth)
        elif np is not None and isinstance(value, np.ndarray) and value.ndim > 0 and len(value):
            self._array(value)
        elif (native := native_items(value)) is not None:  # a dataclass: orjson writes it as this dict
            self.dict_of(native, depth)
        elif type(value) is str:  # JSON escapes per character: parts of a string encode to parts of its JSON
            self.out.write(b'"')
            for i in range(0, len(value), self.piece):
                self._emit(value[i : i + self.piece], False)
            self.out.write(b'"')
        else:
            self._emit(value, False, numbers=True, whole=True)

    def dict_of(self, mapping: dict, depth: int, sizes: list[int] | None = None) -> None:
        """Encode mapping, its values sized by :func:`item_sizes` (given, or found here)."""
        piece = self.piece
        if sizes is None:
            sizes = item_sizes(mapping, piece)
        self.out.write(b"{")
        batch, batch_size, comma = {}, 0, False
        for (key, item), size in zip(dict.items(mapping), sizes):
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
                self.out.write(b"," + orjson.dumps(key) + b":" if comma else orjson.dumps(key) + b":")
                comma = True
                self.value(item, depth + 1)
        if batch:
            self._emit(batch, comma)
        self.out.write(b"}")

    def _list(self, seq: list | tuple, depth: int) -> None:
        piece, n = self.piece, len(seq)
        self.out.write(b"[")
        if n and type(seq[0]) in NUMBER and type(seq[-1]) in NUMBER:
            step = max(1, piece // (FLOAT_BYTES if type(seq[0]) is float else INT_BYTES))
            if n <= step:
                self._emit(seq, False, numbers=True)  # a slice would copy it for nothing
            for i in range(0, n if n > step else 0, step):
                self._emit(seq[i : i + step], i > 0, numbers=True)
            self.out.write(b"]")
            return
        # A short list cut into pieces has items of a piece's size or more: guess before scanning each.
        i, guess, over = 0, n < UNPROBED_ITEMS, False
        while i < n:
            j, batch_size = i, 0
            while j < n and batch_size < piece:
                # After a sibling took a long scan to turn out too big for a piece, guess first: the next likely is too.
                if guess and estimate(seq[j], piece) > piece:
                    size = sys.maxsize
                else:
                    size = scan(seq[j], piece, _OWN_PIECE_ITEMS)
                    guess = piece < size < sys.maxsize  # maxsize: the scan saw at once
                over = size > piece
                if over:
                    break
                batch_size += size
                j += 1
            if j > i:
                self._emit(seq[i:j], i > 0)
            if over:
                if j > 0:
                    self.out.write(b",")
                self.value(seq[j], depth + 1)
                j += 1
            i = j
        self.out.write(b"]")

    def _array(self, array: Any) -> None:
        rows = len(array)
        step = max(1, self.piece // (max(1, array.size // rows) * FLOAT_BYTES))
        # A one-row slice of a strided array is contiguous: convert it as default() would the whole.
        as_list = not array.flags.c_contiguous
        self.out.write(b"[")
        for i in range(0, rows, step):
            part = array[i : i + step]
            self._emit(part.tolist() if as_list else part, i > 0, numbers=True)
        self.out.write(b"]")
