"""Offline runs: how fast a run reaches local disk, and how much disk it takes.

    python tools/bench_offline.py [--episodes 200] [--episode-kb 1000]

Logs ``--episodes`` synthetic episodes (one ``log_episodes()`` per episode)
to an offline run, then ``finish()``, in a fresh process; reports the JSON
rate from the first log to the end of ``finish()``, the process's CPU time,
the bytes on disk and how long ``log_episodes()`` took. It uses only the public
API, so the same script measures an earlier checkout for a baseline
(``PYTHONPATH=/path/to/old/checkout python tools/bench_offline.py``).
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--episode-kb", type=int, default=1000)
    args = parser.parse_args()
    import prime_runs
    from prime_runs.cli.workload import generate_episode

    rng = random.Random(0)
    now = time.time()
    built = [
        generate_episode(rng.getrandbits(64), target_bytes=args.episode_kb * 1000, step=i // 16, now=now)
        for i in range(args.episodes)
    ]
    json_bytes = sum(len(__import__("orjson").dumps(e)) for e in built)
    with tempfile.TemporaryDirectory(prefix="bench-offline-") as tmp:
        os.chdir(tmp)
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        began = time.perf_counter()
        run = prime_runs.init("bench", mode="offline", handle_signals=False)
        latencies = []
        for episode in built:
            t0 = time.perf_counter()
            run.log_episodes([episode])
            latencies.append(time.perf_counter() - t0)
        run.finish(timeout_s=600)
        elapsed = time.perf_counter() - began
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        on_disk = sum(p.stat().st_size for p in Path(tmp).rglob("*") if p.is_file())
        stored = sum(c["stored"] for c in run.stats()["sinks"].values())
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    print(f"prime_runs from {os.path.dirname(prime_runs.__file__)}")
    print(
        f"{stored}/{args.episodes} episodes, {json_bytes / 1e6:.1f} MB of JSON in {elapsed:.2f} s: "
        f"{json_bytes / elapsed / 1e6:.1f} MB/s; CPU {cpu:.2f} s; on disk {on_disk / 1e6:.1f} MB "
        f"({json_bytes / max(on_disk, 1):.2f}x smaller)"
    )
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    print(
        f"log_episodes(): median {latencies[len(latencies) // 2] * 1000:.3f} ms, p99 {p99 * 1000:.3f} ms, "
        f"slowest {latencies[-1] * 1000:.3f} ms"
    )


if __name__ == "__main__":
    main()
