"""``TracesClient``: uploads, reads and runs against a Traces service."""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from prime_traces._api.models import UploadReceipt
from prime_traces._api.reads import ReadAPI
from prime_traces._api.runs import MAX_METRIC_ROWS_PER_REQUEST, RUN_KINDS, TERMINAL_STATUSES, RunsAPI
from prime_traces._http.retry import DEFAULT_UPLOAD_ATTEMPTS
from prime_traces._http.transport import Transport
from prime_traces._lines.encoder import encode_record_parts, is_episode
from prime_traces._lines.parts import LineLike, LineParts
from prime_traces._upload.batching import DEFAULT_TARGET_BATCH_BYTES, MAX_BATCH_BYTES, MAX_BATCH_LINES, iter_file_lines
from prime_traces._upload.body_buffers import BODY_BUFFERS
from prime_traces._upload.compress import COMPRESSION_CHOICES, CodingSelector
from prime_traces._upload.sender import DEFAULT_MAX_REFUSED_S, Sender, UploadSettings
from prime_traces._upload.uploader import DEFAULT_ABANDON_AFTER_S, Flag, OnBatch, Upload
from prime_traces._upload.window import InFlightWindow
from prime_traces.config import READ_TIMEOUT_S, resolve_config
from prime_traces.encoding import LineFormat
from prime_traces.errors import APIError, PrimeTracesError, RetryableAPIError, TransportError
from prime_traces.threads import DaemonPool

logger = logging.getLogger(__name__)

# The client and the values its knobs take, for code built on it (``prime_runs`` checks its
# own arguments against the same values before it creates anything).
__all__ = [
    "COMPRESSION_CHOICES",
    "DEFAULT_MAX_IN_FLIGHT",
    "DEFAULT_PING_TIMEOUT_S",
    "DEFAULT_TARGET_BATCH_BYTES",
    "DEFAULT_UPLOAD_ATTEMPTS",
    "MAX_BATCH_BYTES",
    "MAX_BATCH_LINES",
    "MAX_IN_FLIGHT_LIMIT",
    "MAX_METRIC_ROWS_PER_REQUEST",
    "RUN_KINDS",
    "TERMINAL_STATUSES",
    "TracesClient",
    "is_episode_record",
]

DEFAULT_MAX_IN_FLIGHT = 8
#: The most uploads in flight the service allows per credential (contract §9).
MAX_IN_FLIGHT_LIMIT = 8
#: The highest zstd level a client may pin (zstd's own limit without ultra mode).
MAX_ZSTD_LEVEL = 19
#: How long :meth:`TracesClient.ping` waits for the whole answer by default.
DEFAULT_PING_TIMEOUT_S = 10.0


def is_episode_record(record: Any) -> bool:
    """A mapping with a ``traces`` key, or an object with a ``traces`` attribute (contract §7)."""
    return is_episode(record)


