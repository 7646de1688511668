"""Legacy training samples (contract §10): presigned uploads of Parquet files, played locally.

A training run on an account without Prime Traces sends its samples as one
Parquet file per step, in three requests:

1. ``POST /rft/samples/presign`` with ``{"run_id", "step"}`` answers
   ``{"data": {"presignedUrl", "s3Key", "expiresIn"}}``. The URL points back
   at this service, at ``/_storage/train-samples/<token>``, and is good for
   ``expiresIn`` seconds (:data:`PRESIGN_EXPIRES_S`).
2. ``PUT <presignedUrl>`` with the file's bytes, without credentials: the
   token in the URL is the credential, as with the object store's presigned
   URLs. An unknown or expired token is 403 ``forbidden``; a file over
   :data:`MAX_SAMPLE_FILE_BYTES` is 400 ``upload_too_large``; a PUT again
   replaces the bytes. It answers 200 with an empty body.
3. ``POST /rft/samples/confirm`` with ``{"run_id", "step", "s3_key"}``
   records the file as part of the run. Confirming it again is a success;
   a key this run was not given is 404 ``not_found``; a step that is not the
   presigned one, or a file not uploaded yet, is 400 ``invalid_run``.

A step may have several files (each presign gives a new key), as on the
platform, where the viewer unions a step's files. ``GET
/api/v1/runs/{id}/sample-files?limit=&cursor=`` (a local addition) pages a
run's files in step order: ``{"items": [{"s3_key", "step", "size_bytes",
"sha256", "created_at", "uploaded_at", "confirmed_at"}], "next_cursor"}``.

The database keeps a SHA-256 of each URL token, never the token; the URL
appears in no log.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from typing import Any

from prime_traces.errors import ErrorCode
from prime_traces.server import _models as m
from prime_traces.server._http import HTTPError, Request, Response, json_response, open_route, platform_routes, route
from prime_traces.server._metrics import INT64_MIN, require_run
from prime_traces.server._pages import keyset_page
from prime_traces.server._platform import integer, invalid, json_object, required_string, run_of_kind

logger = logging.getLogger(__name__)

PRESIGN_EXPIRES_S = 900
MAX_SAMPLE_FILE_BYTES = 256 * 1024 * 1024
STORAGE_PATH = "/_storage/train-samples/"
_SUCCESS = "success"
_FILES_SQL = (
    "SELECT * FROM (SELECT rowid AS seq, s3_key, step, size_bytes, sha256, created_at, uploaded_at, "
    "confirmed_at FROM train_sample_files WHERE run_id = ?)"
)


def _token_digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def _step(body: dict[str, Any]) -> int:
    step = integer(body, "step", required=True, minimum=INT64_MIN)
    assert step is not None  # required=True
    return step


def presign(req: Request) -> Response:
    body = json_object(req)
    run_id = required_string(body, "run_id")
    step = _step(body)
    token = secrets.token_urlsafe(32)
    s3_key = f"runs/{run_id}/step-{step}/{secrets.token_hex(8)}.parquet"
    now = time.time()
    with req.state.store.writer() as conn:
        run_of_kind(conn, run_id, "train", adopt=False)
        conn.execute(
            "INSERT INTO train_sample_files (s3_key, run_id, step, token_sha256, expires_at, created_at, created_by) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (s3_key, run_id, step, _token_digest(token), now + PRESIGN_EXPIRES_S, now, req.producer),
        )
    logger.debug("run %r step %d: sample file %s presigned", run_id, step, s3_key)
    url = f"{req.base_url()}{STORAGE_PATH}{token}"
    return json_response(200, {"data": {"presignedUrl": url, "s3Key": s3_key, "expiresIn": PRESIGN_EXPIRES_S}})


def _forbidden() -> HTTPError:
    return HTTPError(403, ErrorCode.FORBIDDEN, "this upload URL is unknown or has expired; presign a new one")


def put_file(req: Request) -> Response:
    digest = _token_digest(req.params["token"])
    with req.state.store.reader() as conn:
        row = conn.execute(
            "SELECT s3_key, expires_at FROM train_sample_files WHERE token_sha256 = ?", (digest,)
        ).fetchone()
    if row is None or row["expires_at"] < time.time():
        raise _forbidden()
    length = req.body_length()
    if length is None:
        raise HTTPError(411, None, "send the file with a Content-Length")
    if length > MAX_SAMPLE_FILE_BYTES:
        raise HTTPError(
            400, ErrorCode.UPLOAD_TOO_LARGE, f"the file is {length:,} bytes; at most {MAX_SAMPLE_FILE_BYTES:,}"
        )
    data = bytes(req.read_body(length))
    with req.state.store.writer() as conn:
        conn.execute("INSERT OR REPLACE INTO train_sample_data (s3_key, data) VALUES (?, ?)", (row["s3_key"], data))
        conn.execute(
            "UPDATE train_sample_files SET size_bytes = ?, sha256 = ?, uploaded_at = ? WHERE s3_key = ?",
            (len(data), hashlib.sha256(data).hexdigest(), time.time(), row["s3_key"]),
        )
    logger.debug("sample file %s: %d bytes stored", row["s3_key"], len(data))
    return Response(200, b"", content_type=None)


def confirm(req: Request) -> Response:
    body = json_object(req)
    run_id = required_string(body, "run_id")
    step = _step(body)
    s3_key = required_string(body, "s3_key")
    with req.state.store.writer() as conn:
        run_of_kind(conn, run_id, "train", adopt=False)
        row = conn.execute(
            "SELECT step, uploaded_at, confirmed_at FROM train_sample_files WHERE s3_key = ? AND run_id = ?",
            (s3_key, run_id),
        ).fetchone()
        if row is None:
            raise HTTPError(404, ErrorCode.NOT_FOUND, f"run {run_id!r} was given no sample file {s3_key!r}")
        if row["step"] != step:
            raise invalid(f"{s3_key!r} was presigned for step {row['step']}, not {step}")
        if row["uploaded_at"] is None:
            raise invalid(f"nothing was uploaded to {s3_key!r}; PUT the file to its presigned URL first")
        if row["confirmed_at"] is None:
            conn.execute("UPDATE train_sample_files SET confirmed_at = ? WHERE s3_key = ?", (time.time(), s3_key))
    return json_response(200, {"data": {"status": _SUCCESS, "s3_key": s3_key, "step": step}})


def _iso_or_none(epoch: float | None) -> str | None:
    return m.iso(epoch) if epoch is not None else None


def list_files(req: Request) -> Response:
    run_id = req.params["run_id"]
    with req.state.store.reader() as conn:
        conn.execute("BEGIN")
        require_run(conn, run_id)
        rows, cursor = keyset_page(
            conn,
            req.query,
            select=_FILES_SQL,
            where=[],
            args=[run_id],
            scope=f"sample-files:{run_id}",
            filters={},
            keys=("step", "seq"),
            key_types=(int, int),
            descending=False,
        )
    items = [
        {
            "s3_key": r["s3_key"],
            "step": r["step"],
            "size_bytes": r["size_bytes"],
            "sha256": r["sha256"],
            "created_at": m.iso(r["created_at"]),
            "uploaded_at": _iso_or_none(r["uploaded_at"]),
            "confirmed_at": _iso_or_none(r["confirmed_at"]),
        }
        for r in rows
    ]
    return json_response(200, {"items": items, "next_cursor": cursor})


ROUTES = [
    *platform_routes("POST", "/rft/samples/presign", presign),
    *platform_routes("POST", "/rft/samples/confirm", confirm),
    open_route("PUT", STORAGE_PATH + "{token}", put_file),
    route("GET", "/runs/{run_id}/sample-files", list_files),
]
