"""HTTP for the client: one ``requests.Session`` per thread, errors translated.

This is the one place where ``requests`` exceptions and error answers become
``prime_traces.errors`` types (contract §6). requests does not promise that a
Session is thread-safe, so every thread that sends gets its own, with
keep-alive. After ``fork`` the child builds new sessions: it never writes to
a socket it shares with its parent.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import requests

from prime_traces._config import (
    CONNECT_TIMEOUT_S,
    READ_TIMEOUT_S,
    ClientConfig,
    default_headers,
)
from prime_traces._retry import parse_retry_after
from prime_traces.errors import (
    APIError,
    APITimeoutError,
    ErrorCode,
    ForbiddenError,
    LineFormatConflictError,
    NotFoundError,
    RetryableAPIError,
    TransportError,
    UnauthorizedError,
    ValidationRejectedError,
)

logger = logging.getLogger(__name__)

RETRYABLE_STATUSES = frozenset({429, 502, 503, 504})


def error_from_response(resp: requests.Response) -> APIError:
    """The typed error for an answer that is not 2xx."""
    code: str | None = None
    message: str | None = None
    line: int | None = None
    record_id: str | None = None
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
    elif isinstance(payload, dict) and "detail" in payload:
        message = str(payload["detail"])
    elif resp.content and payload is None:
        message = resp.content[:500].decode("utf-8", "replace")
    status = resp.status_code
    args: tuple[Any, ...] = (status, code, message or f"HTTP {status}")
    kwargs: dict[str, Any] = {"line": line, "record_id": record_id}
    if status in RETRYABLE_STATUSES:
        return RetryableAPIError(*args, retry_after=parse_retry_after(resp.headers.get("Retry-After")), **kwargs)
    if status == 400:
        return ValidationRejectedError(*args, **kwargs)
    if status == 401:
        return UnauthorizedError(*args, **kwargs)
    if status == 403:
        return ForbiddenError(*args, **kwargs)
    if status == 404:
        return NotFoundError(*args, **kwargs)
    if status == 409 and code != ErrorCode.TRACE_NOT_INDEXED.value:
        return LineFormatConflictError(*args, **kwargs)
    return APIError(*args, **kwargs)


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
        self._lock = threading.Lock()
        self._local = threading.local()
        self._sessions: list[requests.Session] = []
        self._pid = os.getpid()

    def __repr__(self) -> str:
        return f"Transport(base_url={self.config.base_url!r})"

    def _session(self) -> requests.Session:
        if os.getpid() != self._pid:
            self._after_fork()
        session = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            session.headers.update(self._headers)
            self._local.session = session
            with self._lock:
                self._sessions.append(session)
        return session

    def _after_fork(self) -> None:
        # The parent's sessions hold the parent's sockets: forget them, unclosed
        # (closing would shut sockets the parent is still using).
        self._lock = threading.Lock()
        self._local = threading.local()
        self._sessions = []
        self._pid = os.getpid()

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
    ) -> requests.Response:
        """Send one request; return a 2xx response or raise the typed error."""
        read_timeout = self.timeout_s if timeout_s is None else max(0.001, min(timeout_s, self.timeout_s))
        connect_timeout = min(self.connect_timeout_s, read_timeout)
        try:
            resp = self._session().request(
                method,
                url,
                params=params,
                data=data,
                headers=dict(headers) if headers else None,
                stream=stream,
                timeout=(connect_timeout, read_timeout),
                allow_redirects=True,
            )
        except requests.Timeout as err:
            raise APITimeoutError(f"{method} {_path(url)}: no answer within {read_timeout:g} s") from err
        except requests.RequestException as err:
            raise TransportError(f"{method} {_path(url)}: {type(err).__name__}: {_short(err)}") from err
        if resp.status_code >= 400:
            try:
                if stream:
                    resp.content  # noqa: B018  (read the error body before closing)
            finally:
                resp.close()
            raise error_from_response(resp)
        return resp

    def close(self) -> None:
        """Close every session this transport opened (in this process)."""
        with self._lock:
            sessions, self._sessions = self._sessions, []
        for session in sessions:
            session.close()


def _path(url: str) -> str:
    return url.split("?", 1)[0]


def _short(err: BaseException) -> str:
    text = str(err)
    return text if len(text) <= 300 else text[:300] + "..."
