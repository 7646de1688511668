"""The switch interval a run lowers while it uploads, and puts back."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from _fork import in_child
from _run_helpers import (  # noqa: F401  (fixtures are used by name)
    GATE_TIMEOUT_S,
    assert_buckets,
    episodes,
    gate,
    isolated,
    online,
)

import prime_runs
from prime_runs._upload import switch_interval

FLUSH_TIMEOUT_S = 30.0
FOUND_S = 0.005


@pytest.fixture(autouse=True)
def interpreter_default() -> Iterator[None]:
    assert switch_interval._holds == 0, "an earlier test left a hold"
    before = sys.getswitchinterval()
    sys.setswitchinterval(FOUND_S)
    yield
    sys.setswitchinterval(before)
    assert switch_interval._holds == 0, "this test left a hold"


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


def test_a_change_made_between_two_holds_is_what_the_last_release_puts_back():
    first = switch_interval.hold(0.0005)
    sys.setswitchinterval(0.002)  # the user's, while a run uploads
    second = switch_interval.hold(0.0005)
    assert sys.getswitchinterval() == pytest.approx(0.0005)
    first()
    second()
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

    def child() -> list[float]:
        seen = [sys.getswitchinterval()]
        own = switch_interval.hold(0.0005)
        release()  # the parent's release, taken before the fork, must not end the child's own hold
        seen.append(sys.getswitchinterval())
        own()
        return [*seen, sys.getswitchinterval()]

    try:
        seen = in_child(child)
    finally:
        release()
    assert seen == pytest.approx([FOUND_S, 0.0005, FOUND_S])
    assert sys.getswitchinterval() == pytest.approx(FOUND_S)


def interval_while_uploading(run: prime_runs.Run, gate, count: int) -> float:
    """Log ``count`` episodes, read the switch interval while the first upload waits at the gate, then finish."""
    try:
        assert run.log_episodes(episodes("e", count))
        assert gate.entered.wait(GATE_TIMEOUT_S)  # an upload is in progress
        seen = sys.getswitchinterval()
        gate.open()
        assert run.flush(timeout_s=FLUSH_TIMEOUT_S)
    finally:
        gate.open()
        run.finish(timeout_s=FLUSH_TIMEOUT_S)
    return seen


def test_a_run_lowers_it_while_it_uploads_and_puts_it_back_at_finish(service, gate):
    run = online(service, "switching")
    assert sys.getswitchinterval() == pytest.approx(FOUND_S)  # nothing logged yet
    seen = interval_while_uploading(run, gate, 2)
    assert seen == pytest.approx(prime_runs.init.__kwdefaults__["switch_interval_s"])
    assert_buckets(run, submitted=2, stored=2)
    assert sys.getswitchinterval() == pytest.approx(FOUND_S)


def test_a_run_that_only_logs_metrics_leaves_the_interpreter_alone(service):
    run = online(service, "metrics-only")
    try:
        run.log({"loss": 1.0}, step=0)
        assert run.flush(timeout_s=FLUSH_TIMEOUT_S)
        assert sys.getswitchinterval() == pytest.approx(FOUND_S)
    finally:
        run.finish(timeout_s=FLUSH_TIMEOUT_S)
    assert run.stats()["metrics"]["stored"] == 1


def test_a_run_told_none_leaves_the_interpreter_alone(service, gate):
    run = online(service, "leave-it", switch_interval_s=None)
    assert interval_while_uploading(run, gate, 1) == pytest.approx(FOUND_S)
    assert_buckets(run, submitted=1, stored=1)
