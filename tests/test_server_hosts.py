"""The guard against DNS rebinding: without an API key, only a local ``Host`` is answered.

Raw requests over loopback carry the ``Host`` a browser would send for a page
whose name was re-pointed at 127.0.0.1; every route (API, viewer files,
unknown paths) refuses them with 403 ``forbidden`` in the usual envelope,
before any route runs. With an API key the key is the protection and
``Host`` is not looked at. The client and the CLI, which address the service
by its loopback URL, are tested against the same guard in their own modules.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from _raw_http import Answer, connect, read_answers, request_head

from prime_traces.server import LocalTracesService
from prime_traces.server._hosts import check_host, host_is_local
from prime_traces.server._http import HTTPError

pytestmark = pytest.mark.timeout(30)

ROUTES = [
    ("GET", "/"),
    ("GET", "/ui/app.js"),
    ("GET", "/api/v1/runs"),
    ("GET", "/api/v1/_viewer/runs"),
    ("GET", "/api/v1/_stats"),
    ("GET", "/no/such/route"),
    ("POST", "/api/v1/runs"),
]
FOREIGN_HOSTS = [
    "evil.example",
    "evil.example:8765",
    "127.0.0.1.evil.example",
    "localhost.evil.example:80",
    "localhost:8765@evil.example",
    "10.0.0.1",
    "[::2]:8765",
    "[::ffff:7f00:1]",
    "127.0.0.1:notaport",
    "",
]
LOCAL_HOSTS = [
    "localhost",
    "LOCALHOST:1234",
    "localhost.",
    "viewer.localhost:8765",
    "127.0.0.1",
    "127.0.0.1:8765",
    "127.45.6.7:1",
    "[::1]",
    "[::1]:8765",
    "[0:0:0:0:0:0:0:1]:8765",
]


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Iterator[LocalTracesService]:
    """One service for the many requests that change nothing."""
    with LocalTracesService(tmp_path_factory.mktemp("hosts") / "traces.db") as svc:
        yield svc


def ask(svc: LocalTracesService, method: str, path: str, host: str | None, extra: list[str] | None = None) -> Answer:
    """One request carrying ``Host: host`` (None: no Host header), and its answer."""
    body = b"{}" if method == "POST" else b""
    headers = [("Content-Length", str(len(body)))] + [("Host", h) for h in extra or []]
    with connect(svc.url) as sock:
        sock.sendall(request_head(method, path, headers, host=host) + body)
        sock.shutdown(1)
        answers, _ = read_answers(sock, timeout_s=10)
    assert len(answers) == 1, answers
    return answers[0]


def assert_refused(answer: Answer) -> None:
    assert answer.status == 403, answer
    assert answer.headers["content-type"] == "application/json"
    error = json.loads(answer.body)["error"]
    assert error["code"] == "forbidden"
    assert "localhost, *.localhost, 127.0.0.0/8 or [::1]" in error["message"]
    assert "--api-key" in error["message"]


@pytest.mark.parametrize("host", FOREIGN_HOSTS)
@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_a_foreign_host_is_refused_on_every_route(shared, method, path, host) -> None:
    assert_refused(ask(shared, method, path, host))


def test_a_request_without_host_or_with_two_is_refused(service) -> None:
    answer = ask(service, "GET", "/api/v1/runs", None)
    assert_refused(answer)
    assert "no Host header" in json.loads(answer.body)["error"]["message"]
    answer = ask(service, "GET", "/api/v1/runs", "localhost", extra=["evil.example"])
    assert_refused(answer)
    assert "2 Host headers" in json.loads(answer.body)["error"]["message"]


def test_the_refusal_names_the_host_it_refused_and_runs_no_route(service) -> None:
    answer = ask(service, "POST", "/api/v1/runs", "rebound.evil.example:8765")
    assert "'rebound.evil.example:8765' refused" in json.loads(answer.body)["error"]["message"]
    listed = ask(service, "GET", "/api/v1/runs", "localhost")
    assert listed.status == 200
    assert json.loads(listed.body)["items"] == []  # the refused POST created nothing
    assert service.stats()["rejections"].get("forbidden") == 1


@pytest.mark.parametrize("host", LOCAL_HOSTS)
def test_a_local_host_is_answered(shared, host) -> None:
    assert ask(shared, "GET", "/api/v1/runs", host).status == 200
    assert ask(shared, "GET", "/", host).status == 200


def test_a_refused_request_leaves_the_connection_usable(service) -> None:
    body = b'{"name": "x", "kind": "train"}'
    with connect(service.url) as sock:
        sock.sendall(request_head("POST", "/api/v1/runs", [("Content-Length", str(len(body)))], host="evil.example"))
        sock.sendall(body + request_head("GET", "/api/v1/runs", [], host=service.url.removeprefix("http://")))
        sock.shutdown(1)
        answers, closed = read_answers(sock, timeout_s=10)
    assert [a.status for a in answers] == [403, 200]
    assert closed


def test_a_service_on_ipv6_loopback_answers_its_literal(tmp_path) -> None:
    with LocalTracesService(tmp_path / "traces.db", host="::1") as svc:
        assert ask(svc, "GET", "/api/v1/runs", svc.url.removeprefix("http://")).status == 200
        assert_refused(ask(svc, "GET", "/api/v1/runs", "evil.example"))


def test_with_an_api_key_the_key_decides_and_host_is_not_checked(tmp_path) -> None:
    key = "hosts-test-key"
    with LocalTracesService(tmp_path / "traces.db", api_key=key) as svc:
        with connect(svc.url) as sock:
            sock.sendall(request_head("GET", "/api/v1/runs", [], token=key, host="lan-name.example:8765"))
            sock.shutdown(1)
            answers, _ = read_answers(sock, timeout_s=10)
        assert [a.status for a in answers] == [200]
        unauthorized = ask(svc, "GET", "/api/v1/runs", "lan-name.example")  # the default token, not the key
        assert unauthorized.status == 401
        assert ask(svc, "GET", "/", "lan-name.example").status == 200
        assert key not in repr(svc.state)  # a logged state shows no key


@pytest.mark.parametrize(
    ("host", "bound", "local"),
    [
        ("devbox:8765", "devbox", True),
        ("DEVBOX", "devbox", True),
        ("devbox.example:8765", "devbox", False),
        ("[::1]:1", "::1", True),
        ("[fe80::1]:1", "::1", False),
        ("evil.example", "127.0.0.1", False),
    ],
)
def test_the_exact_bound_host_is_local_too(host, bound, local) -> None:
    assert host_is_local(host, bound) is local


def test_the_refusal_names_a_bound_host_that_is_no_loopback_name() -> None:
    with pytest.raises(HTTPError) as refused:
        check_host(["evil.example"], "devbox")
    assert "or 'devbox' (the address it was bound to)" in refused.value.message
    with pytest.raises(HTTPError) as refused:
        check_host(["evil.example"], "127.0.0.1")
    assert "bound to" not in refused.value.message
