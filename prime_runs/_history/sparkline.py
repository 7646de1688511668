"""A metric's history in one line: ``▁▂▄▆█▇▅`` with last / min / max and the step range.

Used by the finish summary and ``prime-runs show``. Long histories are cut
into as many buckets as the line has cells, each showing its bucket's mean,
so 100,000 steps and 10 steps both fit. NaN and the infinities are not drawn
(they have no height): a bucket holding one shows ``!``, so a diverging
run is visible, and the counts say how many there were.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

BARS = "▁▂▃▄▅▆▇█"
DEFAULT_WIDTH = 40
NOT_FINITE_MARK = "!"
EMPTY_MARK = " "


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def sparkline(values: Sequence[Any], width: int = DEFAULT_WIDTH) -> str:
    """The values (in step order) as at most ``width`` cells; non-numbers are skipped."""
    numbers = [n for n in (_number(v) for v in values) if n is not None]
    if not numbers:
        return ""
    cells = min(width, len(numbers))
    buckets: list[list[float]] = [[] for _ in range(cells)]
    for i, n in enumerate(numbers):
        buckets[i * cells // len(numbers)].append(n)
    means: list[float | None] = []
    for bucket in buckets:
        finite = [n for n in bucket if math.isfinite(n)]
        means.append(sum(finite) / len(finite) if len(finite) == len(bucket) else None)
    finite_means = [m for m in means if m is not None]
    if not finite_means:
        return NOT_FINITE_MARK * cells
    low, high = min(finite_means), max(finite_means)
    span = high - low
    line = []
    for mean in means:
        if mean is None:
            line.append(NOT_FINITE_MARK)
        elif span == 0:
            line.append(BARS[len(BARS) // 2])
        else:
            line.append(BARS[min(len(BARS) - 1, int((mean - low) / span * len(BARS)))])
    return "".join(line)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return f"{value:.4g}"
    return str(value)


def metric_line(
    name: str, steps: Sequence[int | None], values: Sequence[Any], *, name_width: int = 16, width: int = DEFAULT_WIDTH
) -> str:
    """``reward  ▁▂▄▆█  last 0.81  min 0.02  max 0.9  steps 0..999 (1,000)``."""
    numbers = [n for n in (_number(v) for v in values) if n is not None]
    finite = [n for n in numbers if math.isfinite(n)]
    parts = [f"{name:<{name_width}}", sparkline(values, width).ljust(min(width, max(1, len(numbers))))]
    if values:
        parts.append(f"last {_fmt(values[-1])}")
    if finite:
        parts.append(f"min {_fmt(min(finite))}  max {_fmt(max(finite))}")
    not_finite = len(numbers) - len(finite)
    if not_finite:
        parts.append(f"{not_finite} not finite")
    known = [s for s in steps if s is not None]
    if known:
        parts.append(f"steps {min(known)}..{max(known)} ({len(values):,})")
    return "  ".join(parts)
