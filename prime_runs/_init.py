"""``prime_runs.init()``: choose the mode, find or create the run, start logging."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping
from typing import Any

from prime_runs._encoding import RunStamp
from prime_runs._lifecycle import (
    KINDS,
    RunLifecycle,
    describe,
    export_run_id,
    new_run_id,
    rank_info,
    resolve_mode,
)
from prime_runs._queue import (
    DEFAULT_MAX_QUEUED_BYTES,
    DEFAULT_MAX_QUEUED_RECORDS,
    SizeMeter,
)
from prime_runs._worker import UploadWorker
from prime_runs.errors import PrimeRunsError
from prime_runs.run import ON_ERROR, Run
from prime_traces import DEFAULT_TARGET_BATCH_BYTES, TracesClient
from prime_traces._compress import COMPRESSION_CHOICES
from prime_traces._config import DEFAULT_BASE_URL, resolve_config
from prime_traces.client import MAX_IN_FLIGHT_LIMIT

logger = logging.getLogger(__name__)

DEFAULT_FINISH_TIMEOUT_S = 60.0
DEFAULT_DIR = "prime-runs"
#: How often config and summary changes are sent while the run goes on.
UPDATE_INTERVAL_S = 10.0
# A cancelled upload waits this long for requests in flight, inside finish()'s +1 s.
_ABANDON_AFTER_S = 0.3


def init(
    name: str | None = None,
    *,
    kind: str = "train",
    config: Mapping[str, Any] | None = None,
    tags: list[str] | None = None,
    id: str | None = None,  # noqa: A002  (the public name)
    mode: str | None = None,
    dir: str | os.PathLike[str] | None = None,  # noqa: A002
    api_key: str | None = None,
    base_url: str | None = None,
    team_id: str | None = None,
    on_error: str = "warn",
    max_queued_records: int = DEFAULT_MAX_QUEUED_RECORDS,
    max_queued_bytes: int = DEFAULT_MAX_QUEUED_BYTES,
    max_in_flight: int = 8,
    compression: str = "auto",
    finish_timeout_s: float = DEFAULT_FINISH_TIMEOUT_S,
    handle_signals: bool = True,
) -> Run:
    """Start a run and return its :class:`Run`.

    ``mode`` is ``"online"`` (the default when an API key or
    ``PRIME_TRACES_URL`` is configured: records go to the Traces service),
    ``"offline"`` (the default otherwise: records are appended as JSONL under
    ``dir``, default ``./prime-runs/<run-id>/``) or ``"disabled"`` (every
    call a no-op). ``PRIME_RUNS_MODE`` overrides the default; the argument
    overrides both. Online, the run is created on the service, or attached to
    ``id`` / ``PRIME_RUN_ID``; with ``RANK`` set, only rank 0 creates and
    finishes it.

    Raises:
        ValueError: an argument is out of range.
        PrimeRunsError: online, the run could not be created or attached.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
    if finish_timeout_s < 0:
        raise ValueError(f"finish_timeout_s must be at least 0, not {finish_timeout_s}")
    # Everything is checked before anything is created on the service.
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be 'warn' or 'raise', not {on_error!r}")
    if max_queued_records < 1:
        raise ValueError(f"max_queued_records must be greater than 0, not {max_queued_records}")
    if max_queued_bytes < 1:
        raise ValueError(f"max_queued_bytes must be greater than 0, not {max_queued_bytes}")
    if not 1 <= max_in_flight <= MAX_IN_FLIGHT_LIMIT:
        raise ValueError(f"max_in_flight must be between 1 and {MAX_IN_FLIGHT_LIMIT}, not {max_in_flight}")
    if compression not in COMPRESSION_CHOICES:
        raise ValueError(f"compression must be one of {', '.join(COMPRESSION_CHOICES)}, not {compression!r}")
    settings = resolve_config(api_key, base_url, team_id)
    configured = bool(settings.api_key) or settings.base_url != DEFAULT_BASE_URL
    chosen = resolve_mode(mode, online_configured=configured)
    common: dict[str, Any] = dict(
        name=name, kind=kind, mode=chosen, config=dict(config or {}), on_error=on_error,
        finish_timeout_s=finish_timeout_s, handle_signals=handle_signals,
    )  # fmt: skip
    if chosen == "disabled":
        return Run(run_id=id or "disabled", url=None, worker=None, lifecycle=None, owner=False, **common)
    ranks = rank_info(id)
    meter = SizeMeter()
    worker_options: dict[str, Any] = dict(
        max_queued_records=max_queued_records, max_queued_bytes=max_queued_bytes, size_meter=meter,
        write_cap_bytes=max_in_flight * DEFAULT_TARGET_BATCH_BYTES,
    )  # fmt: skip
    if chosen == "offline":
        from prime_runs._offline_sink import OfflineSink

        run_id = ranks.run_id or new_run_id()
        run_dir = os.fspath(dir) if dir is not None else os.path.join(DEFAULT_DIR, run_id)
        sink = OfflineSink(run_dir, stamp=RunStamp(run_id, kind), meter=meter)
        worker = UploadWorker([sink], **worker_options)
        run = Run(run_id=run_id, url=None, worker=worker, lifecycle=None, owner=ranks.owner, dir=run_dir, **common)
        worker.on_error = run._note_error
        return run
    return _online(settings, ranks, tags, meter, worker_options, common, max_in_flight, compression)


def _online(settings: Any, ranks: Any, tags: list[str] | None, meter: SizeMeter, worker_options: dict[str, Any],
            common: dict[str, Any], max_in_flight: int, compression: str) -> Run:  # fmt: skip
    from prime_runs._traces_sink import TracesSink

    client = TracesClient(
        settings.api_key, settings.base_url, settings.team_id,
        max_in_flight=max_in_flight, compression=compression, abandon_after_s=_ABANDON_AFTER_S,
    )  # fmt: skip
    lifecycle = RunLifecycle(client._transport)
    url = None
    run_id = ranks.run_id
    if ranks.owner:
        try:
            payload = lifecycle.create(
                name=common["name"], kind=common["kind"], config=common["config"], tags=tags, run_id=run_id
            )
        except Exception as err:
            client.close()
            raise PrimeRunsError(
                f"could not create the run on {settings.base_url} ({describe(err)}); check PRIME_API_KEY "
                "and PRIME_TRACES_URL, or pass mode='offline' to log to disk"
            ) from err
        run_id = str(payload.get("id") or run_id)
        url = payload.get("url")
        common["name"] = payload.get("name", common["name"])
        # Processes this one starts (other ranks, eval workers) log into the same run.
        export_run_id(run_id)
    assert run_id is not None
    context = {"source": "prime-runs", "run_type": common["kind"]}
    sink = TracesSink(client, stamp=RunStamp(run_id, common["kind"]), context=context, meter=meter, owns_client=True)
    worker = UploadWorker([sink], **worker_options)
    run = Run(run_id=run_id, url=url, worker=worker, lifecycle=lifecycle, owner=ranks.owner, **common)
    worker.on_error = run._note_error
    # The worker thread runs the update: a stalled answer must not hold its uploads for long.
    worker.tick = functools.partial(run.send_updates, timeout_s=UPDATE_INTERVAL_S)
    worker.tick_interval_s = UPDATE_INTERVAL_S
    return run
