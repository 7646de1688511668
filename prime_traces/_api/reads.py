"""Reads and deletes against the Traces service (contract §3, §4), retried per §6.

:class:`ReadAPI` turns each call into one logical request over a
:class:`~prime_traces._http.transport.Transport`: GETs are retried on 429, 502,
503, 504 and transport failures; a streamed raw download only until its first
body byte; DELETEs only when the service provably did nothing (429, a 503
with a service-refusal code, or a connection that was never made). Anything
else that leaves a delete's fate unknown is :class:`AmbiguousDeleteError`.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import IO, Any, TypeAlias, TypeVar

import orjson
import tenacity

from prime_traces._api.models import (
    EpisodeDetail,
    EpisodeListPage,
    EpisodeSummary,
    MetricRow,
    MetricsPage,
    RunListPage,
    RunStepList,
    RunSummary,
    TraceListPage,
    TraceSummary,
    _Model,
)
from prime_traces._http.retry import (
    DEFAULT_GET_ATTEMPTS,
    get_retrying,
    wait_retry_after_or_backoff,
)
from prime_traces._http.transport import Transport, not_sent
from prime_traces.config import api_url, encode_query
from prime_traces.errors import (
    SERVICE_REFUSAL_CODES,
    AmbiguousDeleteError,
    ResponseFormatError,
    RetryableAPIError,
    TransportError,
)

logger = logging.getLogger(__name__)

DEFAULT_DELETE_ATTEMPTS = 3
DOWNLOAD_CHUNK_BYTES = 256 * 1024

TRACE_FILTERS = frozenset(
    {
        "run_id",
        "environment_id",
        "model_id",
        "model_provider",
        "task_id",
        "outcome",
        "upload_id",
        "reward_min",
        "reward_max",
        "has_error",
        "is_truncated",
        "created_after",
        "created_before",
        "context",
        "sort",
        "limit",
        "cursor",
    }
)
EPISODE_TRACE_FILTERS = TRACE_FILTERS - {"sort", "upload_id"}
EPISODE_FILTERS = frozenset(
    {
        "run_id",
        "upload_id",
        "environment_id",
        "outcome",
        "has_error",
        "run_step",
        "step_min",
        "step_max",
        "created_after",
        "created_before",
        "context",
        "limit",
        "cursor",
    }
)
RUN_FILTERS = frozenset({"run_type", "created_by", "created_after", "created_before", "limit", "cursor"})
METRIC_FILTERS = frozenset({"names", "min_step", "max_step", "limit", "cursor"})

_RAW = (("raw", "true"),)
M = TypeVar("M", bound=_Model)
T = TypeVar("T")
# A query string's (name, value) pairs. An alias, as ReadAPI.list hides the builtin inside the class.
_Query: TypeAlias = list[tuple[str, str]]


class _StreamInterrupted(Exception):
    """Carries the error of a download cut short after bytes were written: never retried."""

    def __init__(self, error: TransportError) -> None:
        super().__init__(str(error))
        self.error = error


def _query_value(value: Any) -> Any:
    # encode_query knows no datetimes; the service reads ISO-8601 (naive means UTC).
    if isinstance(value, datetime):
        text = value.isoformat()
        return text[:-6] + "Z" if text.endswith("+00:00") else text
    return value


def _query(method: str, filters: Mapping[str, Any], known: frozenset[str]) -> _Query:
    unknown = sorted(set(filters) - known)
    if unknown:
        raise TypeError(f"{method}() got unknown filter(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return encode_query({name: _query_value(value) for name, value in filters.items()})


def _path(url: str) -> str:
    return url.split("?", 1)[0]


def _delete_retryable(err: BaseException) -> bool:
    """Whether a failed DELETE certainly did nothing, so sending it again is safe."""
    if isinstance(err, RetryableAPIError):
        if err.status_code == 429:
            return True
        return err.status_code == 503 and err.code in SERVICE_REFUSAL_CODES
    return isinstance(err, TransportError) and not_sent(err)


def _log_retry(retry_state: tenacity.RetryCallState) -> None:
    outcome = retry_state.outcome
    next_action = retry_state.next_action
    logger.info(
        "attempt %d failed (%s); retrying in %.2f s",
        retry_state.attempt_number,
        outcome.exception() if outcome is not None else None,
        next_action.sleep if next_action is not None else 0.0,
    )


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # not possible everywhere (Windows); the rename itself is still atomic
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class ReadAPI:
    """Lists, gets, downloads and deletes traces, episodes and runs.

    Thread-safe as its :class:`Transport` is; it does not own the transport
    and never closes it. Every call blocks until its answer (or its last
    retry) and raises the typed errors of :mod:`prime_traces.errors`; a body
    that does not fit its model raises :class:`ResponseFormatError`.
    ``sleep`` waits between retries (default :func:`time.sleep`)::

        reads = ReadAPI(Transport(resolve_config()))
        for trace in reads.iter(run_id="run-1", has_error=True):
            print(trace.trace_id, trace.score.reward)
    """

    def __init__(
        self,
        transport: Transport,
        *,
        sleep: Callable[[float], None] | None = None,
        max_get_attempts: int = DEFAULT_GET_ATTEMPTS,
        max_delete_attempts: int = DEFAULT_DELETE_ATTEMPTS,
    ) -> None:
        for name, value in (("max_get_attempts", max_get_attempts), ("max_delete_attempts", max_delete_attempts)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int of at least 1, got {value!r}")
        self._transport = transport
        self._base_url = transport.config.base_url
        self._sleep = time.sleep if sleep is None else sleep
        self._max_get_attempts = max_get_attempts
        self._max_delete_attempts = max_delete_attempts

    def __repr__(self) -> str:
        return f"ReadAPI(base_url={self._base_url!r})"

    # -- plumbing -------------------------------------------------------------

    def _url(self, *parts: str) -> str:
        return api_url(self._base_url, *parts)

    def _retry_get(self, attempt: Callable[..., T], *args: Any) -> T:
        return get_retrying(self._max_get_attempts, sleep=self._sleep)(attempt, *args)

    def _get_json(self, url: str, params: _Query | None = None) -> Any:
        def attempt() -> Any:
            resp = self._transport.request("GET", url, params=params)
            try:
                return orjson.loads(resp.content)
            except orjson.JSONDecodeError:
                raise ResponseFormatError(f"GET {_path(url)}", "the body is not JSON") from None

        return self._retry_get(attempt)

    def _get_model(self, model: type[M], url: str, params: _Query | None = None) -> M:
        return model.from_dict(self._get_json(url, params))

    def _pages(self, fetch: Callable[..., Any], filters: dict[str, Any]) -> Iterator[Any]:
        cursor = filters.pop("cursor", None)
        while True:
            page = fetch(**filters, cursor=cursor)
            yield from page.items
            if not page.next_cursor:
                return
            if page.next_cursor == cursor:
                raise ResponseFormatError(type(page).__name__, "next_cursor repeats the cursor just sent")
            cursor = page.next_cursor

    # -- traces ---------------------------------------------------------------

    def list(self, **filters: Any) -> TraceListPage:
        """One page of traces, newest first, matching ``filters`` (contract §3).

        Filters: ``run_id``, ``environment_id``, ``model_id``, ``model_provider``,
        ``task_id``, ``outcome`` (equality), ``upload_id`` (str or list: any of),
        ``reward_min``/``reward_max`` (float), ``has_error``/``is_truncated``
        (bool), ``created_after``/``created_before`` (ISO-8601 str or datetime),
        ``context`` (``{key: value}``, all must match), ``sort``, ``limit``
        (1..100, default 20) and ``cursor`` (``next_cursor`` of the previous
        page, valid only with the same filters). ``None`` means unset.

        Raises ``TypeError`` for an unknown filter name and
        :class:`ValidationRejectedError` (400 ``invalid_filter``/``invalid_cursor``)
        for a value the service refuses.
        """
        return self._get_model(TraceListPage, self._url("traces"), _query("list", filters, TRACE_FILTERS))

    def iter(self, **filters: Any) -> Iterator[TraceSummary]:
        """Every trace matching ``filters`` (as :meth:`list`), fetching pages lazily.

        ``limit`` is the page size. Filter names are checked now; errors of a
        page request are raised when iteration reaches that page.
        """
        _query("iter", filters, TRACE_FILTERS)
        return self._pages(self.list, dict(filters))

    def get(self, trace_id: str) -> TraceSummary:
        """The summary of the trace ``trace_id``; :class:`NotFoundError` if there is none."""
        return self._get_model(TraceSummary, self._url("traces", trace_id))

    def get_raw(self, trace_id: str) -> bytes:
        """The stored document of ``trace_id``, byte for byte, held in memory.

        For large documents prefer :meth:`download_raw`. Raises
        :class:`NotFoundError` if there is no such trace.
        """
        url = self._url("traces", trace_id)
        return self._retry_get(lambda: self._transport.request("GET", url, params=_RAW).content)

    def download_raw(self, trace_id: str, dest: str | os.PathLike[str]) -> Path:
        """Stream the stored document of ``trace_id`` into the file ``dest``; return its path.

        The bytes go to a temporary file beside ``dest`` (mode 0600), which is
        fsync'd and renamed onto ``dest`` only once complete: ``dest`` is either
        untouched or the whole document, and no temporary file outlives the
        call. The request is retried like any GET until the first body byte
        arrives; a failure after that raises :class:`TransportError` (or
        :class:`APITimeoutError`). Raises :class:`NotFoundError` if there is no
        such trace and ``OSError`` if the file cannot be written.
        """
        dest = Path(dest)
        url = self._url("traces", trace_id)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as out:
                interrupted: TransportError | None = None
                try:
                    self._retry_get(self._stream_into, url, out)
                except _StreamInterrupted as stop:
                    interrupted = stop.error
                if interrupted is not None:
                    raise interrupted
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, dest)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _fsync_dir(dest.parent)
        return dest

    def _stream_into(self, url: str, out: IO[bytes]) -> int:
        out.seek(0)
        out.truncate()
        resp = self._transport.request("GET", url, params=_RAW, stream=True)
        written = 0
        try:
            for chunk in self._transport.iter_body(resp, DOWNLOAD_CHUNK_BYTES, f"GET {_path(url)}"):
                out.write(chunk)
                written += len(chunk)
        except TransportError as err:  # APITimeoutError included
            if written:
                raise _StreamInterrupted(err) from err
            raise
        return written

    def delete(self, trace_id: str, *, created_at: str | datetime | None = None) -> None:
        """Delete every stored copy of ``trace_id`` (only the copies at ``created_at`` if given).

        Raises :class:`NotFoundError` when nothing matched (a repeat of a
        delete that succeeded included) and :class:`AmbiguousDeleteError` when
        the answer was lost in a way that leaves unknown whether it happened.
        """
        params = encode_query({"created_at": _query_value(created_at)})
        self._delete(self._url("traces", trace_id), params)

    def delete_run(self, run_id: str) -> None:
        """Delete every trace of the run ``run_id`` (episode rows stay).

        Raises :class:`NotFoundError` when the run has no traces and
        :class:`AmbiguousDeleteError` as :meth:`delete` does.
        """
        if not isinstance(run_id, str) or not run_id:
            raise ValueError(f"run_id must be a non-empty string, not {run_id!r}")
        self._delete(self._url("traces"), [("run_id", run_id)])

    def _delete(self, url: str, params: _Query) -> None:
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(_delete_retryable),
            wait=wait_retry_after_or_backoff(),
            stop=tenacity.stop_after_attempt(self._max_delete_attempts),
            sleep=self._sleep,
            before_sleep=_log_retry,
            reraise=True,
        )
        try:
            retrying(self._transport.request, "DELETE", url, params=params)
        except (RetryableAPIError, TransportError) as err:
            if _delete_retryable(err):
                raise  # refused or never sent, attempts used up: certainly not done
            raise AmbiguousDeleteError(
                f"DELETE {_path(url)}: {err}; it may or may not have happened "
                "(not retried): get or list the target to find out"
            ) from err

    # -- episodes -------------------------------------------------------------

    def list_episodes(self, **filters: Any) -> EpisodeListPage:
        """One page of episodes, newest first (contract §3).

        Filters: ``run_id``, ``upload_id`` (str or list), ``environment_id``,
        ``outcome``, ``has_error``, ``run_step``/``step_min``/``step_max`` and
        ``context`` (matched through member traces), ``created_after``,
        ``created_before``, ``limit``, ``cursor``. Raises as :meth:`list`.
        """
        params = _query("list_episodes", filters, EPISODE_FILTERS)
        return self._get_model(EpisodeListPage, self._url("episodes"), params)

    def iter_episodes(self, **filters: Any) -> Iterator[EpisodeSummary]:
        """Every episode matching ``filters`` (as :meth:`list_episodes`), fetched lazily."""
        _query("iter_episodes", filters, EPISODE_FILTERS)
        return self._pages(self.list_episodes, dict(filters))

    def get_episode(self, episode_id: str) -> EpisodeDetail:
        """The episode ``episode_id`` with its member aggregate; :class:`NotFoundError` if none."""
        return self._get_model(EpisodeDetail, self._url("episodes", episode_id))

    def list_episode_traces(self, episode_id: str, **filters: Any) -> TraceListPage:
        """One page of the member traces of ``episode_id``, newest first.

        Takes the filters of :meth:`list` except ``sort`` and ``upload_id``.
        Raises :class:`NotFoundError` if there is no such episode.
        """
        params = _query("list_episode_traces", filters, EPISODE_TRACE_FILTERS)
        return self._get_model(TraceListPage, self._url("episodes", episode_id, "traces"), params)

    # -- runs -----------------------------------------------------------------

    def list_runs(self, **filters: Any) -> RunListPage:
        """One page of runs, most recently ingested first.

        Filters: ``run_type`` and ``created_by`` (str or list: any of),
        ``created_after``, ``created_before``, ``limit``, ``cursor``.
        """
        return self._get_model(RunListPage, self._url("runs"), _query("list_runs", filters, RUN_FILTERS))

    def get_run(self, run_id: str) -> RunSummary:
        """The summary of the run ``run_id``; :class:`NotFoundError` if it is unknown."""
        return self._get_model(RunSummary, self._url("runs", run_id))

    def list_metrics(self, run_id: str, **filters: Any) -> MetricsPage:
        """One page of the run's metrics history (contract §9), in step order.

        Filters: ``names`` (list or comma-separated: only these metrics),
        ``min_step`` / ``max_step`` (inclusive), ``limit`` (1..10,000, default
        1,000), ``cursor``. :class:`NotFoundError` for an unknown run.
        """
        filters = dict(filters)
        if isinstance(filters.get("names"), (list, tuple)):
            filters["names"] = ",".join(filters["names"])
        params = _query("list_metrics", filters, METRIC_FILTERS)
        return self._get_model(MetricsPage, self._url("runs", run_id, "metrics"), params)

    def iter_metrics(self, run_id: str, **filters: Any) -> Iterator[MetricRow]:
        """Every row of the run's metrics history (as :meth:`list_metrics`), fetching pages lazily."""
        _query("iter_metrics", filters, METRIC_FILTERS)
        cursor = filters.pop("cursor", None)
        while True:
            page = self.list_metrics(run_id, **filters, cursor=cursor)
            yield from page.rows
            if not page.next_cursor:
                return
            if page.next_cursor == cursor:
                raise ResponseFormatError("MetricsPage", "next_cursor repeats the cursor just sent")
            cursor = page.next_cursor

    def get_run_steps(self, run_id: str) -> RunStepList:
        """Per-step counts of the run ``run_id`` (empty, not an error, for an unknown run)."""
        return self._get_model(RunStepList, self._url("runs", run_id, "steps"))
