"""A client used in a forked child builds its own sessions and threads."""

from __future__ import annotations

import os

import orjson
import pytest
from _fork import in_child
from _wire import trace

from prime_traces import TracesClient

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")

def test_a_forked_child_uploads_through_its_own_sessions_and_threads(service):
    with TracesClient(api_key="k", base_url=service.url, max_in_flight=2) as client:
        client.upload_lines([orjson.dumps(trace("parent-1"))])
        parent_sessions = list(client._transport._sessions)
        parent_threads = client._pool.threads
        assert parent_sessions and parent_threads

        def child() -> dict:
            (receipt,) = client.upload_lines([orjson.dumps(trace("child-1"))])
            fresh = all(s not in parent_sessions for s in client._transport._sessions)
            own_threads = all(t not in parent_threads for t in client._pool.threads)
            return {"receipt": receipt.upload_id, "fresh": fresh, "own": own_threads}

        result = in_child(child)
        assert result["fresh"] and result["own"], result
        # The parent's client still works over its own connections.
        client.upload_lines([orjson.dumps(trace("parent-2"))])
    with service.state.store.reader() as conn:
        ids = {row[0] for row in conn.execute("SELECT trace_id FROM traces")}
    assert ids == {"parent-1", "child-1", "parent-2"}
