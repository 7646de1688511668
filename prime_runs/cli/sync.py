"""``prime-runs sync``: upload local runs, exactly once.

``sync`` exits 0 when every record of every run is on the service, 3 when
everything is except records the service (or the run itself) refused, which
stay in the runs' ``rejected-*.jsonl.zst`` files, 4 when everything that
still reads is but records were lost (damage on disk, or the run itself
could not keep them: running it again cannot help), 1 when something is left to upload (run it again, or it gave
up after ``--timeout-s`` without progress), and 2 for a bad command line. Problems
are one line on stderr, ``prime-runs: ...``: never a traceback, never the API
key. What stdout's reader did not wait for (``| head``) ends quietly:
``prime_runs.cli`` sees to that.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from prime_runs._console.progress import Progress, human_bytes
from prime_runs._local.rundir import RUN_FILE, RunDirectory, runs_root
from prime_runs._local.segments import DATA_KINDS, METRICS, REJECTED, segment_files
from prime_runs._local.sync_run import SyncReport, sync_run
from prime_runs.cli.sync_target import SyncTarget
from prime_runs.cli.sync_watch import DEFAULT_SYNC_TIMEOUT_S, SyncTimedOut, SyncWatch
from prime_runs.errors import PrimeRunsError
from prime_traces import TracesClient
from prime_traces.cli_output import positive_float
from prime_traces.config import ENV_API_KEY, ENV_TRACES_URL, resolve_config
from prime_traces.errors import PrimeTracesError
from prime_traces.platform import PlatformClient

PROG = "prime-runs"
EXIT_OK, EXIT_LEFT, EXIT_USAGE, EXIT_REJECTED, EXIT_LOST = 0, 1, 2, 3, 4
EXIT_UNREADABLE = 1  # ls: the runs could not be read
#: A run's own drain, stopped by its finish(), lets go of the sync lock within about a second.
_WAIT_FOR_LOCK_S = 5.0


def add_sync_command(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "sync",
        help="upload local runs to the Traces service",
        description="Upload runs kept on local disk (offline runs, and what an online run could not "
        "deliver) to the Traces service, exactly once: an interrupted or repeated sync uploads "
        "only what is missing. Exit status: 0 all uploaded; 3 all uploaded but records the service "
        "refused (kept in rejected-*.jsonl.zst); 4 all that is left uploaded, but records were lost (damage on "
        "disk, or the run itself could not keep them: running sync again will not help); 1 something left to "
        "upload (run it again).",
    )
    p.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="a run directory, or a directory of them (default: $PRIME_RUNS_DIR, else ./prime-runs)",
    )
    p.add_argument("--api-key", default=None, help=f"API key (default: ${ENV_API_KEY}, then ~/.prime/config.json)")
    p.add_argument(
        "--base-url",
        default=None,
        help=f"Traces service URL (default: ${ENV_TRACES_URL}, then the run's own, then ~/.prime/config.json)",
    )
    p.add_argument("--team-id", default=None, help="team to act for")
    p.add_argument(
        "--timeout-s",
        type=positive_float,
        default=DEFAULT_SYNC_TIMEOUT_S,
        metavar="S",
        help=f"give up after S seconds without progress, exit status 1 (default {DEFAULT_SYNC_TIMEOUT_S:g}); "
        "while it waits, sync says so every 30 s",
    )
    p.add_argument(
        "--retry-rejected",
        action="store_true",
        help="send again the records the service refused (not those this package's own rules refused), "
        "each once; says how many it stored and how many are still refused",
    )
    p.set_defaults(func=run_sync)


def _fail(message: str) -> None:
    print(f"{PROG}: {' '.join(message.split())}", file=sys.stderr)


def is_run_directory(path: str) -> bool:
    """Whether ``path`` is a run's directory (a stray file in a directory of runs is not)."""
    if not os.path.isdir(path):
        return False
    return os.path.isfile(os.path.join(path, RUN_FILE)) or bool(segment_files(path, (*DATA_KINDS, REJECTED, METRICS)))


def find_runs(paths: list[str]) -> tuple[list[str], list[str]]:
    """Run directories among ``paths`` (each a run directory or a directory of them), and missing paths."""
    runs, missing = [], []
    for path in paths:
        if not os.path.isdir(path):
            missing.append(path)
        elif is_run_directory(path):
            runs.append(path)
        else:
            for child in (os.path.join(path, n) for n in sorted(os.listdir(path))):
                if is_run_directory(child):
                    runs.append(child)
                elif not os.path.isdir(child):
                    _fail(f"skipped {child}: a file, not a run directory")
    return runs, missing


