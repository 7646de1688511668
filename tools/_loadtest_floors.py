"""What this machine lets any SDK do for a caller's latency, its cores busy or not: measured before the scenarios.

Three floors, each measured with no SDK at all:

- :func:`measure_pauses`: how long a spinning thread loses its core when
  preempted, beside as many spinning processes as cores (one thread more
  wants a core than there are). A ``log_episodes()`` call in a tight loop is
  such a thread.
- :func:`measure_lag_floor`: the lag of an asyncio event loop's 1 ms probe
  (the producer's own probe, ``_loadtest_probes.probe_lag``) in a process
  whose only other work is one thread running pure Python, under the switch
  interval a run sets while it uploads: alone, with the cores busy, and with
  one thread more than cores. That thread holds the GIL until another
  thread has waited a switch interval for it and then lets go within a few
  bytecodes: as willing a holder as there can be. When the kernel
  deschedules it while it holds the GIL, the event loop waits until it runs
  again, whatever it was doing. An uploading SDK has at least one such
  thread (its encoder runs Python).
- :func:`measure_call_floor`: a stand-in for ``log_episodes()``'s path on
  the caller's thread (copy the list, queue it under a condition, count
  under a lock: a few microseconds) called in a tight loop, as a producer
  does, beside the same thread of pure Python, then beside it and a thread
  hashing in 1 MiB steps (letting go of the GIL for each: a stand-in for
  the request threads' C calls, harsher than our one hash per batch), with
  no other process busy. Every call needs the GIL, so one that arrives
  while another thread holds it waits.

Run as ``python tools/_loadtest_floors.py --lag-probe SECONDS`` or
``--call-probe SECONDS HASHERS`` it is the probing process itself (a process
of its own, so that the interval it sets and the threads it starts touch
nothing else).
"""

from __future__ import annotations

import asyncio
import collections
import gc
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

from _loadtest_probes import probe_lag, quantile

from prime_runs._upload.switch_interval import DEFAULT_SWITCH_INTERVAL_S

_SPIN = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # the cores this process may run on
    except AttributeError:  # not on Linux
        return os.cpu_count() or 2


