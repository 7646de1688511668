"""The load test's report: one line per row while it runs, and the Markdown table of every row."""

from __future__ import annotations

import datetime
import platform
from typing import Any

from _loadtest_targets import slowest_call, verdicts

MARK_BEGIN, MARK_END = "<!-- loadtest:begin -->", "<!-- loadtest:end -->"


def line(row: dict[str, Any]) -> str:
    return (
        f"{row['scenario']} {row['variant']} [{row['sdk']}]: {row['delivered_all']} delivered of "
        f"{row['episodes_all']}, dropped {row['dropped']}, failed {row['failed']}, spooled {row['spooled']}, "
        f"lost {row['lost_all']}; finish {row['finish_s']:.1f} s, exit {row['exit_s']:.2f} s; "
        f"{row['mb_s']:.1f} MB/s; log max {row['log_max_ms']:.2f} ms; peak RSS {row['peak_rss_mb']:.0f} MB"
    )


def _slowest_call(row: dict[str, Any], ceiling: dict[str, float]) -> str:
    _ms, gc_ms, waits, preempted = slowest_call(row)
    return f"{waits} / {preempted} / {gc_ms:.2f}"


def _cpu_split(row: dict[str, Any], ceiling: dict[str, float]) -> str:
    if row["sdk"] != "ours" or "upload_thread_cpu_s" not in row:
        return "—"  # the roles are this SDK's threads
    per_mb = 1e3 / (row["json_bytes"] / 1e6)
    upload, main = row["upload_thread_cpu_s"], row["main_thread_cpu_s"]
    return f"{upload * per_mb:.2f} / {main * per_mb:.2f} / {(row['cpu_s'] - upload - main) * per_mb:.2f}"


def _page_faults(row: dict[str, Any], _ceiling: dict[str, float]) -> str:
    if "page_faults" not in row:
        return "—"
    return f"{row['page_faults'] / 1e3:.0f} / {row['service_page_faults_all'] / 1e3:.0f}"


def _service_rss(row: dict[str, Any], _ceiling: dict[str, float]) -> str:
    if "service_peak_rss_mb_all" not in row:
        return "—"
    return f"{row['service_rss_at_start_mb_all']:.0f} / {row['service_peak_rss_mb_all']:.0f}"


COLUMNS: list[tuple[str, Any]] = [
    ("scenario", lambda r, c: r["scenario"]),
    ("variant", lambda r, c: r["variant"]),
    ("SDK", lambda r, c: r["sdk"]),
    ("delivered (service, all producers)", lambda r, c: f"{r['delivered_all']} of {r['episodes_all']}"),
    ("dropped", lambda r, c: r["dropped"]),
    ("failed", lambda r, c: r["failed"]),
    ("spooled", lambda r, c: r["spooled"]),
    ("lost", lambda r, c: r["lost_all"]),
    ("MB/s", lambda r, c: f"{r['mb_s']:.1f}"),
    ("share of ceiling", lambda r, c: f"{r['mb_s'] / c['ceiling_mb_s']:.2f}"),
    ("`log_episodes()` max / p99 ms", lambda r, c: f"{r['log_max_ms']:.2f} / {r['log_p99_ms']:.2f}"),
    ("slowest call: waits / preempted / GC ms", _slowest_call),
    ("longest GC pause ms", lambda r, c: f"{r['gc_max_ms']:.2f}" if "gc_max_ms" in r else "—"),
    ("lag p99 / max ms", lambda r, c: f"{r['lag_p99_ms']:.1f} / {r['lag_max_ms']:.1f}" if r["lag_samples"] else "—"),
    ("finish s", lambda r, c: f"{r['finish_s']:.1f}"),
    ("exit s", lambda r, c: f"{r['exit_s']:.2f}" + (" (killed)" if r["exit_killed"] else "")),
    ("peak RSS MB", lambda r, c: f"{r['peak_rss_mb']:.0f}"),
    ("above workload MB", lambda r, c: f"{r['rss_above_workload_mb']:.0f}"),
    ("client CPU s", lambda r, c: f"{r['cpu_s']:.1f}"),
    ("client ms/MB: upload thread / main thread / the rest (request threads)", _cpu_split),
    ("service CPU s", lambda r, c: f"{r['service_cpu_s_all']:.1f}"),
    ("page faults, thousands: client / service", _page_faults),
    ("service RSS MB: at start / peak", _service_rss),
]


def _gzip_deflater() -> str:
    from prime_traces._upload import compress as _compress

    if _compress._isal_zlib is not None:
        return "ISA-L's level 1 (the `isal` package is installed)"
    return "zlib's level 1 (`isal` is not installed)"


def markdown(rows: list[dict[str, Any]], ceiling: dict[str, float], command: str, scale: float) -> str:
    head = (
        f"{MARK_BEGIN}\n## Load test (`tools/loadtest.py`)\n\n"
        f"`{command}`, {datetime.date.today()}, {platform.machine()}, Python {platform.python_version()}; "
        f"episode sizes: the production distribution times {scale}. Ceiling of this machine in the same run: "
        f"{ceiling['ceiling_mb_s']:.0f} MB/s (client {ceiling['client_s_per_mb'] * 1e3:.2f} ms/MB for orjson, "
        f"SHA-256 of the JSON and zstd-1; service {ceiling['service_s_per_mb'] * 1e3:.2f} ms/MB for "
        "decompression, the UTF-8 check, SHA-256 and counting lines; two cores). "
        f"Forced gzip is {_gzip_deflater()}. "
        f"Our record encoder costs {ceiling['encoder_s_per_mb'] * 1e3:.2f} ms/MB on one core "
        f"({ceiling['encoder_s_per_mb'] / ceiling['dumps_s_per_mb']:.2f}x `orjson.dumps`): it holds the GIL, "
        f"so one process cannot encode faster than {1 / ceiling['encoder_s_per_mb']:.0f} MB/s. One walk of the "
        f"records that sums their number lists, the least that refuses NaN over orjson, costs "
        f"{ceiling['walk_s_per_mb'] * 1e3:.2f} ms/MB.\n\n"
    )
    table = "| " + " | ".join(name for name, _ in COLUMNS) + " |\n" + "|---" * len(COLUMNS) + "|\n"
    table += "".join("| " + " | ".join(str(cell(r, ceiling)) for _, cell in COLUMNS) + " |\n" for r in rows)
    return head + verdicts(rows, ceiling) + "\n" + table + MARK_END + "\n"
