"""A client used in a forked child builds its own sessions and threads."""

from __future__ import annotations

import os
import select

import orjson
import pytest
from _wire import trace

from prime_traces import TracesClient

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")

CHILD_TIMEOUT_S = 30.0


def _run_in_child(body) -> bytes:
    """Run ``body()`` in a forked child; return what it wrote (bytes) or fail."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        os.close(read_fd)
        code = 0
        try:
            os.write(write_fd, body())
        except BaseException as err:  # noqa: BLE001
            os.write(write_fd, f"child failed: {type(err).__name__}: {err}".encode())
            code = 1
        finally:
            os._exit(code)
    os.close(write_fd)
    try:
        ready, _, _ = select.select([read_fd], [], [], CHILD_TIMEOUT_S)
        if not ready:
            os.kill(pid, 9)
            pytest.fail("forked child did not answer in time (deadlock?)")
        chunks = []
        while chunk := os.read(read_fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(read_fd)
        _, status = os.waitpid(pid, 0)
    output = b"".join(chunks)
    assert os.waitstatus_to_exitcode(status) == 0, output.decode(errors="replace")
    return output


def test_a_forked_child_uploads_through_its_own_sessions_and_threads(service):
    with TracesClient(api_key="k", base_url=service.url, max_in_flight=2) as client:
        client.upload_lines([orjson.dumps(trace("parent-1"))])
        parent_sessions = list(client._transport._sessions)
        parent_threads = client._pool.threads
        assert parent_sessions and parent_threads

        def child() -> bytes:
            (receipt,) = client.upload_lines([orjson.dumps(trace("child-1"))])
            fresh = all(s not in parent_sessions for s in client._transport._sessions)
            own_threads = all(t not in parent_threads for t in client._pool.threads)
            return orjson.dumps({"receipt": receipt.upload_id, "fresh": fresh, "own": own_threads})

        result = orjson.loads(_run_in_child(child))
        assert result["fresh"] and result["own"], result
        # The parent's client still works over its own connections.
        client.upload_lines([orjson.dumps(trace("parent-2"))])
    with service.state.store.reader() as conn:
        ids = {row[0] for row in conn.execute("SELECT trace_id FROM traces")}
    assert ids == {"parent-1", "child-1", "parent-2"}
