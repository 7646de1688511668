"""``prime-runs demo``: a synthetic training run against the embedded local service.

It starts the local Traces service in this process (SQLite under ``--dir``),
runs a small training loop that logs each step's episodes and metrics,
finishes the run, reads the traces back and prints what happened.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from typing import Any

DEFAULT_DEMO_DIR = "prime-runs-demo"
DEMO_API_KEY = "demo"


def add_demo_command(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "demo",
        help="log a synthetic training run to the embedded local service",
        description="Start the local Traces service in-process, log a synthetic training run "
        "(steps x episodes of realistic agentic JSON), finish it, read it back, print a summary.",
    )
    p.add_argument("--steps", type=int, default=20, help="training steps (default: 20)")
    p.add_argument("--episodes-per-step", type=int, default=16, help="episodes per step (default: 16)")
    p.add_argument("--episode-kb", type=int, default=256, help="approximate size of an episode (default: 256)")
    p.add_argument("--dir", default=DEFAULT_DEMO_DIR, help=f"where the service keeps its SQLite file "
                   f"(default: ./{DEFAULT_DEMO_DIR})")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    import prime_runs
    from prime_runs._workload import generate_episode
    from prime_traces import TracesClient
    from prime_traces.server import LocalTracesService

    if args.steps < 1 or args.episodes_per_step < 1 or args.episode_kb < 10:
        print("prime-runs demo: --steps and --episodes-per-step must be >= 1, --episode-kb >= 10")
        return 2
    os.makedirs(args.dir, exist_ok=True)
    db_path = os.path.join(args.dir, "traces.db")
    rng = random.Random(args.seed)
    with LocalTracesService(db_path) as service:
        print(f"local Traces service on {service.url} (SQLite: {db_path})")
        run = prime_runs.init(
            "demo-grpo", kind="train", config={"lr": 1e-6, "episodes_per_step": args.episodes_per_step},
            base_url=service.url, api_key=DEMO_API_KEY, mode="online", handle_signals=False,
        )  # fmt: skip
        print(f"run {run.id}: {args.steps} steps x {args.episodes_per_step} episodes of ~{args.episode_kb} KB")
        slowest_s = 0.0
        logged = 0
        json_bytes = 0
        started = time.monotonic()
        for step in range(args.steps):
            now = time.time()
            episodes = [
                generate_episode(rng.getrandbits(64), target_bytes=args.episode_kb * 1000, run_id=run.id,
                                 step=step, now=now)  # fmt: skip
                for _ in range(args.episodes_per_step)
            ]
            call_started = time.perf_counter()
            run.log_episodes(episodes)
            slowest_s = max(slowest_s, time.perf_counter() - call_started)
            logged += len(episodes)
            json_bytes += args.episode_kb * 1000 * len(episodes)
            run.log({"reward": rng.random(), "loss": 1.0 / (step + 1)}, step=step)
        run.finish()
        elapsed = time.monotonic() - started
        stats = run.stats()
        sink = stats["sinks"]["traces"]
        with TracesClient(api_key=DEMO_API_KEY, base_url=service.url) as client:
            stored_episodes = sum(1 for _ in client.iter_episodes(run_id=run.id, limit=100))
            summary = client.get_run(run.id)
        print()
        print(f"episodes logged            {logged}")
        print(f"episodes stored            {sink['stored']} (read back from the service: {stored_episodes})")
        print(f"episodes dropped           {run.dropped_records}")
        print(f"episodes failed            {sum(sink['failed'].values())}")
        print(f"slowest log_episodes()     {slowest_s * 1000:.2f} ms")
        print(f"throughput                 {logged / elapsed:.1f} episodes/s, "
              f"{json_bytes / elapsed / 1e6:.1f} MB/s of JSON (generation included)")  # fmt: skip
        print(f"run status                 {summary.status} ({summary.trace_count} traces, "
              f"steps {summary.step_min}..{summary.step_max})")  # fmt: skip
        print(f"run URL                    {run.url}")
        print()
        print("To look at it again, serve the same database and list the run's traces:")
        print(f"  prime-traces serve --db {db_path} --port 8765")
        print(f"  prime-traces list --run-id {run.id} --base-url http://127.0.0.1:8765 --api-key {DEMO_API_KEY}")
    ok = sink["stored"] == logged == stored_episodes
    return 0 if ok else 1
