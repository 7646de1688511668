"""Request bodies: memory grows with the bytes received, reads time out, memory is capped.

A client that declares a large Content-Length and sends little must cost the
service little; one that stops sending is cut off after the read timeout and
its in-flight slot is given back; and past a global cap on the memory held by
bodies and their decompression, uploads are refused with a retryable 503
rather than allocated. Stalled clients are raw sockets over loopback; the
test synchronises on the service closing their connection.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
import zlib

import pytest
import requests
from _raw_http import connect, request_head, wait_closed
from _upload_checks import MIB, committed, error_of
from _wire import auth, build_upload, jsonl, post_upload, trace
from test_server_concurrency import Gate

from prime_traces.server import LocalTracesService
from prime_traces.server._http import producer_of

pytestmark = pytest.mark.timeout(90)

CLOSE_S = 20.0


def _stalled_upload(url: str, declared: int, sent: int = 1024, token: str = "test-token") -> socket.socket:
    """A connection that sent an upload's headers declaring ``declared`` bytes, then ``sent`` of them."""
    body, headers = build_upload([trace("t-stalled")])
    head = request_head("POST", "/api/v1/traces", [*headers.items(), ("Content-Length", str(declared))], token=token)
    sock = connect(url)
    sock.sendall(head + (body + bytes(sent))[:sent])
    return sock


def _status(pid: int) -> dict[str, int]:
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return {k: int(fields[k].split()[0]) * 1024 for k in ("VmRSS", "VmHWM")}


# -- memory grows with the bytes received -------------------------------------------


def test_a_declared_length_is_not_allocated_before_its_bytes_arrive(tmp_path):
    # In its own process, so that its peak resident memory (VmHWM) is its own.
    connections, declared = 8, 200 * MIB
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "prime_traces.cli",
            "serve",
            "--port",
            "0",
            "--db",
            str(tmp_path / "t.db"),
            "--max-uploads-in-flight",
            str(connections),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("listening on "), line
        url = line.removeprefix("listening on ")
        assert post_upload(url, [trace("t-warm")]).status_code == 201  # every code path loaded
        before = _status(proc.pid)
        socks = [_stalled_upload(url, declared) for _ in range(connections)]
        try:
            for sock in socks:
                # End of input: the service's read of the body sees EOF, gives up and
                # closes; so once every connection is closed, every body was read.
                sock.shutdown(socket.SHUT_WR)
            for sock in socks:
                wait_closed(sock, CLOSE_S)
        finally:
            for sock in socks:
                sock.close()
        grown = _status(proc.pid)["VmHWM"] - before["VmHWM"]
        assert grown < 64 * MIB, (
            f"peak resident memory grew by {grown / MIB:.0f} MiB for {connections} bodies declaring "
            f"{declared // MIB} MiB and sending 1 KiB each"
        )
        assert post_upload(url, [trace("t-after")]).status_code == 201
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


# -- reads time out ----------------------------------------------------------------


def test_stalled_uploads_are_dropped_after_the_read_timeout_and_give_their_slots_back(tmp_path):
    # Eight stalled uploads hold every slot of the credential; the read timeout frees them.
    with LocalTracesService(tmp_path / "t.db", max_uploads_in_flight=8, read_timeout_s=0.5) as svc:
        start = time.monotonic()
        socks = [_stalled_upload(svc.url, 100_000) for _ in range(8)]
        try:
            for sock in socks:
                assert wait_closed(sock, CLOSE_S) == b""  # cut off without an answer
        finally:
            for sock in socks:
                sock.close()
        assert time.monotonic() - start >= 0.5
        assert svc.stats()["in_flight"] == {}
        assert svc.stats()["read_timeouts"] == 8
        docs = [trace("t-1")]
        committed(post_upload(svc.url, docs), jsonl(docs))


def test_an_idle_connection_is_closed_after_the_read_timeout(tmp_path):
    with LocalTracesService(tmp_path / "t.db", read_timeout_s=0.5) as svc, connect(svc.url) as sock:
        sock.sendall(b"GET /api/v1/tra")  # half a request line, then nothing
        assert wait_closed(sock, CLOSE_S) == b""


