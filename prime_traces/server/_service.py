"""The local Traces service as an object: start, stop, its URL and state.

The top layer of the service: it puts the route table together from every
handler module's ``ROUTES`` (``GET /_stats`` is its own; the platform's run
routes of contract §10 from the ``_platform_*`` modules; the viewer's files
unless ``ui=False``) and hands it to the listener with the state.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from typing import Any

from prime_traces.server import (
    _metrics,
    _platform_evals,
    _platform_files,
    _platform_hub,
    _platform_rft,
    _reads,
    _runs,
    _ui,
    _upload,
    _viewer,
)
from prime_traces.server._body import DEFAULT_MAX_BODY_MEMORY_BYTES, DEFAULT_READ_TIMEOUT_S, MemoryBudget
from prime_traces.server._faults import (
    DEFAULT_MAX_UPLOADS_IN_FLIGHT,
    DEFAULT_SATURATED_RETRY_AFTER_S,
    Faults,
    InFlightLimiter,
    Stats,
)
from prime_traces.server._hosts import is_loopback
from prime_traces.server._http import Request, Response, Route, json_response, route
from prime_traces.server._listener import TracesHTTPServer
from prime_traces.server._state import DEFAULT_MAX_BODY_BYTES, ServiceState, service_stats
from prime_traces.server._store import Store

logger = logging.getLogger(__name__)

STORE_MODES = ("sqlite", "none")
VALIDATE_MODES = ("full", "light")
_STOP_TIMEOUT_S = 5.0


def get_stats(req: Request) -> Response:
    return json_response(200, service_stats(req.state))


ROUTES: list[Route] = [
    *_upload.ROUTES,
    *_runs.ROUTES,
    *_metrics.ROUTES,
    *_reads.ROUTES,
    *_viewer.ROUTES,
    *_platform_hub.ROUTES,
    *_platform_evals.ROUTES,
    *_platform_rft.ROUTES,
    *_platform_files.ROUTES,
    route("GET", "/_stats", get_stats),
]


class LocalTracesService:
    """The local Traces service, served from a thread of this process.

    ``start()`` binds (port 0 picks a free one) and returns once the service
    answers; ``stop()`` closes every connection, waits for the request threads
    (bounded) and closes the database. Both are idempotent. Faults can be
    changed while it runs through ``service.faults``.

    Each socket read waits at most ``read_timeout_s``: a client that stops
    sending is cut off and gives back its in-flight slot. Request bodies
    and their decompression hold at most ``max_body_memory_bytes`` across
    all requests; past it an upload gets 503 ``ingest_capacity_exceeded``
    with ``Retry-After: saturated_retry_after_s``.

    Without ``api_key`` it binds only to loopback and answers only requests
    whose ``Host`` names this machine (``localhost``, ``*.localhost``,
    127.0.0.0/8, ``[::1]``, or ``host`` itself); any other is 403
    ``forbidden``, against DNS rebinding (``_hosts``).

    With ``ui=True`` (the default) the same port serves the read-only web
    viewer at ``/`` (:attr:`viewer_url`); its files need no credentials, its
    data comes from ``/api/v1`` like any client's.

    Usage::

        with LocalTracesService(tmp_path / "traces.db", latency_ms=100) as svc:
            requests.get(f"{svc.url}/api/v1/traces", headers=auth)
    """

    def __init__(
        self,
        db_path: str | os.PathLike[str] | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
        max_uploads_in_flight: int = DEFAULT_MAX_UPLOADS_IN_FLIGHT,
        store: str = "sqlite",
        validate: str = "full",
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        saturated_retry_after_s: float = DEFAULT_SATURATED_RETRY_AFTER_S,
        read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
        max_body_memory_bytes: int = DEFAULT_MAX_BODY_MEMORY_BYTES,
        ui: bool = True,
        **faults: Any,
    ) -> None:
        if store not in STORE_MODES:
            raise ValueError(f"store must be one of {STORE_MODES}, not {store!r}")
        if validate not in VALIDATE_MODES:
            raise ValueError(f"validate must be one of {VALIDATE_MODES}, not {validate!r}")
        if not 0 < read_timeout_s < float("inf"):
            raise ValueError(f"read_timeout_s must be greater than 0 and finite, not {read_timeout_s}")
        if max_body_memory_bytes < 1:
            raise ValueError(f"max_body_memory_bytes must be greater than 0, not {max_body_memory_bytes}")
        if validate == "light" and store != "none":
            raise ValueError("validate='light' parses no JSON, so it needs store='none'")
        if not api_key and not is_loopback(host):
            raise ValueError(
                f"refusing to serve on non-loopback address {host!r} without an API key; "
                "pass --api-key (or set PRIME_TRACES_SERVE_API_KEY), or bind to 127.0.0.1"
            )
        self.host = host
        self.port = port
        self.faults = Faults(**faults)
        self.faults.validate()
        self._tmpdir: str | None = None
        if db_path is None:
            self._tmpdir = tempfile.mkdtemp(prefix="prime-traces-")
            db_path = os.path.join(self._tmpdir, "traces.db")
        self.db_path = os.fspath(db_path)
        self._options: dict[str, Any] = {
            "api_key": api_key or None,
            "store_mode": store,
            "validate_mode": validate,
            "max_body_bytes": max_body_bytes,
            "saturated_retry_after_s": saturated_retry_after_s,
            "read_timeout_s": read_timeout_s,
            "ui": ui,
        }
        self.ui = ui
        self._limit = max_uploads_in_flight
        self._max_body_memory_bytes = max_body_memory_bytes
        self._lock = threading.Lock()
        self._server: TracesHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.state: ServiceState | None = None

    def __repr__(self) -> str:
        running = self._server is not None
        return f"LocalTracesService(db_path={self.db_path!r}, running={running})"

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:54321`` (routes are under ``/api/v1``)."""
        if self._server is None:
            raise RuntimeError("the service is not running; call start() first")
        host, port = self._server.server_address[:2]
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{port}"

    @property
    def viewer_url(self) -> str | None:
        """The web viewer's address (``url`` + ``/``), or None when served with ``ui=False``."""
        return f"{self.url}/" if self.ui else None

    def start(self) -> LocalTracesService:
        with self._lock:
            if self._server is not None:
                return self
            store = Store(self.db_path)
            self.state = ServiceState(
                store=store,
                faults=self.faults,
                stats=Stats(),
                limiter=InFlightLimiter(self._limit),
                budget=MemoryBudget(self._max_body_memory_bytes),
                **self._options,
            )
            try:
                routes = [*ROUTES, *_ui.ROUTES] if self.ui else ROUTES
                server = TracesHTTPServer((self.host, self.port), self.state, routes)
            except BaseException:
                store.close()
                raise
            self._server = server
            self._thread = threading.Thread(
                target=server.serve_forever,
                kwargs={"poll_interval": 0.05},
                name="prime-traces-serve",
                daemon=True,
            )
            self._thread.start()
            logger.info("local Traces service listening on %s", self.url)
            return self

    def serve_forever(self) -> None:
        """Serve on the calling thread until :meth:`stop` is called elsewhere."""
        self.start()
        assert self.state is not None
        self.state.stopping.wait()

    def stop(self) -> None:
        with self._lock:
            server, thread, state = self._server, self._thread, self.state
            if server is None or state is None:
                return
            state.stopping.set()
            server.shutdown()
            server.server_close()
            server.close_all(_STOP_TIMEOUT_S)
            if thread is not None:
                thread.join(_STOP_TIMEOUT_S)
            state.store.close()
            self._server = None
            self._thread = None
            if self._tmpdir is not None:
                shutil.rmtree(self._tmpdir, ignore_errors=True)
                self._tmpdir = None

    def stats(self) -> dict[str, Any]:
        """The same counters as ``GET /api/v1/_stats``."""
        if self.state is None:
            raise RuntimeError("the service has not been started")
        return service_stats(self.state)

    def __enter__(self) -> LocalTracesService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
