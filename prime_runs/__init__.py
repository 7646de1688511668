"""Log RL episodes from a training or evaluation script without slowing it down.

    import prime_runs

    run = prime_runs.init("grpo-math", kind="train", config={"lr": 1e-6})
    for step in range(steps):
        run.log_episodes(episodes)       # never blocks
        run.log({"reward": mean_reward}, step=step)
    run.finish()                         # bounded by finish_timeout_s

Records go to the Traces service (online), to a local directory (offline),
or nowhere (disabled); see :func:`init`.
"""

import logging

from prime_runs._init import init
from prime_runs._queue import DEFAULT_MAX_QUEUED_BYTES, DEFAULT_MAX_QUEUED_RECORDS
from prime_runs._sink import Ledger, Sink, SinkStatus
from prime_runs._worker import UploadWorker
from prime_runs.errors import PrimeRunsError, RunStateError, SinkError
from prime_runs.run import Run
from prime_traces.version import __version__

logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "__version__",
    "DEFAULT_MAX_QUEUED_BYTES",
    "DEFAULT_MAX_QUEUED_RECORDS",
    "Ledger",
    "PrimeRunsError",
    "Run",
    "RunStateError",
    "Sink",
    "SinkError",
    "SinkStatus",
    "UploadWorker",
    "init",
]
