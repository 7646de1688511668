"""Which failures are retried, how long to wait, and when to give up (contract §6).

The policy is a declared :class:`tenacity.Retrying` built from tenacity's
pieces: :func:`upload_retrying` for ``POST /traces`` and :func:`get_retrying`
for reads. Only :class:`RetryableAPIError` (429, 502, 503, 504) and
:class:`TransportError` (timeouts included) are retried; everything else,
every 4xx above all, is raised at once. A wait honours ``Retry-After``
(capped at :data:`MAX_RETRY_AFTER_S`), else backs off exponentially with
jitter. A ``cancel`` event cuts a wait short and stops the retries.

A *refusal* (429, or a 503 with one of the service's refusal codes) is the
service asking the client to slow down, not a failure of the request. With
``refusals_free`` an upload waits it out without spending an attempt, for as
long as ``max_refused_s`` allows (``None``: until ``cancel`` or the deadline).
"""

from __future__ import annotations

import datetime
import email.utils
import logging
import math
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import tenacity
from tenacity import RetryCallState

from prime_traces.errors import SERVICE_REFUSAL_CODES, RetryableAPIError, TransportError

logger = logging.getLogger(__name__)

DEFAULT_UPLOAD_ATTEMPTS = 5
DEFAULT_GET_ATTEMPTS = 3
MAX_RETRY_AFTER_S = 60.0
MAX_BACKOFF_S = 30.0

RETRYABLE_ERRORS = (RetryableAPIError, TransportError)


def _retryable(error: BaseException) -> bool:
    return isinstance(error, RETRYABLE_ERRORS)


def is_refusal(error: BaseException | None) -> bool:
    """429, or 503 with a refusal code: the service did nothing and asks to be asked later."""
    if not isinstance(error, RetryableAPIError):
        return False
    return error.status_code == 429 or (error.status_code == 503 and error.code in SERVICE_REFUSAL_CODES)


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header, or ``None`` to ignore it.

    Accepts delta-seconds (a float is tolerated) or an HTTP-date. A negative
    delay or a past date means 0; the result is capped at
    :data:`MAX_RETRY_AFTER_S`. ``now`` is the current Unix time, used only to
    turn an HTTP-date into a delay (default :func:`time.time`).
    """
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    try:
        seconds: float | None = float(text)
    except ValueError:
        seconds = _seconds_until_http_date(text, now)
    if seconds is None or math.isnan(seconds):
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


def _seconds_until_http_date(text: str, now: float | None) -> float | None:
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:
        # RFC 9110 dates are always GMT; "-0000" parses as naive.
        when = when.replace(tzinfo=datetime.timezone.utc)
    # Wall-clock time is right here: an HTTP-date is a wall-clock instant.
    current = time.time() if now is None else now
    return when.timestamp() - current


def backoff_s(attempt: int, rng: random.Random | None = None) -> float:
    """The wait after the ``attempt``-th failure (0-based) without ``Retry-After``.

    ``min(30, 2**attempt)`` seconds times a uniform jitter in [0.5, 1.5], so
    producers that failed together do not retry together.
    """
    jitter = (rng or random).uniform(0.5, 1.5)
    return min(MAX_BACKOFF_S, 2.0**attempt) * jitter


class wait_retry_after_or_backoff(tenacity.wait.wait_base):
    """A tenacity wait: the error's ``retry_after`` if it has one, else :func:`backoff_s`."""

    def __init__(self, rng: random.Random | None = None, *, refusal_jitter: bool = False) -> None:
        self.rng = rng or random.Random()
        # Producers refused together must not all come back at the same instant.
        self.refusal_jitter = refusal_jitter

    def __call__(self, retry_state: RetryCallState) -> float:
        outcome = retry_state.outcome
        error = outcome.exception() if outcome is not None and outcome.failed else None
        retry_after = getattr(error, "retry_after", None)
        if retry_after is not None:
            wait = max(float(retry_after), 0.0)
            if self.refusal_jitter and is_refusal(error):
                wait *= self.rng.uniform(1.0, 1.5)
            return min(wait, MAX_RETRY_AFTER_S)
        return backoff_s(retry_state.attempt_number - 1, self.rng)


class stop_before_deadline(tenacity.stop.stop_base):
    """A tenacity stop: give up when the coming wait would end past ``deadline_monotonic``."""

    def __init__(self, deadline_monotonic: float, clock: Callable[[], float] = time.monotonic):
        self.deadline_monotonic = deadline_monotonic
        self.clock = clock

    def __call__(self, retry_state: RetryCallState) -> bool:
        return self.clock() + retry_state.upcoming_sleep > self.deadline_monotonic


class stop_after_failures(tenacity.stop.stop_base):
    """A tenacity stop for one call: ``max_attempts`` failures that were not refusals.

    Refusals spend no attempt; they stop the retries only once they have gone
    on, with no other answer between them, for more than ``max_refused_s``
    (``None``: never). Stateful, so a fresh one serves each call.
    """

    def __init__(self, max_attempts: int, max_refused_s: float | None, clock: Callable[[], float]):
        self.max_attempts = max_attempts
        self.max_refused_s = max_refused_s
        self.clock = clock
        self._failures = 0
        self._refused_since: float | None = None
        self._counted = 0

    def __call__(self, retry_state: RetryCallState) -> bool:
        if retry_state.attempt_number != self._counted:
            self._counted = retry_state.attempt_number
            outcome = retry_state.outcome
            error = outcome.exception() if outcome is not None and outcome.failed else None
            if is_refusal(error):
                if self._refused_since is None:
                    self._refused_since = self.clock()
            else:
                self._refused_since = None
                self._failures += 1
        if self._failures >= self.max_attempts:
            return True
        if self._refused_since is not None and self.max_refused_s is not None:
            return self.clock() - self._refused_since >= self.max_refused_s
        return False


