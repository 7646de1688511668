"""What ``run.log()`` accepts: the shapes training code produces, turned into a history row.

Nested dicts flatten with ``/`` (``{"train": {"loss": x}}`` is ``train/loss``);
keys become strings (``{3: 1.0}`` is ``"3"``); numpy, torch and any other
object with ``.item()`` become Python numbers; NaN and the infinities are kept
(the contract carries them as the strings ``"NaN"``, ``"Infinity"``,
``"-Infinity"``: a diverging loss is the value most worth seeing). Values
that are not scalars (lists, arrays of more than one element, arbitrary
objects) are refused by name, and the rest of the row is kept. Nothing here
raises for a user's value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

#: How deep nested dicts are flattened; deeper values are refused (a cycle ends here too).
MAX_DEPTH = 16
#: The contract's strings for the non-finite floats.
NAN, INFINITY, MINUS_INFINITY = "NaN", "Infinity", "-Infinity"
_SCALARS = (bool, int, float, str, type(None))


def _scalar(value: Any) -> tuple[bool, Any]:
    """``(True, number or text)`` for a scalar (``.item()`` unwrapped), ``(False, None)`` otherwise."""
    if isinstance(value, _SCALARS):
        return True, value
    item = getattr(value, "item", None)
    if callable(item):
        size = getattr(value, "size", None)
        numel = getattr(value, "numel", None)
        try:
            if size is not None and not callable(size) and size != 1:
                return False, None
            if callable(numel) and numel() != 1:
                return False, None
            value = item()
        except Exception:  # noqa: BLE001  (item() is user code: whatever it raises, the value is not a number)
            return False, None
        return (True, value) if isinstance(value, _SCALARS) else (False, None)
    return False, None


def flatten(metrics: Mapping[Any, Any]) -> tuple[dict[str, Any], list[str]]:
    """The row's ``{name: value}`` in the caller's order, and the names refused (with why) for a warning.

    Values stay Python values (floats may be NaN); :func:`to_wire` makes them JSON.
    """
    row: dict[str, Any] = {}
    refused: list[str] = []
    _flatten_into(row, refused, "", metrics, 0)
    return row, refused


def _flatten_into(row: dict[str, Any], refused: list[str], prefix: str, mapping: Mapping[Any, Any], depth: int) -> None:
    try:
        items = list(mapping.items())
    except Exception as err:  # noqa: BLE001  (user code: a mapping that cannot list its items)
        refused.append(f"{prefix or 'the metrics'} ({type(err).__name__} while reading it)")
        return
    for key, value in items:
        name = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            if depth + 1 >= MAX_DEPTH:
                refused.append(f"{name} (nested deeper than {MAX_DEPTH} levels)")
            else:
                _flatten_into(row, refused, name, value, depth + 1)
            continue
        ok, scalar = _scalar(value)
        if ok:
            row[name] = scalar
        else:
            refused.append(f"{name} (a {type(value).__name__}, not a scalar)")


def to_wire(value: Any) -> Any:
    """A row value as the contract carries it: non-finite floats as their strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return NAN if math.isnan(value) else (INFINITY if value > 0 else MINUS_INFINITY)
    return value


def from_wire(value: Any) -> Any:
    """The inverse of :func:`to_wire`, for showing a history: ``"NaN"`` is a float again."""
    if value == NAN:
        return math.nan
    if value == INFINITY:
        return math.inf
    if value == MINUS_INFINITY:
        return -math.inf
    return value


def row(step: int, time_s: float, values: Mapping[str, Any]) -> dict[str, Any]:
    """One history row as sent (contract §9): ``{step, time, metrics}``."""
    return {"step": step, "time": time_s, "metrics": {k: to_wire(v) for k, v in values.items()}}


class History:
    """The history of up to ``max_names`` metrics, for sparklines: bounded, whatever the run's length.

    Past ``max_points`` points a name keeps every other point (the whole run
    at half the resolution), so memory stays constant and the shape stays.
    """

    def __init__(self, max_names: int = 10, max_points: int = 2048) -> None:
        self.max_names = max_names
        self.max_points = max_points
        self.points: dict[str, tuple[list[int], list[Any]]] = {}
        self._strides: dict[str, int] = {}
        self._seen: dict[str, int] = {}
        self._latest: dict[str, tuple[int, Any]] = {}

    def add(self, step: int, values: Mapping[str, Any]) -> None:
        for name, value in values.items():
            if name not in self.points:
                if len(self.points) >= self.max_names:
                    continue
                self.points[name], self._strides[name], self._seen[name] = ([], []), 1, 0
            self._latest[name] = (step, value)
            self._seen[name] += 1
            if (self._seen[name] - 1) % self._strides[name]:
                continue
            steps, kept = self.points[name]
            steps.append(step)
            kept.append(value)
            if len(kept) >= self.max_points:
                del steps[1::2], kept[1::2]
                self._strides[name] *= 2

    def discard(self, steps: set[int]) -> None:
        """Forget the points of ``steps`` (rows that were not kept): no sparkline shows them."""
        for name in list(self.points):
            kept_steps, kept = self.points[name]
            if len(steps) == 1 and kept_steps and kept_steps[-1] in steps and kept_steps[-2:-1] != kept_steps[-1:]:
                kept_steps.pop()  # the common case, a row dropped as it was logged
                kept.pop()
            elif steps.intersection(kept_steps):
                keep = [i for i, step in enumerate(kept_steps) if step not in steps]
                self.points[name] = ([kept_steps[i] for i in keep], [kept[i] for i in keep])
            if self._latest[name][0] in steps:
                remaining_steps, remaining = self.points[name]
                if remaining_steps:
                    self._latest[name] = (remaining_steps[-1], remaining[-1])
                else:
                    del self.points[name], self._latest[name]

    def series(self, name: str) -> tuple[list[int], list[Any]]:
        """The kept points of ``name``, ending with its latest value (kept or not)."""
        steps, values = (list(x) for x in self.points[name])
        latest = self._latest[name]
        if not steps or steps[-1] != latest[0]:
            steps.append(latest[0])
            values.append(latest[1])
        return steps, values
