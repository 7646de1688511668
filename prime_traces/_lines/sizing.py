"""Size a value for the record encoder, checking its floats; or guess its size, checking nothing.

The encoder cuts a large record into pieces of about ``PIECE_BYTES``, so it must
know which values fit in a piece. :func:`scan` walks a value until past a
limit, estimating its encoded size and refusing NaN and ±Infinity (orjson would
write them as ``null``): a return within the limit means every float in the value
was checked. :func:`estimate` guesses a value's size from the first and last
items of each list, in microseconds, so that a value plainly too big for a piece
is not scanned for a piece's worth before the encoder descends into it (a wrong
guess only cuts that value into smaller pieces).
"""

from __future__ import annotations

import dataclasses
import enum
import heapq
import math
import sys
from typing import Any

FLOAT_BYTES = 22  # a float32 logprob prints as ~20 characters, a float64 as up to 24
INT_BYTES = 6
KEY_BYTES = 12  # a dict key: its quotes, colon and comma, and ~8 characters
NUMBER = (int, float)
UNPROBED_ITEMS = 64  # chunked: a list of this many other values is gone through item by item
ESTIMATE_NODES = 64  # containers a guess looks at, at most


_UNSET = object()


class NonFinite(ValueError):
    """args[0] is the NaN or ±Infinity found."""


def native_items(value: object) -> dict[Any, Any] | None:
    """What orjson writes of a dataclass instance, as a dict of name to value; None for any other value.

    orjson takes a value for a dataclass only when its type itself was made
    one (``__dataclass_fields__`` in the type's own ``__dict__``), and writes
    the instance's ``__dict__``, or its fields when the type itself declares
    ``__slots__``, leaving out names that start with an underscore; a NaN
    among them becomes ``null``, as anywhere else, so the walk below and the
    locator look in. A name that is not a string is kept (orjson refuses it);
    a slot never set is left out.
    """
    kind = type(value)
    if "__dataclass_fields__" not in kind.__dict__:
        return None
    attributes = None if "__slots__" in kind.__dict__ else getattr(value, "__dict__", None)
    if attributes is not None:
        pairs = list(attributes.items())
    else:
        pairs = [(field.name, getattr(value, field.name, _UNSET)) for field in dataclasses.fields(value)]  # type: ignore[arg-type]
    return {name: item for name, item in pairs if item is not _UNSET and not (type(name) is str and name[:1] == "_")}


def check_numbers(seq: Any) -> bool:
    """Whether seq holds only ints and floats; raises NonFinite on NaN or ±Infinity."""
    try:
        total = sum(seq)  # C speed, and NaN or ±Infinity anywhere makes the total non-finite
    except Exception:  # noqa: BLE001  not all numbers (numpy values inside may broadcast or warn): look at each
        return False
    if type(total) is int:
        return True
    if not isinstance(total, float):
        return False  # numpy scalars, Decimals: the item-by-item scan judges them
    if not math.isfinite(total):
        for x in seq:
            if isinstance(x, float) and not math.isfinite(x):
                raise NonFinite(x)
    return True  # finite floats whose sum overflowed


def keys_bytes(mapping: dict) -> int:
    """A dict's braces and keys, as :func:`scan` counts them (its values aside)."""
    return 2 + KEY_BYTES * dict.__len__(mapping)


