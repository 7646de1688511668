"""Request framing: a body's length must be unambiguous, or the connection is closed.

A request whose length two parties could read differently (Content-Length
with Transfer-Encoding, two Content-Length headers, a Content-Length that is
not plain digits) is how a request is smuggled past a proxy: the bytes after
the length one party used are read by the other as a new request. The
service answers such a request 400 (411 for Transfer-Encoding alone, which it
does not decode) and closes the connection, so nothing after it is read.
Every exchange here is a raw socket over loopback.
"""

from __future__ import annotations

import json

import pytest
from _raw_http import connect, read_answers, request_head
from _wire import build_upload, trace

pytestmark = pytest.mark.timeout(60)

CLOSE_S = 5.0
RUN = json.dumps({"name": "r", "kind": "eval", "config": {}, "tags": []}).encode()
# What a proxy that framed the request differently would forward as a second request.
SMUGGLED = (
    b"DELETE /api/v1/traces?run_id=victim HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer test-token\r\n\r\n"
)


def _exchange(url: str, raw: bytes) -> tuple[list[int], bool]:
    with connect(url) as sock:
        sock.sendall(raw)
        answers, closed = read_answers(sock, CLOSE_S)
    return [a.status for a in answers], closed


def _refused(url: str, raw: bytes, status: int = 400) -> None:
    statuses, closed = _exchange(url, raw)
    assert statuses == [status], f"answers {statuses}: the bytes after the first request were read"
    assert closed, "the connection stayed open after an ambiguous length"


@pytest.mark.parametrize("te", ["chunked", "Chunked", "gzip, chunked", "identity"])
def test_content_length_with_transfer_encoding_is_refused(service, te):
    head = request_head(
        "POST",
        "/api/v1/runs",
        [("Content-Type", "application/json"), ("Content-Length", str(len(RUN))), ("Transfer-Encoding", te)],
    )
    _refused(service.url, head + RUN + SMUGGLED)
    assert _runs(service) == 0


def test_transfer_encoding_before_content_length_is_refused(service):
    head = request_head("POST", "/api/v1/runs", [("Transfer-Encoding", "chunked"), ("Content-Length", str(len(RUN)))])
    _refused(service.url, head + RUN + SMUGGLED)


def test_an_upload_with_content_length_and_transfer_encoding_is_refused(service):
    body, headers = build_upload([trace("t-1")])
    head = request_head(
        "POST",
        "/api/v1/traces",
        [*headers.items(), ("Content-Length", str(len(body))), ("Transfer-Encoding", "chunked")],
    )
    _refused(service.url, head + body + SMUGGLED)
    assert service.stats()["upload_attempts"] == 0


@pytest.mark.parametrize("second", ["same", "larger", "smaller"])
def test_two_content_length_headers_are_refused(service, second):
    other = {"same": len(RUN), "larger": len(RUN) + len(SMUGGLED), "smaller": 2}[second]
    head = request_head("POST", "/api/v1/runs", [("Content-Length", str(len(RUN))), ("Content-Length", str(other))])
    _refused(service.url, head + RUN + SMUGGLED)
    assert _runs(service) == 0


@pytest.mark.parametrize("value", ["+{n}", "{n}, {n}", "{n}_0", "-1", "0x10", ""])
def test_a_content_length_that_is_not_plain_digits_is_refused(service, value):
    head = request_head("POST", "/api/v1/runs", [("Content-Length", value.format(n=len(RUN)))])
    _refused(service.url, head + RUN + SMUGGLED)


@pytest.mark.parametrize("path", ["/api/v1/runs", "/api/v1/traces"])
def test_transfer_encoding_alone_is_length_required_and_closes(service, path):
    chunked = f"{len(RUN):x}\r\n".encode() + RUN + b"\r\n0\r\n\r\n"
    head = request_head("POST", path, [("Transfer-Encoding", "chunked")])
    _refused(service.url, head + chunked + SMUGGLED, status=411)


def test_a_get_with_transfer_encoding_is_refused(service):
    head = request_head("GET", "/api/v1/traces", [("Transfer-Encoding", "chunked")])
    _refused(service.url, head + b"0\r\n\r\n" + SMUGGLED, status=411)


def test_a_well_framed_request_keeps_the_connection(service):
    head = request_head("POST", "/api/v1/runs", [("Content-Length", str(len(RUN)))])
    # The second request asks to close, so the service closes only after answering both.
    get = request_head("GET", "/api/v1/runs", [("Connection", "close")])
    statuses, closed = _exchange(service.url, head + RUN + get)
    assert (statuses, closed) == ([201, 200], True)


def _runs(service) -> int:
    with service.state.store.reader() as conn:
        return conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
