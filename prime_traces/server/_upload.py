"""``POST /api/v1/traces``: the upload, checked in the contract's order (§2).

auth (in the dispatcher) → in-flight limit → key syntax → body (bounded) →
injected faults → multipart → decoding → size → digest → idempotent replay
or conflict → metadata → lines → all-or-nothing commit.

Memory: the body is read as it arrives and charged to the service's budget
(``_body``); once decoded, a compressed body is freed, and an uncompressed
one *is* the decoded bytes. Lines are validated without keeping them, then
parsed again a chunk at a time as they are stored.
"""

from __future__ import annotations

import codecs
import functools
import hashlib
import logging
import re
import time
from typing import Any

import orjson

from prime_traces.errors import ErrorCode
from prime_traces.server._decode import decode_body
from prime_traces.server._extract import UploadMeta
from prime_traces.server._faults import Faults
from prime_traces.server._http import (
    HTTPError,
    Request,
    Response,
    drop_connection,
    json_response,
    retry_after_value,
    route,
)
from prime_traces.server._ingest import iter_rows, validate_full, validate_light
from prime_traces.server._store import UploadRecord

logger = logging.getLogger(__name__)

_KEY_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
# Decoded a slice at a time, no big str is built: 64 KiB slices check mostly-ASCII JSON at ~0.3 ms/MB, 1 MiB
# slices at ~0.5 (their str is built wider as soon as one character needs it), the whole body at once at ~2.
_UTF8_SLICE_BYTES = 64 << 10
_LINE_FORMATS = {None: "trace", "trace": "trace", "episode": "episode"}
# The code of an injected failure: 429 and 503 are refusals; the rest carry none.
_INJECTED_CODES = {429: ErrorCode.RATE_LIMITED, 503: ErrorCode.INGEST_CAPACITY_EXCEEDED}


def post_traces(req: Request) -> Response:
    state = req.state
    length = req.body_length()
    if length is None:
        req.handler.close_after_response()
        raise HTTPError(411, None, "Content-Length is required; chunked uploads are not accepted")
    if length > state.max_body_bytes:
        # Refused before reading: the connection is closed rather than drained.
        req.handler.close_after_response()
        raise HTTPError(
            400, ErrorCode.UPLOAD_TOO_LARGE, f"request body of {length} bytes is over {state.max_body_bytes}"
        )
    if not state.limiter.try_acquire(req.producer):
        req.handler.drain_body()
        retry_after = state.saturated_retry_after_s
        raise HTTPError(
            503,
            ErrorCode.WRITER_POOL_SATURATED,
            f"more than {state.limiter.limit} uploads in flight for this credential; retry later",
            headers={"Retry-After": retry_after_value(retry_after)},
        )
    try:
        return _upload(req, length)
    finally:
        state.limiter.release(req.producer)


def _upload(req: Request, length: int) -> Response:
    state, faults = req.state, req.state.faults
    key = req.header("Idempotency-Key") or ""
    if not _KEY_RE.match(key):
        raise HTTPError(
            400, ErrorCode.INVALID_IDEMPOTENCY_KEY, "Idempotency-Key must be 'sha256:' and 64 lowercase hex digits"
        )
    raw_format = req.header("X-Prime-Line-Format")
    link_mb_s = faults.link_mb_s
    # The link's rate is read at each chunk: lifting the cap speeds up the bodies being read too.
    shared = functools.partial(_pass_link, faults) if link_mb_s else None
    body = req.read_body(length, faults.bandwidth_mb_s, shared, link_mb_s * 1e6 if link_mb_s else None)
    state.stats.count_upload_attempt(length)
    if faults.before_upload is not None:
        faults.before_upload()
    if faults.on_upload is not None:
        faults.on_upload(key)
    if faults.hang_uploads:
        state.stopping.wait()
        drop_connection()
    if faults.take_failure():
        code = _INJECTED_CODES.get(faults.fail_status)
        headers = {}
        if faults.fail_retry_after_s is not None:
            headers["Retry-After"] = retry_after_value(faults.fail_retry_after_s)
        raise HTTPError(faults.fail_status, code, "injected failure; retry later", headers=headers)
    dropping = faults.take_drop()
    if dropping and not faults.drop_after_commit:
        drop_connection()
    wire = [body]
    del body  # _process holds the only reference, so it can free the wire bytes once decoded
    try:
        return _process(req, wire, key[len("sha256:") :], raw_format)
    finally:
        if dropping:
            # Whatever the verdict, the answer is lost with the connection.
            drop_connection()


