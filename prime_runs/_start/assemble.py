"""What a run is made of, per mode: its directory, its sinks, its metrics lane, and its run on the platform.

Offline, records and rows go to the run directory. Online, the run is
created on the platform (or attached to), records go to the Traces service
(kept in the run directory when it cannot take them), training metrics go
to the platform step by step, and what the platform has no place for (an
evaluation's metrics history) is kept in the run directory.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prime_runs._history.lane import MetricsLane
from prime_runs._local.disk_budget import DiskBudget
from prime_runs._local.rundir import RunDirectory, check_run_id
from prime_runs._local.segments import METRICS
from prime_runs._local.spool import RecordFiles, Spool
from prime_runs._records.lines import RunStamp
from prime_runs._records.sink import Sink
from prime_runs._records.size_meter import SizeMeter
from prime_runs._service.ownership import RankInfo, export_run_id, new_run_id
from prime_runs._service.platform_runs import Handle, PlatformRuns, RunSpec, runs_for
from prime_runs._sinks.disk import DiskSink
from prime_runs._sinks.legacy import legacy_for
from prime_traces.client import TracesClient
from prime_traces.config import ClientConfig
from prime_traces.platform import PlatformClient

# A cancelled upload waits this long for requests in flight, inside finish()'s +1 s.
_ABANDON_AFTER_S = 0.3


@dataclass
class Parts:
    """What a mode assembles for its run."""

    run_id: str
    name: str | None
    rundir: RunDirectory
    files: RecordFiles
    sinks: list[Sink]
    metrics: MetricsLane
    url: str | None = None
    #: The Traces service the records go to (online).
    service_url: str | None = None
    #: The run's lifecycle on the platform (online, and only where this process records it).
    runs: PlatformRuns | None = None


def open_directory(root: str, run_id: str) -> RunDirectory:
    rundir = RunDirectory(os.path.join(root, run_id))
    if rundir.exists():
        rundir.recover()  # a crashed earlier process may have left a torn last entry
    return rundir


def offline(root: str, ranks: RankInfo, spec: RunSpec, meter: SizeMeter, budget: DiskBudget | None = None) -> Parts:
    run_id = ranks.run_id or new_run_id()
    rundir = open_directory(root, run_id)
    files = RecordFiles(rundir.path, budget=budget)
    return Parts(
        run_id=run_id,
        name=spec.name,
        rundir=rundir,
        files=files,
        sinks=[DiskSink(files, RunStamp(run_id, spec.kind), meter)],
        metrics=MetricsLane(send=None, writer=functools.partial(files.writer, METRICS)),
    )


def online(
    traces: ClientConfig,
    platform: PlatformClient,
    root: str,
    ranks: RankInfo,
    spec: RunSpec,
    meter: SizeMeter,
    *,
    max_in_flight: int,
    compression: str,
    save_local: bool,
    opted_out: bool,
    keep_on_disk: bool = True,
    budget: DiskBudget | None = None,
) -> Parts:
    """Create or attach the run on the platform, then the sinks; the platform client belongs to the parts.

    ``keep_on_disk=False`` (the runs directory cannot be written): the Traces sink has no spool.
    """
    from prime_runs._sinks.traces import TracesSink

    runs = runs_for(spec.kind, platform, team_id=traces.team_id or None)
    handle = _create_or_attach(runs, ranks, spec)
    rundir = open_directory(root, handle.id)
    client = TracesClient(
        traces.api_key,
        traces.base_url,
        traces.team_id,
        max_in_flight=max_in_flight,
        compression=compression,
        abandon_after_s=_ABANDON_AFTER_S,
    )
    stamp = RunStamp(handle.id, spec.kind)
    files = RecordFiles(rundir.path, budget=budget)
    context = spec.upload_context()
    sink = TracesSink(
        client,
        stamp=stamp,
        context=context,
        meter=meter,
        owns_client=True,
        spool=Spool(files, stamp, meter) if keep_on_disk else None,
        legacy=legacy_for(spec.kind, platform, handle.id),
        opted_out=opted_out,
    )
    sinks: list[Sink] = [sink]
    if save_local:
        sinks.append(DiskSink(RecordFiles(rundir.local_path), stamp, name="local", validate=False))
    send = functools.partial(_send_rows, runs, handle.id) if spec.kind == "train" else None
    metrics = MetricsLane(send=send, writer=functools.partial(files.writer, METRICS))
    return Parts(
        run_id=handle.id,
        name=handle.name or spec.name,
        rundir=rundir,
        files=files,
        sinks=sinks,
        metrics=metrics,
        url=handle.url,
        service_url=traces.base_url,
        runs=runs if ranks.owner else None,
    )


def _create_or_attach(runs: PlatformRuns, ranks: RankInfo, spec: RunSpec) -> Handle:
    if ranks.run_id is not None:
        return runs.attach(ranks.run_id)
    # The platform's own errors reach the caller as they are (ForbiddenError names why a team may not).
    handle = runs.create(spec)
    check_run_id(handle.id, f"the platform at {runs.client.config.origin}")
    # Processes this one starts (other ranks, eval workers) log into the same run.
    export_run_id(handle.id, spec.kind)
    return handle


def _send_rows(runs: PlatformRuns, run_id: str, rows: Sequence[Mapping[str, Any]], timeout_s: float | None) -> None:
    runs.send_metrics(run_id, rows, timeout_s or 60.0)
