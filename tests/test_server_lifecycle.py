"""Restarting on the same database, and ``prime-traces serve`` as a process."""

from __future__ import annotations

import http.client
import os
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
from _wire import auth, build_upload, episode, jsonl, post_upload, trace

from prime_traces.cli import SERVE_API_KEY_ENV
from prime_traces.server import LocalTracesService
from prime_traces.server._allocator import _glibc_mallopt

STARTUP_S = 20.0
EXIT_S = 10.0


# -- restart ----------------------------------------------------------------------


def test_committed_uploads_survive_a_restart(tmp_path):
    db = tmp_path / "traces.db"
    traces = [trace("t-1"), trace("t-2")]
    episodes = [episode("ep-1", [trace("m-1"), trace("m-2")])]
    with LocalTracesService(db) as svc:
        first = post_upload(svc.url, traces)
        first_ep = post_upload(svc.url, episodes, line_format="episode")
        assert (first.status_code, first_ep.status_code) == (201, 201)

    with LocalTracesService(db) as svc:
        again = post_upload(svc.url, traces, coding="zstd")
        assert again.status_code == 200
        assert again.json() == first.json()
        again_ep = post_upload(svc.url, episodes, line_format="episode")
        assert again_ep.status_code == 200
        assert again_ep.json() == first_ep.json()
        # The line format was kept too.
        conflict = post_upload(svc.url, episodes)
        assert (conflict.status_code, conflict.json()["error"]["code"]) == (409, "line_format_conflict")
        stats = svc.stats()
        assert (stats["uploads"], stats["replays"]) == (0, 2)
        with svc.state.store.reader() as conn:
            docs = {
                r["trace_id"]: bytes(r["raw"])
                for r in conn.execute("SELECT t.trace_id, d.raw FROM traces t JOIN trace_docs d USING (seq)")
            }
            episode_ids = [r[0] for r in conn.execute("SELECT episode_id FROM episodes")]
            uploads = conn.execute("SELECT COUNT(*) FROM uploads").fetchone()[0]
        assert set(docs) == {"t-1", "t-2", "m-1", "m-2"}
        assert [docs["t-1"], docs["t-2"]] == jsonl(traces).splitlines()
        assert episode_ids == ["ep-1"]
        assert uploads == 2
        # New uploads go on next to the old ones.
        assert post_upload(svc.url, [trace("t-3")]).status_code == 201


# -- prime-traces serve -------------------------------------------------------------


def _serve_command() -> list[str]:
    script = shutil.which("prime-traces", path=os.path.dirname(sys.executable))
    return [script] if script else [sys.executable, "-m", "prime_traces.cli"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != SERVE_API_KEY_ENV}
    env.update(extra)
    return env


