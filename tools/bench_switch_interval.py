"""What the run's lowered switch interval costs a CPU-bound training thread, and what it buys a latency-bound one.

    python tools/bench_switch_interval.py [--episodes 200] [--rounds 3]

Each round, once with ``init(switch_interval_s=None)`` (CPython's 5 ms) and
once with the default (0.5 ms), in the same process, in alternating order: an offline
run logs ``--episodes`` production-sized episodes (scale 0.1) while the main
thread does a fixed amount of pure-Python work; a third thread sleeps 1 ms at
a time and records how late it wakes. Reported per setting (medians over the
rounds) and as ratios of 0.5 ms over 5 ms: the main thread's work time, the
time until ``finish()`` returns, the process's CPU, and the sleeper's lateness.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _loadgen import production_sizes
from loadtest import make_templates

import prime_runs

PROBE_INTERVAL_S = 0.001


def _busy(iterations: int) -> float:
    started = time.perf_counter()
    total = 0
    for i in range(iterations):
        total += i * i % 7
    return time.perf_counter() - started


def _probe(stop: threading.Event, late: list[float]) -> None:
    while not stop.is_set():
        started = time.perf_counter()
        time.sleep(PROBE_INTERVAL_S)
        late.append(time.perf_counter() - started - PROBE_INTERVAL_S)


def one_round(
    episodes: list[dict[str, Any]], workdir: str, interval_s: float | None, iterations: int
) -> dict[str, float]:
    before = sys.getswitchinterval()
    late: list[float] = []
    stop = threading.Event()
    probe = threading.Thread(target=_probe, args=(stop, late), daemon=True)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    run = prime_runs.init(
        "switch-bench", mode="offline", dir=workdir, console="off", handle_signals=False, switch_interval_s=interval_s
    )
    probe.start()
    for episode in episodes:
        run.log_episodes([episode])
    busy_s = _busy(iterations)
    run.finish(timeout_s=300)
    wall_s = time.perf_counter() - wall0
    stored = run.stats()["sinks"]["offline"]["stored"]
    assert stored == len(episodes), f"stored {stored} of {len(episodes)}"
    stop.set()
    probe.join()
    assert sys.getswitchinterval() == before, "the run did not put the switch interval back"
    late.sort()
    return {
        "busy_s": busy_s,
        "finish_s": wall_s,
        "cpu_s": time.process_time() - cpu0,
        "late_p99_ms": late[int(len(late) * 0.99)] * 1e3,
        "late_max_ms": late[-1] * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=20_000_000, help="the main thread's work")
    args = parser.parse_args()
    settings = {"5 ms (None)": None, "0.5 ms (default)": prime_runs.init.__kwdefaults__["switch_interval_s"]}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in settings}
    with tempfile.TemporaryDirectory(prefix="switch-bench-") as tmp:
        templates = make_templates(Path(tmp) / "templates.json")
        sizes = production_sizes(args.episodes, scale=0.1, seed=7)
        episodes = [templates.episode(i, size) for i, size in enumerate(sizes)]
        alone = statistics.median(_busy(args.iterations) for _ in range(3))
        for round_ in range(args.rounds):
            order = list(settings.items())
            for name, interval in order if round_ % 2 == 0 else order[::-1]:  # ABBA: neither always goes first
                results[name].append(one_round(episodes, os.path.join(tmp, "runs"), interval, args.iterations))
    print(
        f"{args.episodes} episodes ({sum(sizes) / 1e6:.0f} MB), {args.rounds} rounds; the main thread's work alone: "
        f"{alone:.2f} s"
    )
    keys = ["busy_s", "finish_s", "cpu_s", "late_p99_ms", "late_max_ms"]
    print(f"| setting | {' | '.join(keys)} |\n|---|{'---|' * len(keys)}")
    medians = {name: {k: statistics.median(r[k] for r in rows) for k in keys} for name, rows in results.items()}
    for name, m in medians.items():
        print(f"| {name} | " + " | ".join(f"{m[k]:.2f}" for k in keys) + " |")
    low, high = medians["0.5 ms (default)"], medians["5 ms (None)"]
    print("| 0.5 ms / 5 ms | " + " | ".join(f"{low[k] / high[k]:.2f}x" for k in keys) + " |")


if __name__ == "__main__":
    main()
