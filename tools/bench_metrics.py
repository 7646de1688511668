"""How long 10,000 ``run.log()`` rows take to reach the service while large episodes upload.

    python tools/bench_metrics.py [--episodes 4] [--episode-mb 35] [--bandwidth-mb-s 20] [--rows 10000]

Against the local service with its body reads capped at ``--bandwidth-mb-s``
(a slow link), one run logs ``--episodes`` episodes of ``--episode-mb`` MB
(random text that compression cannot shrink much), then ``--rows`` metrics
rows. It reports when every row was on the service and when every episode
was, from the same start, and their ratio (the rows' lane must not wait
behind the episodes), plus the ``log()`` call's mean and slowest time.
"""

from __future__ import annotations

import argparse
import base64
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import prime_runs
from prime_traces import TracesClient
from prime_traces.server import LocalTracesService


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=4)
    parser.add_argument("--episode-mb", type=float, default=35.0)
    parser.add_argument("--bandwidth-mb-s", type=float, default=20.0)
    parser.add_argument("--rows", type=int, default=10_000)
    args = parser.parse_args()
    blob = base64.b64encode(os.urandom(int(args.episode_mb * 1e6 * 3 / 4))).decode()
    now = time.time()
    episodes = [
        {
            "version": 1,
            "id": f"big-{i}",
            "env": {"id": "bench"},
            "traces": [{"version": 1, "id": f"big-{i}-t", "timing": {"start": now}, "info": {"blob": blob}}],
        }
        for i in range(args.episodes)
    ]
    with (
        tempfile.TemporaryDirectory() as scratch,
        LocalTracesService(os.path.join(scratch, "db"), bandwidth_mb_s=args.bandwidth_mb_s) as slow,
    ):
        run = prime_runs.init(
            "bench-metrics",
            api_key="bench",
            base_url=slow.url,
            dir=os.path.join(scratch, "runs"),
            console="off",
            handle_signals=False,
        )
        started = time.monotonic()
        run.log_episodes(episodes)
        calls = []
        for step in range(args.rows):
            t = time.perf_counter()
            run.log({"reward": step / args.rows, "loss": 1 / (step + 1), "train": {"kl": 0.01}}, step=step)
            calls.append(time.perf_counter() - t)
        assert run._metrics is not None
        rows_ok = run._metrics.flush(time.monotonic() + 600)
        rows_s = time.monotonic() - started
        records_ok = run.flush(timeout_s=600)
        episodes_s = time.monotonic() - started
        run.finish(timeout_s=60)
        with TracesClient("bench", slow.url) as client:
            stored = sum(1 for _ in client.iter_metrics(run.id, limit=10_000))
    size_mb = args.episodes * args.episode_mb
    print(
        f"{args.episodes} episodes of {args.episode_mb:.0f} MB ({size_mb:.0f} MB) at {args.bandwidth_mb_s:.0f} MB/s, "
        f"{args.rows} rows"
    )
    print(f"rows on the service      {stored} of {args.rows}, after {rows_s:.2f} s (flushed: {rows_ok})")
    print(
        f"episodes on the service  {run.stats()['sinks']['traces']['stored']} of {args.episodes}, after "
        f"{episodes_s:.2f} s (flushed: {records_ok})"
    )
    print(f"rows / episodes          {rows_s / episodes_s:.3f}")
    print(f"log() mean / slowest     {sum(calls) / len(calls) * 1e6:.1f} us / {max(calls) * 1e3:.2f} ms")
    return 0 if stored == args.rows else 1


if __name__ == "__main__":
    sys.exit(main())
