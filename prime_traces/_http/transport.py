"""HTTP for the client: one ``requests.Session`` per thread, errors translated.

This is the one place where ``requests`` exceptions and error answers become
``prime_traces.errors`` types (contract §6), with the API key and any bearer
credential redacted from every text they carry: third-party messages, and
error bodies (a gateway may echo the request's headers back). requests does
not promise that a Session is thread-safe, so every thread that sends gets
its own, with keep-alive; the sessions of threads that have ended are closed
when a new one is made. After ``fork`` the child builds new sessions: it
never writes to a socket it shares with its parent, nor closes one.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import orjson
import requests
import urllib3

from prime_traces._http.redact import Redactor
from prime_traces._http.retry import parse_retry_after
from prime_traces.config import (
    CONNECT_TIMEOUT_S,
    READ_TIMEOUT_S,
    ClientConfig,
    default_headers,
)
from prime_traces.errors import (
    APIError,
    APITimeoutError,
    ErrorCode,
    ForbiddenError,
    LineFormatConflictError,
    LineRejection,
    NotFoundError,
    PaymentRequiredError,
    RetryableAPIError,
    RunFinishedError,
    TransportError,
    UnauthorizedError,
    ValidationRejectedError,
)
from prime_traces.threads import call_in_forked_child

logger = logging.getLogger(__name__)

RETRYABLE_STATUSES = frozenset({429, 502, 503, 504})
_RUN_PATH = re.compile(r"/api/v1/runs(/|$)")


def error_from_response(resp: requests.Response, hide: Redactor | None = None) -> APIError:
    """The typed error for an answer that is not 2xx; ``hide`` redacts the key from its texts.

    Without ``hide``, bearer credentials are still redacted.
    """
    hide = hide or Redactor(None)
    code: str | None = None
    message: str | None = None
    line: int | None = None
    record_id: str | None = None
    errors: tuple[LineRejection, ...] = ()
    try:
        payload = orjson.loads(resp.content) if resp.content else None
    except orjson.JSONDecodeError:
        payload = None
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
        error = payload["error"]
        code = error.get("code") if isinstance(error.get("code"), str) else None
        message = error.get("message") if isinstance(error.get("message"), str) else None
        line = error.get("line") if type(error.get("line")) is int else None
        record_id = error.get("id") if isinstance(error.get("id"), str) else None
        errors = _line_rejections(error.get("errors"), hide)
    elif isinstance(payload, dict) and "detail" in payload:
        message = str(payload["detail"])
    elif resp.content and payload is None:
        # Redacted before the cut to 500 characters, so that no piece of the key is left there.
        message = _short(hide(resp.content[:4096].decode("utf-8", "replace")), 500)
    status = resp.status_code
    args: tuple[Any, ...] = (status, code, hide(message) if message else f"HTTP {status}")
    kwargs: dict[str, Any] = {"line": line, "record_id": record_id, "errors": errors}
    if status in RETRYABLE_STATUSES:
        return RetryableAPIError(*args, retry_after=parse_retry_after(resp.headers.get("Retry-After")), **kwargs)
    if status == 400:
        return ValidationRejectedError(*args, **kwargs)
    if status == 401:
        return UnauthorizedError(*args, **kwargs)
    if status == 402:
        return PaymentRequiredError(*args, **kwargs)
    if status == 403:
        return ForbiddenError(*args, **kwargs)
    if status == 404:
        return NotFoundError(*args, **kwargs)
    if status == 409 and code != ErrorCode.TRACE_NOT_INDEXED.value:
        # A run endpoint's 409 without a code is run_finished (contract §6); an explicit other code is not.
        if code == ErrorCode.RUN_FINISHED.value or (code is None and _is_run_endpoint(resp)):
            return RunFinishedError(*args, **kwargs)
        return LineFormatConflictError(*args, **kwargs)
    return APIError(*args, **kwargs)


def _is_run_endpoint(resp: requests.Response) -> bool:
    # Contract §6: a 409 from the run endpoints means run_finished even without its code.
    request = resp.request
    path = urlsplit(request.url or "").path if request is not None else ""
    return _RUN_PATH.search(path) is not None


def _read_until(resp: requests.Response, deadline: float) -> None:
    """Read the body of a streamed answer, giving up at ``deadline`` (a monotonic instant)."""
    chunks = []
    try:
        while True:
            if time.monotonic() >= deadline:
                raise requests.Timeout("the answer did not end in time")
            # One receive at a time, so the deadline is checked as bytes trickle in.
            chunk = resp.raw.read1(1 << 16, decode_content=True)
            if not chunk:
                break
            chunks.append(chunk)
    except urllib3.exceptions.ReadTimeoutError as err:
        resp.close()
        raise requests.Timeout(str(err)) from err
    except (urllib3.exceptions.HTTPError, OSError) as err:
        resp.close()
        raise requests.ConnectionError(str(err)) from err
    except BaseException:
        resp.close()
        raise
    resp._content = b"".join(chunks)  # what .content would have read
    resp._content_consumed = True  # type: ignore[attr-defined]  # requests declares it; types-requests omits it
    resp.close()


def _line_rejections(entries: Any, hide: Redactor) -> tuple[LineRejection, ...]:
    """The ``errors`` list of a 400 (contract §9); entries without an int line are skipped."""
    if not isinstance(entries, list):
        return ()
    found = []
    for entry in entries:
        if not isinstance(entry, dict) or type(entry.get("line")) is not int:
            continue
        code, message, record_id = entry.get("code"), entry.get("message"), entry.get("id")
        found.append(
            LineRejection(
                entry["line"],
                code if isinstance(code, str) else None,
                hide(message) if isinstance(message, str) else "rejected",
                record_id if isinstance(record_id, str) else None,
            )
        )
    return tuple(found)


class Transport:
    """Sends requests for one client. Thread-safe; each thread has its own Session.

    ``timeout_s`` is the read (and write) timeout; connecting has its own,
    shorter one. A caller can pass a smaller ``timeout_s`` per request, which
    is how a deadline reaches the socket.
    """

    def __init__(
        self,
        config: ClientConfig,
        *,
        timeout_s: float = READ_TIMEOUT_S,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
    ) -> None:
        self.config = config
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._headers = default_headers(config)
        self._hide = Redactor(config.api_key)
        self._lock = threading.Lock()
        self._local = threading.local()
        # Each session with the thread that uses it, so that the sessions of
        # threads that have ended can be found and closed (see _sweep).
        self._sessions: dict[requests.Session, threading.Thread] = {}
        self._pid = os.getpid()
        call_in_forked_child(self._new_lock_in_child)

    def __repr__(self) -> str:
        return f"Transport(base_url={self.config.base_url!r})"

    def _new_lock_in_child(self) -> None:
        # A parent thread may have held the lock at fork time, and it does not
        # exist in the child to release it: never acquire the inherited one.
        self._lock = threading.Lock()

    def _forget_parent_sessions(self) -> None:
        """In a forked child, drop (unclosed) the sessions inherited from the parent. Hold the lock.

        Closing them would close sockets the parent is still using. The pid
        check happens under the lock so that, when several threads of the
        child send at once, exactly one of them replaces the bookkeeping.
        """
        if self._pid != os.getpid():
            self._local = threading.local()
            self._sessions = {}
            self._pid = os.getpid()

    def _session(self) -> requests.Session:
        if self._pid != os.getpid():
            with self._lock:
                self._forget_parent_sessions()
        session = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            session.headers.update(self._headers)
            self._local.session = session
            with self._lock:
                ended = self._sweep()
                self._sessions[session] = threading.current_thread()
            for old in ended:
                old.close()
        return session

    def _sweep(self) -> list[requests.Session]:
        """Remove and return the sessions of threads that have ended. Hold the lock.

        Without this, every short-lived thread that ever sent would keep its
        session, and its keep-alive sockets, open until close(). A thread that
        is no longer alive can no longer be using its session, so it is safe
        to close from here. Done when a thread makes a new session, which is
        exactly when the number of sessions would grow.
        """
        ended = [session for session, thread in self._sessions.items() if not thread.is_alive()]
        for session in ended:
            del self._sessions[session]
        return ended

    def request(
        self,
        method: str,
        url: str,
        *,
        params: Sequence[tuple[str, str]] | Mapping[str, Any] | None = None,
        data: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        stream: bool = False,
        timeout_s: float | None = None,
        whole: bool = False,
    ) -> requests.Response:
        """Send one request; return a 2xx response or raise the typed error.

        ``timeout_s`` bounds connecting and each read. With ``whole`` it bounds
        the whole answer too: a service that trickles its answer byte by byte
        cannot hold the caller past ``timeout_s`` (plus one read).
        """
        read_timeout = self.timeout_s if timeout_s is None else max(0.001, min(timeout_s, self.timeout_s))
        connect_timeout = min(self.connect_timeout_s, read_timeout)
        deadline = time.monotonic() + read_timeout if whole and not stream else None
        try:
            resp = self._session().request(
                method,
                url,
                params=params,
                data=data,
                headers=dict(headers) if headers else None,
                stream=stream or deadline is not None,
                timeout=(connect_timeout, read_timeout),
                allow_redirects=True,
            )
            if deadline is not None:
                _read_until(resp, deadline)
        except requests.Timeout as err:
            self._hide.exception_chain(err)
            raise APITimeoutError(f"{method} {_path(url)}: no answer within {read_timeout:g} s") from err
        except requests.RequestException as err:
            # Third-party messages may quote request headers (requests'
            # InvalidHeader does, as a repr). Redacted before shortening: a cut
            # could leave a piece of the key that no longer matches.
            text, scrubbed = self._hide.subn(str(err))
            self._hide.exception_chain(err)
            hint = " (the API key was removed from this message; check it for stray characters)" if scrubbed else ""
            raise TransportError(f"{method} {_path(url)}: {type(err).__name__}: {_short(text)}{hint}") from err
        if resp.status_code >= 400:
            try:
                if stream:
                    resp.content  # noqa: B018  (read the error body before closing)
            finally:
                resp.close()
            raise error_from_response(resp, self._hide)
        return resp

    def iter_body(self, resp: requests.Response, chunk_bytes: int, what: str) -> Iterator[bytes]:
        """The body of a streamed answer in chunks; a body that breaks off raises the typed error.

        ``what`` names the request in the message (``GET /path``), which says
        how many bytes had arrived. The response is closed at the end, whatever happens.
        """
        written = 0
        try:
            chunks = resp.iter_content(chunk_bytes)
            while True:
                try:
                    chunk = next(chunks)
                except StopIteration:
                    return
                except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as err:
                    # requests reports a read timeout mid-body as ConnectionError(ReadTimeoutError).
                    timed_out = any(isinstance(a, urllib3.exceptions.ReadTimeoutError) for a in err.args)
                    kind = APITimeoutError if timed_out else TransportError
                    self._hide.exception_chain(err)
                    text = self._hide.subn(f"{type(err).__name__}: {err}")[0]
                    raise kind(f"{what}: the body broke off after {written} bytes: {_short(text)}") from err
                written += len(chunk)
                yield chunk
        finally:
            resp.close()

    def close(self) -> None:
        """Close every session this transport opened (in this process).

        In a forked child that never sent, there is nothing of its own to
        close: the sessions it inherited belong to the parent.
        """
        with self._lock:
            self._forget_parent_sessions()
            sessions, self._sessions = self._sessions, {}
        for session in sessions:
            session.close()


def not_sent(err: TransportError) -> bool:
    """Whether the request behind ``err`` failed before any byte of it reached the service."""
    cause = err.__cause__
    if isinstance(cause, requests.ConnectTimeout):
        return True
    if not isinstance(cause, requests.ConnectionError) or isinstance(cause, requests.Timeout):
        return False
    # requests wraps urllib3's MaxRetryError, whose reason says which step failed.
    reason = cause.args[0] if cause.args else None
    reason = getattr(reason, "reason", reason)
    return isinstance(reason, urllib3.exceptions.ConnectTimeoutError)  # NewConnectionError included


def _path(url: str) -> str:
    return url.split("?", 1)[0]


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
