"""``POST /api/v1/traces``: all or nothing, the order of the checks, 401 and 415 (contract §2, §6, §9)."""

from __future__ import annotations

import pytest
from _upload_checks import (
    assert_nothing_stored,
    committed,
    counts,
    error_of,
    line_error,
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

from prime_traces.server import LocalTracesService

# -- all or nothing ---------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["trace", "episode"])
def test_a_rejected_upload_stores_nothing_and_is_not_remembered(service, fmt):
    if fmt == "trace":
        good = [trace(f"t-{i}") for i in range(5)]
        bad, code, record_id = good + [trace("t-1")], "duplicate_trace_id", "t-1"
    else:
        good = [episode(f"ep-{i}", [trace(f"m-{i}")]) for i in range(5)]
        bad = good + [episode("ep-9", [trace("m-9", timing=None)])]
        code, record_id = "created_at_out_of_window", "ep-9"
    header = "episode" if fmt == "episode" else None
    for _ in range(2):  # the same bytes get the same verdict: nothing was remembered
        line_error(post_upload(service.url, bad, line_format=header), code, 6, record_id)
        assert_nothing_stored(service)
    committed(post_upload(service.url, good, line_format=header), jsonl(good))
    assert service.stats()["replays"] == 0
    assert counts(service)["uploads"] == 1


# -- verification order -----------------------------------------------------------


def test_key_syntax_is_checked_before_the_body(service):
    resp = post_upload(service.url, b"", key="sha256:nope", omit_metadata=True, encoded=b"not gzip")
    error_of(resp, 400, "invalid_idempotency_key")


def test_metadata_part_is_checked_before_decoding(service):
    resp = post_upload(service.url, [trace("t-1")], omit_metadata=True, encoded=b"not gzip")
    error_of(resp, 400, "invalid_metadata")


def test_decoding_is_checked_before_the_digest(service):
    resp = post_upload(service.url, [trace("t-1")], key=digest_key(b"x"), encoded=b"not gzip")
    error_of(resp, 400, "malformed_encoding")


def test_size_is_checked_before_the_digest(service):
    encoded = zeros_stream("zstd", 257)
    resp = post_upload(service.url, b"", coding="zstd", encoded=encoded, key=digest_key(b"x"))
    error_of(resp, 400, "upload_too_large")


def test_digest_is_checked_before_metadata_and_lines(service):
    lines = [b"not json", trace("t-1"), trace("t-1")]
    resp = post_upload(service.url, lines, key=digest_key(b"x"), metadata={"schema_version": 99})
    error_of(resp, 400, "digest_mismatch")


def test_metadata_is_checked_before_lines(service):
    resp = post_upload(service.url, [b"not json"], metadata={"schema_version": 2})
    error_of(resp, 400, "unsupported_schema_version")


def test_a_replay_is_answered_before_metadata_and_line_checks(service):
    docs = [trace("t-1"), trace("t-2")]
    receipt = committed(post_upload(service.url, docs), jsonl(docs))
    # These bytes would now fail line validation, and this metadata would fail too.
    service.faults.reject_marker = '"t-2"'
    resp = post_upload(service.url, docs, metadata={"schema_version": 2, "context": [1]})
    assert committed(resp, jsonl(docs), status=200) == receipt
    assert service.stats()["replays"] == 1


# -- 401, 415 ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "authorization",
    [None, "", "Bearer", "Bearer    ", "Basic dGVzdDp0ZXN0", "test-token"],
    ids=["missing", "empty", "scheme-only", "blank-token", "basic", "no-scheme"],
)
def test_upload_without_a_bearer_token_is_unauthenticated(service, authorization):
    body, headers = build_upload([trace("t-1")], key="sha256:bad")  # auth comes first
    if authorization is not None:
        headers["Authorization"] = authorization
    error_of(post_upload(service.url, request=(body, headers), token=None), 401, "unauthenticated")
    assert_nothing_stored(service)


def test_wrong_token_is_unauthenticated_when_an_api_key_is_set(tmp_path):
    docs = [trace("t-1")]
    with LocalTracesService(tmp_path / "t.db", api_key="s3cret") as svc:
        for token in ("test-token", "s3cre", "s3cret2", "S3CRET"):
            error_of(post_upload(svc.url, docs, token=token), 401, "unauthenticated")
        assert_nothing_stored(svc)
        committed(post_upload(svc.url, docs, token="s3cret"), jsonl(docs))


@pytest.mark.parametrize("coding", ["br", "deflate", "compress", "identity-ish", "gzip, zstd"])
def test_unknown_content_encoding_is_415_with_accept_encoding(service, coding):
    resp = post_upload(service.url, [trace("t-1")], coding=coding)
    assert resp.status_code == 415, resp.text
    assert resp.headers.get("Accept-Encoding") == ACCEPT_ENCODING
    assert "error" in resp.json()
    assert_nothing_stored(service)
