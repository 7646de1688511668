"""The benchmark workload: a re-export of ``prime_runs.cli.workload`` for tools/ scripts.

    sys.path.insert(0, "tools")
    from workload import generate_episode, iter_episodes, encoded_lines

Run it to print the sizes, shapes and build times of a few episodes.
"""

from __future__ import annotations

import time

import orjson

from prime_runs.cli.workload import (  # noqa: F401  (re-exported)
    DEFAULT_RUN_ID,
    DEFAULT_TARGET_BYTES,
    SIZE_TOLERANCE,
    encoded_lines,
    generate_episode,
    iter_episodes,
)

if __name__ == "__main__":
    import zlib

    for target in (10_000, 2_200_000, 8_500_000, 35_000_000, 133_000_000):
        began = time.perf_counter()
        built = generate_episode(0, target_bytes=target, now=1.75e9)
        elapsed = time.perf_counter() - began
        line = orjson.dumps(built)
        turns = sum(len(trace["calls"]) for trace in built["traces"])
        print(
            f"target {target:>11,}  encoded {len(line):>11,} ({len(line) / target - 1:+.1%})  "
            f"traces {len(built['traces'])}  turns {turns:>4}  "
            f"gzip-1 {len(line) / len(zlib.compress(line, 1)):.2f}x  built in {elapsed:.2f}s"
        )
