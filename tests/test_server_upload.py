"""``POST /api/v1/traces`` on the local service, over real HTTP (contract §2, §6, §8, §9).

Every 400 the service can produce has a test that asserts its code and, for
a line, the 1-based line number and the record's id; the order tests pin the
contract's verification order where one request has two faults.
"""

from __future__ import annotations

import gzip
import http.client
import json
import socket
import time
from typing import Any

import pytest
import zstandard
from _upload_checks import (
    DAY_S,
    MIB,
    assert_nothing_stored,
    committed,
    counts,
    error_of,
    good_then,
    line_error,
    zeros_key,
    zeros_stream,
)
from _wire import (
    ACCEPT_ENCODING,
    build_upload,
    digest_key,
    episode,
    jsonl,
    post_upload,
    trace,
)

from prime_traces._lines.rules import (
    MAX_ENVIRONMENT_ID_CHARS,
    MAX_EPISODE_ID_CHARS,
    MAX_LINE_BYTES,
    MAX_ROWS_PER_UPLOAD,
    MAX_TRACES_PER_EPISODE,
)
from prime_traces.server import LocalTracesService, _upload
from prime_traces.server._http import HTTPError
from prime_traces.server._state import MAX_UNCOMPRESSED_BYTES

# -- formats and codings --------------------------------------------------------


def _gzip_members(body: bytes) -> bytes:
    half = len(body) // 2
    return gzip.compress(body[:half], mtime=0) + gzip.compress(body[half:], mtime=0)


def _zstd_streamed(body: bytes) -> bytes:
    # A streamed frame carries no content size in its header.
    comp = zstandard.ZstdCompressor(level=3).compressobj()
    return comp.compress(body) + comp.flush()


def _zstd_frames(body: bytes) -> bytes:
    cctx = zstandard.ZstdCompressor(level=1)
    third = len(body) // 3
    return b"".join(cctx.compress(p) for p in (body[:third], body[third : 2 * third], body[2 * third :]))


CODINGS = {
    "gzip": ("gzip", None),
    "gzip-two-members": ("gzip", _gzip_members),
    "zstd": ("zstd", None),
    "zstd-streamed": ("zstd", _zstd_streamed),
    "zstd-three-frames": ("zstd", _zstd_frames),
    "none": ("none", None),
}


@pytest.mark.parametrize("case", list(CODINGS))
def test_trace_upload_is_committed_and_stored_verbatim(service, case):
    coding, encoder = CODINGS[case]
    docs = [trace(f"t-{i}") for i in range(3)]
    body = jsonl(docs)
    encoded = encoder(body) if encoder else None
    resp = post_upload(service.url, docs, coding=coding, encoded=encoded, context={"k": "v"})
    committed(resp, body)
    stats = service.stats()
    assert (stats["uploads"], stats["lines"], stats["uncompressed_bytes"]) == (1, 3, len(body))
    with service.state.store.reader() as conn:
        rows = conn.execute(
            "SELECT t.trace_id, t.episode_id, t.context, d.raw FROM traces t JOIN trace_docs d USING (seq) ORDER BY seq"
        ).fetchall()
    assert [r["trace_id"] for r in rows] == ["t-0", "t-1", "t-2"]
    assert [bytes(r["raw"]) for r in rows] == body.splitlines()
    assert all(r["episode_id"] is None and r["context"] == '{"k":"v"}' for r in rows)


@pytest.mark.parametrize("coding", ["gzip", "zstd", "none"])
def test_episode_upload_is_committed_with_its_members(service, coding):
    docs = [
        episode("ep-1", [trace("m-1"), trace("m-2")]),
        episode("ep-2", [trace("m-3")], env={"id": "env-2"}),
        episode("ep-3", []),
    ]
    body = jsonl(docs)
    committed(post_upload(service.url, docs, line_format="episode", coding=coding), body)
    assert counts(service) == {
        "uploads": 1,
        "traces": 3,
        "trace_docs": 3,
        "episodes": 3,
        "episode_docs": 3,
    }
    with service.state.store.reader() as conn:
        members = conn.execute("SELECT trace_id, episode_id, environment_id FROM traces ORDER BY seq").fetchall()
    assert [tuple(r) for r in members] == [
        ("m-1", "ep-1", "env-1"),
        ("m-2", "ep-1", "env-1"),
        ("m-3", "ep-2", "env-2"),
    ]


