"""``prime-runs show RUN``: a run's status, config, summary and one sparkline per metric.

``RUN`` is a run directory (an offline run, or what an online run kept) or
a run id on the Traces service. The history of a directory is read from its
``metrics-*.jsonl.zst`` files and merged per step as the service merges it
(a later value of a name at a step replaces the earlier one). ``--json``
prints the run and its rows as one document. Errors follow the CLI's rules
(:mod:`prime_traces.cli_output`).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable
from typing import Any

import orjson

from prime_runs._history.sparkline import metric_line
from prime_runs._history.values import from_wire
from prime_runs._local.rundir import RUN_FILE, RunDirectory
from prime_runs._local.segment_reader import iter_entry_lines, scan
from prime_traces.cli_output import fail, print_json
from prime_traces.client import TracesClient
from prime_traces.config import ENV_API_KEY, ENV_TRACES_URL, resolve_config
from prime_traces.errors import PrimeTracesError

PROG = "prime-runs"


def add_show_command(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "show",
        help="show a run: status, config, summary and its metrics' sparklines",
        description="Show a run's status, config and summary, and one line per metric "
        "with a sparkline of its history, last / min / max and the steps. "
        "RUN is a run directory or a run id on the Traces service.",
    )
    p.add_argument("run", metavar="RUN", help="a run directory, or a run id on the service")
    p.add_argument("--json", action="store_true", help="print the run and its metrics rows as one JSON document")
    p.add_argument("--api-key", default=None, help=f"API key (default: ${ENV_API_KEY}, then ~/.prime/config.json)")
    p.add_argument(
        "--base-url", default=None, help=f"Traces service URL (default: ${ENV_TRACES_URL}, then ~/.prime/config.json)"
    )
    p.add_argument("--team-id", default=None, help="team to act for")
    p.set_defaults(func=run_show)


def run_show(args: argparse.Namespace) -> int:
    api_key = args.api_key
    try:
        if os.path.isdir(args.run):
            run, rows = _from_directory(args.run)
        else:
            config = resolve_config(args.api_key, args.base_url, args.team_id)
            api_key = config.api_key
            with TracesClient(config.api_key, config.base_url, config.team_id) as client:
                summary = client.get_run(args.run)
                run = {
                    k: getattr(summary, k) for k in ("run_id", "name", "kind", "status", "config", "summary", "error")
                }
                run["id"] = run.pop("run_id")
                rows = [r.to_dict() for r in client.iter_metrics(args.run, limit=10_000)]
    except (PrimeTracesError, OSError, ValueError) as err:
        fail(PROG, str(err), api_key=api_key, err=err, as_json=args.json)
        return 1
    if args.json:
        print_json({"run": run, "rows": rows})
        return 0
    for line in show_lines(run, rows):
        print(line)
    return 0


def _from_directory(path: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    rundir = RunDirectory(path)
    document = rundir.read_run()
    if document is None and not rundir.metrics_segments():
        raise ValueError(f"{path} is not a run directory (no {RUN_FILE}, no metrics)")
    run = {k: (document or {}).get(k) for k in ("id", "name", "kind", "status", "config", "summary", "error")}
    run["id"] = run["id"] or rundir.run_id
    merged: dict[int, dict[str, Any]] = {}
    loose: list[dict[str, Any]] = []
    for segment in rundir.metrics_segments():
        found = scan(segment, verify_last=False)
        for _entry, lines in iter_entry_lines(segment, found.entries, on_corrupt=lambda *_: None):
            for line in lines:
                row = orjson.loads(line)
                step = row.get("step")
                if step is None:
                    loose.append(row)
                    continue
                kept = merged.setdefault(step, {"step": step, "time": row.get("time"), "metrics": {}})
                kept["metrics"].update(row.get("metrics") or {})
                kept["time"] = max(kept["time"] or 0, row.get("time") or 0)
    return run, [merged[s] for s in sorted(merged)] + sorted(loose, key=lambda r: r.get("time") or 0)


def _pairs(mapping: Any) -> str:
    if not isinstance(mapping, dict) or not mapping:
        return "-"
    return "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in mapping.items())


def series(rows: Iterable[dict[str, Any]]) -> dict[str, tuple[list[int | None], list[Any]]]:
    """Per metric name, its steps and values in row order (NaN strings back to floats)."""
    out: dict[str, tuple[list[int | None], list[Any]]] = {}
    for row in rows:
        for name, value in (row.get("metrics") or {}).items():
            steps, values = out.setdefault(name, ([], []))
            steps.append(row.get("step"))
            values.append(from_wire(value))
    return out


def show_lines(run: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """The lines ``show`` prints."""
    name = f"{run.get('name')!r} (id {run['id']})" if run.get("name") else str(run["id"])
    head = f"run {name}  {run.get('kind') or '-'}  {run.get('status') or 'unknown'}"
    lines = [head + (f"  error: {run['error']}" if run.get("error") else "")]
    lines.append(f"config   {_pairs(run.get('config'))}")
    summary = {k: v for k, v in (run.get("summary") or {}).items() if not str(k).startswith("_records/")}
    lines.append(f"summary  {_pairs(summary)}")
    counts = {k.split("/", 1)[1]: v for k, v in (run.get("summary") or {}).items() if str(k).startswith("_records/")}
    if counts:
        lines.append(f"records  {_pairs(counts)}")
    history = series(rows)
    if not history:
        lines.append("metrics  (no history)")
        return lines
    lines.append(f"metrics  {len(rows):,} rows")
    width = max(8, min(24, max(len(n) for n in history)))
    lines += [f"  {metric_line(n, s, v, name_width=width)}" for n, (s, v) in history.items()]
    return lines
