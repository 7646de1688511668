"""The transport: the API key never leaks through errors, sessions of ended threads close, fork."""

from __future__ import annotations

import logging
import os
import socket
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests
import urllib3
from _fork import in_child

from prime_traces._http.retry import upload_retrying
from prime_traces._http.transport import Transport
from prime_traces.config import ClientConfig, api_url, resolve_config
from prime_traces.errors import TransportError

pytestmark = pytest.mark.timeout(60)

SECRET = "pk-9f8e7d6c5b4a39281706"
#: Long enough that a window of the key cannot occur in a message by chance.
_WINDOW = 6


def leaks(text: str) -> bool:
    """Whether ``text`` holds the key or any piece of it at least ``_WINDOW`` long."""
    return any(SECRET[i : i + _WINDOW] in text for i in range(len(SECRET) - _WINDOW + 1))


def full_text(err: BaseException) -> str:
    """What a traceback or an ``exc_info`` log shows of ``err``, causes included."""
    return "".join(traceback.format_exception(err))


@pytest.fixture
def make_transport() -> Iterator[Callable[..., Transport]]:
    transports: list[Transport] = []

    def make(config: ClientConfig) -> Transport:
        transport = Transport(config)
        transports.append(transport)
        return transport

    yield make
    for transport in transports:
        transport.close()


def open_sockets(session: requests.Session) -> list[socket.socket]:
    """The sockets of the keep-alive connections ``session`` holds in its pools."""
    found = []
    for adapter in session.adapters.values():
        pools = adapter.poolmanager.pools
        for key in pools.keys():  # urllib3 refuses iteration of the container itself
            for conn in list(pools[key].pool.queue):
                if conn is not None and conn.sock is not None:
                    found.append(conn.sock)
    return found


