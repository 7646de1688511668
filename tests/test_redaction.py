"""The API key never leaves in our text, even when a gateway echoes the request headers back.

A real HTTP endpoint on loopback answers every request with an error whose
body quotes the headers it received, ``Authorization: Bearer <key>``
included, as some proxies and gateways do.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import traceback
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
import pytest
from _wire import trace

from prime_traces import TracesClient
from prime_traces.cli import main
from prime_traces.errors import PrimeTracesError

pytestmark = pytest.mark.timeout(60)

LONG_KEY = "pk-echo-7c1d9a4b2e6f8035"
#: Long enough that a window of the key cannot occur in a message by chance.
_WINDOW = 6
#: What the gateway says besides the headers: every word of it must come back whole.
SENTENCE = "upload stopped: the gateway refused the request"


class EchoServer(ThreadingHTTPServer):
    daemon_threads = True
    status = 400
    body_kind = "text"


class EchoHandler(BaseHTTPRequestHandler):
    server: EchoServer

    def answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        headers = dict(self.headers.items())
        if self.server.body_kind == "text":
            body = f"{SENTENCE}\n{self.headers}".encode()
        elif self.server.body_kind == "detail":  # FastAPI's shape, the headers as a Python repr
            body = orjson.dumps({"detail": f"{SENTENCE}; you sent {headers!r}"})
        else:  # the service's own envelope, the headers as JSON
            body = orjson.dumps({"error": {"code": "gateway_echo", "message": f"{SENTENCE}; {json.dumps(headers)}"}})
        self.send_response(self.server.status)
        self.send_header("Content-Type", "text/plain" if self.server.body_kind == "text" else "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_DELETE = do_PATCH = answer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  (the stdlib's signature)
        pass


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer(("127.0.0.1", 0), EchoHandler)
    thread = threading.Thread(target=server.serve_forever, name="echo-server", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def url_of(server: EchoServer) -> str:
    host, port = server.server_address[:2]
    return f"http://{host}:{port}"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("PRIME_API_KEY", "PRIME_TRACES_URL", "PRIME_TEAM_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def full_text(err: BaseException) -> str:
    """What a traceback or an ``exc_info`` log shows of ``err``, causes included, and its report."""
    return "".join(traceback.format_exception(err)) + repr(getattr(err, "report", ""))


def leaks_long_key(text: str) -> bool:
    return any(LONG_KEY[i : i + _WINDOW] in text for i in range(len(LONG_KEY) - _WINDOW + 1))


def bears_key(text: str, key: str) -> bool:
    """Whether ``text`` holds ``key`` as a token after ``Bearer`` (the only way to find a one-letter key)."""
    return re.search(rf"Bearer\s+{re.escape(key)}(?![\w-])", text) is not None


def logged(caplog: pytest.LogCaptureFixture) -> str:
    handler = logging.Formatter()
    return "\n".join(handler.format(record) for record in caplog.records)


Call = Callable[[TracesClient], Any]

CALLS: dict[str, Call] = {
    "list": lambda client: client.list(run_id="run-1"),
    "get": lambda client: client.get("t-1"),
    "upload": lambda client: client.upload_lines([orjson.dumps(trace("t-1"))], max_attempts=2),
}


def failure(server: EchoServer, key: str, call: Call) -> PrimeTracesError:
    with (
        TracesClient(api_key=key, base_url=url_of(server), _sleep=lambda seconds: None) as client,
        pytest.raises(PrimeTracesError) as info,
    ):
        call(client)
    return info.value


#: Every call with a rejection and a failure; an upload also with a retried 502 (reads would back off for real).
CASES = [(call, status) for call in CALLS for status in (400, 500)] + [("upload", 502)]


@pytest.mark.parametrize("body_kind", ["text", "detail", "envelope"])
@pytest.mark.parametrize(("call", "status"), CASES)
def test_an_echoed_key_is_in_no_error_and_no_log_record(echo, caplog, call, status, body_kind):
    echo.status, echo.body_kind = status, body_kind
    caplog.set_level(logging.DEBUG)

    err = failure(echo, LONG_KEY, CALLS[call])

    text = full_text(err)
    assert SENTENCE in text, text
    assert "Bearer <redacted>" in text, text
    assert not leaks_long_key(text), text
    assert not leaks_long_key(logged(caplog)), logged(caplog)
    if status == 502:
        assert any("retrying" in record.getMessage() for record in caplog.records), "the retry log was checked"


@pytest.mark.parametrize("body_kind", ["text", "detail", "envelope"])
@pytest.mark.parametrize("call", list(CALLS))
def test_a_one_letter_key_is_hidden_without_garbling_words(echo, caplog, body_kind, call):
    echo.status, echo.body_kind = 500, body_kind
    caplog.set_level(logging.DEBUG)

    err = failure(echo, "e", CALLS[call])

    text = full_text(err)
    assert SENTENCE in text, text
    assert "prime-traces/" in text and "Authorization" in text, text  # the echoed headers, whole
    assert not bears_key(text, "e"), text
    assert not bears_key(logged(caplog), "e"), logged(caplog)


@pytest.mark.parametrize("key", [LONG_KEY, "e"])
@pytest.mark.parametrize("as_json", [False, True])
def test_the_command_line_error_hides_the_key_and_keeps_every_word(echo, capsys, key, as_json):
    echo.status, echo.body_kind = 400, "text"

    code = main(["list", "--api-key", key, "--base-url", url_of(echo), *(["--json"] if as_json else [])])

    out, err = capsys.readouterr()
    assert code == 1
    assert err.startswith("prime-traces: HTTP 400: ") and SENTENCE in err, err
    assert "Bearer <redacted>" in err, err
    assert not bears_key(out + err, key), out + err
    assert not leaks_long_key(out + err), out + err
    if as_json:
        assert SENTENCE in json.loads(out)["error"]["message"]
