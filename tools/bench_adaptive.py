"""Adaptive zstd levels against a slow link: records delivered per second, adaptive over pinned level 1.

Starts ``prime-traces serve --link-mb-s RATE --store none --validate light``
(one uplink shared by every upload, in its own process; the link is under
test, not the service's CPU), then uploads the same episodes
(``tools/workload.py``, 6.4 MB each) with two clients in turn, several
rounds, alternating which goes first: one with the level pinned at 1 (the
client before adaptive levels), one adapting. Each upload's records per
second is timed; the report is each round's ratio and their median. A second
pass with no link limit checks that adapting costs nothing there.

    python tools/bench_adaptive.py --rate-mb-s 4 --episodes 60 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _serve import start_serve
from workload import generate_episode

from prime_traces import TracesClient


def _episodes(count: int, seed: int) -> list[bytes]:
    # Each upload its own episodes (seeded), so nothing is a replay and both clients send alike.
    now = time.time()
    return [orjson.dumps(generate_episode(seed * 10_000 + i, target_bytes=6_400_000, now=now)) for i in range(count)]


def _upload(url: str, lines: list[bytes], zstd_level: int | None, max_in_flight: int) -> tuple[float, dict]:
    with TracesClient("bench", url, max_in_flight=max_in_flight, compression="zstd", zstd_level=zstd_level) as client:
        started = time.monotonic()
        client.upload_lines(lines, line_format="episode", target_batch_bytes=8 * 1024**2)
        elapsed = time.monotonic() - started
        return len(lines) / elapsed, client.upload_stats()


def _pass(rate_mb_s: float | None, episodes: int, rounds: int, first_seed: int, max_in_flight: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        # The link is under test, not the service's CPU: no storage, light validation (as the load test).
        options = ["--store", "none", "--validate", "light"] + (["--link-mb-s", str(rate_mb_s)] if rate_mb_s else [])
        proc, url = start_serve(os.path.join(tmp, "bench.db"), *options)
        try:
            ratios = []
            for n in range(rounds):
                order = [("pinned", 1), ("adaptive", None)]
                if n % 2:
                    order.reverse()
                rates = {}
                for k, (name, level) in enumerate(order):
                    lines = _episodes(episodes, first_seed + 2 * n + k)
                    rates[name], stats = _upload(url, lines, level, max_in_flight)
                    if name == "adaptive":
                        level_seen = stats.get("zstd_level")
                ratio = rates["adaptive"] / rates["pinned"]
                ratios.append(ratio)
                print(
                    f"  round {n + 1}: pinned-1 {rates['pinned']:.2f} records/s, adaptive {rates['adaptive']:.2f} "
                    f"(ended at level {level_seen}): {ratio:.2f}x",
                    flush=True,
                )
            return ratios
        finally:
            proc.terminate()
            proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate-mb-s", type=float, default=4.0)
    parser.add_argument("--episodes", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-in-flight", type=int, default=8, help="prime_runs' default")
    parser.add_argument("--skip-unlimited", action="store_true")
    args = parser.parse_args()
    print(f"{args.episodes} episodes of 6.4 MB per upload, {args.max_in_flight} in flight, link {args.rate_mb_s} MB/s:")
    slow = _pass(args.rate_mb_s, args.episodes, args.rounds, first_seed=0, max_in_flight=args.max_in_flight)
    print(f"slow link: adaptive / pinned level 1, median {statistics.median(slow):.2f}x")
    if not args.skip_unlimited:
        print("no link limit:")
        free = _pass(None, args.episodes, args.rounds, first_seed=1_000, max_in_flight=args.max_in_flight)
        print(f"no link limit: adaptive / pinned level 1, median {statistics.median(free):.2f}x")


if __name__ == "__main__":
    main()
