"""Raw HTTP/1.1 over a loopback socket, for requests no HTTP client would send.

Framing tests (two Content-Lengths, Content-Length with Transfer-Encoding) and
stalled uploads need bytes that ``requests`` refuses to produce, and need to
see whether the service closed the connection::

    with connect(svc.url) as sock:
        sock.sendall(request_head("POST", "/api/v1/runs", [("Content-Length", "2")]) + b"{}")
        answers, closed = read_answers(sock, timeout_s=5)
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass

DEFAULT_TOKEN = "test-token"


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


def connect(url: str, timeout_s: float = 10.0) -> socket.socket:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s)


def request_head(
    method: str,
    path: str,
    headers: list[tuple[str, str]],
    *,
    token: str | None = DEFAULT_TOKEN,
    host: str | None = "localhost",
) -> bytes:
    """The request line, ``Host`` (None: none), the headers in the order given (repeats kept), and the blank line."""
    lines = [f"{method} {path} HTTP/1.1"]
    if host is not None:
        lines.append(f"Host: {host}")
    if token is not None:
        lines.append(f"Authorization: Bearer {token}")
    lines += [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def read_answers(sock: socket.socket, timeout_s: float) -> tuple[list[Answer], bool]:
    """Every answer the service sends before it closes, and whether it closed within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    data = bytearray()
    closed = False
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            closed = True
            break
        if not chunk:
            closed = True
            break
        data += chunk
    return parse_answers(bytes(data)), closed


def wait_closed(sock: socket.socket, timeout_s: float) -> bytes:
    """Everything the service sends until it closes; fails after ``timeout_s`` with it still open."""
    answers_data = bytearray()
    deadline = time.monotonic() + timeout_s
    while True:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"the service kept the connection open for {timeout_s}s"
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return bytes(answers_data)
        if not chunk:
            return bytes(answers_data)
        answers_data += chunk


def parse_answers(data: bytes) -> list[Answer]:
    """The answers in ``data``; bytes that are no HTTP/1.x answer count as one answer of status 0."""
    answers = []
    while data:
        head, sep, rest = data.partition(b"\r\n\r\n")
        if not sep or not head.startswith(b"HTTP/"):
            answers.append(Answer(0, {}, data))  # e.g. an HTTP/0.9 error page, headerless
            break
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        answers.append(Answer(int(status_line.split()[1]), headers, rest[:length]))
        data = rest[length:]
    return answers
