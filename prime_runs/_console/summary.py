"""The run's lines on the console: where it goes, how finishing goes, and how it ended.

The text is built from ``run.stats()`` only, so what the console says and
what a script reads from ``stats()`` never disagree.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from prime_runs._console.console import Console, stderr_is_terminal
from prime_runs._console.progress import human_bytes, human_duration
from prime_runs._records import reasons
from prime_traces.threads import start_daemon

#: finish() shows progress only when draining takes longer than this.
PROGRESS_AFTER_S = 1.0
TTY_INTERVAL_S = 0.2
PLAIN_INTERVAL_S = 10.0


def _name(name: str | None, run_id: str) -> str:
    return f"{name!r} (id {run_id})" if name else run_id


def destination_line(
    *,
    name: str | None,
    run_id: str,
    mode: str,
    owner: bool,
    service_url: str | None,
    url: str | None,
    directory: str | None,
    save_local: bool,
    without_key: bool = False,
) -> str:
    """The line ``init()`` shows: the run, and where its records go (offline for want of a key: it says so)."""
    where = os.path.abspath(directory) if directory else None
    if mode == "offline":
        why = "no API key found (set PRIME_API_KEY or run `prime login`), so " if without_key else ""
        return (
            f"{why}run {_name(name, run_id)} is offline: it is written to {where}; "
            f"upload it later with: prime-runs sync {where}"
        )
    verb = "logging run" if owner else "logging into run"
    text = f"{verb} {_name(name, run_id)} to {service_url}"
    if url:
        text += f" (view at {url})"
    if save_local and where:
        text += f"; a copy of every record goes to {os.path.join(where, 'local')}"
    return text


def _sinks(stats: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: counts for name, counts in stats.get("sinks", {}).items() if name != "local"}


def records_left(stats: dict[str, Any]) -> int:
    return int(stats.get("queued_records", 0)) + int(stats.get("in_flight_records", 0))


def stored_bytes(stats: dict[str, Any]) -> int:
    return sum(int(c.get("bytes_sent", 0)) for c in _sinks(stats).values())


def _reasons(counter: Counter[str]) -> str:
    return ", ".join(f"{reason} {n}" for reason, n in counter.most_common())


def summary_lines(
    *,
    name: str | None,
    run_id: str,
    mode: str,
    status: str,
    stats: dict[str, Any],
    elapsed_s: float,
    directory: str | None,
    charts: Sequence[str] = (),
) -> list[str]:
    """What finish() says: the outcome, the metrics' sparklines, what was lost and why, and what to do."""
    sinks = _sinks(stats)
    submitted = int(stats.get("submitted", 0))
    stored = sum(int(c["stored"]) for c in sinks.values())
    spooled = sum(int(c["spooled"]) for c in sinks.values())
    failed: Counter[str] = Counter()
    kept: Counter[str] = Counter()
    for counts in sinks.values():
        failed.update(counts.get("failed", {}))
        kept.update({r: n for r, n in counts.get("spooled_reasons", {}).items() if n})
    dropped = Counter(stats.get("dropped", {}))
    where = os.path.abspath(directory) if directory else None
    head = f"run {_name(name, run_id)} {status} in {human_duration(elapsed_s)}: "
    if not submitted:
        lines = [head + "no records logged"]
    elif mode == "offline":
        lines = [head + f"{stored} of {submitted} records saved in {where}"]
    else:
        size = stored_bytes(stats)
        rate = f" at {human_bytes(size / elapsed_s)}/s" if elapsed_s > 0 and size else ""
        lines = [head + f"{stored} of {submitted} records stored ({human_bytes(size)}{rate})"]
    lines += [f"  {chart}" for chart in charts]
    rows = stats.get("metrics") or {}
    not_sent = {k: rows.get(k, 0) for k in ("dropped", "failed", "spooled") if rows.get(k)}
    if not_sent and mode != "offline":
        lines.append(
            f"  metrics: {rows.get('stored', 0)} of {rows.get('logged', 0)} rows stored; "
            + ", ".join(f"{n} {k}" for k, n in not_sent.items())
        )
    if failed:
        lines.append(f"  {sum(failed.values())} not stored: {_reasons(failed)}")
        rejected = sum(n for r, n in failed.items() if reasons.is_own_fault(r))
        if rejected and where:
            lines.append(
                f"  the records refused for their own fault are kept with the reason in "
                f"{os.path.join(where, 'rejected-*.jsonl.zst')} (read them with zstdcat)"
            )
    if sum(dropped.values()):
        lines.append(
            f"  {sum(dropped.values())} dropped before upload: {_reasons(dropped)}; raise max_queued_records "
            "/ max_queued_bytes, or log less often"
        )
    if mode == "offline" and where:
        lines.append(f"  upload the run with: prime-runs sync {where}")
    elif (spooled or not_sent.get("spooled")) and where:
        if spooled:
            why = _reasons(kept)
            since = sum(kept.values()) - spooled
            if since > 0:  # the run uploaded some from disk itself; the reasons count every record put there
                why += f", {since} of them uploaded since"
            lines.append(f"  {spooled} not delivered ({why}) are kept in {where}")
        lines.append(f"  upload them with: prime-runs sync {where}")
    resynced = sum(int(c.get("resynced", 0)) for c in sinks.values())
    if resynced:
        lines.append(
            f"  {resynced} records waited on disk (the uploads fell behind, or the service was down) "
            "and were uploaded from there"
        )
    return lines


