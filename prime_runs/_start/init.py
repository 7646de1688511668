"""``prime_runs.init()``: check the arguments, choose the mode, create or attach the run, start logging."""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import uuid
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from prime_runs._console.console import CONSOLE_CHOICES, Console, console_on
from prime_runs._console.progress import backlog_status
from prime_runs._console.summary import destination_line
from prime_runs._local.disk_budget import DiskBudget, default_max_spool_bytes
from prime_runs._local.rundir import check_run_id, runs_root
from prime_runs._local.writable import writable_problem
from prime_runs._records.size_meter import SizeMeter
from prime_runs._records.train_table import parquet_available
from prime_runs._service.ownership import rank_info
from prime_runs._service.platform_runs import RunSpec
from prime_runs._service.state import RunState
from prime_runs._service.updates import RunUpdates
from prime_runs._start import assemble
from prime_runs._upload.queue import DEFAULT_MAX_QUEUED_BYTES, DEFAULT_MAX_QUEUED_RECORDS, write_cap_bytes
from prime_runs._upload.settings import DEFAULT_SPILL_TIMEOUT_S, WorkerSettings
from prime_runs._upload.switch_interval import DEFAULT_SWITCH_INTERVAL_S
from prime_runs.errors import ConfigurationError, RunDirectoryError
from prime_runs.models import EnvironmentRef, TrainingSpec, normalize_config
from prime_runs.run import ON_ERROR, Run
from prime_traces.client import COMPRESSION_CHOICES, MAX_IN_FLIGHT_LIMIT, RUN_KINDS
from prime_traces.config import configured_traces_url, resolve_config
from prime_traces.platform import PlatformClient, split_api_root

logger = logging.getLogger(__name__)

