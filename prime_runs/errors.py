"""Errors of ``prime_runs``; one root, :class:`PrimeRunsError`."""

from __future__ import annotations


class PrimeRunsError(Exception):
    """Root of every error raised by ``prime_runs``."""


class SinkError(PrimeRunsError):
    """Records of a write were not stored by a sink.

    ``failures`` maps each reason (``rejected:invalid_trace``, ``transient``,
    ``invalid_record``, ``sink_retired``, ``deadline``...) to a record count.
    """

    def __init__(self, sink: str, failures: dict[str, int]) -> None:
        self.sink = sink
        self.failures = dict(failures)
        total = sum(self.failures.values())
        detail = ", ".join(f"{n} {reason}" for reason, n in sorted(self.failures.items()))
        super().__init__(f"{total} records not stored by the {sink} sink: {detail}")


class RunStateError(PrimeRunsError):
    """The run cannot do that now (for example, logging after finish())."""
