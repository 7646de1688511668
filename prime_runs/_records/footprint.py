"""How many times its JSON a record takes in memory as Python objects, from a bounded sampled walk.

The queue bounds what the run holds by the records' encoded (JSON) size,
which the encoder measures exactly; the caller's objects are larger, by a
factor that depends on their shape: about 1.2 for long strings, 2 to 3 for
chat turns and parsed JSON, 5 to 6 for lists of token ids (a 28-byte int and
an 8-byte slot for a 5-byte number). :func:`expansion` walks a sample of a
record (at most :data:`SAMPLE_ITEMS` children of each container, weighted
by how many they stand for, and :data:`MAX_NODES` objects in all) and
estimates both what the sampled objects take and what their JSON takes, so
that the ratio of the two holds even where the walk stopped early. Objects
Python shares (small ints, ``None``, booleans, dict keys, which are mostly
the same few strings) are not counted. It costs about a millisecond for a
10 MB episode; the worker samples a record now and then, not each one.
"""

from __future__ import annotations

import sys
from typing import Any

#: At most this many children of one container are walked; each stands for its share of the rest.
SAMPLE_ITEMS = 16
#: At most this many objects are walked per record.
MAX_NODES = 2_000
#: No record is taken to be smaller in memory than its JSON.
MIN_EXPANSION = 1.0
#: Nor more than this (a record of empty containers could otherwise claim anything).
MAX_EXPANSION = 16.0

_SHARED = (bool, type(None))
_sizeof = sys.getsizeof


def expansion(record: Any) -> float | None:
    """Bytes of Python objects per byte of JSON, for ``record``; None when nothing JSON-like was found."""
    objects = 0.0
    text = 0.0
    nodes = 0
    stack: list[tuple[Any, float]] = [(record, 1.0)]
    while stack and nodes < MAX_NODES:
        value, weight = stack.pop()
        nodes += 1
        if isinstance(value, str):
            objects += _sizeof(value) * weight
            text += (len(value) + 3) * weight  # quotes and a separator
        elif isinstance(value, _SHARED):
            text += 5 * weight
        elif isinstance(value, int):
            if not -5 <= value <= 256:
                objects += _sizeof(value) * weight
            text += (value.bit_length() * 0.31 + 2) * weight
        elif isinstance(value, float):
            objects += 24 * weight
            text += 19 * weight
        elif isinstance(value, dict):
            objects += _sizeof(value) * weight
            text += 2 * weight
            items = list(value.items())
            sample = items if len(items) <= SAMPLE_ITEMS else _every(items)
            share = weight * len(items) / len(sample) if sample else weight
            for key, child in sample:
                text += (len(key) + 3 if isinstance(key, str) else 8) * share
                stack.append((child, share))
        elif isinstance(value, (list, tuple)):
            objects += _sizeof(value) * weight
            text += 2 * weight
            _push(stack, value, weight)
        elif isinstance(value, (bytes, bytearray)):
            objects += _sizeof(value) * weight
            text += len(value) * weight
        elif hasattr(value, "__dict__"):  # a model or a record object: its fields
            objects += _sizeof(value) * weight
            stack.append((vars(value), weight))
        else:
            objects += _sizeof(value) * weight
    if text <= 0:
        return None
    return min(MAX_EXPANSION, max(MIN_EXPANSION, objects / text))


def _every(items: Any) -> list[Any]:
    """:data:`SAMPLE_ITEMS` of ``items``, evenly spaced."""
    step = len(items) / SAMPLE_ITEMS
    return [items[int(i * step)] for i in range(SAMPLE_ITEMS)]


def _push(stack: list[tuple[Any, float]], children: Any, weight: float) -> None:
    if len(children) <= SAMPLE_ITEMS:
        stack.extend((child, weight) for child in children)
    else:
        share = weight * len(children) / SAMPLE_ITEMS
        stack.extend((child, share) for child in _every(children))
