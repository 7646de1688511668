"""Where in a record the value JSON cannot hold is: ``traces[0].logprobs[17] is NaN``.

Encoding fails with a cause but no place (orjson says "Type is not JSON
serializable: set"; the chunked encoder finds a NaN without its path). Once
a record has failed, :func:`locate` walks it again, depth first in the
order the encoder writes it, and names the first value at fault with its
path, so the user can find it in a 35 MB episode. It runs only on a record
that failed, so it may be slow.
"""

from __future__ import annotations

import datetime
import enum
import math
import sys
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from prime_traces._lines.sizing import native_items

_MAX_DEPTH = 254  # orjson's nesting limit
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1  # what orjson encodes
# Types orjson encodes natively besides the JSON ones: never at fault here.
_NATIVE = (datetime.datetime, datetime.date, datetime.time, uuid.UUID)


def _key_path(path: str, key: str) -> str:
    if key.isidentifier():
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]"


def _problem(value: Any) -> str | None:
    """What is wrong with one scalar (or numpy array) value, or None if JSON can hold it."""
    np = sys.modules.get("numpy")
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return None
    if isinstance(value, float) or (np is not None and isinstance(value, np.floating)):
        if math.isfinite(value):
            return None
        name = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
        return f"is {name}; NaN and Infinity are not JSON"
    if isinstance(value, int):
        if _INT_MIN <= value <= _INT_MAX:
            return None
        return "is an integer too large for JSON (over 64 bits)"
    if np is not None and isinstance(value, (np.integer, np.bool_)):
        return None
    if isinstance(value, _NATIVE):
        return None
    kind = type(value).__name__
    if isinstance(value, (set, frozenset)):
        return f"is a {kind}; JSON has no sets (use a list)"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"is {kind}; JSON holds text, not bytes (decode or base64 it)"
    return f"is a {kind}, which JSON cannot hold"


def _children(value: Any, path: str) -> Iterator[tuple[str, Any]] | str | None:
    """The (path, child) pairs of a container; a problem text for a bad key; None for a scalar."""
    np = sys.modules.get("numpy")
    if isinstance(value, enum.Enum) and not isinstance(value, (int, float, str)):
        return iter([(path, value.value)])  # orjson writes a member as its value
    native = native_items(value)
    if native is not None:  # a dataclass: written as this dict
        value = native
    if isinstance(value, Mapping):
        for key in value:
            if not isinstance(key, str):
                return f"has the key {key!r} ({type(key).__name__}); JSON keys must be strings"
        return ((_key_path(path, k), v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ((f"{path}[{i}]", v) for i, v in enumerate(value))
    if np is not None and isinstance(value, np.ndarray):
        if value.dtype.kind in "fc":
            bad = np.argwhere(~np.isfinite(value))
            if len(bad):
                index = "".join(f"[{int(i)}]" for i in bad[0])
                return iter([(f"{path}{index}", value[tuple(bad[0])].item())])
            return iter(())
        if value.dtype.kind == "O":
            return ((f"{path}[{i}]", v) for i, v in enumerate(value.tolist()))
        return iter(())
    return None


def locate(record: Any) -> tuple[str, str] | None:
    """``(path, problem)`` of the first value JSON cannot hold, or None when there is none.

    ``path`` is ``traces[0].logprobs[17]`` (``""`` for the record itself);
    ``problem`` completes the sentence: ``is NaN; NaN and Infinity are not JSON``.
    """
    # Depth first, in the encoder's order; a record that contains itself ends at the depth limit.
    stack: list[tuple[str, Any, int]] = [("", record, 0)]
    while stack:
        path, value, depth = stack.pop()
        if depth > _MAX_DEPTH:
            path = path if len(path) <= 60 else path[:60] + "..."
            return path, f"is nested deeper than {_MAX_DEPTH} levels (does the record contain itself?)"
        children = _children(value, path)
        if children is None:
            problem = _problem(value)
            if problem is not None:
                return path, problem
            continue
        if isinstance(children, str):
            return path, children
        stack.extend(reversed([(p, v, depth + 1) for p, v in children]))
    return None


def describe_located(record: Any) -> str | None:
    """``traces[0].logprobs[17] is NaN; ...`` for ``record``, or None when nothing is found."""
    found = locate(record)
    if found is None:
        return None
    path, problem = found
    return f"{path or 'the record'} {problem}"