def run_sync(args: argparse.Namespace) -> int:
    runs, missing = find_runs(args.paths or [runs_root()])
    for path in missing:
        _fail(f"no such directory: {path}")
    if missing:
        return EXIT_USAGE
    if not runs:
        print(f"no runs to sync in {', '.join(args.paths or [runs_root()])}", file=sys.stderr)
        return EXIT_OK
    clients: dict[tuple[str, str], Any] = {}
    outcome = EXIT_OK
    watch = SyncWatch(args.timeout_s, lambda text: print(f"{PROG}: {text}", file=sys.stderr, flush=True))
    try:
        for path in runs:
            report = _sync_one(path, args, clients, watch)
            if report is None or not report.uploaded_all:
                outcome = EXIT_LEFT
            elif report.lost and outcome != EXIT_LEFT:
                outcome = EXIT_LOST
            elif report.rejected_total and outcome == EXIT_OK:
                outcome = EXIT_REJECTED
    except SyncTimedOut as err:
        again = " ".join(args.paths) if args.paths else ""
        _fail(f"{err}; run prime-runs sync {again} again to upload the rest (nothing is uploaded twice)")
        _fail(f"(a slower service may need more time: --timeout-s, now {args.timeout_s:g})")
        return EXIT_LEFT
    except KeyboardInterrupt:
        _fail("interrupted; run prime-runs sync again to upload the rest (nothing is uploaded twice)")
        return 130
    finally:
        for client in clients.values():
            client.close()
    return outcome


def _sync_one(
    path: str, args: argparse.Namespace, clients: dict[tuple[str, str], Any], watch: SyncWatch
) -> SyncReport | None:
    rundir = RunDirectory(path)
    try:
        document = rundir.read_run() or {}
        target = SyncTarget.of(args.base_url, document)
        config = resolve_config(args.api_key, target.traces_url, args.team_id)
        if not config.api_key:
            raise PrimeRunsError(f"no API key to upload {path} with: set {ENV_API_KEY} or pass --api-key")
        key = (config.base_url, config.team_id)
        client = clients.get(key)
        if client is None:
            client = clients[key] = TracesClient(config.api_key, config.base_url, config.team_id)
        if target.note:
            print(f"{rundir.run_id}: {target.note}")
        platform_url = target.platform_url or config.base_url
        platform = clients.get(("platform", platform_url))
        if platform is None:
            platform = clients[("platform", platform_url)] = PlatformClient(config.api_key, platform_url)
        progress = Progress(rundir.run_id)

        def started(records: int, size: int) -> None:
            watch.progress()
            progress.start(records, size)

        def advanced(records: int, size: int) -> None:
            watch.progress()
            progress.advance(records, size)

        try:
            report = watch.run(
                lambda: sync_run(
                    rundir,
                    client,
                    platform,
                    on_start=started,
                    on_progress=advanced,
                    wait_for_lock_s=_WAIT_FOR_LOCK_S,
                    retry_rejected=args.retry_rejected,
                ),
                config.base_url,
            )
        finally:
            progress.close()
    except SyncTimedOut:
        raise
    except (PrimeRunsError, PrimeTracesError, OSError, ValueError) as err:
        _fail(f"{path}: {err}")
        return None
    for torn in report.torn:
        print(
            f"{report.run_id}: {torn.path} ended in a torn entry ({torn.problem}); cut off {torn.torn_bytes} "
            f"bytes, kept the {torn.lines} whole lines before it",
            file=sys.stderr,
        )
    for damage in report.damaged:
        _fail(f"{report.run_id}: {damage.describe()}")
    for error in report.errors:
        _fail(f"{report.run_id}: {error}")
    print(_summary(report, config.base_url))
    return report


def records(count: int) -> str:
    return f"{count} record{'' if count == 1 else 's'}"


def _summary(report: SyncReport, url: str) -> str:
    if report.uploaded:
        text = f"{report.run_id}: {records(report.uploaded)} uploaded ({human_bytes(report.uploaded_bytes)}) to {url}"
    else:
        text = f"{report.run_id}: nothing new to upload to {url}"
    if report.metric_rows:
        text += f"; {report.metric_rows} metrics rows"
    if report.status:
        text += f"; status {report.status}"
    if report.left:
        text += f"; {records(report.left)} left: run prime-runs sync {report.path} again"
    if report.lost_to_damage:
        text += (
            f"; {records(report.lost_to_damage)} lost to damage on disk (entries that do not read, files cut short:"
            " running sync again cannot bring them back; stderr says where)"
        )
    if report.retried is not None:
        retried = report.retried
        text += f"; retried {records(retried.stored + retried.refused)} the service had refused: "
        text += f"{retried.stored} stored, {retried.refused} still refused"
        if retried.stored_before:
            text += f" ({retried.stored_before} stored by an earlier retry)"
    if report.lost_by_run:
        by_reason = ", ".join(f"{reason}: {count}" for reason, count in sorted(report.lost_by_run.items()))
        text += f"; {records(sum(report.lost_by_run.values()))} the run itself could not keep ({by_reason})"
    if report.rejected_total:
        text += (
            f"; {records(report.rejected_total)} refused"
            f"{f' ({report.rejected_now} just now)' if report.rejected_now else ''}, "
            f"kept in {os.path.join(report.path, 'rejected-*.jsonl.zst')}"
        )
    return text
