"""Errors of ``prime_runs``; one root, :class:`PrimeRunsError`."""

from __future__ import annotations


class PrimeRunsError(Exception):
    """Root of every error raised by ``prime_runs``."""


class ConfigurationError(PrimeRunsError):
    """An argument or setting of ``init()`` cannot make a run (the kind, mode, key, team, model, config...).

    Raised before any request, so a bad setting never leaves a half-created run.
    """


class RunDirectoryError(ConfigurationError):
    """The runs directory cannot be created or written (an offline run, or ``save_local=True``).

    ``root`` is the directory, ``cause`` the ``OSError`` that says why, with
    its errno and path (``Read-only file system``, ``Not a directory``...).
    """

    def __init__(self, root: str, cause: OSError) -> None:
        self.root = root
        self.cause = cause
        super().__init__(
            f"the runs directory {root} cannot be written ({cause}); pass init(dir=...) or set "
            "PRIME_RUNS_DIR to a writable directory"
        )


class EnvironmentResolutionError(PrimeRunsError):
    """An evaluation's environment could not be resolved to an id through the platform's hub."""


class RunFinishedError(PrimeRunsError):
    """The run has finished: it takes no more records, rows or summary values.

    ``log_episodes()`` and the other logging calls never raise it into a
    training loop (a late record is counted as dropped, ``closed``, and the
    console says so); it is the published SDK's name, kept for code that catches it.
    """


class SinkError(PrimeRunsError):
    """Records of a write were not stored by a sink.

    ``failures`` maps each reason (``rejected:invalid_trace``, ``transient``,
    ``invalid_record``, ``sink_retired``, ``deadline``...) to a record count;
    ``detail``, when a record was at fault, names the first one with its id,
    call and position and the cause down to the value's path.
    """

    def __init__(self, sink: str, failures: dict[str, int], detail: str | None = None) -> None:
        self.sink = sink
        self.failures = dict(failures)
        self.detail = detail
        total = sum(self.failures.values())
        counts = ", ".join(f"{n} {reason}" for reason, n in sorted(self.failures.items()))
        text = f"{total} records not stored by the {sink} sink: {counts}"
        super().__init__(f"{text}; first: {detail}" if detail else text)


class RunStateError(PrimeRunsError):
    """Deprecated, and raised by nothing: kept one more release for code that names it."""
