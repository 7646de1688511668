"""HTTP/1.1 connections of the local service: framing, timeouts, dispatch, answers.

One thread per connection (:class:`TracesHTTPServer`), each running a
:class:`RequestHandler` that checks a request's framing before anything
else, then its ``Host`` when the service has no API key (``_hosts``: the
guard against DNS rebinding, for every route at once), routes it to its
handler, turns what the handler raised into an answer, and sends it.
Every socket read waits at most the service's read timeout; every request's
body memory is charged to the service's budget and given back when it is
answered.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import re
import socket
import threading
import time
from collections.abc import Iterable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

from prime_traces.errors import ErrorCode
from prime_traces.server._body import MemoryRefused
from prime_traces.server._hosts import check_host
from prime_traces.server._http import (
    ACCEPT_ENCODING,
    RUNS_PATH,
    UPLOAD_PATH,
    DropConnection,
    HTTPError,
    Request,
    Response,
    Route,
    is_api_path,
    is_internal_path,
    json_response,
    producer_of,
    retry_after_value,
)
from prime_traces.version import __version__

if TYPE_CHECKING:
    from prime_traces.server._state import ServiceState

logger = logging.getLogger(__name__)

_PLATFORM_RUN_UPDATES = tuple(
    f"{root}/{route}" for root in ("/api/v1", "/api/internal") for route in ("evaluations/", "rft/external-runs/")
)

# An unread body up to this size is read and discarded so the connection can
# be reused; a larger one is cut off with the connection.
_DRAIN_LIMIT_BYTES = 64 * 1024 * 1024
_DRAIN_CHUNK_BYTES = 1 << 20
# RFC 9110 §8.6: Content-Length = 1*DIGIT; int() would also take "+5", "5_0", " 5".
_CONTENT_LENGTH_RE = re.compile(r"[0-9]+")


def _is_run_update(method: str, path: str) -> bool:
    """A run's config, summary or status changing: ``PATCH /runs/{id}``, or the platform's ``PUT``s (§10)."""
    if method == "PATCH":
        return path.startswith(RUNS_PATH)
    return method == "PUT" and any(path.startswith(prefix) for prefix in _PLATFORM_RUN_UPDATES)


def _trickled(response: Response, interval_s: float, stopping: threading.Event) -> Response:
    """``response`` with its body sent a byte every ``interval_s`` (a fault)."""
    body = bytes(response.body) if isinstance(response.body, (bytes, bytearray)) else b"".join(response.body)

    def chunks() -> Iterable[bytes]:
        for i in range(len(body)):
            yield body[i : i + 1]
            if stopping.wait(interval_s):
                return

    return Response(response.status, chunks(), response.content_type, response.headers, len(body))


class RequestHandler(BaseHTTPRequestHandler):
    """One connection: each request checked (framing, then ``Host``), routed, answered."""

    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes: with Nagle on, every
    # keep-alive answer would wait ~40 ms for the client's delayed ACK.
    disable_nagle_algorithm = True
    server_version = f"prime-traces-local/{__version__}"
    server: TracesHTTPServer
    #: The request's Content-Length, and how much of its body is still unread.
    content_length: int | None = None
    body_left = 0
    _close_after = False

    def setup(self) -> None:
        # Every read of the socket waits at most this long: a client that stops
        # sending mid-request is cut off and gives back what it held (its
        # in-flight slot, its body memory); an idle keep-alive connection is closed.
        # typeshed declares ``timeout`` a ClassVar, but StreamRequestHandler.setup() reads it from the instance.
        self.timeout = self.server.state.read_timeout_s  # type: ignore[misc]
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  (the stdlib's signature)
        logger.debug("%s %s", self.address_string(), format % args)

    def do_GET(self) -> None:
        self._dispatch()

    do_POST = do_PATCH = do_DELETE = do_PUT = do_GET

    def _dispatch(self) -> None:
        state = self.server.state
        state.stats.count_request()
        split = urlsplit(self.path)
        self._close_after = False
        self.content_length, self.body_left = None, 0
        self.charge = state.budget.charge()
        try:
            try:
                self._check_framing()
                if state.api_key is None:
                    check_host(self.headers.get_all("Host") or [], self.server.bound_host)
                response = self._handle(state, split.path, split.query)
            except HTTPError as err:
                response = self._error(state, err)
            except MemoryRefused as err:
                response = self._error(
                    state,
                    HTTPError(
                        503,
                        ErrorCode.INGEST_CAPACITY_EXCEEDED,
                        str(err),
                        headers={"Retry-After": retry_after_value(state.saturated_retry_after_s)},
                    ),
                )
            except DropConnection:
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)
                return
            except (ConnectionError, TimeoutError) as err:
                logger.debug("connection failed mid-request: %s", err)
                if isinstance(err, TimeoutError):
                    state.stats.count_read_timeout()
                self.close_connection = True
                return
            except Exception:  # the service must answer even when a handler is wrong
                logger.exception("unhandled error for %s %s", self.command, split.path)
                response = json_response(500, {"error": {"code": None, "message": "internal error"}})
        finally:
            self.charge.release()
        if self.command == "POST" and split.path == UPLOAD_PATH:
            # Contract §9: every upload answer advertises the accepted codings.
            response.headers.setdefault("Accept-Encoding", ACCEPT_ENCODING)
        if self.body_left:
            self.drain_body()
        # Added on top of the work, like a network round trip would be.
        if state.faults.latency_ms > 0:
            state.stopping.wait(state.faults.latency_ms / 1000.0)
        if _is_run_update(self.command, split.path):
            if state.faults.on_run_update is not None:
                state.faults.on_run_update()
            if state.faults.trickle_run_update_byte_s > 0:
                response = _trickled(response, state.faults.trickle_run_update_byte_s, state.stopping)
        self._send(response)

    @staticmethod
    def _error(state: ServiceState, err: HTTPError) -> Response:
        if err.status >= 400 and err.code:
            state.stats.count_rejection(err.code)
        return json_response(err.status, err.envelope(), err.headers)

    def _check_framing(self) -> None:
        """Take the body's length from its one Content-Length, or refuse and close.

        A length that two parties could read differently is how a request is
        smuggled: the bytes after the end one of them used are read by the
        other as a new request. So Transfer-Encoding (not decoded here),
        repeated Content-Length headers and a Content-Length that is not
        plain digits are refused, and nothing more is read from the connection.
        """
        lengths = self.headers.get_all("Content-Length") or []
        codings = self.headers.get_all("Transfer-Encoding") or []
        value = lengths[0].strip() if len(lengths) == 1 else ""
        if not codings and (not lengths or _CONTENT_LENGTH_RE.fullmatch(value)):
            self.content_length = int(value) if lengths else None
            self.body_left = self.content_length or 0
            return
        self.close_after_response()
        if codings and lengths:
            raise HTTPError(400, None, "Content-Length and Transfer-Encoding together are refused")
        if codings:
            raise HTTPError(411, None, "Transfer-Encoding is not accepted; send the body with a Content-Length")
        if len(lengths) > 1:
            raise HTTPError(400, None, f"{len(lengths)} Content-Length headers; send exactly one")
        raise HTTPError(400, None, f"Content-Length is not a number of bytes: {lengths[0]!r}")

    def read_body_bytes(self, n: int) -> bytes:
        """Up to ``n`` bytes of the body (fewer only at end of input)."""
        chunk = self.rfile.read(min(n, self.body_left))
        self.body_left -= len(chunk)
        return chunk

    def drain_body(self) -> None:
        """Discard the unread rest of the body, or close the connection after answering."""
        remaining, self.body_left = self.body_left, 0
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
        routes = self.server.routes
        for route_method, pattern, func in routes:
            match = pattern.match(path)
            if match is None:
                continue
            if route_method != method:
                continue
            params = {k: unquote(v) for k, v in match.groupdict().items()}
            # The viewer's files hold no data, and the page must load to ask for a key.
            producer = self._authenticate(state, path) if is_api_path(path) else ""
            query = parse_qs(query_string, keep_blank_values=True)
            req = Request(method, path, params, query, self.headers, producer, state, self)
            return func(req)
        self._authenticate(state, path)
        if any(p.match(path) for _, p, _ in routes):
            raise HTTPError(405, None, f"method {method} not allowed on {path}")
        raise HTTPError(404, ErrorCode.NOT_FOUND, f"no such route: {path}")

    def _authenticate(self, state: ServiceState, path: str) -> str:
        """The producer label of the request's credential, or 401.

        The bearer token, and on the internal root also ``x-api-key`` (the
        platform's launcher sends both there); any one that matches the
        service's key is enough.
        """
        scheme, _, bearer = (self.headers.get("Authorization") or "").partition(" ")
        tokens = [bearer.strip()] if scheme.lower() == "bearer" and bearer.strip() else []
        internal = is_internal_path(path)
        if internal and (self.headers.get("x-api-key") or "").strip():
            tokens.append(self.headers["x-api-key"].strip())
        if not tokens:
            wanted = "bearer token or x-api-key" if internal else "bearer token"
            raise HTTPError(401, ErrorCode.UNAUTHENTICATED, f"missing {wanted}")
        if state.api_key is None:
            return producer_of(tokens[0])
        expected = state.api_key.encode("utf-8")
        for token in tokens:
            if hmac.compare_digest(token.encode("utf-8", "surrogatepass"), expected):
                return producer_of(token)
        raise HTTPError(401, ErrorCode.UNAUTHENTICATED, "invalid API key")

    def _send(self, response: Response) -> None:
        # The read timeout is for reads: a client may take its time over a long
        # raw stream, as it always could.
        self.connection.settimeout(None)
        try:
            self._write(response)
        finally:
            self.connection.settimeout(self.timeout)

    def _write(self, response: Response) -> None:
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
        except (ConnectionError, TimeoutError) as err:
            logger.debug("client went away while we answered: %s", err)
            self.close_connection = True

    def close_after_response(self) -> None:
        """Close the connection after this answer, leaving the rest of the body unread."""
        self._close_after = True
        self.body_left = 0


class TracesHTTPServer(ThreadingHTTPServer):
    """A threading server that answers through ``routes`` and can close every open connection on stop."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128
    #: What getsockname() gives for an AF_INET or AF_INET6 socket: the host is a str.
    server_address: tuple[str, int] | tuple[str, int, int, int]

    def __init__(self, address: tuple[str, int], state: ServiceState, routes: Sequence[Route]) -> None:
        self.state = state
        self.routes = routes
        #: The host as given to bind (a name or a literal), which ``Host`` may name too.
        self.bound_host = address[0]
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
        except Exception:  # noqa: BLE001  (one connection's failure must not end the thread noisily)
            self.handle_error(request, client_address)
        finally:
            with self._conn_lock:
                self._connections.discard(request)
                self._conn_threads.discard(threading.current_thread())
            self.shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Called inside the except above, so exc_info is the connection's failure.
        logger.debug("connection from %s failed", client_address, exc_info=True)  # noqa: LOG014

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