def _spinners(seconds: float, count: int) -> list[subprocess.Popen[bytes]]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(count):
            procs.append(subprocess.Popen([sys.executable, "-c", _SPIN.format(seconds=seconds + 2)]))
    except BaseException:
        _stop(procs)
        raise
    return procs


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
    spinners = _spinners(seconds, _cores())
    try:
        crowded = _spin_gaps(seconds, threshold_s)
    finally:
        _stop(spinners)
    return {
        "seconds": seconds,
        "cores": len(spinners),
        "pause_threshold_ms": threshold_s * 1e3,
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


def measure_lag_floor(crowded_s: float = 6.0, busy_s: float = 3.0, alone_s: float = 3.0) -> dict[str, float]:
    """The 1 ms probe's lag beside one thread of pure Python, as the cores get busier (keys ``lag_floor_*``).

    Alone; beside one spinning process fewer than cores (the cores busy,
    nothing waiting for one); beside as many as cores (one thread more
    wants a core than there are).
    """
    report: dict[str, float] = {}
    for name, seconds, spinning in (("alone", alone_s, 0), ("busy", busy_s, _cores() - 1), ("", crowded_s, _cores())):
        spinners = _spinners(seconds, spinning)
        try:
            probed = _lag_probe(seconds)
        finally:
            _stop(spinners)
        prefix = f"lag_floor_{name}_" if name else "lag_floor_"
        report |= {f"{prefix}p99_ms": probed["p99_ms"], f"{prefix}max_ms": probed["max_ms"]}
        report |= {f"{prefix}spinners": spinning, f"{prefix}samples": probed["samples"]}
    return report | {"lag_floor_seconds": crowded_s}


def _lag_probe(seconds: float) -> dict[str, float]:
    return _probe("lag", seconds)


def _probe(kind: str, seconds: float, *args: str) -> dict[str, float]:
    command = [sys.executable, os.path.abspath(__file__), f"--{kind}-probe", str(seconds), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60)
    if done.returncode != 0:
        raise RuntimeError(f"the {kind} probe failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    report: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def measure_call_floor(seconds: float = 2.0) -> dict[str, float]:
    """The stand-in call's slowest, beside one thread of pure Python, then with a hashing thread too.

    Keys ``call_floor_python_*`` and ``call_floor_*``: ``max_ms``,
    ``over_1ms``, ``calls``, ``median_us``, ``hashed_mb``; and ``call_floor_seconds``.
    """
    report: dict[str, float] = {"call_floor_seconds": seconds}
    for prefix, hashers in (("call_floor_python_", 0), ("call_floor_", 1)):
        probed = _probe("call", seconds, str(hashers))
        report |= {prefix + key: probed[key] for key in ("max_ms", "over_1ms", "calls", "median_us", "hashed_mb")}
    return report


class _StandIn:
    """``log_episodes()``'s path on the caller's thread, without the SDK: copy, queue, count."""

    def __init__(self) -> None:
        self.cond, self.lock = threading.Condition(), threading.Lock()
        self.queued: collections.deque[list[Any]] = collections.deque(maxlen=64)
        self.submitted = 0

    def log(self, records: list[Any]) -> None:
        records = list(records)
        with self.cond:
            self.queued.append(records)
            self.cond.notify_all()
        with self.lock:
            self.submitted += len(records)


def calls_beside_python(seconds: float, hashers: int) -> dict[str, Any]:
    """In this process: the stand-in called in a tight loop for ``seconds`` beside the pure-Python thread.

    ``hashers`` threads hash a 32 MiB buffer in 1 MiB steps meanwhile. Between
    calls the loop makes its next record (a little Python, as a producer does).
    The collector is off while the loop runs (nothing here makes a cycle), so
    a slow call is a wait, never a collection. ``python_loops`` and
    ``hashed_mb`` count what the other threads did while the loop ran.
    """
    sys.setswitchinterval(DEFAULT_SWITCH_INTERVAL_S)
    data = memoryview(bytes(range(256)) * (32 << 12))  # 32 MiB, made before any thread or clock starts
    stop = threading.Event()
    loops, hashed_mb = [0], [0]
    threads = [threading.Thread(target=_pure_python, args=(stop, loops), name="pure-python", daemon=True)]
    threads += [
        threading.Thread(target=_hash, args=(stop, data, hashed_mb), name=f"hashing-{n}", daemon=True)
        for n in range(hashers)
    ]
    stand_in, took_s, clock = _StandIn(), [], time.perf_counter
    gc.collect()
    gc.disable()
    try:
        for thread in threads:
            thread.start()
        loops_before, hashed_before = loops[0], hashed_mb[0]
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            record = {"id": len(took_s), "traces": [{"step": step} for step in range(8)]}
            started = clock()
            stand_in.log([record])
            took_s.append(clock() - started)
        loops_during, hashed_during = loops[0] - loops_before, hashed_mb[0] - hashed_before
    finally:
        stop.set()
        gc.enable()
    for thread in threads:
        thread.join()
    return {
        "max_ms": max(took_s) * 1e3,
        "over_1ms": sum(t > 0.001 for t in took_s),
        "calls": len(took_s),
        "median_us": sorted(took_s)[len(took_s) // 2] * 1e6,
        "python_loops": loops_during,
        "hashed_mb": hashed_during,
    }


def _pure_python(stop: threading.Event, loops: list[int]) -> None:
    """The willing GIL holder of the module's docstring."""
    while not stop.is_set():
        total = 0
        for i in range(200):
            total += i
        loops[0] += 1


def _hash(stop: threading.Event, data: memoryview, hashed_mb: list[int]) -> None:
    """Hash ``data`` over and over in 1 MiB steps, letting go of the GIL for each, until ``stop``."""
    step_bytes = 1 << 20
    digest = hashlib.sha256()
    while not stop.is_set():
        for begin in range(0, len(data), step_bytes):
            digest.update(data[begin : begin + step_bytes])
            hashed_mb[0] += 1
            if stop.is_set():
                return


def probe_beside_python(seconds: float) -> dict[str, Any]:
    """In this process: the event loop's probe for ``seconds`` while one daemon thread runs pure Python.

    The thread is the module docstring's willing GIL holder; ``python_loops``
    counts its loops while the probe ran.
    """
    sys.setswitchinterval(DEFAULT_SWITCH_INTERVAL_S)
    stop = threading.Event()
    loops = [0]
    threading.Thread(target=_pure_python, args=(stop, loops), name="pure-python", daemon=True).start()
    lags: list[float] = []
    end = time.monotonic() + seconds
    before = loops[0]
    asyncio.run(probe_lag(lags, lambda: time.monotonic() < end))
    during = loops[0] - before
    stop.set()
    return {
        "p99_ms": quantile(lags, 0.99) * 1e3,
        "max_ms": max(lags, default=0.0) * 1e3,
        "samples": len(lags),
        "python_loops": during,
        "switch_interval_s": sys.getswitchinterval(),
    }


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--lag-probe":
        print(json.dumps(probe_beside_python(float(sys.argv[2]))))
    elif len(sys.argv) == 4 and sys.argv[1] == "--call-probe":
        print(json.dumps(calls_beside_python(float(sys.argv[2]), int(sys.argv[3]))))
    else:
        sys.exit("usage: python tools/_loadtest_floors.py --lag-probe SECONDS | --call-probe SECONDS HASHERS")
