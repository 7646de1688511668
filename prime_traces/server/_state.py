"""What every request of the local service reaches: its store, limits and counters.

Below both the connections (``_listener``) and the route handlers: each gets
the one :class:`ServiceState` of the service that ``_service`` builds at start.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from prime_traces.server._body import DEFAULT_READ_TIMEOUT_S, MemoryBudget
from prime_traces.server._faults import DEFAULT_SATURATED_RETRY_AFTER_S, Faults, InFlightLimiter, Stats
from prime_traces.server._store import Store

DEFAULT_MAX_BODY_BYTES = 256 * 1024 * 1024 + 1024 * 1024
MAX_UNCOMPRESSED_BYTES = 256 * 1024 * 1024


@dataclass
class ServiceState:
    """What every request handler may reach."""

    store: Store
    faults: Faults
    stats: Stats
    limiter: InFlightLimiter
    budget: MemoryBudget
    #: Kept out of the repr, so that no log or traceback shows it.
    api_key: str | None = field(repr=False)
    store_mode: str = "sqlite"
    validate_mode: str = "full"
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_uncompressed_bytes: int = MAX_UNCOMPRESSED_BYTES
    saturated_retry_after_s: float = DEFAULT_SATURATED_RETRY_AFTER_S
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    #: Whether the web viewer is served, so that answers can link to its pages.
    ui: bool = True
    stopping: threading.Event = field(default_factory=threading.Event)


def service_stats(state: ServiceState) -> dict[str, Any]:
    """The counters of ``GET /api/v1/_stats``."""
    return {**state.stats.snapshot(), **state.limiter.snapshot(), **state.budget.snapshot()}