def _process(req: Request, wire: list[bytearray], digest: str, raw_format: str | None) -> Response:
    state = req.state
    line_format = _LINE_FORMATS.get(raw_format.strip().lower() if raw_format else None)
    body = wire.pop()
    wire_bytes = len(body)
    metadata, data = decode_body(body, req.header("Content-Type"), state.max_uncompressed_bytes, req.charge)
    if data is not body:
        del body
        req.charge.give(wire_bytes)
    _check_utf8(data)
    actual = hashlib.sha256(data).hexdigest()
    if actual != digest:
        raise HTTPError(
            400,
            ErrorCode.DIGEST_MISMATCH,
            f"Idempotency-Key is sha256:{digest} but the traces part hashes to sha256:{actual}",
        )
    if line_format is None:
        raise HTTPError(
            400, ErrorCode.INVALID_METADATA, f"X-Prime-Line-Format must be absent or 'episode', not {raw_format!r}"
        )
    existing = state.store.find_upload(digest)
    if existing is not None:
        return _replay(req, existing, line_format)
    schema_version, context = _metadata(metadata)
    meta = UploadMeta(
        upload_id=digest,
        line_format=line_format,
        context=context,
        schema_version=schema_version,
        producer=req.producer,
        now=time.time(),
        reject_marker=state.faults.reject_marker.encode() if state.faults.reject_marker else None,
        reject_omit_line=state.faults.reject_omit_line,
        reject_first_only=state.faults.reject_first_only,
    )
    validate = validate_light if state.validate_mode == "light" else validate_full
    result = validate(data, meta)
    receipt = {"upload_id": digest, "status": "committed", "line_format": line_format, "lines": result.lines}
    record = UploadRecord(
        digest, line_format, receipt, req.producer, context, schema_version, result.lines, len(data), meta.now
    )
    stored, created = state.store.commit_upload(
        record, iter_rows(data, meta), keep_documents=state.store_mode == "sqlite"
    )
    if not created:
        return _replay(req, stored, line_format)
    state.stats.count_commit(result.lines, len(data))
    return json_response(201, receipt)


def _replay(req: Request, existing: UploadRecord, line_format: str) -> Response:
    if existing.line_format != line_format:
        raise HTTPError(
            409,
            ErrorCode.LINE_FORMAT_CONFLICT,
            f"these bytes were committed as {existing.line_format} lines, not {line_format}",
        )
    req.state.stats.count_replay()
    return json_response(200, existing.receipt)


def _metadata(raw: bytes) -> tuple[int, dict[str, str]]:
    try:
        metadata: Any = orjson.loads(raw)
    except orjson.JSONDecodeError as err:
        raise HTTPError(400, ErrorCode.INVALID_METADATA, f"metadata is not JSON: {err}") from None
    if not isinstance(metadata, dict):
        raise HTTPError(400, ErrorCode.INVALID_METADATA, "metadata must be a JSON object")
    version = metadata.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise HTTPError(400, ErrorCode.INVALID_METADATA, "metadata.schema_version must be an integer")
    if version != 1:
        raise HTTPError(400, ErrorCode.UNSUPPORTED_SCHEMA_VERSION, f"schema_version {version} is not supported; use 1")
    context = metadata.get("context", {})
    if context is None:
        context = {}
    if not isinstance(context, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in context.items()):
        raise HTTPError(400, ErrorCode.INVALID_METADATA, "metadata.context must map strings to strings")
    return version, context


def _check_utf8(data: bytes | bytearray) -> None:
    """400 ``malformed_encoding`` unless ``data`` is UTF-8; checked in slices, so no big str is built.

    Each slice is decoded where it lies (a sequence cut by the slice's end
    starts the next one): an incremental decoder would copy every slice first.
    """
    if data.isascii():
        return
    view = memoryview(data)
    start, size = 0, len(data)
    try:
        while start < size:
            end = min(start + _UTF8_SLICE_BYTES, size)
            start += codecs.utf_8_decode(view[start:end], "strict", end == size)[1]
    except UnicodeDecodeError as err:
        raise HTTPError(
            400, ErrorCode.MALFORMED_ENCODING, f"traces part is not UTF-8 at byte {start + err.start}"
        ) from None


ROUTES = [route("POST", "/traces", post_traces)]


def _pass_link(faults: Faults, n: int) -> float:
    """How long ``n`` more bytes of a body wait for the shared link, at its rate now (0 once it is lifted)."""
    return faults.link.pass_bytes(n, faults.link_mb_s)
