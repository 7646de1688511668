"""Upload requests byte by byte (contract §2), malformed ones included.

:func:`build_upload` produces exactly the request the published client sends,
and every knob that a malformed request needs: a wrong key, a coding the
service does not know, bytes that are not what the coding says, missing or
extra parts. :func:`post_upload` sends one with ``requests``::

    body, headers = build_upload([trace("t-1")], coding="zstd")
    resp = post_upload(svc.url, request=(body, headers))
    assert resp.status_code == 201
"""

from __future__ import annotations

import gzip
import hashlib
import json
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import requests
import zstandard

DEFAULT_TOKEN = "test-token"
DEFAULT_TIMEOUT_S = 30.0
UPLOAD_PATH = "/api/v1/traces"
ACCEPT_ENCODING = "zstd, gzip"

Lines = bytes | Iterable[dict[str, Any] | str | bytes]


def jsonl(lines: Lines) -> bytes:
    """The uncompressed ``traces`` body: compact JSON per document, each ending in LF.

    ``bytes`` is taken as the whole body verbatim; ``str``/``bytes`` items are
    lines taken verbatim (an LF is appended).
    """
    if isinstance(lines, (bytes, bytearray, memoryview)):
        return bytes(lines)
    out = bytearray()
    for line in lines:
        if isinstance(line, dict):
            out += json.dumps(line, separators=(",", ":"), ensure_ascii=False).encode()
        elif isinstance(line, str):
            out += line.encode()
        else:
            out += line
        out += b"\n"
    return bytes(out)


