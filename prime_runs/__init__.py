"""Log RL episodes from a training or evaluation script without slowing it down.

    import prime_runs

    run = prime_runs.init("grpo-math", kind="train", config={"lr": 1e-6})
    for step in range(steps):
        run.log_episodes(episodes)       # never blocks
        run.log({"reward": mean_reward}, step=step)
    run.finish()                         # bounded by finish_timeout_s

Records go to the Traces service (online), to a local directory (offline),
or nowhere (disabled); see :func:`init`. The public API is what ``__all__``
lists: :func:`init`, :class:`Run`, the modes and kinds a run takes, and the
errors (:class:`PrimeRunsError`, the root, and :class:`SinkError`). The
command line is :mod:`prime_runs.cli` (``prime-runs``).
"""

import importlib
import logging
import warnings
from typing import Any

from prime_runs._start.init import KINDS, MODES, init
from prime_runs.errors import PrimeRunsError, SinkError
from prime_runs.run import Run
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
    "__version__",
    "KINDS",
    "MODES",
    "PrimeRunsError",
    "Run",
    "SinkError",
    "init",
]
