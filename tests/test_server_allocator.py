"""``prime-traces serve`` keeps freed request memory for the next requests (glibc only).

Each check runs in a fresh interpreter: the setting is for a whole process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from prime_traces.server._allocator import _glibc_mallopt, keep_freed_memory

glibc = pytest.mark.skipif(_glibc_mallopt() is None, reason="glibc's malloc only")

# One thread allocates and touches 24 MiB (a decoded batch's size) and frees it; a second thread does the
# same. The page faults of each say whether the second reused what the first freed.
_PROBE = textwrap.dedent(
    """
    import json, resource, sys, threading
    from prime_traces.server._allocator import keep_freed_memory

    tuned = keep_freed_memory(1 << 30) if sys.argv[1] == "tuned" else None
    faults = []

    def body():
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        data = bytearray(24 << 20)  # zero-filled: every page touched
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        del data

    for _ in range(2):
        thread = threading.Thread(target=body)
        thread.start()
        thread.join()
    print(json.dumps({"tuned": tuned, "faults": faults}))
    """
)
_PAGES = (24 << 20) // 4096


def _probe(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@glibc
def test_a_second_request_thread_reuses_what_the_first_freed():
    tuned = _probe("tuned")
    assert tuned["tuned"] is True
    first, second = tuned["faults"]
    assert first > _PAGES // 2  # the first touch of the memory faults its pages in
    assert second < _PAGES // 10, tuned  # the second thread gets the same, already faulted memory


@glibc
def test_without_it_the_second_thread_faults_its_memory_in_again():
    # The control: glibc's defaults give the memory back, so the check above can fail.
    first, second = _probe("default")["faults"]
    assert first > _PAGES // 2
    assert second > _PAGES // 2


def test_a_negative_amount_is_refused():
    with pytest.raises(ValueError, match="keep_bytes must be at least 0, not -1"):
        keep_freed_memory(-1)


def test_without_glibc_nothing_changes(monkeypatch):
    monkeypatch.setattr("prime_traces.server._allocator._glibc_mallopt", lambda: None)
    assert keep_freed_memory(1 << 30) is False