def test_replay_returns_the_same_receipt_and_stores_nothing(service):
    docs = [trace("t-1"), trace("t-2")]
    body = jsonl(docs)
    first = post_upload(service.url, docs, coding="gzip", context={"run": "a"})
    receipt = committed(first, body)
    before = counts(service)
    # Neither the coding nor the context is covered by the digest (contract §8).
    again = post_upload(service.url, docs, coding="zstd", context={"run": "b"})
    assert committed(again, body, status=200) == receipt
    assert again.json() == first.json()
    assert counts(service) == before
    stats = service.stats()
    assert (stats["uploads"], stats["replays"], stats["lines"]) == (1, 1, 2)


@pytest.mark.parametrize("committed_as, resent_as", [(None, "episode"), ("episode", None)])
def test_same_bytes_in_the_other_format_are_a_conflict(service, committed_as, resent_as):
    # The lines are valid as committed and a line_format_mismatch as resent, so
    # the 409 also shows that the lookup comes before line validation.
    if committed_as == "episode":
        docs = [episode("ep-1", [trace("m-1")])]
    else:
        docs = [trace("t-1")]
    body = jsonl(docs)
    committed(post_upload(service.url, docs, line_format=committed_as), body)
    before = counts(service)
    error_of(post_upload(service.url, docs, line_format=resent_as), 409, "line_format_conflict")
    assert counts(service) == before
    assert (service.stats()["uploads"], service.stats()["replays"]) == (1, 0)


# -- 400: the request -----------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        None,
        "",
        "sha256:" + "A" * 64,
        "sha256:" + "a" * 63,
        "sha256:" + "a" * 65,
        "a" * 64,
        "SHA256:" + "a" * 64,
        "sha1:" + "a" * 40,
        "sha256:" + "g" * 64,
    ],
    ids=["missing", "empty", "uppercase", "short", "long", "no-prefix", "prefix-case", "sha1", "not-hex"],
)
def test_invalid_idempotency_key(service, key):
    resp = post_upload(service.url, [trace("t-1")], key=key, omit_key=key is None)
    error_of(resp, 400, "invalid_idempotency_key")
    assert_nothing_stored(service)


METADATA_CASES: dict[str, dict[str, Any]] = {
    "missing-part": dict(omit_metadata=True),
    "two-parts": dict(extra_parts=[("metadata", b'{"schema_version": 1}')]),
    "no-traces-part": dict(omit_traces=True),
    "two-traces-parts": dict(extra_parts=[("traces", b"")]),
    "not-json": dict(metadata=b"{schema_version: 1"),
    "list": dict(metadata=b'[{"schema_version": 1}]'),
    "string": dict(metadata=b'"schema_version=1"'),
    "null": dict(metadata=b"null"),
    "no-schema-version": dict(metadata={"context": {"a": "b"}}),
    "string-schema-version": dict(metadata={"schema_version": "1"}),
    "bool-schema-version": dict(metadata={"schema_version": True}),
    "fractional-schema-version": dict(metadata={"schema_version": 1.5}),
    "context-not-object": dict(metadata={"schema_version": 1, "context": ["a", "b"]}),
    "context-int-value": dict(metadata={"schema_version": 1, "context": {"step": 3}}),
    "context-null-value": dict(metadata={"schema_version": 1, "context": {"a": None}}),
}


@pytest.mark.parametrize("case", list(METADATA_CASES))
def test_invalid_metadata(service, case):
    resp = post_upload(service.url, [trace("t-1")], **METADATA_CASES[case])
    error_of(resp, 400, "invalid_metadata")
    assert_nothing_stored(service)


@pytest.mark.parametrize(
    "content_type",
    ["application/json", "multipart/form-data", "multipart/mixed; boundary=x", "text/plain; boundary=x"],
)
def test_a_body_that_is_not_multipart_form_data_is_invalid_metadata(service, content_type):
    body, headers = build_upload([trace("t-1")])
    headers["Content-Type"] = content_type
    error_of(post_upload(service.url, request=(body, headers)), 400, "invalid_metadata")
    assert_nothing_stored(service)


@pytest.mark.parametrize("version", [0, 2, -1, 10**6])
def test_unsupported_schema_version(service, version):
    resp = post_upload(service.url, [trace("t-1")], metadata={"schema_version": version})
    error_of(resp, 400, "unsupported_schema_version")
    assert_nothing_stored(service)


def _flip_last_byte(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 0xFF])


