"""Running a piece of a test in a forked child, bounded, with its result as JSON."""

from __future__ import annotations

import os
import select
from collections.abc import Callable
from typing import Any

import orjson
import pytest

CHILD_TIMEOUT_S = 30.0


def in_child(body: Callable[[], Any], timeout_s: float = CHILD_TIMEOUT_S) -> Any:
    """Run ``body()`` in a forked child that never returns into pytest; return its JSON result.

    A child that does not answer within ``timeout_s`` is killed and the test
    fails (a deadlock after fork is exactly what these tests look for).
    """
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        code = 0
        try:
            os.write(write_fd, orjson.dumps(body()))
        except BaseException as err:  # noqa: BLE001
            os.write(write_fd, orjson.dumps({"child_error": f"{type(err).__name__}: {err}"}))
            code = 1
        finally:
            os._exit(code)
    os.close(write_fd)
    try:
        ready, _, _ = select.select([read_fd], [], [], timeout_s)
        if not ready:
            os.kill(pid, 9)
            pytest.fail("the forked child did not answer in time (deadlock?)")
        chunks = []
        while chunk := os.read(read_fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(read_fd)
        _, status = os.waitpid(pid, 0)
    result = orjson.loads(b"".join(chunks))
    assert os.waitstatus_to_exitcode(status) == 0, result
    return result