def record_counts(stats: dict[str, Any], mode: str) -> dict[str, int]:
    """The counts a finished run's summary carries (``_records/stored``...): its status alone hides losses.

    Offline, ``saved`` (to the run directory) stands for ``stored``.
    """
    sinks = _sinks(stats)
    counts = {
        "_records/logged": int(stats.get("submitted", 0)),
        "_records/stored": sum(int(c["stored"]) for c in sinks.values()),
        "_records/dropped": sum(int(n) for n in stats.get("dropped", {}).values()),
        "_records/failed": sum(sum(c.get("failed", {}).values()) for c in sinks.values()),
        "_records/spooled": sum(int(c["spooled"]) for c in sinks.values()),
    }
    if mode == "offline":
        counts["_records/saved"] = counts.pop("_records/stored")
        del counts["_records/spooled"]
    return counts


class FinishProgress:
    """While ``finish()`` drains: after a second, records and bytes left, rate and time left.

    On a terminal the line is redrawn in place a few times a second; elsewhere
    a plain line every ``PLAIN_INTERVAL_S``. Runs on a daemon thread that
    ``stop`` ends (waiting for it at most ``join_s``).
    """

    def __init__(
        self,
        console: Console,
        stats: Callable[[], dict[str, Any]],
        mean_bytes: Callable[[], float],
        *,
        action: str = "upload",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.console = console
        self.action = action  # what is left to do with the records: "upload", or "write" offline
        self.stats = stats
        self.mean_bytes = mean_bytes
        self.clock = clock
        self.tty = stderr_is_terminal()
        self.interval_s = TTY_INTERVAL_S if self.tty else PLAIN_INTERVAL_S
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lines = 0

    def start(self) -> None:
        if not self.console.enabled:
            return
        self._started = self.clock()
        self._base = stored_bytes(self.stats())
        self._thread = start_daemon(self._run, "prime-runs-finish-progress")

    def line(self) -> str | None:
        stats = self.stats()
        left = records_left(stats)
        if not left:
            return None
        size_left = int(stats.get("queued_bytes", 0)) + int(stats.get("in_flight_records", 0) * self.mean_bytes())
        elapsed = max(1e-9, self.clock() - self._started)
        rate = (stored_bytes(stats) - self._base) / elapsed
        text = f"finishing: {left} records (~{human_bytes(size_left)}) left to {self.action}, {human_bytes(rate)}/s"
        if rate > 0 and size_left:
            text += f", ~{human_duration(size_left / rate)} left"
        return text

    def _run(self) -> None:
        if self._stop.wait(PROGRESS_AFTER_S):
            return
        while True:
            text = self.line()
            if text is not None:
                self.console.say("%s", text, progress=True)
                self.lines += 1
            if self._stop.wait(self.interval_s):
                return

    def stop(self, join_s: float = 0.5) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(join_s)
