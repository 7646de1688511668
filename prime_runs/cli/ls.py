"""``prime-runs ls``: the local runs, and what is left to upload of each.

It exits 0, 2 for a directory that does not exist and 1 when the runs cannot
be read. It reads only: nothing is repaired or changed. Problems are one line
on stderr, ``prime-runs: ...``; with ``--json`` stdout gets one JSON document
either way, the runs or ``{"error": {"message", "code": null, "status":
null}}``.
"""

from __future__ import annotations

import argparse
import datetime
import os
from typing import Any

from prime_runs._console.progress import human_bytes
from prime_runs._local.damage import check_sealed, sealed_sizes
from prime_runs._local.file_progress import FileProgress, pending
from prime_runs._local.rundir import RunDirectory, runs_root
from prime_runs._local.segment_reader import scan
from prime_runs.cli.sync import EXIT_OK, EXIT_UNREADABLE, EXIT_USAGE, PROG, find_runs
from prime_runs.errors import PrimeRunsError
from prime_traces.cli_output import fail, print_json


def add_ls_command(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "ls",
        help="list local runs and what is left to upload",
        description="List the runs in DIR: name, id, status, records and bytes "
        "left to upload, and when they were last synced.",
    )
    p.add_argument(
        "dir",
        nargs="?",
        default=None,
        metavar="DIR",
        help="directory of runs (default: $PRIME_RUNS_DIR, else ./prime-runs)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(func=run_ls)


def local_status(rundir: RunDirectory, document: dict[str, Any]) -> str:
    """The status a run directory shows: ``crashed`` for one whose process died while it was running."""
    status = str(document.get("status") or "unknown")
    if status == "running" and not rundir.owner_alive():
        return "crashed"
    return status


def describe_run(path: str) -> dict[str, Any]:
    """What ``ls`` shows of one run directory (read only: nothing is repaired or changed)."""
    rundir = RunDirectory(path)
    try:
        document = rundir.read_run() or {}
        state = rundir.read_sync()
    except PrimeRunsError as err:
        return {
            "path": path,
            "id": rundir.run_id,
            "name": None,
            "status": f"unreadable: {err}",
            "records_left": None,
            "bytes_left": None,
            "records_damaged": None,
            "last_sync": None,
        }
    service = document.get("service_url") or state.get("last_service")
    mine = state.get("services", {}).get(service, {}) if service else {}
    files = mine.get("files", {})
    sealed = sealed_sizes(document)
    records = size = damaged = 0
    for segment in rundir.data_segments():
        name = os.path.basename(segment)
        progress = FileProgress.load(files.get(name))
        left = pending(scan(segment, verify_last=False), progress)
        records, size = records + left[0], size + left[1]
        damaged += progress.unreadable_lines()
        if name in sealed:
            damage = check_sealed(segment, *sealed[name], repair=False)
            damaged += damage.lost if damage is not None else 0
    last = mine.get("last_sync", {}).get("at")
    return {
        "path": path,
        "id": document.get("id") or rundir.run_id,
        "name": document.get("name"),
        "status": local_status(rundir, document) if document else "unknown",
        "records_left": records,
        "bytes_left": size,
        "records_damaged": damaged,
        "last_sync": last,
    }


def run_ls(args: argparse.Namespace) -> int:
    root = args.dir or runs_root()
    if not os.path.isdir(root):
        fail(PROG, f"no such directory: {root}", as_json=args.json)
        return EXIT_USAGE
    try:
        runs, _ = find_runs([root])
        rows = [describe_run(path) for path in runs]
    except (PrimeRunsError, OSError, ValueError) as err:
        fail(PROG, f"{root}: {err}", err=err, as_json=args.json)
        return EXIT_UNREADABLE
    if args.json:
        print_json(rows)
        return EXIT_OK
    if not rows:
        print(f"no runs in {root}")
        return EXIT_OK
    table = [("NAME", "ID", "STATUS", "RECORDS LEFT", "BYTES LEFT", "DAMAGED", "LAST SYNC")]
    for row in rows:
        when = row["last_sync"]
        table.append(
            (
                row["name"] or "-",
                row["id"],
                row["status"],
                str(row["records_left"]),
                human_bytes(row["bytes_left"] or 0),
                str(row["records_damaged"] or 0),
                datetime.datetime.fromtimestamp(when).strftime("%Y-%m-%d %H:%M:%S") if when else "never",
            )
        )
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    for cells in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(cells, widths)).rstrip())
    return EXIT_OK
