"""``prime-traces serve`` in a process of its own, for the benchmarks that need a service apart from the client."""

from __future__ import annotations

import re
import subprocess
import sys


def start_serve(db: str, *extra: str) -> tuple[subprocess.Popen[str], str]:
    """Start the local service on ``db`` (no viewer) with ``extra`` options; the process and its URL."""
    command = [sys.executable, "-m", "prime_traces.cli", "serve", "--db", db, "--no-ui", *extra]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        found = re.search(r"listening on (http://\S+)", line)
        if found:
            return proc, found.group(1)
    raise SystemExit(f"prime-traces serve did not start (exit {proc.wait()})")
