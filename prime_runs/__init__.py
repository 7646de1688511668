"""Log RL episodes from a training or evaluation script without slowing it down.

The run API (``init`` / ``log_episodes`` / ``finish``) arrives in a later
release; this package currently ships only its command-line entry point.
"""

import logging

from prime_traces._version import __version__

logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = ["__version__"]
