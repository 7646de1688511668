"""ReadAPI over real HTTP: the local service for behaviour, a scripted stub for retries."""

from __future__ import annotations

import itertools
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import orjson
import pytest
from _upload_helpers import DEFAULT_TOKEN, make_episode, make_trace, upload

from prime_traces._api.models import TraceSummary
from prime_traces._api.reads import DOWNLOAD_CHUNK_BYTES, ReadAPI
from prime_traces._http.transport import Transport
from prime_traces.config import resolve_config
from prime_traces.errors import (
    AmbiguousDeleteError,
    NotFoundError,
    RetryableAPIError,
    TransportError,
    ValidationRejectedError,
)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def make_api() -> Iterator[Callable[..., tuple[ReadAPI, list[float]]]]:
    """``make_api(base_url)`` -> (ReadAPI with a recording sleep, the sleeps); closed after."""
    transports: list[Transport] = []

    def make(base_url: str, **transport_options: Any) -> tuple[ReadAPI, list[float]]:
        transport = Transport(resolve_config(api_key=DEFAULT_TOKEN, base_url=base_url, team_id=""), **transport_options)
        transports.append(transport)
        sleeps: list[float] = []
        return ReadAPI(transport, sleep=sleeps.append), sleeps

    yield make
    for transport in transports:
        transport.close()


@pytest.fixture
def api(service: Any, make_api: Callable[..., tuple[ReadAPI, list[float]]]) -> ReadAPI:
    return make_api(service.url)[0]


def put(svc: Any, lines: list[Any], **kwargs: Any) -> str:
    resp = upload(svc.url, lines, **kwargs)
    assert resp.status_code == 201, resp.text
    return resp.json()["upload_id"]


# -- against the local service ------------------------------------------------


def test_list_with_filters(service: Any, api: ReadAPI) -> None:
    now = time.time()
    first = put(
        service,
        [
            make_trace("a-1", start=now - 30, run_id="run-a", reward=1.0),
            make_trace(
                "a-2", start=now - 20, run_id="run-a", reward=0.0, ok=False, errors=[{"type": "E", "message": "m"}]
            ),
            make_trace("b-1", start=now - 10, run_id="run-b", model="other/model", reward=None),
        ],
        context={"source": "test", "stage": "one"},
    )
    put(service, [make_trace("c-1", start=now - 5, run_id="run-a")], context={"source": "other"})

    assert [t.trace_id for t in api.list().items] == ["c-1", "b-1", "a-2", "a-1"]
    assert [t.trace_id for t in api.list(run_id="run-a").items] == ["c-1", "a-2", "a-1"]
    assert [t.trace_id for t in api.list(run_id="run-a", has_error=True).items] == ["a-2"]
    assert [t.trace_id for t in api.list(has_error=False, run_id="run-a").items] == ["c-1", "a-1"]
    assert [t.trace_id for t in api.list(model_id="other/model").items] == ["b-1"]
    assert [t.trace_id for t in api.list(context={"source": "test", "stage": "one"}).items] == ["b-1", "a-2", "a-1"]
    assert [t.trace_id for t in api.list(upload_id=[first], reward_min=0.5).items] == ["a-1"]
    assert api.list(run_id="nope").items == ()
    summary = api.list(run_id="run-b").items[0]
    assert summary.score.reward is None and summary.context == {"source": "test", "stage": "one"}
    assert summary.created_at.tzinfo is not None
    with pytest.raises(ValidationRejectedError) as info:
        api.list(limit=1000)
    assert info.value.code == "invalid_filter"
    with pytest.raises(TypeError, match="unknown filter.*run_idd"):
        api.list(run_idd="x")


def test_iter_follows_cursors_lazily(service: Any, api: ReadAPI) -> None:
    now = time.time()
    put(service, [make_trace(f"t-{i}", start=now - 100 + i, run_id="run-1") for i in range(7)])
    expected = [f"t-{i}" for i in reversed(range(7))]
    assert [t.trace_id for t in api.iter(run_id="run-1", limit=3)] == expected
    page = api.list(run_id="run-1", limit=3)
    assert page.next_cursor is not None
    assert [t.trace_id for t in api.iter(run_id="run-1", limit=3, cursor=page.next_cursor)] == expected[3:]

    calls: list[dict[str, Any]] = []
    real_list = api.list

    def counting_list(**filters: Any) -> Any:
        calls.append(filters)
        return real_list(**filters)

    api.list = counting_list  # type: ignore[method-assign]
    assert [t.trace_id for t in itertools.islice(api.iter(limit=2), 3)] == expected[:3]
    assert len(calls) == 2  # the third page and beyond were never fetched
    with pytest.raises(TypeError):
        api.iter(bogus=1)