def run_in_thread(body: Callable[[], Any]) -> None:
    """Run ``body`` on a new thread, wait for it to end, and re-raise what it raised."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            body()
        except BaseException as err:  # noqa: BLE001  (re-raised on the caller's thread)
            errors.append(err)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


# --- the API key in error messages -------------------------------------------


def test_a_key_requests_refuses_never_reaches_the_error_the_retry_log_or_the_traceback(
    service: Any, make_transport: Callable[..., Transport], caplog: pytest.LogCaptureFixture
) -> None:
    # Built directly, past resolve_config's own check, so the transport alone
    # stands between requests' InvalidHeader (which quotes the header) and us.
    transport = make_transport(ClientConfig(api_key=SECRET + "\n", base_url=service.url))
    url = api_url(service.url, "traces")
    caplog.set_level(logging.INFO, logger="prime_traces")
    retrying = upload_retrying(2, sleep=lambda seconds: None)

    with pytest.raises(TransportError) as info:
        retrying(transport.request, "GET", url)

    err = info.value
    assert isinstance(err.__cause__, requests.exceptions.InvalidHeader), full_text(err)
    assert "InvalidHeader" in str(err) and "check it for stray characters" in str(err)
    assert not leaks(str(err)), str(err)
    assert not leaks(full_text(err)), full_text(err)
    retry_logs = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
    assert len(retry_logs) == 1, caplog.records
    assert not any(leaks(r.getMessage()) for r in caplog.records), [r.getMessage() for r in caplog.records]


def third_party_error(text: str) -> requests.ConnectionError:
    """An error nested as requests and urllib3 nest them, with ``text`` at the bottom.

    urllib3's error is both the argument and the cause of requests' one, and
    holds the lower-level error as an argument only.
    """
    inner = urllib3.exceptions.ProtocolError("Connection aborted.", ValueError(text))
    try:
        raise requests.ConnectionError(inner) from inner
    except requests.ConnectionError as err:
        return err


#: Where the transport cuts third-party text short.
_CUT = 300


@pytest.mark.parametrize(
    "quote",
    [
        lambda key: f"bad header value: Bearer {key}",
        lambda key: f"bad header value: {(f'Bearer {key}').encode()!r}",
        None,
    ],
    ids=["plain", "bytes-repr", "across-the-cut"],
)
def test_any_third_party_text_quoting_the_key_is_scrubbed(
    monkeypatch: pytest.MonkeyPatch,
    make_transport: Callable[..., Transport],
    quote: Callable[[str], str] | None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    if quote is None:
        # The key straddles the cut: cutting before scrubbing would leave its front.
        offset = str(third_party_error(SECRET)).index(SECRET)
        text = "x" * (_CUT - _WINDOW - 2 - offset) + SECRET
        start = str(third_party_error(text)).index(SECRET)
        assert start + _WINDOW < _CUT < start + len(SECRET)
    else:
        text = quote(SECRET)
    assert leaks(text)

    def failing_request(self: requests.Session, *args: Any, **kwargs: Any) -> Any:
        raise third_party_error(text)

    monkeypatch.setattr(requests.Session, "request", failing_request)
    transport = make_transport(ClientConfig(api_key=SECRET, base_url="http://127.0.0.1:9"))
    with pytest.raises(TransportError) as info:
        transport.request("POST", "http://127.0.0.1:9/api/v1/traces")

    err = info.value
    assert isinstance(err.__cause__, requests.ConnectionError)
    assert isinstance(err.__cause__.args[0], urllib3.exceptions.ProtocolError), "kept for callers to inspect"
    assert not leaks(str(err)), str(err)
    assert str(err).startswith("POST http://127.0.0.1:9/api/v1/traces: ConnectionError: ")
    assert "the API key was removed from this message" in str(err)
    assert not leaks(full_text(err)), full_text(err)
    # What an exc_info log of the error prints.
    caplog.set_level(logging.WARNING)
    logging.getLogger("prime_runs.test").warning("write failed: %r", err, exc_info=err)
    assert not leaks(caplog.text), caplog.text


# --- sessions of ended threads -----------------------------------------------


def test_sessions_of_ended_threads_are_closed_when_a_new_thread_sends(
    service: Any, make_transport: Callable[..., Transport]
) -> None:
    transport = make_transport(resolve_config(api_key="k", base_url=service.url, environ={}, config_path=os.devnull))
    url = api_url(service.url, "traces")
    used: list[requests.Session] = []
    all_sent = threading.Barrier(4)

    def send_and_wait() -> None:
        # All three live at once, so that none of them sweeps another.
        transport.request("GET", url)
        used.append(transport._session())
        all_sent.wait(10)

    threads = [threading.Thread(target=send_and_wait) for _ in range(3)]
    for thread in threads:
        thread.start()
    all_sent.wait(10)
    for thread in threads:
        thread.join()
    ended_sockets = [sock for session in used for sock in open_sockets(session)]
    assert len(set(used)) == 3 and len(ended_sockets) == 3
    assert all(sock.fileno() != -1 for sock in ended_sockets)

    newest: list[requests.Session] = []
    run_in_thread(lambda: (transport.request("GET", url), newest.append(transport._session())))

    assert [sock.fileno() for sock in ended_sockets] == [-1, -1, -1]
    assert list(transport._sessions) == newest
    assert open_sockets(newest[0]), "the newest session keeps its connection"


def test_a_live_thread_keeps_its_session_while_others_come_and_go(
    service: Any, make_transport: Callable[..., Transport]
) -> None:
    transport = make_transport(resolve_config(api_key="k", base_url=service.url, environ={}, config_path=os.devnull))
    url = api_url(service.url, "traces")
    transport.request("GET", url)
    mine = transport._session()

    run_in_thread(lambda: transport.request("GET", url))
    run_in_thread(lambda: transport.request("GET", url))

    assert mine in transport._sessions and len(transport._sessions) == 2
    assert all(sock.fileno() != -1 for sock in open_sockets(mine))
    transport.request("GET", url)
    assert transport._session() is mine


# --- fork ---------------------------------------------------------------------


needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")


@needs_fork
def test_close_in_a_child_does_not_take_a_lock_a_parent_thread_held_at_fork(
    make_transport: Callable[..., Transport],
) -> None:
    transport = make_transport(ClientConfig(api_key="k", base_url="http://127.0.0.1:9"))
    holding, release = threading.Event(), threading.Event()

    def hold_the_lock() -> None:
        with transport._lock:
            holding.set()
            release.wait()

    holder = threading.Thread(target=hold_the_lock)
    holder.start()
    try:
        assert holding.wait(10)

        def child() -> dict[str, bool]:
            transport.close()
            return {"closed": True}

        # The holder does not exist in the child: with the inherited lock, close() would hang.
        assert in_child(child, timeout_s=10) == {"closed": True}
    finally:
        release.set()
        holder.join()


@needs_fork
def test_close_in_a_child_leaves_the_parents_sessions_alone(
    service: Any, make_transport: Callable[..., Transport]
) -> None:
    transport = make_transport(resolve_config(api_key="k", base_url=service.url, environ={}, config_path=os.devnull))
    url = api_url(service.url, "traces")
    transport.request("GET", url)
    parent_session = transport._session()
    assert open_sockets(parent_session)

    def child() -> dict[str, Any]:
        transport.close()
        return {"open": [sock.fileno() != -1 for sock in open_sockets(parent_session)]}

    assert in_child(child) == {"open": [True]}
    assert list(transport._sessions) == [parent_session]
    transport.request("GET", url)
    assert transport._session() is parent_session