#: The environment variable that sets the mode when ``init()`` is not told.
MODE_ENV = "PRIME_RUNS_MODE"
#: ``true`` sends a run's records to the platform's legacy sample tables instead of Prime Traces.
TRACES_OPT_OUT_ENV = "PRIME_TRACES_OPT_OUT"
MODES = ("online", "offline", "disabled")
KINDS = RUN_KINDS
#: How long ``finish()`` waits for uploads by default: what is left then is kept on disk for ``prime-runs sync``.
DEFAULT_FINISH_TIMEOUT_S = 60.0
#: How often config and summary changes are sent (and written to run.json) while the run goes on.
UPDATE_INTERVAL_S = 10.0
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def init(
    name: str | None = None,
    *,
    environments: Sequence[Any] | None = None,
    model: str | None = None,
    framework: str | None = None,
    description: str | None = None,
    tags: Sequence[str] | None = None,
    config: Any = None,
    mode: str | None = None,
    team_id: str | None = None,
    api_key: str | None = None,
    base_url: str | None = None,
    on_error: str = "warn",
    finish_timeout: float | None = None,
    kind: str = "eval",
    id: str | None = None,  # noqa: A002  (the public name)
    training: TrainingSpec | None = None,
    traces_opt_out: bool | None = None,
    traces_url: str | None = None,
    dir: str | os.PathLike[str] | None = None,  # noqa: A002
    max_queued_records: int = DEFAULT_MAX_QUEUED_RECORDS,
    max_queued_bytes: int = DEFAULT_MAX_QUEUED_BYTES,
    max_spool_bytes: int | None = None,
    max_in_flight: int = 8,
    compression: str = "auto",
    finish_timeout_s: float | None = None,
    spill_timeout_s: float = DEFAULT_SPILL_TIMEOUT_S,
    save_local: bool = False,
    handle_signals: bool = True,
    console: str | None = None,
    owner: bool | None = None,
    switch_interval_s: float | None = DEFAULT_SWITCH_INTERVAL_S,
) -> Run:
    """Start a run and return its :class:`Run`.

    The published SDK's arguments mean what they mean there: ``kind``
    (``"eval"``, the default, or ``"train"``), ``name``, ``environments``
    (names, ``owner/name`` slugs, ids, dicts or :class:`EnvironmentRef`; an
    evaluation resolves them through the platform's hub), ``model`` (a
    training run's base model), ``framework``, ``description``, ``tags``,
    ``config`` (a mapping, or the path of the file the run was started from),
    ``team_id``, ``training`` (a :class:`TrainingSpec`), ``id`` (attach to a
    run that exists), ``api_key``, ``base_url`` (the platform; alone, it
    points the records there too), ``on_error`` (``"warn"`` or ``"raise"``),
    ``finish_timeout`` and ``traces_opt_out``.

    ``mode``: ``"online"`` (the run lives on the platform, its records go to
    the Traces service), ``"offline"`` (the run and its records are written to
    the run directory, for ``prime-runs sync`` to upload later) or
    ``"disabled"`` (every call does nothing). Without it, ``PRIME_RUNS_MODE``;
    without that, online when an API key is configured, else offline.

    Ours on top: ``traces_url`` (the Traces service, else ``PRIME_TRACES_URL``),
    ``dir`` (the runs directory, else ``PRIME_RUNS_DIR``, else ``./prime-runs``),
    the queue's bounds (``max_queued_records``; ``max_queued_bytes``, the
    held records' estimated encoded size, default 2 GiB),
    ``max_spool_bytes`` (what the run's record files may take on disk;
    default 90% of the space free there when the run starts),
    ``max_in_flight`` upload requests, ``compression``, ``finish_timeout_s``
    (the same as ``finish_timeout``; default 60 s), ``spill_timeout_s``
    (what ``finish()`` may spend writing what is left to disk),
    ``save_local`` (a copy of every record under ``local/``),
    ``handle_signals``, ``console`` (``"auto"``, ``"on"``, ``"off"``), ``owner``
    and ``switch_interval_s``; see the README.

    Ownership: the process that owns the run records its terminal status. A
    process owns the run it creates, or names with ``id=`` (then a failure is
    left to whoever created the run, as the platform expects); it does not own
    a run it attaches to through an inherited ``PRIME_RUN_ID``, nor any run when
    ``RANK`` is set and not 0. ``owner=`` (or ``PRIME_RUN_OWNER=1``/``0``) decides explicitly.

    Raises:
        ConfigurationError: a setting cannot make a run (kind, mode, key, team, model, environments, config file).
        EnvironmentResolutionError: an evaluation's environment is unknown to the hub.
        ValueError: one of this SDK's knobs is out of range.
        prime_traces.APIError: the platform refused to create the run.
    """
    if kind not in KINDS:
        raise ConfigurationError(f"kind={kind!r} is not one of 'eval' or 'train'")
    if training is not None and kind != "train":
        raise ConfigurationError("training= only applies to kind='train'")
    if finish_timeout is not None and finish_timeout_s is not None:
        raise ValueError("pass finish_timeout or finish_timeout_s, not both")
    timeout_s = DEFAULT_FINISH_TIMEOUT_S
    if finish_timeout is not None or finish_timeout_s is not None:
        timeout_s = float(finish_timeout if finish_timeout is not None else finish_timeout_s)  # type: ignore[arg-type]
        if timeout_s < 0:
            raise ValueError(f"finish_timeout_s must be at least 0, not {timeout_s}")
    # Everything is checked before anything is created on the platform.
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be 'warn' or 'raise', not {on_error!r}")
    if max_spool_bytes is not None and max_spool_bytes < 0:
        raise ValueError(f"max_spool_bytes must be at least 0, not {max_spool_bytes}")
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
    spec = RunSpec(
        kind=kind,
        name=name,
        environments=tuple(EnvironmentRef.coerce(env) for env in environments or ()),
        model=model,
        framework=framework,
        description=description,
        tags=tuple(tags or ()),
        team_id=team_id,
        training=training,
        config=normalize_config(config),
    )
    # An explicit platform URL alone points the records there too (the hosted origin serves both).
    explicit_origin = split_api_root(base_url)[0] if base_url else None
    traces = resolve_config(api_key, traces_url or (None if configured_traces_url() else explicit_origin), team_id)
    chosen = resolve_mode(mode, online_configured=bool(traces.api_key))
    if chosen == "disabled":
        console_on(console, mode=chosen, owner=False)  # a bad PRIME_RUNS_CONSOLE is an error in every mode
        run_id = id or f"disabled-{uuid.uuid4().hex[:16]}"
        return Run(
            run_id=run_id,
            name=name,
            kind=kind,
            mode=chosen,
            url=None,
            state=RunState(run_id, spec.config),
            owner=False,
            on_error=on_error,
            finish_timeout_s=timeout_s,
            handle_signals=handle_signals,
            console=Console(enabled=False),
            tags=list(spec.tags),
        )
    opted_out = chosen == "online" and (traces_opt_out if traces_opt_out is not None else _opted_out_by_env())
    if opted_out and kind == "train" and not parquet_available():
        raise ConfigurationError(
            "Opting out of Prime Traces sends training samples to the legacy table, which needs pyarrow: "
            "pip install 'prime-runs[train]'"
        )
    if chosen == "online" and not traces.api_key:
        raise ConfigurationError(
            'mode="online" needs an API key. Set PRIME_API_KEY, run `prime login`, or pass mode="disabled" '
            '(or mode="offline" to keep the run on disk).'
        )
    ranks = rank_info(id, owner=owner)
    if ranks.inherited_kind in KINDS and ranks.inherited_kind != kind:
        # The run this process logs into is its parent's: its kind decides the routes and the stamp.
        kind = ranks.inherited_kind
        spec = dataclasses.replace(spec, kind=kind, training=None)
    console_enabled = console_on(console, mode=chosen, owner=ranks.owner)
    if ranks.run_id is not None:
        check_run_id(ranks.run_id, "id=" if id else "PRIME_RUN_ID")
    meter = SizeMeter()
    root = os.path.abspath(runs_root(dir))  # a chdir after init() must not move where the run writes
    platform: PlatformClient | None = None
    # Offline (or with local copies) the directory is where the records go: it must be writable now.
    no_disk = writable_problem(root, create=chosen == "offline" or save_local)
    if no_disk is not None and (chosen == "offline" or save_local):
        raise RunDirectoryError(root, no_disk)
    limit = max_spool_bytes if max_spool_bytes is not None else default_max_spool_bytes(root)
    budget = DiskBudget(limit) if limit is not None else None
    if chosen == "offline":
        parts = assemble.offline(root, ranks, spec, meter, budget)
    else:
        platform = PlatformClient(traces.api_key, base_url)
        try:
            parts = assemble.online(
                traces,
                platform,
                root,
                ranks,
                spec,
                meter,
                max_in_flight=max_in_flight,
                compression=compression,
                save_local=save_local,
                opted_out=opted_out,
                keep_on_disk=no_disk is None,
                budget=budget,
            )
        except BaseException:
            platform.close()
            raise
    state = RunState(parts.run_id, spec.config)
    run = Run(
        run_id=parts.run_id,
        name=parts.name,
        kind=kind,
        mode=chosen,
        url=parts.url,
        state=state,
        owner=ranks.owner,
        on_error=on_error,
        finish_timeout_s=timeout_s,
        handle_signals=handle_signals,
        console=Console(enabled=console_enabled, directory=parts.rundir.path),
        sinks=parts.sinks,
        worker_settings=worker_settings,
        size_meter=meter,
        updates=(
            RunUpdates(state, parts.runs, attached=ranks.attached and not ranks.told)
            if parts.runs is not None
            else None
        ),
        metrics=parts.metrics,
        tags=list(spec.tags),
        rundir=parts.rundir,
        service_url=parts.service_url,
        attached=ranks.attached and chosen == "online",
        spec=spec,
        release=platform.close if platform is not None else None,
        platform_url=platform.config.api_prefix if platform is not None else None,
    )
    run._sealed_files = parts.files.sealed
    run.console.backlog_status = functools.partial(_backlog_status, weakref.ref(run))
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
            without_key=mode is None and chosen == "offline" and not traces.api_key,
        ),
    )
    if no_disk is not None:
        run.console.say(
            "%s",
            f"the runs directory {root} cannot be written ({no_disk}): what the service cannot take (an "
            "outage, a slow link, the deadline) is lost instead of kept for `prime-runs sync`; pass "
            "init(dir=...) or set PRIME_RUNS_DIR to a writable directory",
        )
    return run


def _backlog_status(ref: weakref.ref[Run]) -> str | None:
    run = ref()  # the console must not keep the run alive
    return backlog_status(run.stats()) if run is not None else None


def resolve_mode(mode: str | None, *, online_configured: bool, environ: Mapping[str, str] | None = None) -> str:
    """The argument (exact), else ``PRIME_RUNS_MODE`` (any case), else online when a key is configured."""
    env = os.environ if environ is None else environ
    from_env = (env.get(MODE_ENV) or "").strip().lower()
    chosen = mode or from_env or ("online" if online_configured else "offline")
    if chosen not in MODES:
        source = "mode" if mode else MODE_ENV
        raise ConfigurationError(f"{source}={chosen!r} is not one of 'online', 'offline' or 'disabled'")
    return chosen


def _opted_out_by_env(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    raw = (env.get(TRACES_OPT_OUT_ENV) or "").strip()
    if not raw:
        return False
    if raw.lower() in _TRUE:
        return True
    if raw.lower() in _FALSE:
        return False
    raise ConfigurationError(f"{TRACES_OPT_OUT_ENV}={raw!r} is not one of true or false")