def test_get_and_odd_ids(service: Any, api: ReadAPI) -> None:
    start = time.time() - 42
    put(service, [make_trace("t 1é", start=start, run_id="r", step=4), make_trace(".", start=start)])
    summary = api.get("t 1é")
    assert isinstance(summary, TraceSummary)
    assert (summary.trace_id, summary.run_id, summary.extra.get("run_step")) == ("t 1é", "r", 4)
    assert abs(summary.created_at.timestamp() - start) < 0.002
    assert api.get(".").trace_id == "."
    with pytest.raises(NotFoundError) as info:
        api.get("missing")
    assert info.value.code == "trace_not_found"
    with pytest.raises(ValueError, match="'/'"):
        api.get("a/b")


def test_get_raw_returns_the_stored_bytes(service: Any, api: ReadAPI) -> None:
    doc = make_trace("raw-1", text='héllo — 世界 🚀 \u2028 "quoted" \\ back')
    line = orjson.dumps(doc)
    put(service, [line])
    raw = api.get_raw("raw-1")
    assert raw == line
    assert "世界 🚀" in raw.decode("utf-8")
    with pytest.raises(NotFoundError):
        api.get_raw("missing")


def test_download_raw_is_atomic(service: Any, api: ReadAPI, tmp_path: Path) -> None:
    line = orjson.dumps(make_trace("dl-1", text="ünïcode ✓" * 2000))
    put(service, [line])
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    dest = out_dir / "doc.json"
    assert api.download_raw("dl-1", dest) == dest
    assert dest.read_bytes() == line
    assert sorted(p.name for p in out_dir.iterdir()) == ["doc.json"]

    missing = out_dir / "missing.json"
    with pytest.raises(NotFoundError):
        api.download_raw("nope", missing)
    assert not missing.exists()
    dest.write_bytes(b"previous")
    with pytest.raises(NotFoundError):
        api.download_raw("nope", dest)
    assert dest.read_bytes() == b"previous"  # a failed download leaves dest untouched
    assert sorted(p.name for p in out_dir.iterdir()) == ["doc.json"]


def test_delete_then_404(service: Any, api: ReadAPI) -> None:
    put(service, [make_trace("d-1"), make_trace("d-2")])
    summary = api.get("d-2")
    api.delete("d-1")
    with pytest.raises(NotFoundError):
        api.get("d-1")
    with pytest.raises(NotFoundError):
        api.delete("d-1")  # a repeat of a delete that succeeded
    with pytest.raises(NotFoundError):
        api.delete("d-2", created_at="2001-01-01T00:00:00Z")
    api.delete("d-2", created_at=summary.created_at)
    with pytest.raises(NotFoundError):
        api.get("d-2")


def test_delete_run(service: Any, api: ReadAPI) -> None:
    put(service, [make_trace(f"r-{i}", run_id="run-x") for i in range(3)] + [make_trace("keep", run_id="run-y")])
    api.delete_run("run-x")
    assert api.list(run_id="run-x").items == ()
    assert [t.trace_id for t in api.list().items] == ["keep"]
    with pytest.raises(NotFoundError) as info:
        api.delete_run("run-x")
    assert info.value.code == "run_not_found"
    with pytest.raises(ValueError):
        api.delete_run("")


