"""``python -m prime_runs.cli``: the ``prime-runs`` command."""

import sys

from prime_runs.cli import main

sys.exit(main())