_BODY = jsonl([trace(f"t-{i}") for i in range(20)])
_GZ = gzip.compress(_BODY, mtime=0)
MALFORMED = {
    "gzip-garbage": ("gzip", _BODY, b"this is not gzip at all"),
    "gzip-truncated": ("gzip", _BODY, _GZ[: len(_GZ) // 2]),
    "gzip-no-trailer": ("gzip", _BODY, _GZ[:-8]),
    "gzip-bad-crc-or-size": ("gzip", _BODY, _flip_last_byte(_GZ)),
    "gzip-trailing-garbage": ("gzip", _BODY, _GZ + b"garbage!"),
    "gzip-empty-part": ("gzip", b"", b""),
    "zstd-garbage": ("zstd", _BODY, b"\x28\xb5\x2f\xfd" + b"\x00garbage" * 8),
    "zstd-not-zstd": ("zstd", _BODY, b"plainly not zstd"),
    "zstd-truncated": ("zstd", _BODY, zstandard.ZstdCompressor().compress(_BODY)[:-20]),
    "zstd-streamed-truncated": ("zstd", _BODY, _zstd_streamed(_BODY)[:-20]),
    "zstd-empty-part": ("zstd", b"", b""),
    "not-utf8-plain": ("none", b'{"id":"t-\xff\xfe"}\n', None),
    "not-utf8-gzip": ("gzip", b'{"id":"t-1"}\n{"id":"\xc3\x28"}\n', None),
    "not-utf8-zstd": ("zstd", b'{"id":"t-1","x":"\xed\xa0\x80"}\n', None),  # a UTF-16 surrogate
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_encoding(service, case):
    coding, body, encoded = MALFORMED[case]
    resp = post_upload(service.url, body, coding=coding, encoded=encoded)
    error_of(resp, 400, "malformed_encoding")
    assert_nothing_stored(service)


@pytest.mark.parametrize(
    "coding, mib, copies",
    [("gzip", 257, 1), ("zstd", 257, 1), ("gzip", 130, 2), ("zstd", 130, 2)],
    ids=["gzip-bomb", "zstd-bomb", "gzip-two-members", "zstd-two-frames"],
)
def test_decompression_bomb_is_upload_too_large(service, coding, mib, copies):
    # Two members/frames each under the limit must still count together.
    encoded = zeros_stream(coding, mib) * copies
    resp = post_upload(service.url, b"", coding=coding, encoded=encoded, key=zeros_key(mib * copies))
    error_of(resp, 400, "upload_too_large")
    assert_nothing_stored(service)


@pytest.mark.slow
@pytest.mark.parametrize(
    "coding, mib, copies",
    [("gzip", 256, 1), ("zstd", 256, 1), ("gzip", 128, 2), ("zstd", 128, 2)],
    ids=["gzip", "zstd", "gzip-two-members", "zstd-two-frames"],
)
def test_exactly_the_uncompressed_limit_is_not_too_large(service, coding, mib, copies):
    # 256 MiB of zeros is one 256 MiB line: past the size check, it fails as a line.
    assert MAX_UNCOMPRESSED_BYTES == 256 * MIB
    encoded = zeros_stream(coding, mib) * copies
    resp = post_upload(service.url, b"", coding=coding, encoded=encoded, key=zeros_key(256))
    line_error(resp, "trace_too_large", 1, None)


def test_body_over_max_body_bytes_is_upload_too_large(tmp_path):
    with LocalTracesService(tmp_path / "t.db", max_body_bytes=4096) as svc:
        docs = [trace(f"t-{i}") for i in range(10)]
        body, headers = build_upload(docs, coding="none")
        assert len(body) > 4096
        error_of(post_upload(svc.url, request=(body, headers)), 400, "upload_too_large")
        small = [trace("t-1")]
        committed(post_upload(svc.url, small), jsonl(small))


def test_huge_content_length_is_refused_without_reading_the_body(service):
    body, headers = build_upload([trace("t-1")])
    claimed = 10 * 1024 * MIB
    head = [
        "POST /api/v1/traces HTTP/1.1",
        f"Host: {service.url.removeprefix('http://')}",
        "Authorization: Bearer test-token",
        f"Content-Length: {claimed}",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    host, port = service.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body + bytes(64 * 1024))
        # If the service tried to read 10 GiB, this would time out instead.
        resp = http.client.HTTPResponse(sock)
        resp.begin()
        payload = resp.read()
    assert resp.status == 400
    assert resp.getheader("Accept-Encoding") == ACCEPT_ENCODING
    assert resp.getheader("Connection", "").lower() == "close"
    assert json.loads(payload)["error"]["code"] == "upload_too_large"
    assert_nothing_stored(service)


@pytest.mark.parametrize(
    "key",
    [
        digest_key(b"some other bytes\n"),
        # A plausible client bug: hashing the compressed bytes instead.
        "compressed",
    ],
)
def test_digest_mismatch(service, key):
    docs = [trace("t-1")]
    body = jsonl(docs)
    encoded = gzip.compress(body, compresslevel=1, mtime=0)
    if key == "compressed":
        key = digest_key(encoded)
    resp = post_upload(service.url, docs, key=key, encoded=encoded)
    error_of(resp, 400, "digest_mismatch")
    assert_nothing_stored(service)


# -- 400: one line ----------------------------------------------------------------


def _sized_line(size: int, record_id: str = "big", cr: bool = False) -> bytes:
    """A JSON line of exactly ``size`` bytes before its LF (a trailing CR included)."""
    start = str(time.time()).encode()
    head = b'{"id":"' + record_id.encode() + b'","timing":{"start":' + start + b'},"pad":"'
    tail = b'"}' + (b"\r" if cr else b"")
    return head + b"x" * (size - len(head) - len(tail)) + tail


@pytest.mark.slow
@pytest.mark.parametrize(
    "size, cr, accepted",
    [
        (MAX_LINE_BYTES, False, True),
        (MAX_LINE_BYTES, True, True),
        (MAX_LINE_BYTES + 1, False, False),
        (MAX_LINE_BYTES + 1, True, False),  # the CR counts toward the line (contract §2)
    ],
    ids=["at-limit", "at-limit-with-cr", "over", "over-by-the-cr"],
)
def test_trace_too_large(tmp_path, size, cr, accepted):
    body = jsonl([trace("t-1")]) + _sized_line(size, cr=cr) + b"\n"
    with LocalTracesService(tmp_path / "t.db", store="none") as svc:
        resp = post_upload(svc.url, body, coding="zstd")
        if accepted:
            committed(resp, body)
            return
        error = error_of(resp, 400, "trace_too_large")
        assert error.get("line") == 2, error
        # Contract §9 asks for the record's id "when the line had one"; an oversized line
        # need not be parsed to answer, so its id is optional, but never a wrong one.
        assert error.get("id") in (None, "big"), error
        assert svc.stats()["uploads"] == 0


def test_too_many_traces_in_upload(service):
    # An episode line counts one row plus one per member. Member contents are
    # irrelevant to the count, which precedes per-record checks (contract §2 step 9).
    first = episode("ep-1", [trace("m-1"), trace("m-2")])  # 3 rows
    members = MAX_ROWS_PER_UPLOAD - 3  # line 2 brings the total to MAX + 1
    second = b'{"id":"ep-2","traces":[' + b",".join([b"{}"] * members) + b"]}"
    body = jsonl([first, second])
    resp = post_upload(service.url, body, line_format="episode", coding="zstd")
    line_error(resp, "too_many_traces_in_upload", 2, "ep-2")
    assert_nothing_stored(service)


def test_exactly_max_rows_is_not_too_many(service):
    first = episode("ep-1", [trace("m-1"), trace("m-2")])
    members = MAX_ROWS_PER_UPLOAD - 4  # exactly MAX rows: counted, then the members fail
    second = b'{"id":"ep-2","traces":[' + b",".join([b"{}"] * members) + b"]}"
    body = jsonl([first, second])
    resp = post_upload(service.url, body, line_format="episode", coding="zstd")
    line_error(resp, "invalid_trace", 2, "ep-2")


INVALID_TRACES = {
    "not-json": (b'{"id": "t-2", ', None, "trace"),
    "json-array": (b'[{"id": "t-2"}]', None, "trace"),
    "json-string": (b'"t-2"', None, "trace"),
    "json-number": (b"42", None, "trace"),
    "json-null": (b"null", None, "trace"),
    "no-id": ({k: v for k, v in trace("x").items() if k != "id"}, None, "trace"),
    "empty-id": (trace(""), None, "trace"),
    "int-id": (trace(7), None, "trace"),  # type: ignore[arg-type]
    "null-id": (trace(None), None, "trace"),  # type: ignore[arg-type]
    "episode-no-id": (episode("", [trace("m-2")]), None, "episode"),
    "member-without-id": (episode("ep-2", [trace("m-2"), {"timing": {"start": time.time()}}]), "ep-2", "episode"),
    "member-empty-id": (episode("ep-2", [trace("")]), "ep-2", "episode"),
    "member-not-object": (episode("ep-2", [trace("m-2"), "m-3"]), "ep-2", "episode"),
}


@pytest.mark.parametrize("case", list(INVALID_TRACES))
def test_invalid_trace(service, case):
    bad, record_id, fmt = INVALID_TRACES[case]
    lines = good_then(bad, fmt=fmt)
    resp = post_upload(service.url, lines, line_format="episode" if fmt == "episode" else None)
    line_error(resp, "invalid_trace", 2, record_id)
    assert_nothing_stored(service)


def test_line_numbers_count_every_physical_line(service):
    # Blank lines and CRLF endings are lines of the body too (contract §9: the
    # number is "inside the request body").
    body = jsonl([trace("t-1")]) + b"\n   \n" + jsonl([trace("t-2")]).replace(b"\n", b"\r\n") + b"oops\n"
    line_error(post_upload(service.url, body), "invalid_trace", 5, None)


@pytest.mark.parametrize(
    "declared, bad, record_id",
    [
        (None, episode("ep-2", [trace("m-2")]), "ep-2"),
        ("episode", trace("t-2"), "t-2"),
        ("episode", episode("ep-2", None), "ep-2"),  # a 'traces' that is not a list
    ],
    ids=["episode-line-in-trace-upload", "trace-line-in-episode-upload", "episode-traces-not-list"],
)
def test_line_format_mismatch(service, declared, bad, record_id):
    lines = good_then(bad, fmt="episode" if declared else "trace")
    resp = post_upload(service.url, lines, line_format=declared)
    line_error(resp, "line_format_mismatch", 2, record_id)
    assert_nothing_stored(service)


def _timing(start: Any) -> dict[str, Any]:
    return {"start": start, "scoring": {"start": 0, "end": 0}}


WINDOW = {
    "no-timing": (lambda: {k: v for k, v in trace("t-2").items() if k != "timing"}, "trace"),
    "no-start": (lambda: trace("t-2", timing={"boot": 1.0}), "trace"),
    "start-is-string": (lambda: trace("t-2", timing=_timing("2026-01-01T00:00:00Z")), "trace"),
    "start-is-null": (lambda: trace("t-2", timing=_timing(None)), "trace"),
    "start-is-bool": (lambda: trace("t-2", timing=_timing(True)), "trace"),
    "too-old": (lambda: trace("t-2", timing=_timing(time.time() - 366 * DAY_S)), "trace"),
    "future": (lambda: trace("t-2", timing=_timing(time.time() + 3600)), "trace"),
    "milliseconds": (lambda: trace("t-2", timing=_timing(time.time() * 1000)), "trace"),
    "member-too-old": (
        lambda: episode("t-2", [trace("m-2"), trace("m-3", timing=_timing(time.time() - 400 * DAY_S))]),
        "episode",
    ),
    "member-no-timing": (lambda: episode("t-2", [trace("m-2", timing=None)]), "episode"),
}


@pytest.mark.parametrize("case", list(WINDOW))
def test_created_at_out_of_window(service, case):
    make, fmt = WINDOW[case]
    lines = good_then(make(), fmt=fmt)
    resp = post_upload(service.url, lines, line_format="episode" if fmt == "episode" else None)
    # For an episode the record of the line is the envelope, whose id is "t-2" here.
    line_error(resp, "created_at_out_of_window", 2, "t-2")
    assert_nothing_stored(service)


def test_created_at_inside_the_window_is_accepted(service):
    now = time.time()
    docs = [
        trace("old", timing=_timing(now - 364 * DAY_S)),
        trace("soon", timing=_timing(now + 240)),
        trace("int-start", timing=_timing(int(now))),
    ]
    committed(post_upload(service.url, docs), jsonl(docs))


@pytest.mark.parametrize(
    "fmt, lines, record_id",
    [
        ("trace", [trace("t-1"), trace("t-2"), trace("t-1")], "t-1"),
        ("episode", [episode("ep-1", [trace("m-1")]), episode("ep-2", [trace("m-2"), trace("m-1")])], "ep-2"),
        ("episode", [episode("ep-1", [trace("m-0")]), episode("ep-2", [trace("m-1"), trace("m-1")])], "ep-2"),
    ],
    ids=["trace-lines", "members-of-two-episodes", "members-of-one-episode"],
)
def test_duplicate_trace_id(service, fmt, lines, record_id):
    # The last line is the first one to repeat an id.
    resp = post_upload(service.url, lines, line_format="episode" if fmt == "episode" else None)
    line_error(resp, "duplicate_trace_id", len(lines), record_id)
    assert_nothing_stored(service)


def test_duplicate_episode_id(service):
    lines = [episode("ep-1", [trace("m-1")]), episode("ep-2", []), episode("ep-1", [trace("m-2")])]
    resp = post_upload(service.url, lines, line_format="episode")
    line_error(resp, "duplicate_episode_id", 3, "ep-1")
    assert_nothing_stored(service)


def test_same_id_for_an_episode_and_a_trace_is_not_a_duplicate(service):
    lines = [episode("x-1", [trace("x-1")])]
    committed(post_upload(service.url, lines, line_format="episode"), jsonl(lines))


def _members(n: int) -> list[dict[str, Any]]:
    start = time.time()
    return [{"id": f"m-{i}", "timing": {"start": start}} for i in range(n)]


@pytest.mark.parametrize("extra, accepted", [(0, True), (1, False)], ids=["at-limit", "over"])
def test_too_many_traces_in_episode(service, extra, accepted):
    lines = [episode("ep-1", [trace("a-1")]), episode("ep-2", _members(MAX_TRACES_PER_EPISODE + extra))]
    resp = post_upload(service.url, lines, line_format="episode", coding="zstd")
    if accepted:
        committed(resp, jsonl(lines))
        assert counts(service)["traces"] == MAX_TRACES_PER_EPISODE + 1
    else:
        line_error(resp, "too_many_traces_in_episode", 2, "ep-2")
        assert_nothing_stored(service)


@pytest.mark.parametrize("extra, accepted", [(0, True), (1, False)], ids=["at-limit", "over"])
def test_episode_id_too_long(service, extra, accepted):
    long_id = "e" * (MAX_EPISODE_ID_CHARS + extra)
    lines = [episode("ep-1", [trace("m-1")]), episode(long_id, [trace("m-2")])]
    resp = post_upload(service.url, lines, line_format="episode")
    if accepted:
        committed(resp, jsonl(lines))
    else:
        line_error(resp, "episode_id_too_long", 2, long_id)
        assert_nothing_stored(service)


@pytest.mark.parametrize("extra, accepted", [(0, True), (1, False)], ids=["at-limit", "over"])
def test_environment_id_too_long(service, extra, accepted):
    env_id = "v" * (MAX_ENVIRONMENT_ID_CHARS + extra)
    lines = [episode("ep-1", [trace("m-1")]), episode("ep-2", [trace("m-2")], env={"id": env_id})]
    resp = post_upload(service.url, lines, line_format="episode")
    if accepted:
        committed(resp, jsonl(lines))
    else:
        line_error(resp, "environment_id_too_long", 2, "ep-2")
        assert_nothing_stored(service)


def test_last_line_may_lack_a_newline(service):
    body = jsonl([trace("t-1"), trace("t-2")]).rstrip(b"\n")
    assert committed(post_upload(service.url, body), body)["upload_id"]
    with service.state.store.reader() as conn:
        docs = [bytes(r[0]) for r in conn.execute("SELECT raw FROM trace_docs ORDER BY seq")]
    assert docs == body.split(b"\n")


@pytest.mark.parametrize(
    ("data", "at"),
    [
        (b"\xc3\xa9" + b"a" * 98 + b"\xff" + b"b" * 10, 100),
        (b"a" * 65535 + b"\xc3(" + b"b" * 10, 65535),  # a sequence begun on a slice's last byte
        (b"\xc3\xa9" + b"a" * 131069 + b"\xe2\x82", 131071),  # cut off by the end of the body
    ],
    ids=["inside-a-slice", "across-slices", "at-the-end"],
)
def test_a_utf8_error_names_the_byte_its_sequence_begins_at(data, at):
    with pytest.raises(HTTPError, match=f"not UTF-8 at byte {at}$"):
        _upload._check_utf8(data)


@pytest.mark.parametrize("before", [1, 2, 3])
def test_utf8_sequences_cut_by_a_slice_end_are_accepted(before):
    slice_bytes = _upload._UTF8_SLICE_BYTES
    for char in ("é", "€", "🚀"):
        data = b"a" * (slice_bytes - before) + (char * 3).encode() + b"z"
        _upload._check_utf8(data)  # no error
        _upload._check_utf8(bytearray(data * 3))