class _Cancellation:
    """Sleep and before-sleep hooks that let ``cancel`` end a wait and the retries.

    tenacity checks its stop only after an attempt fails, so a cancel that
    arrives during a wait would otherwise still buy one more attempt. The
    sleep re-raises the last error instead.
    """

    def __init__(self, cancel: threading.Event | None, sleep: Callable[[float], None] | None):
        self.cancel = cancel
        if sleep is not None:
            self._sleep = sleep
        elif cancel is not None:
            self._sleep = tenacity.nap.sleep_using_event(cancel)
        else:
            self._sleep = time.sleep
        # Per thread, like tenacity's own state: one Retrying may serve many calls.
        self._local = threading.local()

    def before_sleep(self, retry_state: RetryCallState) -> None:
        outcome = retry_state.outcome
        error = outcome.exception() if outcome is not None else None
        self._local.last_error = error
        next_action = retry_state.next_action
        logger.info(
            "attempt %d failed (%s); retrying in %.2f s",
            retry_state.attempt_number,
            error,
            next_action.sleep if next_action is not None else 0.0,
        )

    def sleep(self, seconds: float) -> None:
        self._sleep(seconds)
        error = getattr(self._local, "last_error", None)
        self._local.last_error = None
        if self.cancel is not None and self.cancel.is_set() and error is not None:
            raise error


def _retrying(
    max_attempts: int,
    *,
    cancel: threading.Event | None,
    sleep: Callable[[float], None] | None,
    deadline_monotonic: float | None,
    rng: random.Random | None,
    clock: Callable[[], float],
    refusals_free: bool = False,
    max_refused_s: float | None = None,
    resend: Callable[[BaseException], bool] | None = None,
) -> tenacity.Retrying:
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise ValueError(f"max_attempts must be an int of at least 1, got {max_attempts!r}")
    if max_refused_s is not None and max_refused_s < 0:
        raise ValueError(f"max_refused_s must be at least 0, not {max_refused_s}")
    stop: tenacity.stop.stop_base
    if refusals_free:
        stop = stop_after_failures(max_attempts, max_refused_s, clock)
    else:
        stop = tenacity.stop_after_attempt(max_attempts)
    if cancel is not None:
        stop = stop | tenacity.stop_when_event_set(cancel)
    if deadline_monotonic is not None:
        stop = stop | stop_before_deadline(deadline_monotonic, clock)
    hooks = _Cancellation(cancel, sleep)
    return tenacity.Retrying(
        retry=tenacity.retry_if_exception(resend or _retryable),
        wait=wait_retry_after_or_backoff(rng, refusal_jitter=refusals_free),
        stop=stop,
        sleep=hooks.sleep,
        before_sleep=hooks.before_sleep,
        reraise=True,
    )


def upload_retrying(
    max_attempts: int = DEFAULT_UPLOAD_ATTEMPTS,
    *,
    cancel: threading.Event | None = None,
    sleep: Callable[[float], None] | None = None,
    deadline_monotonic: float | None = None,
    rng: random.Random | None = None,
    clock: Callable[[], float] = time.monotonic,
    refusals_free: bool = False,
    max_refused_s: float | None = None,
) -> tenacity.Retrying:
    """The retry policy of one upload: call it with the function that sends the batch.

    Retries :class:`RetryableAPIError` and :class:`TransportError` up to
    ``max_attempts`` attempts in all, and stops early when ``cancel`` is set or
    the next wait would end past ``deadline_monotonic`` (a
    :func:`time.monotonic` instant). With ``refusals_free``, refusals
    (:func:`is_refusal`) spend no attempt and their ``Retry-After`` gets a
    jitter of up to +50 %; they end the retries only after ``max_refused_s`` of
    refusals in a row (``None``: never). The last error is re-raised unchanged.
    ``sleep`` defaults to waiting on ``cancel`` (so setting it ends the wait
    at once), or :func:`time.sleep` without one; ``rng`` and ``clock`` are for
    tests. The caller must resend identical bytes and key on every attempt::

        retrying = upload_retrying(cancel=shutdown_event)
        receipt = retrying(send_batch, batch)
    """
    return _retrying(
        max_attempts,
        cancel=cancel,
        sleep=sleep,
        deadline_monotonic=deadline_monotonic,
        rng=rng,
        clock=clock,
        refusals_free=refusals_free,
        max_refused_s=max_refused_s,
    )


def get_retrying(max_attempts: int = DEFAULT_GET_ATTEMPTS, **kwargs: Any) -> tenacity.Retrying:
    """The retry policy of a GET: as :func:`upload_retrying`, 3 attempts by default.

    A streamed raw GET must only be retried before its first body byte; the
    caller enforces that by raising a non-retryable error after it.
    """
    return upload_retrying(max_attempts, **kwargs)


def request_retrying(
    max_attempts: int,
    *,
    resend: Callable[[BaseException], bool],
    deadline_monotonic: float | None = None,
    sleep: Callable[[float], None] | None = None,
    rng: random.Random | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> tenacity.Retrying:
    """The retry policy of one request that is not always safe to send twice.

    ``resend(error)`` says whether the failed attempt may be sent again (a
    request the service may have carried out is resent only when doing it
    twice is harmless); waits and stops are those of :func:`upload_retrying`.
    """
    return _retrying(
        max_attempts,
        cancel=None,
        sleep=sleep,
        deadline_monotonic=deadline_monotonic,
        rng=rng,
        clock=clock,
        resend=resend,
    )
