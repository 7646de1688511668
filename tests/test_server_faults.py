"""Each fault option of the local service does what it says, seen over HTTP."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import pytest
import requests
from _wire import ACCEPT_ENCODING, auth, digest_key, jsonl, post_upload, trace

from prime_traces._lines.rules import MAX_ROWS_PER_UPLOAD
from prime_traces.server import LocalTracesService

SERVICE_UNAVAILABLE_CODES = {
    "writer_pool_saturated",
    "ingest_capacity_exceeded",
    "ingest_unavailable",
    "storage_unavailable",
    "auth_unavailable",
}


def stored_rows(svc: LocalTracesService) -> dict[str, int]:
    with svc.state.store.reader() as conn:
        return {
            t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
            for t in ("uploads", "traces", "trace_docs", "episodes")
        }


def timed(call, *args, **kwargs):
    start = time.monotonic()
    result = call(*args, **kwargs)
    return result, time.monotonic() - start


@pytest.mark.parametrize(
    "options",
    [dict(fail_status=404), dict(fail_fraction=1.5), dict(bandwidth_mb_s=0), dict(latency_ms=-1)],
)
def test_invalid_fault_options_are_refused(options):
    with pytest.raises(ValueError):
        LocalTracesService(**options)


def test_latency_delays_every_answer(tmp_path):
    with LocalTracesService(tmp_path / "t.db", latency_ms=300) as svc:
        resp, elapsed = timed(post_upload, svc.url, [trace("t-1")])
        assert resp.status_code == 201
        assert elapsed >= 0.3
        resp, elapsed = timed(requests.get, svc.url + "/api/v1/no-such-route", headers=auth(), timeout=10)
        assert resp.status_code == 404
        assert elapsed >= 0.3
        resp, elapsed = timed(post_upload, svc.url, [trace("t-1")], token=None)
        assert resp.status_code == 401
        assert elapsed >= 0.3
        svc.faults.latency_ms = 600  # changed while running
        resp, elapsed = timed(post_upload, svc.url, [trace("t-2")])
        assert resp.status_code == 201
        assert elapsed >= 0.6


def test_bandwidth_cap_slows_the_body(tmp_path):
    lines = [trace(f"t-{i}", pad="x" * 10_000) for i in range(200)]
    body = jsonl(lines)
    assert len(body) >= 2_000_000
    with LocalTracesService(tmp_path / "t.db", bandwidth_mb_s=10) as svc:
        resp, elapsed = timed(post_upload, svc.url, body, coding="none")
        assert resp.status_code == 201, resp.text
        assert elapsed >= len(body) / 10e6


def test_a_link_cap_is_shared_by_uploads_at_once(tmp_path):
    # Per-request bandwidth lets two uploads go twice as fast as one; a link does not: 4 MB at 8 MB/s
    # takes 0.5 s however the bytes are split between requests.
    bodies = [jsonl([trace(f"t-{n}-{i}", pad="x" * 10_000) for i in range(200)]) for n in range(3)]
    body = bodies[2]
    with LocalTracesService(tmp_path / "t.db", link_mb_s=8) as svc:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            started = time.monotonic()
            answers = list(pool.map(lambda b: post_upload(svc.url, b, coding="none"), bodies[:2]))
            elapsed = time.monotonic() - started
        assert [resp.status_code for resp in answers] == [201, 201]
        assert elapsed >= 2 * len(body) / 8e6
        svc.faults.link_mb_s = None  # lifted while running
        resp, elapsed = timed(post_upload, svc.url, body, coding="none")
        assert resp.status_code == 201
        assert elapsed < len(body) / 8e6
    with pytest.raises(ValueError, match="link_mb_s must be greater than 0"):
        LocalTracesService(tmp_path / "u.db", link_mb_s=0)


@pytest.mark.parametrize(
    "status, retry_after, header",
    [(429, 2.5, "2.5"), (503, 1.0, "1"), (503, None, None), (429, 0, "0")],
    ids=["429", "503", "503-no-retry-after", "429-zero"],
)
def test_fail_fraction_one_refuses_every_upload(tmp_path, status, retry_after, header):
    with LocalTracesService(
        tmp_path / "t.db", fail_fraction=1.0, fail_status=status, fail_retry_after_s=retry_after
    ) as svc:
        for i in range(5):
            resp = post_upload(svc.url, [trace(f"t-{i}")])
            assert resp.status_code == status, resp.text
            code = resp.json()["error"]["code"]
            if status == 429:
                assert code == "rate_limited"
            else:
                assert code in SERVICE_UNAVAILABLE_CODES
            assert resp.headers.get("Accept-Encoding") == ACCEPT_ENCODING
            if header is None:
                assert "Retry-After" not in resp.headers
            else:
                assert float(resp.headers["Retry-After"]) == float(header)
        assert svc.stats()["uploads"] == 0
        assert stored_rows(svc)["uploads"] == 0


def test_fail_count_refuses_the_next_n_then_succeeds(tmp_path):
    docs = [trace("t-1")]
    with LocalTracesService(tmp_path / "t.db", fail_count=3, fail_status=503) as svc:
        assert [post_upload(svc.url, docs).status_code for _ in range(4)] == [503, 503, 503, 201]
        assert post_upload(svc.url, docs).status_code == 200
        stats = svc.stats()
        assert (stats["uploads"], stats["replays"]) == (1, 1)
        svc.faults.fail_count = 1
        assert post_upload(svc.url, docs).status_code == 503
        assert post_upload(svc.url, docs).status_code == 200


def test_reject_marker_rejects_the_marked_line(tmp_path):
    docs = [trace("t-1"), trace("t-2"), trace("t-3", info={"note": "POISON here"}), trace("t-4")]
    with LocalTracesService(tmp_path / "t.db", reject_marker="POISON") as svc:
        resp = post_upload(svc.url, docs)
        assert resp.status_code == 400
        error = resp.json()["error"]
        assert (error["code"], error["line"]) == ("invalid_trace", 3)
        assert error.get("id") in (None, "t-3")
        assert stored_rows(svc)["uploads"] == 0
        assert post_upload(svc.url, docs[:2] + docs[3:]).status_code == 201  # unmarked lines pass
        svc.faults.reject_marker = None
        assert post_upload(svc.url, docs).status_code == 201  # the same bytes, now accepted


def test_reject_omit_line_leaves_out_line_and_id(tmp_path):
    docs = [trace("t-1"), trace("t-2", info={"note": "POISON"})]
    with LocalTracesService(tmp_path / "t.db", reject_marker="POISON", reject_omit_line=True) as svc:
        resp = post_upload(svc.url, docs)
        assert resp.status_code == 400
        error = resp.json()["error"]
        assert error["code"] == "invalid_trace"
        assert "line" not in error and "id" not in error
        # It applies to every line rejection, not only the marker's.
        resp = post_upload(svc.url, [trace("t-1"), trace("t-1")])
        error = resp.json()["error"]
        assert error["code"] == "duplicate_trace_id"
        assert "line" not in error and "id" not in error


def test_hung_upload_times_the_client_out_and_the_service_still_stops(tmp_path):
    svc = LocalTracesService(tmp_path / "t.db", hang_uploads=True).start()
    try:
        with pytest.raises(requests.Timeout):
            post_upload(svc.url, [trace("t-1")], timeout=0.5)
        # Other requests are still answered while an upload hangs.
        assert requests.get(svc.url + "/api/v1/no-such-route", headers=auth(), timeout=5).status_code == 404
        assert svc.stats()["uploads"] == 0
    finally:
        _, elapsed = timed(svc.stop)
    assert elapsed < 5.0
    assert not [t.name for t in threading.enumerate() if t.name.startswith("prime-traces-serve")]


@pytest.mark.parametrize("after_commit", [True, False], ids=["drop-after-commit", "drop-before-commit"])
def test_dropped_connection_after_the_body(tmp_path, after_commit):
    docs = [trace("t-1"), trace("t-2")]
    with LocalTracesService(tmp_path / "t.db", drop_after_body=1, drop_after_commit=after_commit) as svc:
        with pytest.raises(requests.ConnectionError):
            post_upload(svc.url, docs)
        assert svc.stats()["upload_attempts"] == 1
        assert svc.stats()["uploads"] == (1 if after_commit else 0)
        assert stored_rows(svc)["traces"] == (2 if after_commit else 0)
        retry = post_upload(svc.url, docs)  # the client retries with the same bytes
        assert retry.status_code == (200 if after_commit else 201), retry.text
        assert retry.json()["upload_id"] == digest_key(jsonl(docs)).removeprefix("sha256:")
        stats = svc.stats()
        assert (stats["uploads"], stats["replays"]) == (1, 1 if after_commit else 0)
        assert stored_rows(svc)["traces"] == 2


@pytest.mark.parametrize("after_commit", [True, False], ids=["drop-after-commit", "drop-before-commit"])
def test_drop_after_body_drops_a_rejected_upload_too(tmp_path, after_commit):
    # "The next N uploads have their connection closed after the body is read":
    # whatever the verdict would have been, the answer is lost.
    with LocalTracesService(tmp_path / "t.db", drop_after_body=1, drop_after_commit=after_commit) as svc:
        with pytest.raises(requests.ConnectionError):
            post_upload(svc.url, [trace("t-1"), b"not json"])
        assert post_upload(svc.url, [trace("t-1"), b"not json"]).status_code == 400


def test_drop_after_body_counts_down(tmp_path):
    with LocalTracesService(tmp_path / "t.db", drop_after_body=2, drop_after_commit=False) as svc:
        for _ in range(2):
            with pytest.raises(requests.ConnectionError):
                post_upload(svc.url, [trace("t-1")])
        assert post_upload(svc.url, [trace("t-1")]).status_code == 201


def test_on_upload_is_called_with_the_key_of_each_upload(tmp_path):
    seen: list[str] = []
    bodies = [jsonl([trace("t-1")]), jsonl([trace("t-2")])]
    with LocalTracesService(tmp_path / "t.db", on_upload=seen.append) as svc:
        for body in bodies:
            assert post_upload(svc.url, body).status_code == 201
        assert post_upload(svc.url, bodies[0]).status_code == 200
        assert post_upload(svc.url, bodies[1], key="sha256:bad").status_code == 400  # refused before it
    assert seen == [digest_key(bodies[0]), digest_key(bodies[1]), digest_key(bodies[0])]


def test_store_none_checks_everything_and_keeps_no_documents(tmp_path):
    docs = [trace("t-1"), trace("t-2")]
    with LocalTracesService(tmp_path / "t.db", store="none") as svc:
        resp = post_upload(svc.url, [trace("t-1"), b"not json"])
        assert resp.status_code == 400
        assert (resp.json()["error"]["code"], resp.json()["error"]["line"]) == ("invalid_trace", 2)
        resp = post_upload(svc.url, [trace("t-1"), trace("t-1")])
        assert resp.json()["error"]["code"] == "duplicate_trace_id"
        resp = post_upload(svc.url, docs, key=digest_key(b"x"))
        assert resp.json()["error"]["code"] == "digest_mismatch"
        first = post_upload(svc.url, docs)
        assert first.status_code == 201
        assert stored_rows(svc) == {"uploads": 1, "traces": 0, "trace_docs": 0, "episodes": 0}
        again = post_upload(svc.url, docs)
        assert again.status_code == 200
        assert again.json() == first.json()
        assert (svc.stats()["uploads"], svc.stats()["replays"], svc.stats()["lines"]) == (1, 1, 2)


def test_validate_light_needs_store_none():
    with pytest.raises(ValueError):
        LocalTracesService(validate="light")


def test_validate_light_parses_no_json_but_checks_the_bytes(tmp_path):
    lines = [b"not json at all", b"[1, 2", trace("t-1"), trace("t-1")]
    with LocalTracesService(tmp_path / "t.db", store="none", validate="light") as svc:
        first = post_upload(svc.url, lines)
        assert first.status_code == 201, first.text
        assert post_upload(svc.url, lines, coding="zstd").json() == first.json()  # a replay
        resp = post_upload(svc.url, lines[:3], key=digest_key(b"x"))
        assert (resp.status_code, resp.json()["error"]["code"]) == (400, "digest_mismatch")
        resp = post_upload(svc.url, lines[:3], encoded=b"not gzip")
        assert (resp.status_code, resp.json()["error"]["code"]) == (400, "malformed_encoding")
        assert svc.stats()["uploads"] == 1


def test_validate_light_still_applies_the_row_limit_and_the_marker(tmp_path):
    with LocalTracesService(tmp_path / "t.db", store="none", validate="light", reject_marker="BAD") as svc:
        assert post_upload(svc.url, b"x\n" * MAX_ROWS_PER_UPLOAD, coding="zstd").status_code == 201
        resp = post_upload(svc.url, b"y\n" * (MAX_ROWS_PER_UPLOAD + 1), coding="zstd")
        assert (resp.status_code, resp.json()["error"]["code"]) == (400, "too_many_traces_in_upload")
        resp = post_upload(svc.url, b"a\nb\nc BAD\n")
        error = resp.json()["error"]
        assert (resp.status_code, error["code"], error["line"]) == (400, "invalid_trace", 3)


def test_validate_light_counts_records_as_full_validation_does(tmp_path):
    # Whitespace-only lines are no records (the client skips them; full
    # validation skips them), so they must not count toward the row limit.
    body = jsonl([trace("t-1")]) + b"\n  \n\r\n" + jsonl([trace("t-2")])
    with LocalTracesService(tmp_path / "full.db") as full:
        full_receipt = post_upload(full.url, body).json()
    with LocalTracesService(tmp_path / "light.db", store="none", validate="light") as light:
        light_receipt = post_upload(light.url, body).json()
    assert full_receipt["lines"] == 2
    assert light_receipt == full_receipt
    with LocalTracesService(tmp_path / "light2.db", store="none", validate="light") as light:
        padded = b"x\n" * MAX_ROWS_PER_UPLOAD + b"\n" * 10
        assert post_upload(light.url, padded, coding="zstd").status_code == 201
