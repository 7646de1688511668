"""The switch interval a run lowers while it uploads, and puts back."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from _fork import in_child
from _run_helpers import assert_buckets, episodes, isolated  # noqa: F401  (fixtures are used by name)

import prime_runs
from prime_runs import _switch_interval as switch_interval

FLUSH_TIMEOUT_S = 30.0
FOUND_S = 0.005


@pytest.fixture(autouse=True)
def interpreter_default() -> Iterator[None]:
    before = sys.getswitchinterval()
    sys.setswitchinterval(FOUND_S)
    yield
    sys.setswitchinterval(before)


def test_a_hold_lowers_the_interval_and_the_last_release_puts_back_what_it_found():
    first = switch_interval.hold(0.0005)
    assert sys.getswitchinterval() == pytest.approx(0.0005)
    second = switch_interval.hold(0.001)  # higher than the current one: lowers nothing
    assert sys.getswitchinterval() == pytest.approx(0.0005)
    first()
    first()  # a release is idempotent: it must not end the second hold
    assert sys.getswitchinterval() == pytest.approx(0.0005)
    second()
    assert sys.getswitchinterval() == pytest.approx(FOUND_S)


def test_a_hold_never_raises_an_interval_the_process_set_lower_itself():
    sys.setswitchinterval(0.0001)
    release = switch_interval.hold(0.0005)
    assert sys.getswitchinterval() == pytest.approx(0.0001)
    release()
    assert sys.getswitchinterval() == pytest.approx(0.0001)


def test_an_interval_someone_changed_meanwhile_is_left_as_they_set_it():
    release = switch_interval.hold(0.0005)
    sys.setswitchinterval(0.002)
    release()
    assert sys.getswitchinterval() == pytest.approx(0.002)


def test_none_holds_nothing_and_a_bad_interval_is_refused():
    switch_interval.hold(None)()
    assert sys.getswitchinterval() == pytest.approx(FOUND_S)
    with pytest.raises(ValueError, match="greater than 0"):
        switch_interval.hold(0.0)
    with pytest.raises(ValueError, match="switch_interval_s"):
        prime_runs.init("bad", switch_interval_s=-1.0, handle_signals=False)


def test_a_forked_child_starts_without_the_parents_holds():
    release = switch_interval.hold(0.0005)
    try:
        child = in_child(lambda: sys.getswitchinterval())
    finally:
        release()
    assert child == pytest.approx(FOUND_S)
    assert sys.getswitchinterval() == pytest.approx(FOUND_S)


def test_a_run_lowers_it_while_it_uploads_and_puts_it_back_at_finish(isolated):
    run = prime_runs.init("switching", handle_signals=False)
    try:
        assert sys.getswitchinterval() == pytest.approx(FOUND_S)  # nothing logged yet: no worker thread
        assert run.log_episodes(episodes("e", 1))
        assert run.flush(timeout_s=FLUSH_TIMEOUT_S)
        assert sys.getswitchinterval() == pytest.approx(prime_runs.init.__kwdefaults__["switch_interval_s"])
    finally:
        run.finish(timeout_s=FLUSH_TIMEOUT_S)
    assert_buckets(run, "offline", submitted=1, stored=1)
    assert sys.getswitchinterval() == pytest.approx(FOUND_S)


def test_a_run_told_none_leaves_the_interpreter_alone(isolated):
    run = prime_runs.init("leave-it", handle_signals=False, switch_interval_s=None)
    try:
        assert run.log_episodes(episodes("e", 1))
        assert run.flush(timeout_s=FLUSH_TIMEOUT_S)
        assert sys.getswitchinterval() == pytest.approx(FOUND_S)
    finally:
        run.finish(timeout_s=FLUSH_TIMEOUT_S)
    assert_buckets(run, "offline", submitted=1, stored=1)
