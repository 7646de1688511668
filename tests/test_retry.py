"""The retry policy: what is retried, the exact waits, cancellation (contract §6)."""

from __future__ import annotations

import email.utils
import logging
import random
import threading
import time

import pytest
from _sync import NotedWaitEvent

from prime_traces import (
    APIError,
    APITimeoutError,
    ForbiddenError,
    LineFormatConflictError,
    NotFoundError,
    RetryableAPIError,
    TransportError,
    UnauthorizedError,
    ValidationRejectedError,
)
from prime_traces._http.retry import (
    MAX_RETRY_AFTER_S,
    backoff_s,
    get_retrying,
    parse_retry_after,
    upload_retrying,
)

NOW = 1_750_000_000.0


class FixedRng:
    """An rng whose jitter is always ``value``; records the bounds it was asked for."""

    def __init__(self, value: float = 1.0) -> None:
        self.value = value
        self.calls: list[tuple[float, float]] = []

    def uniform(self, low: float, high: float) -> float:
        self.calls.append((low, high))
        return self.value


class Flaky:
    """A callable that raises the given errors in turn, then returns ``"ok"``."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def _busy(retry_after: float | None = None) -> RetryableAPIError:
    return RetryableAPIError(503, "writer_pool_saturated", "busy", retry_after=retry_after)


@pytest.fixture
def waits() -> list[float]:
    return []


# --- Retry-After ------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("5", 5.0),
        ("1.5", 1.5),
        (" 2 ", 2.0),
        ("0", 0.0),
        ("-3", 0.0),
        ("-0.5", 0.0),
        ("60", 60.0),
        ("120", MAX_RETRY_AFTER_S),
        ("inf", MAX_RETRY_AFTER_S),
        ("nan", None),
        ("garbage", None),
        ("5 seconds", None),
        ("", None),
        ("   ", None),
        (None, None),
    ],
)
def test_parse_retry_after_seconds(value, expected):
    assert parse_retry_after(value, now=NOW) == expected


def test_parse_retry_after_http_date():
    in_30s = email.utils.formatdate(NOW + 30, usegmt=True)
    assert parse_retry_after(in_30s, now=NOW) == 30.0


def test_parse_retry_after_past_date_is_zero():
    assert parse_retry_after(email.utils.formatdate(NOW - 300, usegmt=True), now=NOW) == 0.0


def test_parse_retry_after_far_date_is_capped():
    assert parse_retry_after(email.utils.formatdate(NOW + 3600, usegmt=True), now=NOW) == 60.0


def test_parse_retry_after_asctime_date_is_gmt():
    value = time.strftime("%a %b %d %H:%M:%S %Y", time.gmtime(NOW + 10))
    assert parse_retry_after(value, now=NOW) == 10.0


def test_parse_retry_after_uses_the_wall_clock_by_default():
    in_20s = email.utils.formatdate(time.time() + 20, usegmt=True)
    assert 15.0 <= parse_retry_after(in_20s) <= 20.0  # type: ignore[operator]


# --- backoff ------------------------------------------------------------------


def test_backoff_doubles_up_to_thirty_seconds():
    rng = FixedRng(1.0)
    assert [backoff_s(a, rng) for a in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    assert set(rng.calls) == {(0.5, 1.5)}


def test_backoff_jitter_scales_the_wait():
    assert backoff_s(3, FixedRng(0.5)) == 4.0
    assert backoff_s(3, FixedRng(1.5)) == 12.0
    assert backoff_s(10, FixedRng(1.5)) == 45.0


def test_backoff_with_a_real_rng_stays_in_bounds():
    rng = random.Random(7)
    for attempt in range(8):
        base = min(30, 2**attempt)
        assert 0.5 * base <= backoff_s(attempt, rng) <= 1.5 * base


# --- exact waits ------------------------------------------------------------


def test_upload_retries_five_attempts_then_reraises_the_last_error(waits):
    errors = [_busy() for _ in range(5)]
    flaky = Flaky(*errors)
    retrying = upload_retrying(sleep=waits.append, rng=FixedRng(1.0))
    with pytest.raises(RetryableAPIError) as info:
        retrying(flaky)
    assert info.value is errors[-1]
    assert flaky.calls == 5
    assert waits == [1.0, 2.0, 4.0, 8.0]


def test_success_after_failures_returns_the_result(waits):
    flaky = Flaky(_busy(), TransportError("reset"))
    assert upload_retrying(sleep=waits.append, rng=FixedRng(1.0))(flaky) == "ok"
    assert flaky.calls == 3
    assert waits == [1.0, 2.0]


def test_retry_after_replaces_the_backoff_and_is_capped(waits):
    flaky = Flaky(_busy(3.0), _busy(None), _busy(0.0), _busy(500.0))
    assert upload_retrying(sleep=waits.append, rng=FixedRng(1.0))(flaky) == "ok"
    assert waits == [3.0, 2.0, 0.0, 60.0]


def test_jitter_comes_from_the_rng(waits):
    flaky = Flaky(_busy(), _busy())
    upload_retrying(sleep=waits.append, rng=FixedRng(0.5))(flaky)
    assert waits == [0.5, 1.0]


def test_max_attempts_is_configurable(waits):
    flaky = Flaky(*[APITimeoutError("slow") for _ in range(8)])
    with pytest.raises(APITimeoutError):
        upload_retrying(8, sleep=waits.append, rng=FixedRng(1.0))(flaky)
    assert flaky.calls == 8
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]


def test_get_retrying_makes_three_attempts(waits):
    flaky = Flaky(*[_busy() for _ in range(3)])
    with pytest.raises(RetryableAPIError):
        get_retrying(sleep=waits.append, rng=FixedRng(1.0))(flaky)
    assert flaky.calls == 3
    assert waits == [1.0, 2.0]


def test_iterator_style_uses_the_same_policy(waits):
    flaky = Flaky(_busy(), _busy())
    for attempt in upload_retrying(sleep=waits.append, rng=FixedRng(1.0)):
        with attempt:
            result = flaky()
    assert result == "ok" and waits == [1.0, 2.0]


@pytest.mark.parametrize("max_attempts", [0, -1, True, 1.5])
def test_invalid_max_attempts_is_refused(max_attempts):
    with pytest.raises(ValueError, match="max_attempts"):
        upload_retrying(max_attempts)


# --- what is never retried --------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        ValidationRejectedError(400, "invalid_trace", "bad line", line=3),
        UnauthorizedError(401, "unauthenticated", "no"),
        APIError(402, None, "payment required"),
        ForbiddenError(403, "forbidden", "no scope"),
        NotFoundError(404, "trace_not_found", "gone"),
        LineFormatConflictError(409, "line_format_conflict", "other format"),
        APIError(413, None, "too large"),
        APIError(500, None, "boom"),
        ValueError("not an API error"),
    ],
    ids=lambda e: type(e).__name__ + str(getattr(e, "status_code", "")),
)
def test_non_retryable_errors_raise_at_once(error, waits):
    flaky = Flaky(error)
    with pytest.raises(type(error)) as info:
        upload_retrying(sleep=waits.append, rng=FixedRng())(flaky)
    assert info.value is error
    assert flaky.calls == 1
    assert waits == []


# --- cancellation and deadline -----------------------------------------------


def test_cancel_set_before_a_failure_stops_without_waiting(waits):
    cancel = threading.Event()
    cancel.set()
    flaky = Flaky(_busy(), _busy())
    with pytest.raises(RetryableAPIError):
        upload_retrying(cancel=cancel, sleep=waits.append, rng=FixedRng())(flaky)
    assert flaky.calls == 1
    assert waits == []


def test_cancel_during_a_wait_stops_without_another_attempt():
    cancel = threading.Event()
    first = _busy()
    flaky = Flaky(first, _busy(), _busy())
    waited: list[float] = []

    def sleep(seconds: float) -> None:
        waited.append(seconds)
        cancel.set()

    with pytest.raises(RetryableAPIError) as info:
        upload_retrying(cancel=cancel, sleep=sleep, rng=FixedRng())(flaky)
    assert info.value is first
    assert flaky.calls == 1
    assert waited == [1.0]


def test_default_sleep_is_cut_short_by_cancel():
    cancel = NotedWaitEvent()
    first = _busy(retry_after=60.0)
    flaky = Flaky(first, _busy())

    def cancel_once_waiting() -> None:
        # Setting the event before the wait began would stop the retries
        # without ever interrupting a sleep.
        cancel.waiting.wait()
        cancel.set()

    helper = threading.Thread(target=cancel_once_waiting)
    started = time.monotonic()
    helper.start()
    try:
        with pytest.raises(RetryableAPIError) as info:
            upload_retrying(cancel=cancel)(flaky)
        elapsed = time.monotonic() - started
        waited_on_cancel = cancel.waiting.is_set()
    finally:
        cancel.waiting.set()  # frees the helper if the sleep never waited on the event
        helper.join(timeout=5)
    assert waited_on_cancel
    assert elapsed < 30  # far below the 60 s Retry-After
    assert info.value is first
    assert flaky.calls == 1


def test_deadline_stops_before_a_wait_that_would_pass_it():
    now = [100.0]
    waited: list[float] = []

    def sleep(seconds: float) -> None:
        waited.append(seconds)
        now[0] += seconds

    flaky = Flaky(*[_busy() for _ in range(5)])
    retrying = upload_retrying(sleep=sleep, rng=FixedRng(1.0), deadline_monotonic=103.5, clock=lambda: now[0])
    with pytest.raises(RetryableAPIError):
        retrying(flaky)
    # Waits of 1 and 2 end at 101 and 103; the next, 4, would end at 107.
    assert waited == [1.0, 2.0]
    assert flaky.calls == 3


def test_deadline_applies_to_retry_after_too(waits):
    flaky = Flaky(_busy(retry_after=30.0), _busy())
    retrying = upload_retrying(sleep=waits.append, rng=FixedRng(), deadline_monotonic=20.0, clock=lambda: 0.0)
    with pytest.raises(RetryableAPIError):
        retrying(flaky)
    assert waits == [] and flaky.calls == 1


# --- logging ----------------------------------------------------------------


def test_each_retry_is_logged_before_sleeping(caplog, waits):
    flaky = Flaky(_busy(), TransportError("connection reset"))
    with caplog.at_level(logging.INFO, logger="prime_traces._http.retry"):
        upload_retrying(sleep=waits.append, rng=FixedRng(1.0))(flaky)
    messages = [r.getMessage() for r in caplog.records if r.name == "prime_traces._http.retry"]
    assert len(messages) == 2
    assert "attempt 1 failed" in messages[0] and "1.00 s" in messages[0]
    assert "connection reset" in messages[1] and "2.00 s" in messages[1]