def test_a_slow_but_steady_upload_is_not_cut_off(tmp_path):
    # The timeout bounds each read, not the whole body: pieces 0.2 s apart
    # take longer than the 0.5 s timeout in all.
    docs = [trace(f"t-{i}") for i in range(20)]
    body, headers = build_upload(docs, coding="none")
    pieces = [body[i : i + len(body) // 5 + 1] for i in range(0, len(body), len(body) // 5 + 1)]
    pace = threading.Event()
    with LocalTracesService(tmp_path / "t.db", read_timeout_s=0.5) as svc, connect(svc.url) as sock:
        start = time.monotonic()
        sock.sendall(request_head("POST", "/api/v1/traces", [*headers.items(), ("Content-Length", str(len(body)))]))
        for piece in pieces:
            pace.wait(0.2)  # pacing a slow client, not synchronisation
            sock.sendall(piece)
        answer = wait_closed_after_answer(sock)
        assert time.monotonic() - start > 0.5
    assert answer.startswith(b"HTTP/1.1 201"), answer[:200]


def test_a_slow_reader_of_a_raw_stream_is_not_cut_off(tmp_path):
    # The timeout is for reads from the client: writes to one that pauses
    # (more than the socket buffers hold) wait for it, as they always did.
    big = trace("t-big", info={"pad": "x" * (16 * MIB)})
    pause = threading.Event()
    with LocalTracesService(tmp_path / "t.db", read_timeout_s=0.5) as svc:
        committed(post_upload(svc.url, [big]), jsonl([big]))
        with requests.get(
            f"{svc.url}/api/v1/traces/t-big", params={"raw": "true"}, headers=auth(), stream=True, timeout=30
        ) as resp:
            first = resp.raw.read(1024)
            pause.wait(1.0)  # pacing a slow reader, longer than the read timeout
            rest = resp.raw.read()
    assert first + rest == jsonl([big]).rstrip(b"\n")


def test_serve_takes_read_timeout_s(tmp_path):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "prime_traces.cli",
            "serve",
            "--port",
            "0",
            "--db",
            str(tmp_path / "t.db"),
            "--read-timeout-s",
            "0.5",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("listening on "), (line, proc.stderr.read() if proc.poll() else "")
        sock = _stalled_upload(line.removeprefix("listening on "), 100_000)
        with sock:
            assert wait_closed(sock, CLOSE_S) == b""
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=10)


def test_read_timeout_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="read_timeout_s must be greater than 0 and finite"):
        LocalTracesService(tmp_path / "t.db", read_timeout_s=0)
    with pytest.raises(ValueError, match="max_body_memory_bytes must be greater than 0"):
        LocalTracesService(tmp_path / "t.db", max_body_memory_bytes=0)


# -- a global cap on body memory -----------------------------------------------------


def _refused_for_memory(resp) -> None:
    error_of(resp, 503, "ingest_capacity_exceeded")
    assert float(resp.headers["Retry-After"]) == 1.0


def test_a_body_over_the_memory_cap_is_refused_with_503(tmp_path):
    with LocalTracesService(tmp_path / "t.db", max_body_memory_bytes=MIB) as svc:
        docs = [trace(f"t-{i}") for i in range(2500)]
        assert len(jsonl(docs)) > 2 * MIB
        _refused_for_memory(post_upload(svc.url, docs, coding="none"))
        assert svc.stats()["body_memory_bytes"] == 0
        small = [trace("t-small")]
        committed(post_upload(svc.url, small, coding="none"), jsonl(small))
        assert svc.stats()["rejections"] == {"ingest_capacity_exceeded": 1}


def test_decompressed_bytes_count_toward_the_memory_cap(tmp_path):
    with LocalTracesService(tmp_path / "t.db", max_body_memory_bytes=MIB) as svc:
        docs = [trace(f"t-{i}") for i in range(2000)]
        body, headers = build_upload(docs, coding="gzip")
        assert len(body) < MIB // 4
        _refused_for_memory(post_upload(svc.url, request=(body, headers)))
        # A gzip bomb far past the cap is refused, not inflated.
        bomb = zlib.compressobj(1, zlib.DEFLATED, 31)
        encoded = bomb.compress(bytes(200 * MIB)) + bomb.flush()
        _refused_for_memory(post_upload(svc.url, b"", encoded=encoded))
        assert svc.stats()["body_memory_bytes"] == 0


def test_memory_held_by_one_upload_refuses_another(tmp_path):
    gate = Gate()
    held = [trace(f"a-{i}") for i in range(1500)]  # ~1.5 MiB, held inside the service
    other = [trace(f"b-{i}") for i in range(1500)]
    with LocalTracesService(tmp_path / "t.db", max_body_memory_bytes=2 * MIB, before_upload=gate) as svc:
        with connect(svc.url, timeout_s=30) as sock:
            body, headers = build_upload(held, coding="none")
            sock.sendall(
                request_head("POST", "/api/v1/traces", [*headers.items(), ("Content-Length", str(len(body)))]) + body
            )
            try:
                gate.wait_arrivals(1)
                assert svc.stats()["body_memory_bytes"] >= len(body)
                # Another credential, so only the memory cap can refuse it.
                _refused_for_memory(post_upload(svc.url, other, coding="none", token="other"))
            finally:
                gate.open()
            assert wait_closed_after_answer(sock).startswith(b"HTTP/1.1 201")
        assert svc.stats()["body_memory_bytes"] == 0
        committed(post_upload(svc.url, other, coding="none", token="other"), jsonl(other))
        assert svc.stats()["max_in_flight"] == {producer_of("test-token"): 1, producer_of("other"): 1}


def wait_closed_after_answer(sock: socket.socket) -> bytes:
    sock.shutdown(socket.SHUT_WR)  # no more requests: the service answers, then sees EOF
    return wait_closed(sock, CLOSE_S)
