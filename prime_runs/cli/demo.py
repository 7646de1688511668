"""``prime-runs demo``: a synthetic training run against the embedded local service.

It starts the local Traces service in this process (SQLite in a temporary
directory, or in ``--keep DIR``), runs a small training loop that logs each
step's episodes and metrics, finishes the run, reads the traces back and
prints what happened. The run's own console lines (``prime-runs: ...``) go to
stderr as in any training script; the demo's report goes to stdout.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from typing import Any
from urllib.parse import quote

DEMO_API_KEY = "demo"
VIEW_PORT = 8765


def add_demo_command(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "demo",
        help="log a synthetic training run to the embedded local service",
        description="Start the local Traces service in-process, log a synthetic training run "
        "(steps x episodes of realistic agentic JSON), finish it, read it back, print a summary. "
        "The service's SQLite file is deleted afterwards unless --keep DIR.",
    )
    p.add_argument("--steps", type=int, default=20, help="training steps (default: 20)")
    p.add_argument("--episodes-per-step", type=int, default=16, help="episodes per step (default: 16)")
    p.add_argument("--episode-kb", type=int, default=256, help="approximate size of an episode (default: 256)")
    p.add_argument(
        "--keep",
        default=None,
        metavar="DIR",
        help="keep the service's SQLite file (traces.db) in DIR, to look at it afterwards",
    )
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    if args.steps < 1 or args.episodes_per_step < 1 or args.episode_kb < 10:
        print("prime-runs demo: --steps and --episodes-per-step must be >= 1, --episode-kb >= 10", file=sys.stderr)
        return 2
    if args.keep is not None:
        os.makedirs(args.keep, exist_ok=True)
        return _demo(args, args.keep)
    with tempfile.TemporaryDirectory(prefix="prime-runs-demo-") as scratch:
        return _demo(args, scratch)


def _demo(args: argparse.Namespace, where: str) -> int:
    import prime_runs
    from prime_runs._console.progress import Progress
    from prime_runs.cli.workload import generate_episode
    from prime_traces import TracesClient
    from prime_traces.server import LocalTracesService

    db_path = os.path.join(where, "traces.db")
    rng = random.Random(args.seed)
    total = args.steps * args.episodes_per_step
    with LocalTracesService(db_path) as service:
        print(
            f"local Traces service on {service.url}, SQLite in {db_path}"
            + ("" if args.keep else " (deleted at the end; --keep DIR keeps it)")
        )
        print(f"training: {args.steps} steps x {args.episodes_per_step} episodes of ~{args.episode_kb} KB", flush=True)
        run = prime_runs.init(
            name="demo-grpo",
            kind="train",
            model="demo/synthetic-policy",
            team_id="demo",
            environments=["demo/agentic-tasks"],
            training=prime_runs.TrainingSpec(max_steps=args.steps, batch_size=args.episodes_per_step),
            config={"lr": 1e-6, "episodes_per_step": args.episodes_per_step},
            base_url=service.url,
            api_key=DEMO_API_KEY,
            mode="online",
            handle_signals=False,
            dir=os.path.join(where, "runs"),
        )
        progress = Progress("demo: logged", stream=sys.stderr)
        progress.start(total, total * args.episode_kb * 1000)
        slowest_s = 0.0
        started = time.monotonic()
        for step in range(args.steps):
            now = time.time()
            episodes = [
                generate_episode(
                    rng.getrandbits(64), target_bytes=args.episode_kb * 1000, run_id=run.id, step=step, now=now
                )
                for _ in range(args.episodes_per_step)
            ]
            call_started = time.perf_counter()
            run.log_episodes(episodes)
            slowest_s = max(slowest_s, time.perf_counter() - call_started)
            progress.advance(len(episodes), args.episode_kb * 1000 * len(episodes))
            run.log({"reward": rng.random(), "loss": 1.0 / (step + 1)}, step=step)
        progress.close()
        run.finish()
        elapsed = time.monotonic() - started
        with TracesClient(api_key=DEMO_API_KEY, base_url=service.url) as client:
            stored_episodes = sum(1 for _ in client.iter_episodes(run_id=run.id, limit=100))
            summary = client.get_run(run.id)
        _report(run, summary, stored_episodes, db_path, slowest_s, elapsed, total, args)
    return 0 if run.stats()["sinks"]["traces"]["stored"] == total == stored_episodes else 1


def _report(
    run: Any,
    summary: Any,
    stored_episodes: int,
    db_path: str,
    slowest_s: float,
    elapsed: float,
    total: int,
    args: argparse.Namespace,
) -> None:
    sink = run.stats()["sinks"]["traces"]
    json_bytes = total * args.episode_kb * 1000
    print()
    print(f"episodes logged            {total}")
    print(f"episodes stored            {sink['stored']} (read back from the service: {stored_episodes})")
    print(f"episodes dropped           {run.dropped_records}")
    print(f"episodes failed            {sum(sink['failed'].values())}")
    print(
        f"traces stored              {summary.trace_count} (an episode is one rollout: an envelope holding "
        "one trace per agent that took part, 1 to 4 here)"
    )
    print(f"slowest log_episodes()     {slowest_s * 1000:.2f} ms")
    print(
        f"throughput                 {total / elapsed:.1f} episodes/s, "
        f"{json_bytes / elapsed / 1e6:.1f} MB/s of JSON (generation included)"
    )
    print(f"run status                 {summary.status} (steps {summary.step_min}..{summary.step_max})")
    print()
    base_url = f"http://127.0.0.1:{VIEW_PORT}"
    if args.keep is None:
        db_path = os.path.join("DIR", "traces.db")
    print("The run's traces, while the database is served:")
    print(f"  prime-traces list --run-id {run.id} --base-url {base_url} --api-key {DEMO_API_KEY}")
    if args.keep is None:
        print("The database is deleted now. To look at the run afterwards, run the demo with --keep DIR,")
        print("then serve the kept file and open the run's page in a browser:")
    else:
        print("To look at it again, serve the kept database and open the run's page in a browser:")
    print(f"  prime-traces serve --db {db_path} --port {VIEW_PORT}")
    print(f"  {run_page_url(base_url, run.id)}")


def run_page_url(base_url: str, run_id: str) -> str:
    """The viewer's page of ``run_id`` on the service at ``base_url``."""
    return f"{base_url}/#/run/{quote(run_id, safe='')}"