def test_episodes(service: Any, api: ReadAPI) -> None:
    now = time.time()
    members = [
        make_trace("m-1", start=now - 50, run_id="run-e", step=1, agent="a"),
        make_trace("m-2", start=now - 40, run_id="run-e", step=2, agent="b", total_tokens=30),
    ]
    put(
        service,
        [
            make_episode("ep-1", members, run_id="run-e", env="env-1"),
            make_episode(
                "ep-2",
                [make_trace("m-3", start=now - 30, run_id="run-e", step=2)],
                run_id="run-e",
                ok=False,
                errors=[{"type": "Boom", "message": "bad"}],
            ),
        ],
        episode=True,
    )
    assert [e.episode_id for e in api.list_episodes(run_id="run-e").items] == ["ep-2", "ep-1"]
    assert [e.episode_id for e in api.list_episodes(has_error=True).items] == ["ep-2"]
    assert [e.episode_id for e in api.list_episodes(run_step=1).items] == ["ep-1"]
    assert [e.episode_id for e in api.iter_episodes(limit=1)] == ["ep-2", "ep-1"]
    detail = api.get_episode("ep-1")
    assert (detail.environment_id, detail.has_error, detail.error.type) == ("env-1", False, None)
    assert detail.traces.trace_count == 2 and detail.traces.total_tokens == 150
    assert detail.traces.agent_names == ("a", "b")
    assert api.get_episode("ep-2").error.type == "Boom"
    traces = api.list_episode_traces("ep-1")
    assert [t.trace_id for t in traces.items] == ["m-2", "m-1"]
    assert all(t.episode_id == "ep-1" for t in traces.items)
    with pytest.raises(NotFoundError):
        api.get_episode("ep-404")
    with pytest.raises(TypeError):
        api.list_episode_traces("ep-1", sort="newest")


def test_runs(service: Any, api: ReadAPI) -> None:
    put(
        service,
        [
            make_trace("s-0", run_id="run-s", step=0, reward=1.0),
            make_trace("s-1", run_id="run-s", step=1, reward=0.0),
            make_trace("s-2", run_id="run-s", step=1, reward=1.0),
        ],
    )
    assert "run-s" in [r.run_id for r in api.list_runs().items]
    run = api.get_run("run-s")
    assert (run.trace_count, run.step_min, run.step_max, run.step_count) == (3, 0, 1, 2)
    assert run.status is None  # known only from traces: lifecycle fields null
    steps = api.get_run_steps("run-s")
    assert [(s.step, s.trace_count, s.avg_reward) for s in steps.items] == [(0, 1, 1.0), (1, 2, 0.5)]
    assert api.get_run_steps("run-unknown").items == ()
    with pytest.raises(NotFoundError):
        api.get_run("run-unknown")


# -- retries, against a scripted stub ---------------------------------------


Answer = Any  # (status, headers, body) or a callable(handler)