class Serve:
    """A ``prime-traces serve`` process; always reaped, killed if it outlives the test."""

    def __init__(self, tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [*_serve_command(), "serve", "--db", str(tmp_path / "serve.db"), "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            bufsize=0,
            env=env or _env(),
        )
        self.stdout = b""

    def read_line(self) -> str:
        """The first stdout line, read without blocking past ``STARTUP_S``."""
        deadline = time.monotonic() + STARTUP_S
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self.stdout:
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"no line from serve within {STARTUP_S}s: {self.stdout!r}"
                if sel.select(remaining):
                    chunk = os.read(fd, 4096)
                    assert chunk, f"serve closed stdout: {self.stdout!r} {self.finish()[1]!r}"
                    self.stdout += chunk
        return self.stdout.split(b"\n", 1)[0].decode()

    def finish(self, timeout_s: float = EXIT_S) -> tuple[bytes, bytes]:
        """Wait for the exit; return ``(all stdout, stderr)``."""
        try:
            out, err = self.proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            raise
        self.stdout += out
        return self.stdout, err

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate()


@pytest.fixture
def serve(tmp_path):
    started: list[Serve] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Serve:
        started.append(Serve(tmp_path, *args, env=env))
        return started[-1]

    yield start
    for process in started:
        process.close()


def _wait_for_an_upload_attempt(url: str) -> None:
    """Return once the service has counted an upload attempt.

    It counts the attempt after reading the body and before ``--hang-uploads``
    hangs it, so a counted attempt is an upload in flight. There is no event to
    wait on across the process boundary, hence the bounded poll.
    """
    deadline = time.monotonic() + STARTUP_S
    pause = threading.Event()
    while True:
        stats = requests.get(url + "/api/v1/_stats", headers=auth(), timeout=10).json()
        if stats["upload_attempts"] >= 1:
            return
        assert time.monotonic() < deadline, f"no upload attempt within {STARTUP_S}s: {stats}"
        pause.wait(0.01)


def _url(line: str) -> str:
    prefix = "listening on http://"
    assert line.startswith(prefix), line
    host, port = line[len(prefix) :].rsplit(":", 1)
    assert port.isdigit() and int(port) > 0, line
    return f"http://{'127.0.0.1' if host == '0.0.0.0' else host}:{port}"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_serve_prints_its_address_answers_and_stops_on_a_signal(serve, signum):
    proc = serve()
    line = proc.read_line()
    url = _url(line)
    docs = [trace("t-1")]
    assert post_upload(url, docs).status_code == 201
    assert post_upload(url, docs).status_code == 200
    # Without --api-key, only a Host that names this machine is answered (DNS rebinding).
    foreign = requests.get(url + "/api/v1/runs", headers={**auth(), "Host": "rebound.example"}, timeout=10)
    assert (foreign.status_code, foreign.json()["error"]["code"]) == (403, "forbidden")
    proc.proc.send_signal(signum)
    start = time.monotonic()
    stdout, stderr = proc.finish()
    assert time.monotonic() - start < 5.0
    assert proc.proc.returncode == 0, stderr
    # The address, then the viewer's URL, and nothing else on stdout.
    assert stdout == f"{line}\nviewer: {line.removeprefix('listening on ')}/\n".encode()
    assert b"Traceback" not in stderr


@pytest.mark.timeout(60)
@pytest.mark.skipif(_glibc_mallopt() is None, reason="glibc's malloc only")
def test_serve_keeps_freed_request_memory_for_the_next_requests(serve):
    # The setting itself is checked in test_server_allocator; here, that serve makes it, with its budget.
    proc = serve("--log-level", "DEBUG", "--max-body-memory-bytes", str(512 << 20))
    url = _url(proc.read_line())
    assert post_upload(url, [trace("t-1")]).status_code == 201
    proc.proc.send_signal(signal.SIGTERM)
    _, stderr = proc.finish()
    assert proc.proc.returncode == 0, stderr
    assert f"allocator: M_ARENA_MAX=1, M_MMAP_THRESHOLD={32 << 20}, M_TRIM_THRESHOLD={512 << 20}".encode() in stderr, (
        stderr
    )


@pytest.mark.timeout(60)
def test_serve_no_ui_serves_and_prints_no_viewer(serve):
    proc = serve("--no-ui")
    line = proc.read_line()
    url = _url(line)
    assert requests.get(url + "/", timeout=10).status_code == 401
    assert requests.get(url + "/api/v1/_viewer/runs", headers=auth(), timeout=10).status_code == 200
    proc.proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.finish()
    assert proc.proc.returncode == 0, stderr
    assert stdout == (line + "\n").encode()


@pytest.mark.timeout(60)
def test_serve_refuses_a_public_address_without_an_api_key(serve):
    proc = serve("--host", "0.0.0.0")
    stdout, stderr = proc.finish()
    assert proc.proc.returncode == 2
    assert stdout == b""
    message = stderr.decode()
    assert "0.0.0.0" in message and "API key" in message, message
    assert "Traceback" not in message


@pytest.mark.timeout(60)
def test_serve_takes_the_api_key_from_the_environment(serve):
    proc = serve("--host", "0.0.0.0", env=_env(**{SERVE_API_KEY_ENV: "s3cret"}))
    url = _url(proc.read_line())
    docs = [trace("t-1")]
    resp = post_upload(url, docs, token="test-token")
    assert (resp.status_code, resp.json()["error"]["code"]) == (401, "unauthenticated")
    assert requests.get(url + "/api/v1/no-such-route", headers=auth("nope"), timeout=10).status_code == 401
    assert post_upload(url, docs, token="s3cret").status_code == 201
    # With a key, the key decides: any Host (a LAN name, a proxy's) is answered.
    lan = requests.get(url + "/api/v1/runs", headers={**auth("s3cret"), "Host": "lan-name.example"}, timeout=10)
    assert lan.status_code == 200
    proc.proc.send_signal(signal.SIGTERM)
    proc.finish()
    assert proc.proc.returncode == 0


@pytest.mark.timeout(60)
def test_serve_exits_2_when_the_port_is_taken(tmp_path, serve):
    with LocalTracesService(tmp_path / "other.db") as svc:
        port = svc.url.rsplit(":", 1)[1]
        proc = serve("--port", port)
        stdout, stderr = proc.finish()
    assert proc.proc.returncode == 2
    assert stdout == b""
    assert b"prime-traces serve:" in stderr


SIGNAL_ROUNDS = 8


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_serve_stops_on_the_first_signal_while_an_upload_is_in_flight(serve):
    # The service is up and idle, then an upload arrives and hangs; the signal
    # lands while its request thread is busy. That delivery can miss the main
    # thread, so only some rounds exercise it; a correct serve passes them all.
    body, headers = build_upload([trace("t-1")])
    for round_number in range(SIGNAL_ROUNDS):
        signum = (signal.SIGTERM, signal.SIGINT)[round_number % 2]
        proc = serve("--hang-uploads")
        url = _url(proc.read_line())
        idle = requests.get(url + "/api/v1/_stats", headers=auth(), timeout=10)
        assert (idle.status_code, idle.json()["upload_attempts"]) == (200, 0)
        host, port = url.removeprefix("http://").rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        try:
            conn.request("POST", "/api/v1/traces", body=body, headers={**headers, **auth()})
            # Sent is not received: a signal that beat the upload to the service
            # would pass the round with nothing in flight.
            _wait_for_an_upload_attempt(url)
            proc.proc.send_signal(signum)
            try:
                _, stderr = proc.finish(timeout_s=5.0)
            except subprocess.TimeoutExpired:
                pytest.fail(f"round {round_number}: serve ignored {signum.name} while an upload was in flight")
            assert proc.proc.returncode == 0, stderr
            with pytest.raises((ConnectionError, http.client.HTTPException)):
                conn.getresponse()  # the hung upload is cut off, never answered
        finally:
            conn.close()
