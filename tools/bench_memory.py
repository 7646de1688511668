"""Does the memory a run holds stay within ``max_queued_bytes``? Peak RSS above the start, per source tree.

A child process logs ``--episodes`` generated episodes of ``--episode-mb``
MB, each generated, logged and dropped by the caller (``--per-call`` of
them in one ``log_episodes()`` call, as a trainer logs a step), under
``max_queued_bytes``, against ``prime-traces serve --link-mb-s`` (a link
slower than the run), then finishes with ``--finish-s``. A thread samples
its RSS every 5 ms; the start is the RSS after ``init()``, before the first
episode. Each ``--src`` (a source tree, first the baseline) runs
``--rounds`` times, alternating, against one service, with the tree's own
``.venv`` (``python3 -m venv .venv && .venv/bin/pip install -e
./packaging/prime-traces -e .`` there); the report gives
each run's peak above the start, over the bound, and what was dropped,
stored and kept on disk.

    python tools/bench_memory.py --src /path/to/before --src . --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _rss import SAMPLER
from _serve import start_serve

CHILD = """
import json, os, sys, threading
import prime_runs
print(prime_runs.__file__, file=sys.stderr)
from prime_runs.cli.workload import generate_episode

import orjson
url, runs, count, size, bound, finish_s, burst, per_call = sys.argv[1:9]
# --burst: four episodes encoded once, each logged as a fresh orjson.loads of its bytes (a producer
# faster than any encoder); otherwise each is generated in turn (slower than the encoder).
target = int(float(size) * 1e6)
texts = [orjson.dumps(generate_episode(i, target_bytes=target)) for i in range(4)] if burst == "1" else []
run = prime_runs.init("memory", environments=["e"], base_url=url, api_key="k", dir=runs, console="off",
                      max_queued_bytes=int(bound))
start = rss()
start_sampling()
batch = []
for i in range(int(count)):
    episode = orjson.loads(texts[i % 4]) if texts else generate_episode(i, target_bytes=target)
    episode["id"] = f"ep-{i}"
    batch.append(episode)
    del episode
    if len(batch) == int(per_call) or i == int(count) - 1:
        run.log_episodes(batch)
        batch = []
run.finish(timeout_s=float(finish_s))
done.set()
traces = run.stats()["sinks"]["traces"]
detail = {k: traces.get(k) for k in ("resynced", "backlogs", "drained_bytes", "spooled_reasons", "bytes_sent")}
print(json.dumps({"peak_above_mb": (peak[0] - start) / 1e6, "dropped": sum(run.stats()["dropped"].values()),
                  "stored": traces["stored"], "spooled": traces["spooled"], "detail": detail}))
"""


def interpreter(src: Path) -> tuple[dict[str, str], str]:
    """The environment and Python that import ``src``'s packages: its own ``.venv`` when it has one.

    An editable install of this checkout in the running interpreter would win
    over ``PYTHONPATH``, so a tree is measured with its own virtualenv.
    """
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    own = src / ".venv" / "bin" / "python"
    if own.exists():
        return env, str(own)
    return {**env, "PYTHONPATH": str(src)}, sys.executable


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src", action="append", required=True, help="a source tree (first: the baseline)")
    parser.add_argument("--episodes", type=int, default=60)
    parser.add_argument("--episode-mb", type=float, default=10.0)
    parser.add_argument("--max-queued-bytes", type=int, default=200_000_000)
    parser.add_argument("--link-mb-s", type=float, default=1.0)
    parser.add_argument("--finish-s", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--burst", action="store_true", help="log parsed copies of four episodes, back to back")
    parser.add_argument("--per-call", type=int, default=1, help="episodes per log_episodes() call (a step's worth)")
    parser.add_argument("--detail", action="store_true", help="print the Traces sink's backlog figures too")
    args = parser.parse_args()
    bound_mb = args.max_queued_bytes / 1e6
    with tempfile.TemporaryDirectory() as tmp:
        serve, url = start_serve(os.path.join(tmp, "traces.db"), "--link-mb-s", str(args.link_mb_s))
        try:
            for round_ in range(args.rounds):
                for n, src in enumerate(args.src):
                    env, python = interpreter(Path(src).resolve())
                    command = [
                        python,
                        "-c",
                        SAMPLER + textwrap.dedent(CHILD),
                        url,
                        os.path.join(tmp, f"runs-{round_}-{n}"),
                        str(args.episodes),
                        str(args.episode_mb),
                        str(args.max_queued_bytes),
                        str(args.finish_s),
                        "1" if args.burst else "0",
                        str(args.per_call),
                    ]
                    # cwd: ``-c`` puts the working directory first on sys.path, where a checkout would shadow ``src``.
                    out = subprocess.run(command, env=env, cwd=tmp, capture_output=True, text=True, check=True).stdout
                    result = json.loads(out.strip().splitlines()[-1])
                    print(
                        f"round {round_} {src}: peak RSS +{result['peak_above_mb']:.0f} MB "
                        f"({result['peak_above_mb'] / bound_mb:.2f}x the {bound_mb:.0f} MB bound); "
                        f"dropped {result['dropped']}, stored {result['stored']}, on disk {result['spooled']}",
                        flush=True,
                    )
                    if args.detail:
                        print(f"  {result['detail']}", flush=True)
        finally:
            serve.terminate()
            serve.wait()


if __name__ == "__main__":
    main()
