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

import logging

from prime_runs._init import init
from prime_runs._lifecycle import KINDS, MODES
from prime_runs.errors import PrimeRunsError, SinkError
from prime_runs.run import Run
from prime_traces.version import __version__

logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "__version__",
    "KINDS",
    "MODES",
    "PrimeRunsError",
    "Run",
    "SinkError",
    "init",
]
