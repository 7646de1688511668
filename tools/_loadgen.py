"""The load test's workload: production-sized episodes assembled from shared trace templates.

Sizes follow the production distribution of episode JSON: lognormal with a
median of 6.4 MB and a p90 of 17 MB (mean about 8.5 MB, p99 about 37 MB),
capped at 60 MB, all multiplied by ``scale`` to fit a small machine. An
episode is an envelope around member traces that are shallow copies of a
few realistic templates (``tools/loadtest.py`` makes them with
``prime_runs.cli.workload``): each member has its own ``id``, and shares its
messages, calls and token arrays with every other copy. So an episode of
60 MB costs the producer a few kilobytes of its own memory, while every SDK
still encodes, compresses and uploads all 60 MB of it.

Only the standard library: the published SDK's producer imports this module
too, in a virtualenv that has none of this project's packages.
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

MEDIAN_BYTES = 6.4e6
P90_BYTES = 17e6
CAP_BYTES = 60e6
_Z90 = 1.2815515655446004  # the standard normal's 90th percentile
SIGMA = math.log(P90_BYTES / MEDIAN_BYTES) / _Z90


def production_sizes(count: int, *, scale: float = 1.0, seed: int = 1) -> list[int]:
    """``count`` episode sizes in bytes from the production distribution, times ``scale``."""
    if not 0 < scale <= 1:
        raise ValueError(f"scale must be in (0, 1], not {scale}")
    rng = random.Random(seed)
    mu = math.log(MEDIAN_BYTES)
    return [int(min(CAP_BYTES, rng.lognormvariate(mu, SIGMA)) * scale) for _ in range(count)]


class Templates:
    """Member traces to copy, largest first, with their encoded sizes, and the envelope around them."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.envelope: dict[str, Any] = document["envelope"]
        pairs = sorted(((int(t["size"]), t["trace"]) for t in document["traces"]), key=lambda p: -p[0])
        self.sizes = [size for size, _ in pairs]
        self.traces = [trace for _, trace in pairs]
        self.envelope_bytes = len(json.dumps(self.envelope, separators=(",", ":")))

    @classmethod
    def load(cls, path: str) -> Templates:
        with open(path, encoding="utf-8") as file:
            return cls(json.load(file))

    def episode(self, index: int, size_bytes: int, *, prefix: str = "ep") -> dict[str, Any]:
        """Episode ``index`` of about ``size_bytes`` of JSON (never below one smallest member)."""
        episode_id = f"{prefix}-{index:06d}"
        members: list[dict[str, Any]] = []
        left = size_bytes - self.envelope_bytes
        while True:
            # The largest template that fits what is left; the smallest when none does.
            choice = next((k for k, size in enumerate(self.sizes) if size <= left), None)
            if choice is None:
                if members:
                    break
                choice = len(self.sizes) - 1
            template = self.traces[choice]
            members.append({**template, "id": f"{episode_id}-t{len(members):04d}"})
            left -= self.sizes[choice] + 1  # the comma between members
        return {**self.envelope, "id": episode_id, "traces": members}


def poisoned(episode: dict[str, Any]) -> dict[str, Any]:
    """The episode with a value no JSON can hold (NaN) in its first member: an SDK must refuse it alone."""
    first = {**episode["traces"][0], "info": {"poison": float("nan")}}
    return {**episode, "traces": [first, *episode["traces"][1:]]}
