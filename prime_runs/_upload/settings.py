"""The upload worker's knobs, from ``init()`` to the worker in one frozen value, checked once."""

from __future__ import annotations

from dataclasses import dataclass

from prime_runs._upload.queue import DEFAULT_MAX_QUEUED_BYTES, DEFAULT_MAX_QUEUED_RECORDS, write_cap_bytes
from prime_traces.client import MAX_IN_FLIGHT_LIMIT

DEFAULT_WRITE_CAP_BYTES = write_cap_bytes(MAX_IN_FLIGHT_LIMIT, DEFAULT_MAX_QUEUED_BYTES)
#: How long, past finish()'s deadline, what was not delivered may take to be spooled to disk.
DEFAULT_SPILL_TIMEOUT_S = 30.0
#: How often the worker runs its timer (the run's config and summary updates, ``run.json``).
DEFAULT_TICK_INTERVAL_S = 10.0


@dataclass(frozen=True)
class WorkerSettings:
    """How much the upload worker holds, how long it spools, and how it shares the GIL.

    - ``max_queued_records`` / ``max_queued_bytes``: the queue's bounds (bytes
      as estimated by the run's size meter); a write past them is dropped and counted.
    - ``write_cap_bytes``: the estimated bytes one write of the worker takes from the queue.
    - ``spill_timeout_s``: past ``finish()``'s deadline, how long what is left may take to reach disk.
    - ``tick_interval_s``: the period of the worker's timer.
    - ``switch_interval_s``: the interpreter's switch interval while the worker has work
      (``None``: left alone; see :mod:`prime_runs._upload.switch_interval`).

    Raises ``ValueError`` at construction for a value out of range.
    """

    max_queued_records: int = DEFAULT_MAX_QUEUED_RECORDS
    max_queued_bytes: int = DEFAULT_MAX_QUEUED_BYTES
    write_cap_bytes: int = DEFAULT_WRITE_CAP_BYTES
    spill_timeout_s: float = DEFAULT_SPILL_TIMEOUT_S
    tick_interval_s: float = DEFAULT_TICK_INTERVAL_S
    switch_interval_s: float | None = None

    def __post_init__(self) -> None:
        if self.max_queued_records < 1:
            raise ValueError(f"max_queued_records must be greater than 0, not {self.max_queued_records}")
        if self.max_queued_bytes < 1:
            raise ValueError(f"max_queued_bytes must be greater than 0, not {self.max_queued_bytes}")
        if self.write_cap_bytes < 1:
            raise ValueError(f"write_cap_bytes must be greater than 0, not {self.write_cap_bytes}")
        if self.spill_timeout_s < 0:
            raise ValueError(f"spill_timeout_s must be at least 0, not {self.spill_timeout_s}")
        if not self.tick_interval_s > 0:
            raise ValueError(f"tick_interval_s must be greater than 0, not {self.tick_interval_s}")
        if self.switch_interval_s is not None and not self.switch_interval_s > 0:
            raise ValueError(f"switch_interval_s must be greater than 0 or None, not {self.switch_interval_s}")
