"""Helpers for the client's upload tests: a client for a local service, and trace lines that repeat."""

from __future__ import annotations

import time

import orjson
from _wire import trace

from prime_traces import TracesClient
from prime_traces.server import LocalTracesService

TOKEN = "client-test-token"
NOW = time.time()


def client_for(svc: LocalTracesService, **kwargs) -> TracesClient:
    return TracesClient(api_key=TOKEN, base_url=svc.url, **kwargs)


def lines_of(n: int, *, pad: int = 0, prefix: str = "t") -> list[bytes]:
    """``n`` trace lines, the same bytes on every call within a test run."""
    timing = {"start": NOW, "scoring": {"start": NOW + 1, "end": NOW + 2}}
    return [orjson.dumps(trace(f"{prefix}-{i}", info={"pad": "x" * pad}, timing=timing, calls=[])) for i in range(n)]


def stored_trace_ids(svc: LocalTracesService) -> set[str]:
    with svc.state.store.reader() as conn:
        return {row[0] for row in conn.execute("SELECT trace_id FROM traces")}


def producer() -> str:
    """The producer the service records for ``TOKEN``."""
    from prime_traces.server._http import producer_of

    return producer_of(TOKEN)
