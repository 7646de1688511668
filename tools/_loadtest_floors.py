"""What this machine lets any SDK do for a caller's latency while its cores are busy: measured before the scenarios.

Two floors, each measured with no SDK at all, beside as many spinning
processes as cores (so that one more thread wants the cores than there are):

- :func:`measure_pauses`: how long a spinning thread loses its core when
  preempted. A ``log_episodes()`` call in a tight loop is such a thread.
- :func:`measure_lag_floor`: the lag of an asyncio event loop's 1 ms probe
  (the producer's own probe) in a process whose only other work is one
  thread running pure Python, under the switch interval a run sets while it
  uploads. That thread is the most willing holder of the GIL there is: it
  offers it back every few bytecodes. When the kernel deschedules it while
  it holds the GIL, the event loop waits for it to run again, whatever the
  thread was doing. An uploading SDK has at least one such thread (its
  encoder runs Python), so its lag cannot be lower than this.

Run as ``python tools/_loadtest_floors.py --lag-probe SECONDS`` it is the
probing process itself (a process of its own, so that the interval it sets
and the thread it starts touch nothing else).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

from prime_runs._switch_interval import DEFAULT_SWITCH_INTERVAL_S

PROBE_INTERVAL_S = 0.001  # as the producer's probe (_loadtest_producer)
_SPIN = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"


def _spinners(seconds: float) -> list[subprocess.Popen[bytes]]:
    count = os.cpu_count() or 2
    return [subprocess.Popen([sys.executable, "-c", _SPIN.format(seconds=seconds + 2)]) for _ in range(count)]


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.kill()
        proc.wait()


def measure_pauses(seconds: float = 4.0, threshold_s: float = 0.0003) -> dict[str, float]:
    """How long this machine leaves a spinning thread without its core: alone, then crowded.

    A gap between two clock reads of a loop that does nothing else is time
    the thread did not run.
    """
    alone = _spin_gaps(seconds, threshold_s)
    spinners = _spinners(seconds)
    try:
        crowded = _spin_gaps(seconds, threshold_s)
    finally:
        _stop(spinners)
    return {
        "seconds": seconds,
        "cores": len(spinners),
        "alone_max_ms": max(alone, default=0.0) * 1e3,
        "alone_over_1ms": sum(gap > 0.001 for gap in alone),
        "crowded_max_ms": max(crowded, default=0.0) * 1e3,
        "crowded_median_ms": sorted(crowded)[len(crowded) // 2] * 1e3 if crowded else 0.0,
        "crowded_per_s": len(crowded) / seconds,
    }


def _spin_gaps(seconds: float, threshold_s: float) -> list[float]:
    clock = time.perf_counter
    end = clock() + seconds
    gaps: list[float] = []
    last = clock()
    while last < end:
        now = clock()
        if now - last > threshold_s:
            gaps.append(now - last)
        last = now
    return gaps


def measure_lag_floor(seconds: float = 6.0, alone_s: float = 3.0) -> dict[str, float]:
    """The 1 ms probe's lag beside one thread of pure Python: alone, then crowded (keys ``lag_floor_*``)."""
    alone = _lag_probe(alone_s)
    spinners = _spinners(seconds)
    try:
        crowded = _lag_probe(seconds)
    finally:
        _stop(spinners)
    return {
        "lag_floor_seconds": seconds,
        "lag_floor_p99_ms": crowded["p99_ms"],
        "lag_floor_max_ms": crowded["max_ms"],
        "lag_floor_samples": crowded["samples"],
        "lag_floor_python_loops": crowded["python_loops"],
        "lag_floor_alone_p99_ms": alone["p99_ms"],
        "lag_floor_alone_max_ms": alone["max_ms"],
    }


def _lag_probe(seconds: float) -> dict[str, float]:
    command = [sys.executable, os.path.abspath(__file__), "--lag-probe", str(seconds)]
    out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=seconds + 60).stdout
    report: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return report


def _quantile(values: list[float], q: float) -> float:  # as the producer's
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def probe_beside_python(seconds: float) -> dict[str, Any]:
    """In this process: the event loop's probe for ``seconds`` while one daemon thread runs pure Python."""
    sys.setswitchinterval(DEFAULT_SWITCH_INTERVAL_S)
    stop = threading.Event()
    loops = [0]

    def python() -> None:
        while not stop.is_set():
            total = 0
            for i in range(200):
                total += i
            loops[0] += 1

    threading.Thread(target=python, name="pure-python", daemon=True).start()

    async def probe() -> list[float]:
        loop = asyncio.get_running_loop()
        lags: list[float] = []
        end = loop.time() + seconds
        while loop.time() < end:
            asked = loop.time()
            await asyncio.sleep(PROBE_INTERVAL_S)
            lags.append(max(0.0, loop.time() - asked - PROBE_INTERVAL_S))
        return lags

    lags = asyncio.run(probe())
    stop.set()
    return {
        "p99_ms": _quantile(lags, 0.99) * 1e3,
        "max_ms": max(lags, default=0.0) * 1e3,
        "samples": len(lags),
        "python_loops": loops[0],
    }


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--lag-probe":
        print(json.dumps(probe_beside_python(float(sys.argv[2]))))
    else:
        sys.exit("usage: python tools/_loadtest_floors.py --lag-probe SECONDS")
