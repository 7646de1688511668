"""Which shape for the backlog: every batch to disk first, or disk only past a memory budget?

Two runs of the same code, alternated, each in a process of its own against
``prime-traces serve --store none`` in another:

- ``memory``: the run as it ships: records wait in memory (bounded by
  ``max_queued_bytes``) and go to the run directory only when the uploads fall
  behind (past half the bound);
- ``disk``: every write goes to the run directory first and is uploaded from
  there (the run is put behind a slow link at ``init()`` and never catches
  up; its drain uses every upload slot, or two behind a slow link as the
  backlog's does), as a write-ahead log would.

Two scenarios: ``fast``, no link limit (``--episodes`` parsed episodes of
``--episode-mb`` MB logged back to back, ``finish()`` waits for all): the
throughput from the first log to the end of ``finish()``; ``slow``, a
``--link-mb-s`` link (compressed bytes: about five times as many of JSON;
300 episodes of 1 MB logged at 20 MB/s, ``finish()`` gets ``--finish-s``):
what is stored by then, what waits on disk, what was dropped. Each reports
peak RSS above the start and the bytes written to the run directory. Run it
from the checkout (its ``.venv``)::

    .venv/bin/python tools/bench_shapes.py --rounds 2
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
import json, os, sys, threading, time
import orjson
import prime_runs
from prime_runs.cli.workload import generate_episode

url, runs, shape, count, size, per_s, finish_s, all_slots = sys.argv[1:9]
texts = [orjson.dumps(generate_episode(i, target_bytes=int(float(size) * 1e6))) for i in range(4)]
run = prime_runs.init("shapes", environments=["e"], base_url=url, api_key="k", dir=runs, console="off")
if shape == "disk":
    class Sticky(threading.Event):
        def clear(self):  # never caught up: every write goes through the run directory
            pass
    (sink,) = [s for s in run._worker.sinks if getattr(s, "outage", None) is not None]
    sink.outage._behind = Sticky()
    sink.outage._behind.set()
    # Without a link limit the drain uses every slot; behind a slow link two, as the backlog's drain does.
    sink.outage._signalled = all_slots == "1"
start = rss()
start_sampling()
began = time.monotonic()
pace = threading.Event()
for i in range(int(count)):
    episode = orjson.loads(texts[i % 4])
    episode["id"] = f"ep-{i}"
    for k, member in enumerate(episode["traces"]):
        member["id"] = f"ep-{i}-t{k}"
    run.log_episodes([episode])
    del episode
    if float(per_s):
        pace.wait(max(0.0, began + (i + 1) / float(per_s) - time.monotonic()))
run.finish(timeout_s=float(finish_s))
elapsed = time.monotonic() - began
done.set()
traces = run.stats()["sinks"]["traces"]
written = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(runs) for f in files if ".jsonl" in f)
print(json.dumps({"elapsed_s": elapsed, "peak_above_mb": (peak[0] - start) / 1e6,
                  "dropped": sum(run.stats()["dropped"].values()), "stored": traces["stored"],
                  "failed": traces["failed"],
                  "spooled": traces["spooled"], "disk_mb": written / 1e6, "mb": int(count) * float(size)}))
"""


def child(python: str, url: str, runs: str, shape: str, args: list[str], cwd: str) -> dict[str, float]:
    command = [python, "-c", SAMPLER + textwrap.dedent(CHILD), url, runs, shape, *args]
    # cwd: ``-c`` puts the working directory first on sys.path, where a checkout would shadow the packages.
    out = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--episode-mb", type=float, default=6.0)
    parser.add_argument("--link-mb-s", type=float, default=1.0, help="compressed MB/s (about 5x that of JSON)")
    parser.add_argument("--finish-s", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--scenarios", default="fast,slow")
    args = parser.parse_args()
    python = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        # No storage (as the load test's service): the service is not the limit, the client and the link are.
        fast, fast_url = start_serve(os.path.join(tmp, "fast.db"), "--store", "none")
        slow, slow_url = start_serve(
            os.path.join(tmp, "slow.db"), "--store", "none", "--link-mb-s", str(args.link_mb_s)
        )
        scenarios = {
            "fast": (fast_url, [str(args.episodes), str(args.episode_mb), "0", "600", "1"]),
            "slow": (slow_url, ["300", "1", "20", str(args.finish_s), "0"]),
        }
        try:
            for name in args.scenarios.split(","):
                url, child_args = scenarios[name]
                rates: dict[str, list[float]] = {"memory": [], "disk": []}
                for round_ in range(args.rounds):
                    for shape in ("memory", "disk"):
                        runs = os.path.join(tmp, f"runs-{name}-{round_}-{shape}")
                        r = child(python, url, runs, shape, child_args, tmp)
                        rate = r["mb"] / r["elapsed_s"]
                        rates[shape].append(rate if name == "fast" else r["stored"])
                        print(
                            f"{name} round {round_} {shape:6}: {rate:6.1f} MB/s logged to finished, "
                            f"stored {r['stored']}, failed {r['failed']}, on disk {r['spooled']}, "
                            f"dropped {r['dropped']}, "
                            f"{r['disk_mb']:.0f} MB written to the run directory, "
                            f"peak RSS +{r['peak_above_mb']:.0f} MB",
                            flush=True,
                        )
                what = "throughput" if name == "fast" else "stored by the deadline"
                ratios = [f"{d / m:.2f}x" if m else "-" for m, d in zip(rates["memory"], rates["disk"])]
                print(f"{name}: disk-first / memory-budget {what}: {', '.join(ratios)}", flush=True)
        finally:
            for proc in (fast, slow):
                proc.terminate()
                proc.wait()


if __name__ == "__main__":
    main()
