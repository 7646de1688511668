"""HTTP as route handlers see it: requests, answers, errors, routes, credentials.

Route handlers are plain functions ``handler(req: Request) -> Response``
registered in a module's ``ROUTES`` list; they raise :class:`HTTPError` for
any answer that is an error, and the connection handler (``_listener``)
turns it into the contract's envelope ``{"error": {"code", "message",
"line"?, "id"?}}``. A request reaches its connection only through
:class:`Connection`, so this module stays below the listener that serves it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from prime_traces.errors import ErrorCode
from prime_traces.server._body import MemoryCharge, read_body

if TYPE_CHECKING:
    import socketserver

    from prime_traces.server._state import ServiceState

API_PREFIX = "/api/v1"
#: The platform's internal root (contract §10): the platform's run routes answer here too.
INTERNAL_PREFIX = "/api/internal"
UPLOAD_PATH = API_PREFIX + "/traces"
RUNS_PATH = API_PREFIX + "/runs/"
ACCEPT_ENCODING = "zstd, gzip"
DEFAULT_MAX_JSON_BODY_BYTES = 16 * 1024 * 1024


class HTTPError(Exception):
    """An error answer: status, envelope code and message, and where it is."""

    def __init__(
        self,
        status: int,
        code: ErrorCode | str | None,
        message: str,
        *,
        line: int | None = None,
        record_id: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = str(code) if code is not None else None
        self.message = message
        self.line = line
        self.record_id = record_id
        self.headers = headers or {}
        #: Every rejected line of an upload, ``{"line", "id"?, "code", "message"}`` (contract §9).
        self.errors: list[dict[str, Any]] | None = None

    def envelope(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.line is not None:
            error["line"] = self.line
            if self.record_id is not None:
                error["id"] = self.record_id
        if self.errors:
            error["errors"] = self.errors
        return {"error": error}


@dataclass
class Response:
    """An answer. ``body`` is bytes, or an iterable of chunks with ``length`` set."""

    status: int
    body: bytes | Iterable[bytes] = b""
    content_type: str | None = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    length: int | None = None


def json_response(status: int, obj: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(status, orjson.dumps(obj), headers=headers or {})


class Connection(Protocol):
    """What a handler may do with the connection its request came on (``_listener.RequestHandler``)."""

    #: The request's one Content-Length, or None.
    content_length: int | None
    charge: MemoryCharge

    @property
    def server(self) -> socketserver.TCPServer: ...

    def read_body_bytes(self, n: int) -> bytes: ...

    def drain_body(self) -> None: ...

    def close_after_response(self) -> None: ...


@dataclass
class Request:
    """One request as a route handler sees it."""

    method: str
    path: str
    params: dict[str, str]
    query: dict[str, list[str]]
    headers: Any
    producer: str
    state: ServiceState
    handler: Connection

    def header(self, name: str) -> str | None:
        return self.headers.get(name)

    def body_length(self) -> int | None:
        """The request's one Content-Length (checked before routing), or None."""
        return self.handler.content_length

    @property
    def charge(self) -> MemoryCharge:
        """This request's share of the service's body memory budget."""
        return self.handler.charge

    def read_body(
        self,
        length: int,
        bandwidth_mb_s: float | None = None,
        link: Callable[[int], float] | None = None,
        link_rate_b_s: float | None = None,
    ) -> bytearray:
        return read_body(self.handler.read_body_bytes, length, self.handler.charge, bandwidth_mb_s, link, link_rate_b_s)

    def json_body(self, max_bytes: int = DEFAULT_MAX_JSON_BODY_BYTES) -> Any:
        """The JSON body of a run request; 400 ``invalid_run`` if too large or not JSON."""
        length = self.body_length() or 0
        if length > max_bytes:
            raise HTTPError(400, ErrorCode.INVALID_RUN, f"request body over {max_bytes >> 20} MiB")
        raw = self.read_body(length)
        try:
            return orjson.loads(raw) if raw else {}
        except orjson.JSONDecodeError as err:
            raise HTTPError(400, ErrorCode.INVALID_RUN, f"body is not JSON: {err}") from None

    def base_url(self) -> str:
        host = self.headers.get("Host") or "{}:{}".format(*self.handler.server.server_address[:2])
        return f"http://{host}"


Route = tuple[str, "re.Pattern[str]", Callable[[Request], Response]]


def _segments(pattern: str) -> str:
    """``pattern`` as a regular expression: ``{name}`` matches one path segment."""
    return re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", pattern)


def route(method: str, pattern: str, func: Callable[[Request], Response], prefix: str = API_PREFIX) -> Route:
    """A route for ``pattern`` under ``prefix`` (``/api/v1``); ``{name}`` matches one segment."""
    return (method, re.compile(f"^{re.escape(prefix)}{_segments(pattern)}$"), func)


def platform_routes(method: str, pattern: str, func: Callable[[Request], Response]) -> list[Route]:
    """``pattern`` under ``/api/v1`` and under the internal root ``/api/internal`` (contract §10)."""
    return [route(method, pattern, func), route(method, pattern, func, prefix=INTERNAL_PREFIX)]


def open_route(method: str, pattern: str, func: Callable[[Request], Response]) -> Route:
    """A route outside ``/api`` answered without credentials: the request carries its own (a URL token)."""
    return (method, re.compile(f"^{_segments(pattern)}$"), func)


def page_route(pattern: str, func: Callable[[Request], Response]) -> Route:
    """A ``GET`` route outside ``/api/v1`` (the viewer's files): answered without credentials."""
    return ("GET", re.compile(f"^{pattern}$"), func)


def is_api_path(path: str) -> bool:
    """Whether ``path`` is under ``/api/v1`` or the internal root, where every request needs a credential."""
    return any(path == prefix or path.startswith(prefix + "/") for prefix in (API_PREFIX, INTERNAL_PREFIX))


def is_internal_path(path: str) -> bool:
    """Whether ``path`` is under ``/api/internal``, where ``x-api-key`` may carry the token instead."""
    return path == INTERNAL_PREFIX or path.startswith(INTERNAL_PREFIX + "/")


def producer_of(token: str) -> str:
    """A stable, non-secret label for a credential."""
    return "key-" + hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()[:12]


class DropConnection(Exception):
    """Raised by a handler to close the connection without an answer."""


def drop_connection() -> None:
    raise DropConnection()


def retry_after_value(seconds: float) -> str:
    """A ``Retry-After`` value: whole seconds when ``seconds`` is whole."""
    return str(int(seconds)) if float(seconds).is_integer() else f"{seconds:.3f}"
