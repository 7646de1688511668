"""Log RL episodes from a training or evaluation script without slowing it down.

    import prime_runs

    run = prime_runs.init(kind="train", name="grpo-math", model="Qwen/Qwen3-4B", config={"lr": 1e-6})
    for step in range(steps):
        run.log_episodes(episodes)       # never blocks
        run.log_metrics({"reward": mean_reward}, step=step)
    run.finish()                         # bounded by finish_timeout

A drop-in for the published prime-runs SDK: its public names (``init``,
``Run``, ``RunStatus``, ``RunKind``, ``TrainingSpec``, ``ConfigSource``,
``CONFIG_SOURCE_KEY``, ``EnvironmentRef``, ``MODE_ENV``, ``TRACES_OPT_OUT_ENV``,
the ``metrics`` and ``projection`` modules and its errors) mean what they mean
there. Runs live on the platform (online), in a local directory (offline), or
nowhere (disabled); see :func:`init`. Ours on top: ``KINDS``, ``MODES``,
:class:`SinkError`, ``Run.log()``, ``Run.stats()``, offline runs and the
command line, :mod:`prime_runs.cli` (``prime-runs``).
"""

import importlib
import logging
import warnings
from typing import Any

from prime_runs import metrics, projection
from prime_runs._start.init import KINDS, MODE_ENV, MODES, TRACES_OPT_OUT_ENV, init
from prime_runs.errors import (
    ConfigurationError,
    EnvironmentResolutionError,
    PrimeRunsError,
    RunDirectoryError,
    RunFinishedError,
    SinkError,
)
from prime_runs.models import CONFIG_SOURCE_KEY, ConfigSource, EnvironmentRef, RunKind, RunStatus, TrainingSpec
from prime_runs.run import Run
from prime_traces.errors import (
    APIError,
    ForbiddenError,
    NotFoundError,
    PaymentRequiredError,
    RetryableAPIError,
    TransportError,
    UnauthorizedError,
)
from prime_traces.version import __version__

logging.getLogger(__name__).addHandler(logging.NullHandler())

# Names of earlier releases that are internal now, kept one more release with a DeprecationWarning.
_DEPRECATED = {
    "DEFAULT_MAX_QUEUED_BYTES": "prime_runs._upload.queue",
    "DEFAULT_MAX_QUEUED_RECORDS": "prime_runs._upload.queue",
    "Ledger": "prime_runs._records.ledger",
    "Sink": "prime_runs._records.sink",
    "SinkStatus": "prime_runs._records.sink",
    "UploadWorker": "prime_runs._upload.worker",
    "RunStateError": "prime_runs.errors",
}


def __getattr__(name: str) -> Any:
    home = _DEPRECATED.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"prime_runs.{name} is deprecated: it is internal and leaves the package's API in the next release",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(home), name)


__all__ = [
    "init",
    "Run",
    "RunStatus",
    "RunKind",
    "TrainingSpec",
    "ConfigSource",
    "CONFIG_SOURCE_KEY",
    "EnvironmentRef",
    "TRACES_OPT_OUT_ENV",
    "MODE_ENV",
    "metrics",
    "projection",
    "PrimeRunsError",
    "ConfigurationError",
    "EnvironmentResolutionError",
    "APIError",
    "RunFinishedError",
    "ForbiddenError",
    "NotFoundError",
    "PaymentRequiredError",
    "RetryableAPIError",
    "TransportError",
    "UnauthorizedError",
    "__version__",
    "KINDS",
    "MODES",
    "SinkError",
    "RunDirectoryError",
]