class StubServer:
    """Answers each request with the next scripted answer, on 127.0.0.1."""

    def __init__(self, script: list[Answer]) -> None:
        self.script = list(script)
        self.requests: list[tuple[str, str]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  (the stdlib's signature)
                pass

            def _answer(self) -> None:
                stub.requests.append((self.command, self.path))
                answer = stub.script.pop(0) if stub.script else (500, {}, b"script exhausted")
                if callable(answer):
                    answer(self)
                    return
                status, headers, body = answer
                self.send_response(status)
                for name, value in {"Content-Length": str(len(body)), **headers}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_DELETE = _answer

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), name="stub-http", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@pytest.fixture
def stub() -> Iterator[Callable[[list[Answer]], StubServer]]:
    servers: list[StubServer] = []

    def make(script: list[Answer]) -> StubServer:
        servers.append(StubServer(script))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


def envelope(code: str | None, status: int, headers: dict[str, str] | None = None) -> Answer:
    body = orjson.dumps({"error": {"code": code, "message": f"scripted {status}"}})
    return (status, {"Content-Type": "application/json", **(headers or {})}, body)


SUMMARY = orjson.dumps(
    {
        "trace_id": "t-1",
        "upload_id": "u" * 64,
        "episode_id": None,
        "created_at": "2026-07-20T18:02:11.482Z",
        "ingested_at": "2026-07-20T18:02:12Z",
        "run_id": None,
        "environment_id": None,
        "model": {"provider": None, "id": None},
        "task_id": None,
        "agent_name": None,
        "score": {"reward": None, "outcome": None},
        "execution": {"has_error": False, "is_truncated": False},
        "duration_ms": 0,
        "total_tokens": 0,
        "size_bytes": 10,
        "context": {},
    }
)
OK_SUMMARY = (200, {"Content-Type": "application/json"}, SUMMARY)
ACCEPTED = (202, {}, b"")


def drop_without_answer(handler: BaseHTTPRequestHandler) -> None:
    handler.close_connection = True
    handler.connection.shutdown(socket.SHUT_RDWR)


def truncated_body(sent: bytes, promised: int) -> Answer:
    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", str(promised))
        handler.end_headers()
        handler.wfile.write(sent)
        handler.wfile.flush()
        handler.close_connection = True
        handler.connection.shutdown(socket.SHUT_RDWR)

    return answer


def test_get_retried_on_503_then_succeeds(stub: Any, make_api: Any) -> None:
    server = stub([envelope("storage_unavailable", 503, {"Retry-After": "0.25"}), OK_SUMMARY])
    api, sleeps = make_api(server.url)
    assert api.get("t-1").trace_id == "t-1"
    assert len(server.requests) == 2
    assert sleeps == [0.25]


def test_get_retried_after_a_dropped_connection(stub: Any, make_api: Any) -> None:
    server = stub([drop_without_answer, (502, {}, b"bad gateway"), OK_SUMMARY])
    api, sleeps = make_api(server.url)
    assert api.get("t-1").trace_id == "t-1"
    assert len(server.requests) == 3 and len(sleeps) == 2


@pytest.mark.parametrize(
    ("status", "code", "error"),
    [
        (400, "invalid_filter", ValidationRejectedError),
        (404, "trace_not_found", NotFoundError),
    ],
)
def test_get_not_retried_on_4xx(stub: Any, make_api: Any, status: int, code: str, error: type) -> None:
    server = stub([envelope(code, status), OK_SUMMARY])
    api, sleeps = make_api(server.url)
    with pytest.raises(error):
        api.get("t-1")
    assert len(server.requests) == 1 and sleeps == []


def test_get_gives_up_after_three_attempts(stub: Any, make_api: Any) -> None:
    server = stub([envelope(None, 504)] * 3 + [OK_SUMMARY])
    api, sleeps = make_api(server.url)
    with pytest.raises(RetryableAPIError) as info:
        api.get("t-1")
    assert info.value.status_code == 504
    assert len(server.requests) == 3 and len(sleeps) == 2


@pytest.mark.parametrize(
    "refusal", [envelope("writer_pool_saturated", 503), envelope("rate_limited", 429), envelope(None, 429)]
)
def test_delete_retried_on_refusal(stub: Any, make_api: Any, refusal: Answer) -> None:
    server = stub([refusal, ACCEPTED])
    api, sleeps = make_api(server.url)
    api.delete("t-1", created_at="2026-07-20T18:02:11.482Z")
    assert [method for method, _ in server.requests] == ["DELETE", "DELETE"]
    assert server.requests[0][1] == "/api/v1/traces/t-1?created_at=2026-07-20T18%3A02%3A11.482Z"
    assert len(sleeps) == 1


def test_delete_refused_three_times_is_not_ambiguous(stub: Any, make_api: Any) -> None:
    server = stub([envelope("auth_unavailable", 503)] * 3)
    api, sleeps = make_api(server.url)
    with pytest.raises(RetryableAPIError) as info:
        api.delete_run("run-1")
    assert info.value.code == "auth_unavailable"
    assert server.requests == [("DELETE", "/api/v1/traces?run_id=run-1")] * 3
    assert len(sleeps) == 2


@pytest.mark.parametrize(
    "answer",
    [
        envelope(None, 502),
        envelope(None, 504),
        envelope(None, 503),
        envelope("something_new", 503),
        (503, {}, b"plain text"),
        drop_without_answer,
    ],
    ids=["502", "504", "503-no-code", "503-unknown-code", "503-no-envelope", "dropped-after-send"],
)
def test_delete_ambiguous_failures_are_not_retried(stub: Any, make_api: Any, answer: Answer) -> None:
    server = stub([answer, ACCEPTED])
    api, sleeps = make_api(server.url)
    with pytest.raises(AmbiguousDeleteError) as info:
        api.delete("t-1")
    assert isinstance(info.value.__cause__, (RetryableAPIError, TransportError))
    assert len(server.requests) == 1 and sleeps == []


def test_delete_not_found_is_not_ambiguous(stub: Any, make_api: Any) -> None:
    server = stub([envelope("trace_not_found", 404)])
    api, sleeps = make_api(server.url)
    with pytest.raises(NotFoundError):
        api.delete("t-1")
    assert len(server.requests) == 1 and sleeps == []


def test_delete_retried_when_the_connection_is_refused(make_api: Any) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # Nothing listens on the port now: every attempt fails before sending anything.
    api, sleeps = make_api(f"http://127.0.0.1:{port}")
    with pytest.raises(TransportError) as info:
        api.delete("t-1")
    assert not isinstance(info.value, AmbiguousDeleteError)
    assert len(sleeps) == 2


def test_download_retried_before_the_first_byte(stub: Any, make_api: Any, tmp_path: Path) -> None:
    body = '{"id": "t-1", "text": "ünï"}'.encode()
    server = stub([envelope(None, 503), truncated_body(b"", len(body)), (200, {}, body)])
    api, sleeps = make_api(server.url)
    dest = tmp_path / "doc.json"
    assert api.download_raw("t-1", dest) == dest
    assert dest.read_bytes() == body
    assert len(server.requests) == 3 and len(sleeps) == 2
    assert server.requests[0] == ("GET", "/api/v1/traces/t-1?raw=true")
    assert [p.name for p in tmp_path.iterdir()] == ["doc.json"]


def test_download_not_retried_once_bytes_flowed(stub: Any, make_api: Any, tmp_path: Path) -> None:
    sent = b"x" * (DOWNLOAD_CHUNK_BYTES + 1000)  # one whole chunk reaches the file, then the cut
    server = stub([truncated_body(sent, 4 * DOWNLOAD_CHUNK_BYTES), (200, {}, b"{}")])
    api, sleeps = make_api(server.url)
    dest = tmp_path / "doc.json"
    with pytest.raises(TransportError, match=f"after {DOWNLOAD_CHUNK_BYTES} bytes"):
        api.download_raw("t-1", dest)
    assert len(server.requests) == 1 and sleeps == []
    assert list(tmp_path.iterdir()) == []  # neither dest nor a temporary file


def test_get_raw_and_list_are_retried_too(stub: Any, make_api: Any) -> None:
    page = orjson.dumps({"items": [orjson.loads(SUMMARY)], "next_cursor": None})
    server = stub([envelope("rate_limited", 429), (200, {}, b"raw bytes"), drop_without_answer, (200, {}, page)])
    api, sleeps = make_api(server.url)
    assert api.get_raw("t-1") == b"raw bytes"
    assert [t.trace_id for t in api.list(has_error=False, context={"a.b": "c d"}).items] == ["t-1"]
    assert server.requests[-1][1] == "/api/v1/traces?has_error=false&context.a.b=c+d"
    assert len(sleeps) == 2


def test_the_metrics_history_pages_back_in_step_order_with_its_summary(service: Any, api: ReadAPI) -> None:
    import requests

    headers = {"Authorization": f"Bearer {DEFAULT_TOKEN}"}
    run_id = requests.post(
        f"{service.url}/api/v1/runs", json={"name": "m", "kind": "train"}, headers=headers, timeout=10
    ).json()["id"]
    rows = [
        {"step": s, "time": 1.0 + s, "metrics": {"reward": s / 10, "loss": "NaN" if s == 7 else 1 / (s + 1)}}
        for s in reversed(range(25))
    ]
    assert requests.post(
        f"{service.url}/api/v1/runs/{run_id}/metrics", json={"rows": rows}, headers=headers, timeout=10
    ).json() == {"accepted": 25}
    got = list(api.iter_metrics(run_id, names=["reward"], limit=4))  # seven pages
    assert [r.step for r in got] == list(range(25))
    assert [r.metrics for r in got] == [{"reward": s / 10} for s in range(25)]
    page = api.list_metrics(run_id, min_step=7, max_step=7)
    assert [(r.step, r.metrics["loss"]) for r in page.rows] == [(7, "NaN")] and page.next_cursor is None
    summary = api.get_run(run_id).metrics
    assert summary["reward"] == {"last": 2.4, "min": 0.0, "max": 2.4, "count": 25, "last_step": 24}
    assert summary["loss"]["count"] == 25 and summary["loss"]["min"] == 1 / 25
    with pytest.raises(TypeError, match="unknown filter"):
        api.list_metrics(run_id, step=3)
    with pytest.raises(NotFoundError):
        api.list_metrics("no-such-run")
