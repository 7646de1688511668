"""Sending one batch: its settings, its multipart body and coding, its retries and window slot.

:class:`Sender` runs on the request pool's threads: it hashes, compresses
and posts one batch, retrying as ``upload_retrying`` says, and holds a slot
of the client's :class:`~prime_traces._upload.window.InFlightWindow` for each
attempt on the wire. :class:`~prime_traces._upload.uploader.Upload` keeps the
window of batches in order around it.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from prime_traces._api.models import UploadReceipt
from prime_traces._http.retry import DEFAULT_UPLOAD_ATTEMPTS, is_refusal, upload_retrying
from prime_traces._http.transport import Transport
from prime_traces._upload.batching import (
    DEFAULT_TARGET_BATCH_BYTES,
    MAX_BATCH_BYTES,
    Batch,
)
from prime_traces._upload.compress import (
    ZSTD,
    CodingSelector,
    compress,
    content_encoding_header,
)
from prime_traces._upload.levels import AdaptiveLevel
from prime_traces._upload.window import OK, OTHER, REFUSED, InFlightWindow
from prime_traces.errors import (
    APIError,
    RetryableAPIError,
    TransportError,
)

LINE_FORMATS = ("trace", "episode")
#: How long a batch may be refused (429, 503 refusals) in a row before the upload gives up.
DEFAULT_MAX_REFUSED_S = 600.0


@dataclass(frozen=True)
class UploadSettings:
    """Everything one upload needs besides its lines."""

    line_format: str = "trace"
    context: dict[str, str] | None = None
    schema_version: int = 1
    target_batch_bytes: int = DEFAULT_TARGET_BATCH_BYTES
    max_attempts: int = DEFAULT_UPLOAD_ATTEMPTS
    #: Refusals spend no attempt; a batch refused this long in a row fails (None: never, until cancel).
    max_refused_s: float | None = DEFAULT_MAX_REFUSED_S
    #: While "auto" coding has not learnt the service's codings, cut the first batch small to learn them.
    #: False: every batch is cut at target_batch_bytes, so the batches depend on the lines alone.
    learn_coding: bool = True

    def validate(self) -> None:
        if self.line_format not in LINE_FORMATS:
            raise ValueError(f"line_format must be 'trace' or 'episode', not {self.line_format!r}")
        if not 0 < self.target_batch_bytes <= MAX_BATCH_BYTES:
            raise ValueError(f"target_batch_bytes must be within 1..{MAX_BATCH_BYTES}, not {self.target_batch_bytes}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, not {self.max_attempts}")
        if self.max_refused_s is not None and self.max_refused_s < 0:
            raise ValueError(f"max_refused_s must be at least 0 or None, not {self.max_refused_s}")
        if self.context is not None and not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.context.items()
        ):
            raise ValueError("context must map strings to strings")

    def metadata(self) -> bytes:
        # The reference client writes it with spaces after separators.
        meta: dict[str, Any] = {"schema_version": self.schema_version}
        if self.context:
            meta["context"] = self.context
        return json.dumps(meta).encode()


class Sender:
    """Sends one batch with retries; runs on pool threads.

    Every attempt holds a slot of the client's :class:`InFlightWindow` while
    its request is on the wire (not while it waits to retry), and tells the
    window how it went.
    """

    def __init__(
        self,
        transport: Transport,
        selector: CodingSelector,
        window: InFlightWindow,
        *,
        zstd_level: int | None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self.transport = transport
        self.selector = selector
        self.window = window
        #: A pinned zstd level, or None: the level adapts to the link (:class:`AdaptiveLevel`).
        self.zstd_level = zstd_level
        self.levels = AdaptiveLevel()
        self.sleep = sleep
        self.url = transport.config.base_url + "/api/v1/traces"

    def send(
        self, batch: Batch, settings: UploadSettings, cancel: threading.Event | None, reserved: bool = False
    ) -> UploadReceipt:
        """Send ``batch`` until it commits, fails for good, or ``cancel`` is set.

        ``reserved``: the caller holds a window reservation for the first attempt.
        """
        metadata = settings.metadata()
        retrying = upload_retrying(
            settings.max_attempts,
            cancel=cancel,
            sleep=self.sleep,
            refusals_free=True,
            max_refused_s=settings.max_refused_s,
        )
        reservation = [reserved]
        return retrying(self._attempt, batch, metadata, settings.line_format, cancel, reservation)

    def _attempt(
        self, batch: Batch, metadata: bytes, line_format: str, cancel: threading.Event | None, reservation: list[bool]
    ) -> UploadReceipt:
        reserved, reservation[0] = reservation[0], False
        ticket = self.window.acquire(cancel, reserved=reserved)
        if ticket is None:
            raise TransportError("upload cancelled before the request was sent")
        outcome = OTHER
        try:
            receipt = self._send_coded(batch, metadata, line_format)
            outcome = OK
            return receipt
        except RetryableAPIError as err:
            outcome = REFUSED if is_refusal(err) else OTHER
            raise
        finally:
            self.window.release(ticket, outcome)

    def _send_coded(self, batch: Batch, metadata: bytes, line_format: str) -> UploadReceipt:
        coding = self.selector.current()
        try:
            return self._post(batch, batch.key, metadata, line_format, coding)
        except APIError as err:
            if err.status_code == 415 and coding == ZSTD:
                self.selector.refused(ZSTD)
                return self._post(batch, batch.key, metadata, line_format, self.selector.current())
            raise

    def _post(self, batch: Batch, key: str, metadata: bytes, line_format: str, coding: str) -> UploadReceipt:
        boundary = uuid.uuid4().hex
        encoding = content_encoding_header(coding)
        part_headers = 'Content-Disposition: form-data; name="traces"; filename="traces.jsonl"\r\n'
        part_headers += "Content-Type: application/x-ndjson\r\n"
        if encoding:
            part_headers += f"Content-Encoding: {encoding}\r\n"
        head = (
            (
                f'--{boundary}\r\nContent-Disposition: form-data; name="metadata"\r\n'
                f"Content-Type: application/json\r\n\r\n"
            ).encode()
            + metadata
            + f"\r\n--{boundary}\r\n{part_headers}\r\n".encode()
        )
        level = self.zstd_level if self.zstd_level is not None else self.levels.current()
        cpu_started = time.thread_time()
        compressed = compress(batch.data, coding, zstd_level=level)
        cpu_s = time.thread_time() - cpu_started
        body = b"".join((head, compressed, f"\r\n--{boundary}--\r\n".encode()))
        body_bytes = len(compressed)
        del compressed
        headers = {"Idempotency-Key": key, "Content-Type": f"multipart/form-data; boundary={boundary}"}
        if line_format == "episode":
            headers["X-Prime-Line-Format"] = "episode"
        sent = time.monotonic()
        resp = self.transport.request("POST", self.url, data=body, headers=headers)
        if coding == ZSTD and self.zstd_level is None and resp.status_code < 300:
            self.levels.observe(level, batch.size_bytes, cpu_s, time.monotonic() - sent, body_bytes)
        self.selector.observe(resp.headers)
        try:
            payload = orjson.loads(resp.content)
            return UploadReceipt.from_dict(payload)
        except (orjson.JSONDecodeError, TypeError, ValueError, KeyError) as err:
            # The batch may be stored: resending is safe (a replay) and gets the receipt.
            raise TransportError(f"upload answered {resp.status_code} without a valid receipt") from err
