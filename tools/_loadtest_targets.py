"""The load test's targets, checked against the rows of one run: each a measured figure and a verdict.

A target whose scenario did not run is left out. Ratios only compare rows of
the same run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prime_runs._upload.switch_interval import DEFAULT_SWITCH_INTERVAL_S

Rows = list[dict[str, Any]]
Ceiling = dict[str, float]  # the machine's ceiling and its pauses, measured before the scenarios


def _pick(rows: Rows, scenario: str, sdk: str = "ours", variant: str | None = None) -> list[dict[str, Any]]:
    return [r for r in rows if r["scenario"] == scenario and r["sdk"] == sdk and variant in (None, r["variant"])]


def _all_delivered(rows: Rows, _ceiling: Ceiling) -> tuple[str, bool] | None:
    checked = _pick(rows, "a", variant="defaults") + _pick(rows, "b", variant="max_in_flight=8")
    if not checked:
        return None
    text = "; ".join(
        f"{r['scenario']} {r['variant']}: {r['delivered_all']} of {r['episodes']}, "
        f"dropped {r['dropped']}, failed {r['failed']}"
        for r in checked
    )
    ok = all(r["delivered_all"] == r["episodes"] and r["dropped"] == r["failed"] == 0 for r in checked)
    return text, ok


def slowest_call(row: dict[str, Any]) -> tuple[float, float, float, float]:
    """The slowest ``log_episodes()`` call of a row: (ms, GC ms, times it waited, times it was preempted)."""
    ms, _index, _cpu_ms, gc_ms, waits, preempted = row["log_slowest"][0]
    return ms, gc_ms, waits, preempted


def _log_max(rows: Rows, ceiling: Ceiling) -> tuple[str, bool] | None:
    ours = [r for r in rows if r["sdk"] == "ours"]
    if not ours:
        return None
    worst = max(ours, key=lambda r: r["log_max_ms"])
    _ms, gc_ms, waits, preempted = slowest_call(worst)
    # The calling thread's own counts (getrusage per thread): what the call waited for, not what it did.
    text = (
        f"{worst['log_max_ms']:.2f} ms at worst ({worst['scenario']} {worst['variant']}): inside it the thread "
        f"gave up its core {waits} times waiting (the GIL, a lock) and was preempted {preempted} times; "
        f"the garbage collector {gc_ms:.2f} ms"
    )
    if "crowded_median_ms" in ceiling:  # measured before the scenarios (_loadtest_floors.measure_pauses)
        cores = ceiling.get("cores", 2)
        text += (
            ". A thread waiting for the GIL while another runs Python waits at least a switch interval "
            f"({DEFAULT_SWITCH_INTERVAL_S * 1e3:g} ms while a run uploads); a preempted thread waited "
            f"{ceiling['crowded_median_ms']:.1f} ms at the median here ({cores + 1:.0f} spinning "
            f"threads on {cores:.0f} cores; at most {ceiling['crowded_max_ms']:.1f}); "
        )
        alone_ms, seconds = ceiling["alone_max_ms"], ceiling["seconds"]
        if alone_ms > 0:
            text += f"alone, a spinning thread lost its core for at most {alone_ms:.1f} ms in {seconds:.0f} s"
        else:  # no gap over the threshold at all
            threshold_ms = ceiling.get("pause_threshold_ms", 0.3)
            text += f"alone, a spinning thread never lost its core for over {threshold_ms:g} ms in {seconds:.0f} s"
    if "call_floor_max_ms" in ceiling:  # measured before the scenarios (_loadtest_floors.measure_call_floor)
        text += _call_floor(ceiling, ours)
    return text, worst["log_max_ms"] <= 1.0


def _call_floor(ceiling: Ceiling, ours: Rows) -> str:
    def floor(prefix: str) -> str:
        over, calls = ceiling[prefix + "over_1ms"], ceiling[prefix + "calls"]
        return f"the slowest took {ceiling[prefix + 'max_ms']:.2f} ms, {over:,.0f} of {calls:,.0f} calls over 1 ms"

    text = (
        ". The floor here, with no SDK: a stand-in for the call's path (copy the list, queue it under a "
        f"condition, count under a lock: {ceiling['call_floor_python_median_us']:.1f} µs at the median) called "
        f"in a tight loop for {ceiling['call_floor_seconds']:g} s with the collector off, beside one thread of "
        f"pure Python: {floor('call_floor_python_')}; beside that thread and one hashing in 1 MiB steps: "
        f"{floor('call_floor_')}"
    )
    counted = [r for r in ours if "log_over_1ms" in r and r["episodes"]]
    if counted:
        most = max(counted, key=lambda r: r["log_over_1ms"] / r["episodes"])
        text += (
            f"; ours, the most per call: {most['log_over_1ms']:,} of {most['episodes']:,} calls over 1 ms "
            f"({most['scenario']} {most['variant']}, {most['log_s']:.2f} s of logging)"
        )
    return text


def _lag(rows: Rows, ceiling: Ceiling) -> tuple[str, bool] | None:
    # Scenario v's lag is verifiers' to_record() holding the GIL: its own target compares it with the published SDK.
    probed = [r for r in rows if r["sdk"] == "ours" and r["lag_samples"] and r["scenario"] != "v"]
    if not probed:
        return None
    worst_row = max(probed, key=lambda r: r["lag_p99_ms"])
    p99, worst = worst_row["lag_p99_ms"], max(r["lag_max_ms"] for r in probed)
    text = f"p99 {p99:.1f} ms ({worst_row['scenario']} {worst_row['variant']}), max {worst:.1f} ms"
    if "lag_floor_p99_ms" in ceiling:  # measured before the scenarios (_loadtest_floors.measure_lag_floor)
        text += _lag_floor(ceiling, p99)
    return text, p99 <= 5.0 and worst <= 15.0


def _lag_floor(ceiling: Ceiling, p99: float) -> str:
    def floor(prefix: str) -> str:
        return f"p99 {ceiling[prefix + 'p99_ms']:.1f} ms, max {ceiling[prefix + 'max_ms']:.1f}"

    text = (
        ". The floor here, with no SDK: the same probe beside one thread of pure Python (it lets go of the GIL "
        "within a few bytecodes once another thread has waited a switch interval for it), with one thread more "
        f"than cores ({ceiling['lag_floor_spinners']:.0f} spinning processes) {floor('lag_floor_')}; with the "
        f"cores busy ({ceiling['lag_floor_busy_spinners']:.0f}) {floor('lag_floor_busy_')}; alone "
        f"{floor('lag_floor_alone_')}"
    )
    if ceiling["lag_floor_p99_ms"] > 0:
        text += f". Ours at worst is {p99 / ceiling['lag_floor_p99_ms']:.2f}x the first floor's p99"
    return text


def _share_and_published(rows: Rows, ceiling: Ceiling) -> tuple[str, bool] | None:
    ours, gzip, published = (
        _pick(rows, "a", variant="defaults"),
        _pick(rows, "a", variant="gzip"),
        _pick(rows, "a", "published"),
    )
    if not ours:
        return None
    share = ours[0]["mb_s"] / ceiling["ceiling_mb_s"]
    efficiency, busy = share_factors(ours[0], ceiling)
    text = (
        f"{share:.2f} of the ceiling = CPU efficiency {efficiency:.2f} (the ceiling's CPU over the run's) "
        f"× two cores busy {busy:.2f}"
    )
    best = efficiency_bound(ours[0], ceiling)
    text += (
        f"; had the upload thread cost one `orjson.dumps` plus one walk of the record (the least that refuses "
        f"NaN here), efficiency about {best:.2f}, share about {best * busy:.2f} at this run's busy"
    )
    most, walk_ms, main_ms = share_bound(ours[0], ceiling)
    text += (
        f"; this SDK cannot pass {most:.3f} here even with two cores fully busy: beyond the ceiling's "
        f"operations it must walk the records to refuse NaN ({walk_ms:.2f} ms/MB) and the producer make and "
        f"hand them over ({main_ms:.2f} ms/MB on its thread)"
    )
    ok = share >= 0.85
    if published:
        ratio = ours[0]["mb_s"] / published[0]["mb_s"]
        text += f"; {ratio:.1f}x the published SDK"
        ok = ok and ratio >= 15
        if gzip:
            gzip_ratio = gzip[0]["mb_s"] / published[0]["mb_s"]
            text += f" ({gzip_ratio:.1f}x with gzip)"
            ok = ok and gzip_ratio >= 8
    return text, ok


def share_factors(row: dict[str, Any], ceiling: Ceiling) -> tuple[float, float]:
    """A row's share of the ceiling as its two exact factors: CPU efficiency × how busy it kept two cores.

    Efficiency is the CPU the ceiling's operations need for the row's bytes
    over the CPU spent by the producer (from ``init()``'s return on, the load
    test's own work included) and the service (its whole run); busy is that CPU
    over two cores for the producer's wall time. Their product is the share,
    so a run cannot pass its efficiency however well it keeps the cores busy.
    """
    spent = _spent_s(row)
    return _needed_s(row, ceiling) / spent, spent / (2 * row["wall_s"])


def _spent_s(row: dict[str, Any]) -> float:
    """CPU seconds of the producer and the service together."""
    return row["cpu_s"] + row["service_cpu_s_all"]


def _needed_s(row: dict[str, Any], ceiling: Ceiling) -> float:
    """CPU seconds the ceiling's operations need for the row's bytes."""
    return (ceiling["client_s_per_mb"] + ceiling["service_s_per_mb"]) * row["json_bytes"] / 1e6


def efficiency_bound(row: dict[str, Any], ceiling: Ceiling) -> float:
    """The row's CPU efficiency had its upload thread cost only one ``orjson.dumps`` and one walk per record.

    Everything else (request threads, the rest of the producer, the service)
    stays as measured. An estimate, not a bound: the walk and ``dumps`` are
    measured apart from the run, and the rest includes the load test's own work.
    """
    floor = (ceiling["dumps_s_per_mb"] + ceiling["walk_s_per_mb"]) * row["json_bytes"] / 1e6
    return _needed_s(row, ceiling) / (_spent_s(row) - row["upload_thread_cpu_s"] + floor)


def share_bound(row: dict[str, Any], ceiling: Ceiling) -> tuple[float, float, float]:
    """The highest share of the ceiling this SDK could reach here: (share, walk ms/MB, producer ms/MB).

    The ceiling counts only what the wire contract makes both sides do. A run
    must also refuse NaN and ±Infinity, which orjson writes as ``null``: at
    least one walk of every record (the load test's own walk, measured apart
    from the run); and its producing thread spends CPU on the same two cores
    (as measured in the run: the workload and ``log_episodes()``). With both
    cores busy all the time, the share is at most the ceiling's CPU over the
    ceiling's CPU plus those two.
    """
    mb = row["json_bytes"] / 1e6
    walk_s, main_s = ceiling["walk_s_per_mb"] * mb, row["main_thread_cpu_s"]
    needed = _needed_s(row, ceiling)
    return needed / (needed + walk_s + main_s), walk_s / mb * 1e3, main_s / mb * 1e3


def _window_speedup(rows: Rows, _ceiling: Ceiling) -> tuple[str, bool] | None:
    one, eight = _pick(rows, "b", variant="max_in_flight=1"), _pick(rows, "b", variant="max_in_flight=8")
    if not (one and eight):
        return None
    r1 = one[0]
    # Per batch at 1 in flight: CPU c (client and service) then network n, one after the other; two cores
    # run at most two batches' CPU at once, so no window can beat (c + n) / (c / 2) = 2 + 2n/c.
    batches = max(1, r1["uploads_all"])
    cpu = _spent_s(r1) / batches
    network = 0.1 + (r1["wire_mb_all"] / batches) / 100
    bound = 2 + 2 * network / cpu
    ratio = eight[0]["mb_s"] / r1["mb_s"]
    r8 = eight[0]
    cpu8 = _spent_s(r8) / max(1, r8["uploads_all"])
    # The 8-in-flight run cannot end before its own CPU is spent on two cores: 1-in-flight time over that floor.
    floor_ratio = r1["wall_s"] / (_spent_s(r8) / 2)
    text = (
        f"{ratio:.2f}x over 1 in flight; bound {bound:.2f}x; {ratio / bound:.3f} of it. CPU per batch "
        f"{cpu * 1e3:.0f} ms at 1 in flight, {cpu8 * 1e3:.0f} ms at 8; at 8 the run's own CPU on two cores "
        f"allows {floor_ratio:.2f}x, and it kept them {ratio / floor_ratio:.2f} busy"
    )
    free = _pick(rows, "a", variant="defaults")
    if free:  # the same work with no network time at all: what 8 in flight can approach, not pass
        needed = 0.9 * bound * r1["mb_s"]
        text += (
            f"; 0.9 of the bound asks {needed:.0f} MB/s at 8 in flight, "
            f"{needed / free[0]['mb_s']:.2f}x what (a) did with no network time ({free[0]['mb_s']:.0f} MB/s)"
        )
    return text, ratio >= 0.9 * bound


def _poisoned(rows: Rows, _ceiling: Ceiling) -> tuple[str, bool] | None:
    ours = _pick(rows, "c")
    if not ours:
        return None
    r = ours[0]
    named = sum(1 for detail in r.get("failure_details", {}).values() if "NaN" in detail)
    return f"lost {r['lost_all']}, failed {r['failed']}, named {named}", r["lost_all"] == r["failed"] == named == 1


def _hung(rows: Rows, _ceiling: Ceiling) -> tuple[str, bool] | None:
    ours = _pick(rows, "d")
    if not ours:
        return None
    r = ours[0]
    ok = r["finish_s"] <= 60 + 1 and r["lost_all"] == 0 and r["spooled"] == r["episodes"] and r["exit_s"] <= 1.0
    return f"finish {r['finish_s']:.1f} s, spooled {r['spooled']} of {r['episodes']}, exit {r['exit_s']:.2f} s", ok


def _two_producers(rows: Rows, _ceiling: Ceiling) -> tuple[str, bool] | None:
    alone, two, shared = (
        _pick(rows, "e", variant=v) for v in ("one producer", "two credentials", "one shared credential")
    )
    if not (alone and two and shared):
        return None
    rate = alone[0]["mb_s"]
    two_rate, shared_rate = sum(r["mb_s"] for r in two), sum(r["mb_s"] for r in shared)
    complete = all(r["delivered_all"] == r["episodes_all"] for r in two + shared)
    ok = complete and two_rate >= 1.8 * rate and shared_rate >= 0.9 * rate
    return f"two credentials {two_rate / rate:.2f}x one producer, one shared {shared_rate / rate:.2f}x", ok


def _memory(rows: Rows, _ceiling: Ceiling) -> tuple[str, bool] | None:
    a, f = _pick(rows, "a", variant="defaults"), _pick(rows, "f")
    if not (a or f):
        return None
    parts, ok = [], True
    if a:
        parts.append(f"a: {a[0]['rss_above_workload_mb']:.0f} MB above the workload")
        ok = ok and a[0]["rss_above_workload_mb"] <= 250
    if f:
        parts.append(f"f: peak {f[0]['peak_rss_mb']:.0f} MB")
        ok = ok and f[0]["peak_rss_mb"] <= 600
    return "; ".join(parts), ok


def _verifiers(rows: Rows, _ceiling: Ceiling) -> tuple[str, bool] | None:
    ours = _pick(rows, "v")
    if not ours:
        return None
    parts, ok = [], True
    for row in ours:
        text = (
            f"{row['variant']}: {row['delivered_all']} of {row['episodes']} in {row['wall_s']:.1f} s, "
            f"lag p99 {row['lag_p99_ms']:.0f} / max {row['lag_max_ms']:.0f} ms"
        )
        ok = ok and row["delivered_all"] == row["episodes"]
        published = _pick(rows, "v", "published", row["variant"])
        if published:
            theirs = published[0]
            ratio = theirs["wall_s"] / row["wall_s"]
            text += (
                f" (published {theirs['delivered_all']} in {theirs['wall_s']:.1f} s, lag p99 "
                f"{theirs['lag_p99_ms']:.0f} / max {theirs['lag_max_ms']:.0f} ms: ours {ratio:.2f}x as fast)"
            )
            ok = ok and row["wall_s"] <= theirs["wall_s"]
        parts.append(text)
    return "; ".join(parts), ok


TARGETS: list[tuple[str, Callable[[Rows, Ceiling], tuple[str, bool] | None]]] = [
    ("(a), (b at 8): every episode delivered, 0 dropped, 0 failed", _all_delivered),
    ("`log_episodes()` max ≤ 1 ms in every scenario", _log_max),
    ("event-loop lag while uploading: p99 ≤ 5 ms, max ≤ 15 ms", _lag),
    ("(a): ≥ 0.85 of the ceiling; ≥ 15x the published SDK (≥ 8x with gzip)", _share_and_published),
    ("(b): 8 in flight over 1 ≥ 0.9 × the two-core bound 2 + 2n/c", _window_speedup),
    ("(c): exactly one record lost, reported exactly", _poisoned),
    ("(d): finish() within its budget, 0 lost (spooled), exit at once", _hung),
    ("(e): both delivered; two credentials ≥ 1.8x one producer, one shared ≥ 0.9x", _two_producers),
    ("(a): RSS above the workload ≤ 250 MB; (f): peak RSS ≤ 600 MB", _memory),
    ("(v): verifiers Episode objects and dicts: every one delivered, no slower than the published SDK", _verifiers),
]


def verdicts(rows: Rows, ceiling: Ceiling) -> str:
    """The targets as a markdown table: target, measured, PASS or FAIL."""
    lines = ["| target | measured | verdict |", "|---|---|---|"]
    for name, check in TARGETS:
        result = check(rows, ceiling)
        if result is not None:
            lines.append(f"| {name} | {result[0]} | {'PASS' if result[1] else 'FAIL'} |")
    return "\n".join(lines) + "\n"