def estimate(value: object, limit: int) -> int:
    """Guess value's encoded size from the first and last items of each list, checking nothing.

    Items standing for the most siblings go first. Stops once past limit, or
    after taking ESTIMATE_NODES values off its heap (a dict's strings and
    numbers are read in passing; a dict of more than that many values stands
    on its first), so a wide value costs about what a narrow one does.
    Guesses overshoot as well as undershoot: use one only to spare a scan.
    """
    np = sys.modules.get("numpy")
    size, nodes, order = 0, ESTIMATE_NODES, 0
    heap: list[tuple[int, int, Any]] = [(-1, 0, value)]  # minus how many siblings a value stands for
    while heap and nodes and size <= limit:
        minus, _, v = heapq.heappop(heap)
        times = -minus
        nodes -= 1
        t = type(v)
        if t is str:
            size += times * (len(v) + 2)
        elif t is dict or (t is not list and isinstance(v, dict)):
            n = dict.__len__(v)
            if n > ESTIMATE_NODES:  # wide: its first value stands for all
                size += times * n * KEY_BYTES
                order += 1
                heapq.heappush(heap, (-times * n, order, next(iter(dict.values(v)))))
                continue
            size += times * (2 + KEY_BYTES * n)
            for x in dict.values(v):
                tx = type(x)
                if tx is str:
                    size += times * len(x)
                elif tx is float:
                    size += times * FLOAT_BYTES
                elif tx is int or tx is bool or x is None:
                    size += times * INT_BYTES
                else:
                    order += 1
                    heapq.heappush(heap, (minus, order, x))
        elif t is list or t is tuple or isinstance(v, list):
            exact = t is list or t is tuple
            n = len(v) if exact else list.__len__(v)  # a subclass's own storage, as orjson reads it
            size += times * (n + 2)
            if n:
                first = v[0] if exact else list.__getitem__(v, 0)
                if type(first) in NUMBER:
                    size += times * n * (FLOAT_BYTES if type(first) is float else INT_BYTES)
                elif n == 1:
                    order += 1
                    heapq.heappush(heap, (minus, order, first))
                else:  # the first and the last item each stand for half of them
                    last = v[-1] if exact else list.__getitem__(v, -1)
                    heapq.heappush(heap, (-times * (n // 2), order + 1, first))
                    heapq.heappush(heap, (-times * (n - n // 2), order + 2, last))
                    order += 2
        elif np is not None and isinstance(v, np.ndarray):
            size += times * FLOAT_BYTES * v.size
        else:
            size += times * INT_BYTES
    return size


def scan(value: object, limit: int, own_piece_items: int = 0) -> int:
    """Estimate value's encoded size and check its floats, returning once past limit.

    A return of at most limit means every float in value was checked; lists of
    numbers are summed only then, so a scan that stops early wastes no sums.
    With own_piece_items, a long list of numbers (or numpy array), or a long
    list of anything, makes the scan return more than limit at once.
    """
    np = sys.modules.get("numpy")
    size = 0
    # Any: the loop dispatches on the exact type() of each value, which mypy cannot narrow through.
    stack: list[Any] = [value]
    numbers: list[list | tuple] = []
    while True:
        while stack:
            v = stack.pop()
            t = type(v)
            if t is str:
                size += len(v) + 2 if v.isascii() else 2 * len(v) + 2
            elif t is dict or (t is not list and isinstance(v, dict)):
                if t is dict:  # len() and .values() cost less than calls through dict's slots
                    size += 2 + KEY_BYTES * len(v)
                    values = v.values()
                else:  # a subclass's own storage, as orjson reads it
                    size += 2 + KEY_BYTES * dict.__len__(v)
                    values = dict.values(v)
                for x in values:
                    tx = type(x)
                    if tx is str:
                        size += len(x) if x.isascii() else 2 * len(x)
                    elif tx is float:
                        if not math.isfinite(x):
                            raise NonFinite(x)
                        size += FLOAT_BYTES
                    elif tx is int or tx is bool or x is None:
                        size += INT_BYTES
                    else:
                        stack.append(x)
            elif t is list or t is tuple or isinstance(v, list):
                if t is not list and t is not tuple:
                    v = list.__getitem__(v, slice(None))
                n = len(v)
                if n and type(v[0]) in NUMBER and type(v[-1]) in NUMBER:
                    if own_piece_items and n >= own_piece_items:
                        return sys.maxsize
                    size += n * (FLOAT_BYTES if type(v[0]) is float else INT_BYTES)
                    numbers.append(v)
                elif own_piece_items and n >= UNPROBED_ITEMS:
                    return sys.maxsize
                else:
                    size += n + 2
                    stack.extend(v)
            elif t is float or isinstance(v, float) or (np is not None and isinstance(v, np.floating)):
                if not math.isfinite(v):  # numpy's float32 and float16 too
                    raise NonFinite(float(v))
                size += FLOAT_BYTES
            elif np is not None and isinstance(v, np.ndarray):
                if own_piece_items and v.size >= own_piece_items:
                    return sys.maxsize
                size += v.size * FLOAT_BYTES + 2
                if size > limit:
                    return size
                if v.dtype.kind in "fc" and not np.isfinite(v).all():
                    raise NonFinite(v[~np.isfinite(v)].flat[0].item())
                if v.dtype.kind == "O":
                    stack.extend(v.ravel().tolist())
            elif t is int or t is bool or v is None:
                size += INT_BYTES
            elif isinstance(v, enum.Enum):
                size += INT_BYTES  # so that a member whose value leads back to it still ends the walk
                stack.append(v.value)  # orjson writes a member as its value
            else:
                native = native_items(v)
                if native is None:
                    size += INT_BYTES
                else:  # a dataclass: written as a dict of its public attributes
                    size += 2 + KEY_BYTES * len(native)
                    stack.extend(native.values())
            if size > limit:
                return size
        if not numbers:
            return size
        v = numbers.pop()
        if not check_numbers(v):
            stack.extend(v)  # numbers at both ends only: look at every item
