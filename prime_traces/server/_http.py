"""HTTP plumbing of the local service: requests, responses, routing, auth.

Route handlers are plain functions ``handler(req: Request) -> Response``
registered in a module's ``ROUTES`` list; they raise :class:`HTTPError` for
any answer that is an error, and this module turns it into the contract's
envelope ``{"error": {"code", "message", "line"?, "id"?}}``.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

import orjson

from prime_traces._version import __version__
from prime_traces.errors import ErrorCode
from prime_traces.server._faults import throttled_read

if TYPE_CHECKING:
    from prime_traces.server._service import ServiceState

logger = logging.getLogger(__name__)

API_PREFIX = "/api/v1"
UPLOAD_PATH = API_PREFIX + "/traces"
RUNS_PATH = API_PREFIX + "/runs/"
ACCEPT_ENCODING = "zstd, gzip"
# An unread body up to this size is read and discarded so the connection can
# be reused; a larger one is cut off with the connection.
_DRAIN_LIMIT_BYTES = 64 * 1024 * 1024
_DRAIN_CHUNK_BYTES = 1 << 20
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


def _trickled(response: Response, interval_s: float, stopping: threading.Event) -> Response:
    """``response`` with its body sent a byte every ``interval_s`` (a fault)."""
    body = bytes(response.body) if isinstance(response.body, (bytes, bytearray)) else b"".join(response.body)

    def chunks() -> Iterable[bytes]:
        for i in range(len(body)):
            yield body[i : i + 1]
            if stopping.wait(interval_s):
                return

    return Response(response.status, chunks(), response.content_type, response.headers, len(body))


def json_response(status: int, obj: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(status, orjson.dumps(obj), headers=headers or {})


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
    handler: RequestHandler

    def header(self, name: str) -> str | None:
        return self.headers.get(name)

    def body_length(self) -> int | None:
        raw = self.headers.get("Content-Length")
        if raw is None:
            return None
        try:
            value = int(raw)
        except ValueError:
            raise HTTPError(400, None, f"Content-Length is not a number: {raw!r}") from None
        if value < 0:
            raise HTTPError(400, None, "Content-Length is negative")
        return value

    def read_body(self, length: int, bandwidth_mb_s: float | None = None) -> bytearray:
        self.handler.body_read = True
        return throttled_read(self.handler.rfile.readinto, length, bandwidth_mb_s)

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
        host = self.headers.get("Host") or "%s:%s" % self.handler.server.server_address[:2]
        return f"http://{host}"


Route = tuple[str, "re.Pattern[str]", Callable[[Request], Response]]


def route(method: str, pattern: str, func: Callable[[Request], Response]) -> Route:
    """A route for ``pattern`` under ``/api/v1``; ``{name}`` matches one segment."""
    regex = re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", pattern)
    return (method, re.compile(f"^{re.escape(API_PREFIX)}{regex}$"), func)


def producer_of(token: str) -> str:
    """A stable, non-secret label for a credential."""
    return "key-" + hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()[:12]


class RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes: with Nagle on, every
    # keep-alive answer would wait ~40 ms for the client's delayed ACK.
    disable_nagle_algorithm = True
    server_version = f"prime-traces-local/{__version__}"
    server: TracesHTTPServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        logger.debug("%s %s", self.address_string(), format % args)

    def do_GET(self) -> None:
        self._dispatch()

    do_POST = do_PATCH = do_DELETE = do_PUT = do_GET

    def _dispatch(self) -> None:
        state = self.server.state
        state.stats.count_request()
        split = urlsplit(self.path)
        self._close_after = False
        self.body_read = False
        try:
            response = self._handle(state, split.path, split.query)
        except HTTPError as err:
            response = json_response(err.status, err.envelope(), err.headers)
            if err.status >= 400 and err.code:
                state.stats.count_rejection(err.code)
        except _DropConnection:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        except (ConnectionError, TimeoutError, socket.timeout) as err:
            logger.debug("connection failed mid-request: %s", err)
            self.close_connection = True
            return
        except Exception:  # the service must answer even when a handler is wrong
            logger.exception("unhandled error for %s %s", self.command, split.path)
            response = json_response(500, {"error": {"code": None, "message": "internal error"}})
        if self.command == "POST" and split.path == UPLOAD_PATH:
            # Contract §9: every upload answer advertises the accepted codings.
            response.headers.setdefault("Accept-Encoding", ACCEPT_ENCODING)
        if not self.body_read:
            self.drain_body()
        # Added on top of the work, like a network round trip would be.
        if state.faults.latency_ms > 0:
            state.stopping.wait(state.faults.latency_ms / 1000.0)
        if self.command == "PATCH" and split.path.startswith(RUNS_PATH):
            if state.faults.on_run_update is not None:
                state.faults.on_run_update()
            if state.faults.trickle_run_update_byte_s > 0:
                response = _trickled(response, state.faults.trickle_run_update_byte_s, state.stopping)
        self._send(response)

    def drain_body(self) -> None:
        """Discard an unread request body, or close the connection after answering."""
        self.body_read = True
        try:
            remaining = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            remaining = 0
        if remaining > _DRAIN_LIMIT_BYTES:
            self._close_after = True
            return
        while remaining > 0:
            chunk = self.rfile.read(min(_DRAIN_CHUNK_BYTES, remaining))
            if not chunk:
                self._close_after = True
                return
            remaining -= len(chunk)

    def _handle(self, state: ServiceState, path: str, query_string: str) -> Response:
        method = self.command
        for route_method, pattern, func in state.routes:
            match = pattern.match(path)
            if match is None:
                continue
            if route_method != method:
                continue
            params = {k: unquote(v) for k, v in match.groupdict().items()}
            producer = self._authenticate(state)
            query = parse_qs(query_string, keep_blank_values=True)
            req = Request(method, path, params, query, self.headers, producer, state, self)
            return func(req)
        self._authenticate(state)
        if any(p.match(path) for _, p, _ in state.routes):
            raise HTTPError(405, None, f"method {method} not allowed on {path}")
        raise HTTPError(404, ErrorCode.NOT_FOUND, f"no such route: {path}")

    def _authenticate(self, state: ServiceState) -> str:
        header = self.headers.get("Authorization") or ""
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise HTTPError(401, ErrorCode.UNAUTHENTICATED, "missing bearer token")
        if state.api_key is not None and not hmac.compare_digest(
            token.encode("utf-8", "surrogatepass"), state.api_key.encode("utf-8")
        ):
            raise HTTPError(401, ErrorCode.UNAUTHENTICATED, "invalid API key")
        return producer_of(token)

    def _send(self, response: Response) -> None:
        body = response.body
        if isinstance(body, (bytes, bytearray)):
            length = len(body)
        else:
            if response.length is None:
                raise ValueError("a streamed response needs a length")
            length = response.length
        self.send_response(response.status)
        if response.content_type and length:
            self.send_header("Content-Type", response.content_type)
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(length))
        if self.close_connection or self._close_after:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if self.command == "HEAD":
            return
        try:
            if isinstance(body, (bytes, bytearray)):
                self.wfile.write(body)
            else:
                for chunk in body:
                    self.wfile.write(chunk)
            self.wfile.flush()
        except (ConnectionError, socket.timeout) as err:
            logger.debug("client went away while we answered: %s", err)
            self.close_connection = True

    def close_after_response(self) -> None:
        """Close the connection after this answer (a body was left unread)."""
        self._close_after = True


class _DropConnection(Exception):
    """Raised by a handler to close the connection without an answer."""


def drop_connection() -> None:
    raise _DropConnection()


class TracesHTTPServer(ThreadingHTTPServer):
    """A threading server that can close every open connection on stop."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], state: ServiceState) -> None:
        self.state = state
        self._conn_lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._conn_threads: set[threading.Thread] = set()
        # Per server, not per class: one process may serve IPv4 and IPv6 at once.
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, RequestHandler)

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(
            target=self._run_connection,
            args=(request, client_address),
            name=f"prime-traces-serve-{client_address[1]}",
            daemon=True,
        )
        with self._conn_lock:
            self._connections.add(request)
            self._conn_threads.add(thread)
        thread.start()

    def _run_connection(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            with self._conn_lock:
                self._connections.discard(request)
                self._conn_threads.discard(threading.current_thread())
            self.shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        logger.debug("connection from %s failed", client_address, exc_info=True)

    def close_all(self, timeout_s: float) -> None:
        """Shut every open connection and wait up to ``timeout_s`` for its thread."""
        with self._conn_lock:
            connections = list(self._connections)
            threads = list(self._conn_threads)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + timeout_s
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
