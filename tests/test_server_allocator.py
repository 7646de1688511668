"""``prime-traces serve`` keeps freed request memory for the next requests (glibc only).

Each page-fault check runs in a fresh interpreter: the setting is for a whole process.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest

from prime_traces.server import _allocator
from prime_traces.server._allocator import HEAP_CHUNK_MAX_BYTES, keep_freed_memory

glibc = pytest.mark.skipif(_allocator._glibc_mallopt() is None, reason="glibc's malloc only")

# Two request threads at once, as the service runs them: the first allocates and touches 24 MiB (a decoded
# batch) and frees it, then stays alive while the second does the same. Their page faults say whether the
# second reused what the first freed. Transparent huge pages are off for the probe, so that a fault is a page.
_PROBE = textwrap.dedent(
    """
    import ctypes, json, resource, sys, threading
    from prime_traces.server._allocator import keep_freed_memory

    ctypes.CDLL(None).prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE
    tuned = keep_freed_memory(1 << 30) if sys.argv[1] == "tuned" else None
    faults, freed, done = [], threading.Event(), threading.Event()

    def body():
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        data = bytearray(24 << 20)  # zero-filled: every page touched
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        del data

    def first():
        body()
        freed.set()
        done.wait()  # alive, so its arena is not handed to the second thread

    thread = threading.Thread(target=first)
    thread.start()
    freed.wait()
    second = threading.Thread(target=body)
    second.start()
    second.join()
    done.set()
    thread.join()
    print(json.dumps({"tuned": tuned, "faults": faults}))
    """
)
_PAGES = (24 << 20) // 4096


def _probe(mode: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, timeout=60, env=env)
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
    # The control: with glibc's defaults the second thread has an arena of its own, so the check above can fail.
    first, second = _probe("default")["faults"]
    assert first > _PAGES // 2
    assert second > _PAGES // 2


class _Mallopt:
    def __init__(self, refuse: int | None = None) -> None:
        self.calls: list[tuple[int, int]] = []
        self.refuse = refuse

    def __call__(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return 0 if param == self.refuse else 1


@pytest.fixture
def mallopt(monkeypatch):
    for name in [variable for _, _, variable, _ in _allocator._SETTINGS] + ["GLIBC_TUNABLES"]:
        monkeypatch.delenv(name, raising=False)

    def install(refuse: int | None = None) -> _Mallopt:
        fake = _Mallopt(refuse)
        monkeypatch.setattr(_allocator, "_glibc_mallopt", lambda: fake)
        return fake

    return install


def test_the_settings_and_the_cap_on_what_is_kept(mallopt):
    fake = mallopt()
    assert keep_freed_memory(8 << 30) is True
    assert fake.calls == [(-8, 1), (-3, HEAP_CHUNK_MAX_BYTES), (-1, 2**31 - 1)]


def test_a_setting_the_environment_makes_is_left_to_it(mallopt, monkeypatch):
    fake = mallopt()
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=0")
    assert keep_freed_memory(1 << 30) is True
    assert fake.calls == [(-3, HEAP_CHUNK_MAX_BYTES)]


def test_a_refused_setting_is_logged_and_the_others_stay_made(mallopt, caplog):
    fake = mallopt(refuse=-3)
    with caplog.at_level(logging.WARNING, logger="prime_traces.server._allocator"):
        assert keep_freed_memory(1 << 30) is False
    assert [param for param, _ in fake.calls] == [-8, -3, -1]
    assert [r.getMessage() for r in caplog.records] == [
        f"glibc refused M_MMAP_THRESHOLD={HEAP_CHUNK_MAX_BYTES}; freed request memory may go back to the system"
    ]


def test_a_negative_amount_is_refused():
    with pytest.raises(ValueError, match="keep_bytes must be at least 0, not -1"):
        keep_freed_memory(-1)


def test_without_glibc_nothing_changes(monkeypatch):
    monkeypatch.setattr(_allocator, "_glibc_mallopt", lambda: None)
    assert keep_freed_memory(1 << 30) is False
