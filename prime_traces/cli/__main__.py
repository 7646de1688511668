"""``python -m prime_traces.cli``: the ``prime-traces`` command."""

import sys

from prime_traces.cli import main

sys.exit(main())
