"""How much memory a record holds as Python objects, estimated from a bounded sample.

A queued record is the caller's objects, not its JSON: a list of floats
holds about 32 bytes per number against 9 characters of JSON, a token id
36 against 7, a short dict a few hundred bytes against its text. The
record queue bounds memory by this size, so the bound a user sets is the
one RSS shows.

Walking every object of a 10 MB record would cost twenty times its
encoding, so the walk samples: a container of more than ``SAMPLE_ITEMS``
items is measured from that many, evenly spaced, and scaled by its
length; past ``MAX_NODES`` objects the rest of a container is taken at the
mean of what was measured. Objects the interpreter shares are not
counted: ``None``, booleans, small integers, and dict keys short enough to
be interned or cached by ``orjson.loads`` (a run's records repeat their
keys, so counting them in every dict would count one object thousands of
times).
"""

from __future__ import annotations

import itertools
import sys
from typing import Any

#: Items measured from one container; a longer one is scaled from these.
SAMPLE_ITEMS = 24
#: Objects measured per record at most; the rest is extrapolated.
MAX_NODES = 4_000
#: Dict keys up to this length are taken as shared (interned, or cached by orjson).
SHARED_KEY_CHARS = 64

_SHARED_INTS = range(-5, 257)


def held_bytes(record: Any) -> int:
    """The estimated bytes ``record`` holds as Python objects (bytes and str: their exact size)."""
    return int(_Walk().size(record))


class _Walk:
    __slots__ = ("nodes", "measured", "total")

    def __init__(self) -> None:
        self.nodes = 0
        # Running mean of the items measured so far, for what the node budget leaves out.
        self.measured = 0
        self.total = 0.0

    def size(self, obj: Any) -> float:
        self.nodes += 1
        kind = type(obj)
        if obj is None or kind is bool or (kind is int and obj in _SHARED_INTS):
            return 0.0
        if kind is dict:
            return sys.getsizeof(obj) + self._items(obj, len(obj), True)
        if kind is list or kind is tuple:
            return sys.getsizeof(obj) + self._items(obj, len(obj), False)
        if isinstance(obj, dict):
            return sys.getsizeof(obj) + self._items(obj, len(obj), True)
        if isinstance(obj, (list, tuple)):
            return sys.getsizeof(obj) + self._items(obj, len(obj), False)
        return float(sys.getsizeof(obj))

    def _items(self, container: Any, length: int, mapping: bool) -> float:
        if not length:
            return 0.0
        if self.nodes >= MAX_NODES:
            return length * self._mean()
        step = max(1, length // SAMPLE_ITEMS)
        picked = 0
        total = 0.0
        if mapping:
            for key, value in itertools.islice(container.items(), 0, None, step):
                item = self.size(value)
                if type(key) is not str or len(key) > SHARED_KEY_CHARS:
                    item += self.size(key)
                total += item
                picked += 1
                if picked == SAMPLE_ITEMS or self.nodes >= MAX_NODES:
                    break
        else:
            for position in range(0, length, step):
                total += self.size(container[position])
                picked += 1
                if picked == SAMPLE_ITEMS or self.nodes >= MAX_NODES:
                    break
        self.measured += picked
        self.total += total
        return total * length / picked

    def _mean(self) -> float:
        return self.total / self.measured if self.measured else 64.0
