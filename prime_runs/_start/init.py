"""``prime_runs.init()``: choose the mode, find or create the run, start logging."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prime_runs._console.console import CONSOLE_CHOICES, Console, console_on
from prime_runs._console.summary import destination_line
from prime_runs._history.lane import MetricsLane
from prime_runs._local.rundir import RunDirectory, check_run_id, runs_root
from prime_runs._local.segments import METRICS
from prime_runs._local.spool import RecordFiles, Spool
from prime_runs._records.lines import RunStamp
from prime_runs._records.sink import Sink
from prime_runs._records.size_meter import SizeMeter
from prime_runs._service.ownership import RankInfo, export_run_id, new_run_id, rank_info
from prime_runs._service.state import RunState
from prime_runs._service.updates import RunUpdates, describe_error
from prime_runs._sinks.disk import DiskSink
from prime_runs._upload.queue import DEFAULT_MAX_QUEUED_BYTES, DEFAULT_MAX_QUEUED_RECORDS, write_cap_bytes
from prime_runs._upload.settings import DEFAULT_SPILL_TIMEOUT_S, WorkerSettings
from prime_runs._upload.switch_interval import DEFAULT_SWITCH_INTERVAL_S
from prime_runs.errors import PrimeRunsError
from prime_runs.run import ON_ERROR, Run
from prime_traces.client import COMPRESSION_CHOICES, MAX_IN_FLIGHT_LIMIT, RUN_KINDS, TracesClient
from prime_traces.config import DEFAULT_BASE_URL, ClientConfig, resolve_config

logger = logging.getLogger(__name__)

ENV_MODE = "PRIME_RUNS_MODE"
MODES = ("online", "offline", "disabled")
KINDS = RUN_KINDS
DEFAULT_FINISH_TIMEOUT_S = 60.0
#: How often config and summary changes are sent (and written to run.json) while the run goes on.
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
    spill_timeout_s: float = DEFAULT_SPILL_TIMEOUT_S,
    save_local: bool = False,
    handle_signals: bool = True,
    console: str | None = None,
    owner: bool | None = None,
    switch_interval_s: float | None = DEFAULT_SWITCH_INTERVAL_S,
) -> Run:
    """Start a run and return its :class:`Run`.

    ``mode`` is ``"online"`` (the default when an API key or
    ``PRIME_TRACES_URL`` is configured: records go to the Traces service),
    ``"offline"`` (the default otherwise: the run, records included, is
    written to its run directory, for ``prime-runs sync`` to upload later)
    or ``"disabled"`` (every call a no-op). ``PRIME_RUNS_MODE`` overrides the
    default; the argument overrides both. Online, the run is created on the
    service, or attached to ``id`` / ``PRIME_RUN_ID``.

    Ownership: the process that owns the run creates it and records its
    terminal status at ``finish()``. A process owns the run it starts, or
    names with ``id=``; it does not own a run it attaches to through an
    inherited ``PRIME_RUN_ID`` (an eval worker started by the training
    process must not mark its parent's run completed), nor any run when
    ``RANK`` is set and not 0. ``owner=True`` (or ``PRIME_RUN_OWNER=1``, for a
    launcher that created the run for rank 0) and ``owner=False`` decide
    explicitly.

    The run directory is ``<dir>/<run-id>/`` (``dir`` defaults to
    ``PRIME_RUNS_DIR``, else ``./prime-runs``). Online, it is created only
    when something must be kept: records the service could not take, or
    did not take by ``finish()``'s deadline (spooled within
    ``spill_timeout_s`` more), records it refused, and, with
    ``save_local=True``, a copy of every record logged (under ``local/``).

    ``console`` (``"auto"``, ``"on"`` or ``"off"``; default
    ``PRIME_RUNS_CONSOLE``, else ``"auto"``) says whether the run tells its
    user on stderr where it goes, each kind of record it loses (the first at
    once, with the record's id, call, position and cause) and how it ended.
    ``auto`` is on for the process that owns the run and off for other ranks.
    The lines go through the ``prime_runs.console`` logger.

    ``switch_interval_s``: while the run has records to upload, the
    interpreter's switch interval (``sys.setswitchinterval``) is lowered to
    this if it is higher, and put back once the upload thread is idle or the
    run has finished, so the caller's threads get the GIL back within about
    half a millisecond of the upload thread's work instead of five
    (``log_episodes()`` and an event loop on the main thread stay
    responsive). Where the caller's own thread is CPU-bound Python, it then
    shares the GIL fairly with the upload instead of starving it (measured:
    its work 1.28x as long while a run uploads, 4% more CPU in all);
    ``None`` leaves the interpreter's setting alone.

    Raises:
        ValueError: an argument is out of range.
        PrimeRunsError: a run id cannot name a directory; online, the run
            could not be created or attached.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
    if finish_timeout_s < 0:
        raise ValueError(f"finish_timeout_s must be at least 0, not {finish_timeout_s}")
    # Everything is checked before anything is created on the service.
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be 'warn' or 'raise', not {on_error!r}")
    if not 1 <= max_in_flight <= MAX_IN_FLIGHT_LIMIT:
        raise ValueError(f"max_in_flight must be between 1 and {MAX_IN_FLIGHT_LIMIT}, not {max_in_flight}")
    worker_settings = WorkerSettings(
        max_queued_records=max_queued_records,
        max_queued_bytes=max_queued_bytes,
        write_cap_bytes=write_cap_bytes(max_in_flight, max_queued_bytes),
        spill_timeout_s=spill_timeout_s,
        tick_interval_s=UPDATE_INTERVAL_S,
        switch_interval_s=switch_interval_s,
    )
    if compression not in COMPRESSION_CHOICES:
        raise ValueError(f"compression must be one of {', '.join(COMPRESSION_CHOICES)}, not {compression!r}")
    if console is not None and console not in CONSOLE_CHOICES:
        raise ValueError(f"console must be one of {', '.join(CONSOLE_CHOICES)}, not {console!r}")
    settings = resolve_config(api_key, base_url, team_id)
    configured = bool(settings.api_key) or settings.base_url != DEFAULT_BASE_URL
    chosen = resolve_mode(mode, online_configured=configured)
    if chosen == "disabled":
        console_on(console, mode=chosen, owner=False)  # a bad PRIME_RUNS_CONSOLE is an error in every mode
        return Run(
            run_id=id or "disabled",
            name=name,
            kind=kind,
            mode=chosen,
            url=None,
            state=RunState(id or "disabled", config or {}),
            owner=False,
            on_error=on_error,
            finish_timeout_s=finish_timeout_s,
            handle_signals=handle_signals,
            console=Console(enabled=False),
            tags=list(tags or []),
        )
    ranks = rank_info(id, owner=owner)
    console_enabled = console_on(console, mode=chosen, owner=ranks.owner)
    if ranks.run_id is not None:
        check_run_id(ranks.run_id, "id=" if id else "PRIME_RUN_ID")
    meter = SizeMeter()
    root = os.path.abspath(runs_root(dir))  # a chdir after init() must not move where the run writes
    if chosen == "offline":
        parts = _offline(root, ranks, kind, name, meter)
    else:
        parts = _online(settings, root, ranks, kind, name, config, tags, meter, max_in_flight, compression, save_local)
    state = RunState(parts.run_id, config or {})
    run = Run(
        run_id=parts.run_id,
        name=parts.name,
        kind=kind,
        mode=chosen,
        url=parts.url,
        state=state,
        owner=ranks.owner,
        on_error=on_error,
        finish_timeout_s=finish_timeout_s,
        handle_signals=handle_signals,
        console=Console(enabled=console_enabled, directory=parts.rundir.path),
        sinks=parts.sinks,
        worker_settings=worker_settings,
        size_meter=meter,
        updates=RunUpdates(state, parts.client) if parts.client is not None else None,
        metrics=parts.metrics,
        tags=list(tags or []),
        rundir=parts.rundir,
        service_url=parts.service_url,
    )
    if chosen == "online":
        parts.files.on_first_write = run._directory_needed
    if chosen == "offline" or save_local:
        run._keep_locally()
    run.console.say(
        "%s",
        destination_line(
            name=run.name,
            run_id=run.id,
            mode=run.mode,
            owner=ranks.owner,
            service_url=parts.service_url,
            url=run.url,
            directory=run.dir,
            save_local=save_local,
        ),
    )
    return run


def resolve_mode(mode: str | None, *, online_configured: bool, environ: Mapping[str, str] | None = None) -> str:
    """Argument, else ``PRIME_RUNS_MODE``, else online when a key or URL is configured."""
    env = os.environ if environ is None else environ
    chosen = mode or env.get(ENV_MODE) or ("online" if online_configured else "offline")
    if chosen not in MODES:
        source = "mode" if mode else ENV_MODE
        raise ValueError(f"{source} must be one of {', '.join(MODES)}, not {chosen!r}")
    return chosen


@dataclass
class _Parts:
    """What a mode assembles for its run: where it is, where its records and rows go."""

    run_id: str
    name: str | None
    rundir: RunDirectory
    files: RecordFiles
    sinks: list[Sink]
    metrics: MetricsLane
    url: str | None = None
    service_url: str | None = None
    #: The client that creates and updates the run on the service (online only).
    client: TracesClient | None = None


def _open_directory(root: str, run_id: str) -> RunDirectory:
    rundir = RunDirectory(os.path.join(root, run_id))
    if rundir.exists():
        rundir.recover()  # a crashed earlier process may have left a torn last entry
    return rundir


def _offline(root: str, ranks: RankInfo, kind: str, name: str | None, meter: SizeMeter) -> _Parts:
    run_id = ranks.run_id or new_run_id()
    rundir = _open_directory(root, run_id)
    files = RecordFiles(rundir.path)
    return _Parts(
        run_id=run_id,
        name=name,
        rundir=rundir,
        files=files,
        sinks=[DiskSink(files, RunStamp(run_id, kind), meter)],
        metrics=MetricsLane(send=None, writer=functools.partial(files.writer, METRICS)),
    )


def _online(
    settings: ClientConfig,
    root: str,
    ranks: RankInfo,
    kind: str,
    name: str | None,
    config: Mapping[str, Any] | None,
    tags: list[str] | None,
    meter: SizeMeter,
    max_in_flight: int,
    compression: str,
    save_local: bool,
) -> _Parts:
    from prime_runs._sinks.traces import TracesSink

    client = TracesClient(
        settings.api_key,
        settings.base_url,
        settings.team_id,
        max_in_flight=max_in_flight,
        compression=compression,
        abandon_after_s=_ABANDON_AFTER_S,
    )
    url = None
    run_id = ranks.run_id
    if ranks.owner:
        try:
            payload = client.create_run(
                name, kind=kind, config=dict(config or {}), tags=list(tags or []), run_id=run_id
            )
            run_id = check_run_id(str(payload.get("id") or run_id), f"the service at {settings.base_url}")
        except Exception as err:
            client.close()
            if isinstance(err, PrimeRunsError):
                raise
            raise PrimeRunsError(
                f"could not create the run on {settings.base_url} ({describe_error(err)}); check PRIME_API_KEY "
                "and PRIME_TRACES_URL, or pass mode='offline' to log to disk"
            ) from err
        url = payload.get("url")
        name = payload.get("name", name)
        # Processes this one starts (other ranks, eval workers) log into the same run.
        export_run_id(run_id)
    assert run_id is not None
    rundir = _open_directory(root, run_id)
    stamp = RunStamp(run_id, kind)
    context = {"source": "prime-runs", "run_type": kind}
    files = RecordFiles(rundir.path)
    sink = TracesSink(client, stamp=stamp, context=context, meter=meter, owns_client=True, spool=Spool(files, stamp))
    sinks: list[Sink] = [sink]
    if save_local:
        sinks.append(DiskSink(RecordFiles(rundir.local_path), stamp, name="local", validate=False))
    # Its own client (sessions, connections), closed by the lane: metrics never wait behind the episodes' requests.
    metrics_client = TracesClient(client.config.api_key, client.config.base_url, client.config.team_id, max_in_flight=1)
    metrics = MetricsLane(
        send=functools.partial(metrics_client.post_metrics, run_id),
        writer=functools.partial(files.writer, METRICS),
        on_closed=metrics_client.close,
    )
    return _Parts(
        run_id=run_id,
        name=name,
        rundir=rundir,
        files=files,
        sinks=sinks,
        metrics=metrics,
        url=url,
        service_url=settings.base_url,
        client=client if ranks.owner else None,
    )
