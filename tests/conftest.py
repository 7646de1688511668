"""Shared fixtures: a local service per test, one browser for the viewer's tests, and a guard against leaked threads."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from _browser import launched_chromium

from prime_traces.server import LocalTracesService

_LEAK_GRACE_S = 5.0


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    """Fail a test that leaves a thread running after it returns.

    Threads get a bounded grace period to finish what they were told to stop
    doing (joined, not slept on).
    """
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + _LEAK_GRACE_S
    leaked = []
    for thread in threading.enumerate():
        if thread in before or thread is threading.current_thread():
            continue
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            leaked.append(thread.name)
    assert not leaked, f"test leaked threads: {leaked}"


@pytest.fixture
def service(tmp_path) -> Iterator[LocalTracesService]:
    """A local Traces service on an ephemeral loopback port."""
    with LocalTracesService(tmp_path / "traces.db") as svc:
        yield svc


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """One headless Chromium for every browser test (skips, or fails under CI=true, without one)."""
    with launched_chromium() as chromium:
        yield chromium