def digest_key(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


def encode(body: bytes, coding: str) -> bytes:
    """``body`` in ``coding``; any other coding leaves the bytes as they are."""
    if coding == "gzip":
        return gzip.compress(body, compresslevel=1, mtime=0)
    if coding == "zstd":
        return zstandard.ZstdCompressor(level=1).compress(body)
    return body


def build_upload(
    lines_or_body: Lines,
    *,
    line_format: str | None = None,
    coding: str = "gzip",
    key: str | None = None,
    omit_key: bool = False,
    metadata: dict[str, Any] | bytes | None = None,
    context: dict[str, str] | None = None,
    omit_metadata: bool = False,
    omit_traces: bool = False,
    extra_parts: Sequence[tuple[str, bytes]] = (),
    encoded: bytes | None = None,
) -> tuple[bytes, dict[str, str]]:
    """``(request body, headers)`` of one upload, without Authorization.

    - ``key``: the Idempotency-Key verbatim; default ``sha256:`` of the
      uncompressed body. ``omit_key`` leaves the header out.
    - ``line_format``: the X-Prime-Line-Format value; None leaves it out.
    - ``coding``: ``gzip``, ``zstd``, ``none`` (no Content-Encoding on the
      part), or any other string, sent as the part's coding over raw bytes.
    - ``encoded``: the part's bytes as sent, replacing the encoding of the
      body (broken, truncated or concatenated streams; bombs). The key is
      still computed from ``lines_or_body`` unless given.
    - ``metadata``: a dict (serialised the way the client does, with spaces)
      or raw bytes; default ``{"schema_version": 1}`` plus ``context``.
    - ``omit_metadata`` / ``omit_traces`` leave that part out.
    - ``extra_parts``: ``(name, bytes)`` parts appended after ``traces``.
    """
    body = jsonl(lines_or_body)
    boundary = uuid.uuid4().hex
    if metadata is None:
        metadata = {"schema_version": 1}
        if context:
            metadata["context"] = context
    meta_bytes = metadata if isinstance(metadata, bytes) else json.dumps(metadata).encode()
    part_bytes = encoded if encoded is not None else encode(body, coding)

    out = bytearray()
    if not omit_metadata:
        out += _part(boundary, 'form-data; name="metadata"', "application/json", None, meta_bytes)
    if not omit_traces:
        out += _part(
            boundary,
            'form-data; name="traces"; filename="traces.jsonl"',
            "application/x-ndjson",
            None if coding == "none" else coding,
            part_bytes,
        )
    for name, data in extra_parts:
        out += _part(boundary, f'form-data; name="{name}"', "application/json", None, data)
    out += f"--{boundary}--\r\n".encode()

    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    if not omit_key:
        headers["Idempotency-Key"] = key if key is not None else digest_key(body)
    if line_format is not None:
        headers["X-Prime-Line-Format"] = line_format
    return bytes(out), headers


def _part(boundary: str, disposition: str, content_type: str, coding: str | None, data: bytes) -> bytes:
    head = f"--{boundary}\r\nContent-Disposition: {disposition}\r\nContent-Type: {content_type}\r\n"
    if coding is not None:
        head += f"Content-Encoding: {coding}\r\n"
    return head.encode() + b"\r\n" + data + b"\r\n"


def auth(token: str = DEFAULT_TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def post_upload(
    url: str,
    lines_or_body: Lines | None = None,
    *,
    request: tuple[bytes, dict[str, str]] | None = None,
    token: str | None = DEFAULT_TOKEN,
    timeout: float = DEFAULT_TIMEOUT_S,
    **build: Any,
) -> requests.Response:
    """POST one upload to the service at base ``url``; ``token=None`` sends no Authorization.

    Give either documents/bytes (built with ``build_upload(**build)``) or a
    prebuilt ``request=(body, headers)``.
    """
    if request is None:
        if lines_or_body is None:
            raise ValueError("give lines_or_body or request")
        request = build_upload(lines_or_body, **build)
    body, headers = request
    headers = dict(headers)
    if token is not None:
        headers.update(auth(token))
    return requests.post(url + UPLOAD_PATH, data=body, headers=headers, timeout=timeout)


# -- documents shaped like contract §7 ------------------------------------------


def trace(id: str, **overrides: Any) -> dict[str, Any]:  # noqa: A002
    """A verifiers v1 trace record with ``timing.start`` = now; keys in ``overrides`` replace."""
    now = time.time()
    doc: dict[str, Any] = {
        "version": 1,
        "id": id,
        "task": {"type": "qa", "data": {"idx": 0, "name": "task-0"}, "key": "task-0"},
        "agent": {
            "name": "agent-a",
            "trainable": False,
            "config": {"model": "test-model", "client": {"base_url": "http://localhost:1/v1"}},
        },
        "run": {"id": "run-1", "type": "eval", "work": {"type": "step", "step": 0}},
        "nodes": [
            {"message": {"role": "user", "content": "2+2?"}, "parent": None, "sampled": False},
            {"message": {"role": "assistant", "content": "4"}, "parent": 0, "sampled": True},
        ],
        "calls": [
            {
                "node": 1,
                "model": "test-model",
                "endpoint": "chat",
                "finish_reason": "stop",
                "usage": {"input_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
                "time": {"start": now, "end": now + 0.5},
            }
        ],
        "tools": [],
        "rewards": {"correct": {"score": 1.0, "weight": 1.0}},
        "metrics": {},
        "info": {},
        "is_completed": True,
        "ok": True,
        "stop_condition": "completed",
        "errors": [],
        "timing": {
            "start": now,
            "boot": 0.0,
            "setup": 0.0,
            "agent": 0.5,
            "finalize": 0.0,
            "scoring": {"start": now + 0.5, "end": now + 0.6},
        },
    }
    doc.update(overrides)
    return doc


def episode(id: str, traces: list[dict[str, Any]], **overrides: Any) -> dict[str, Any]:  # noqa: A002
    """An episode envelope holding ``traces``; keys in ``overrides`` replace."""
    doc: dict[str, Any] = {
        "version": 1,
        "id": id,
        "env": {"id": "env-1", "name": "arith"},
        "task": {"type": "qa", "data": {"idx": 0}, "key": "task-0"},
        "group": {"id": "group-1"},
        "run": {"id": "run-1", "type": "eval"},
        "ok": True,
        "errors": [],
        "outcome": "completed",
        "traces": traces,
        "info": {},
    }
    doc.update(overrides)
    return doc