class TracesClient(ReadAPI, RunsAPI):
    """A client for the Traces service: concurrent ordered uploads, reads, and runs.

    Configuration: each argument, else ``PRIME_API_KEY`` / ``PRIME_TRACES_URL``
    / ``PRIME_TEAM_ID``, else ``~/.prime/config.json``, else the default.
    Uploads keep up to ``max_in_flight`` requests in flight on daemon threads
    that never hold up interpreter exit; receipts come back in batch order.
    Thread-safe: several threads may upload at once and share the in-flight
    limit. After ``fork`` the child builds its own sessions and threads.
    Bodies are zstd-compressed when the service takes it (``compression="auto"``),
    at a level that adapts to the link: 1 on a fast one, up to 9 while the
    wire is the limit (``prime_traces._upload.levels``); ``zstd_level=N`` pins it.
    Runs are created, updated and finished with :meth:`create_run`,
    :meth:`update_run` and :meth:`post_metrics` (see ``RunsAPI``).

    Usage::

        with TracesClient() as client:
            receipts = client.upload_records(episodes, line_format="episode")
            page = client.list(run_id="run-1")
    """

    def __init__(
        self,
        api_key: str | None = None,
        base_url: str | None = None,
        team_id: str | None = None,
        *,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        compression: str = "auto",
        timeout_s: float = READ_TIMEOUT_S,
        zstd_level: int | None = None,
        abandon_after_s: float = DEFAULT_ABANDON_AFTER_S,
        config_path: str | os.PathLike[str] | None = None,
        _sleep: Any = None,
    ) -> None:
        if not 1 <= max_in_flight <= MAX_IN_FLIGHT_LIMIT:
            raise ValueError(
                f"max_in_flight must be between 1 and {MAX_IN_FLIGHT_LIMIT} (the service allows at "
                f"most {MAX_IN_FLIGHT_LIMIT} uploads in flight per credential), not {max_in_flight}"
            )
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be greater than 0, not {timeout_s}")
        if zstd_level is not None and not 1 <= zstd_level <= MAX_ZSTD_LEVEL:
            raise ValueError(f"zstd_level must be between 1 and {MAX_ZSTD_LEVEL}, or None to adapt, not {zstd_level}")
        config = resolve_config(api_key, base_url, team_id, config_path=config_path)
        transport = Transport(config, timeout_s=timeout_s)
        super().__init__(transport)
        self.config = config
        self.max_in_flight = max_in_flight
        self.abandon_after_s = abandon_after_s
        self._selector = CodingSelector(compression)
        self._window = InFlightWindow(max_in_flight)
        self._sender = Sender(transport, self._selector, self._window, zstd_level=zstd_level, sleep=_sleep)
        # Up to twice the window's batches are queued; those waiting out a refusal keep their thread.
        self._pool = DaemonPool(2 * max_in_flight, name="prime-traces-upload")
        self._closed = threading.Event()

    def __repr__(self) -> str:
        return (
            f"TracesClient(base_url={self.config.base_url!r}, max_in_flight={self.max_in_flight}, "
            f"compression={self._selector.compression!r})"
        )

    def upload_lines(
        self,
        lines: Iterable[LineLike],
        *,
        line_format: LineFormat | str = LineFormat.TRACE,
        context: dict[str, str] | None = None,
        schema_version: int = 1,
        target_batch_bytes: int = DEFAULT_TARGET_BATCH_BYTES,
        max_attempts: int = DEFAULT_UPLOAD_ATTEMPTS,
        max_refused_s: float | None = DEFAULT_MAX_REFUSED_S,
        on_batch: OnBatch | None = None,
        cancel: threading.Event | None = None,
        stop: Flag | None = None,
        learn_coding: bool = True,
    ) -> list[UploadReceipt]:
        """Upload JSONL lines; return the receipts in batch order.

        Lines are batched deterministically (30 MiB by default, the SHA-256 of
        each batch's bytes its idempotency key), so re-running an upload
        replays instead of storing twice. ``on_batch(batch, receipt)`` runs on
        this thread, in batch order, as each head-of-line batch commits.

        A batch gets ``max_attempts`` attempts against failures (5xx,
        transport errors). Refusals (429, and 503 with a refusal code) are the
        service asking to slow down: they spend no attempt, shrink the
        client's in-flight window, and are waited out (``Retry-After``, with
        jitter) for up to ``max_refused_s`` in a row (``None``: until
        ``cancel`` is set).

        With ``compression="auto"``, until the client knows which codings the
        service takes, the first batch is cut at 1 MiB and sent alone, in
        gzip, to learn them; ``learn_coding=False`` cuts every batch at
        ``target_batch_bytes`` instead, so that the batches (and their keys)
        depend on the lines alone: what an upload resumed by another client
        must do to replay the batches of the first.

        ``stop``: once it is set, no further batch is sent, and the batches in
        flight get ``abandon_after_s`` to commit, then are abandoned (their
        outcome ``ABANDONED`` with the key they were sent under, so a resend of
        the same bytes replays); unlike ``cancel``, nothing else is cut short
        and no failure is implied. The upload then raises ``UploadError``
        whose report has ``stopped`` set and says from which line nothing was
        sent. The caller keeps those lines (on disk, say) instead of waiting
        for a slow network.

        Raises:
            TraceTooLargeError, TypeError: a line cannot be sent, found before
                any request went out.
            UploadError: once requests have gone out, any failure or a set
                ``cancel`` or ``stop``; its ``report`` says what became of every line.
        """
        if isinstance(lines, (str, bytes, bytearray)):
            raise TypeError("lines must be an iterable of lines, not a single str or bytes")
        if self._closed.is_set():
            raise RuntimeError("this TracesClient is closed")
        if isinstance(line_format, LineFormat):
            line_format = line_format.value
        settings = UploadSettings(
            line_format, context, schema_version, target_batch_bytes, max_attempts, max_refused_s, learn_coding
        )
        settings.validate()
        upload = Upload(
            self._pool,
            self._sender,
            settings,
            max_in_flight=self.max_in_flight,
            on_batch=on_batch,
            cancel=cancel,
            abandon_after_s=self.abandon_after_s,
            stop=stop,
        )
        return upload.run(lines)

    def upload_records(
        self, records: Iterable[Any], *, line_format: LineFormat | str | None = None, **kwargs: Any
    ) -> list[UploadReceipt]:
        """Upload records, encoded lazily one at a time as batches fill.

        Records are mappings, objects with ``to_record()``, or objects whose
        ``to_json()`` returns the record's JSON bytes (sent as they are).
        ``line_format`` defaults to ``"episode"`` when the first record has
        ``traces``, else ``"trace"``. Other arguments as :meth:`upload_lines`.
        """
        iterator = iter(records)
        first = next(iterator, None)
        if first is None:
            return []
        if line_format is None:
            line_format = "episode" if is_episode_record(first) else "trace"
        return self.upload_lines(_encoded(itertools.chain((first,), iterator)), line_format=line_format, **kwargs)

    def upload_file(self, path: str | os.PathLike[str], **kwargs: Any) -> list[UploadReceipt]:
        """Upload a JSONL file, streamed; arguments as :meth:`upload_lines`."""
        return self.upload_lines(iter_file_lines(path), **kwargs)

    def ping(self, timeout_s: float = DEFAULT_PING_TIMEOUT_S) -> bool:
        """Whether the service is up: one cheap read, sent once, its whole answer bounded by ``timeout_s``.

        True when the service answered anything but 429 or a 5xx: a 4xx such
        as 401 comes from a service that is up (the call that needs the key
        raises it). False when no answer came in time (refused, reset,
        trickled) or the service said it is overloaded or failing. Raises no
        error of this package; ``ValueError`` for a ``timeout_s`` that is not
        positive::

            if not client.ping(timeout_s=2.0):
                print("the Traces service is not answering")
        """
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be greater than 0, not {timeout_s}")
        try:
            self._transport.request("GET", self._url("traces"), params={"limit": "1"}, timeout_s=timeout_s, whole=True)
        except (RetryableAPIError, TransportError):
            return False
        except APIError as err:
            return err.status_code is not None and err.status_code < 500
        except PrimeTracesError:
            return False
        return True

    def upload_stats(self) -> dict[str, Any]:
        """The in-flight window now (its limit, requests in flight, refusals, decreases) and the zstd level."""
        stats = self._window.snapshot()
        if self._sender.zstd_level is None:
            stats.update(self._sender.levels.snapshot())
        else:
            stats["zstd_level"] = self._sender.zstd_level
        return stats

    def close(self) -> None:
        """Release sessions and threads. Requests still running are abandoned."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._pool.shutdown(wait=False)  # never waits: a hung request must not hold up close()
        self._transport.close()
        BODY_BUFFERS.trim()  # the idle body buffers go back to the system

    def __enter__(self) -> TracesClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _encoded(records: Iterable[Any]) -> Iterator[bytes | LineParts]:
    for index, record in enumerate(records):
        yield encode_record_parts(record, index)
