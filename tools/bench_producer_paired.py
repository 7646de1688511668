"""Scenario (a)'s producer of this tree against another checkout's, paired: is this change slower?

    python tools/bench_producer_paired.py --against /path/to/other/checkout [--pairs 8] [--episodes 1000]

The other checkout needs its own ``.venv`` with its packages installed (the
README's quick start there). Each pair runs both producers
(``tools/_loadtest_producer.py`` of each tree, with its own interpreter, ours
with its defaults and the asyncio probe) one after the other, in alternating
order, each against a fresh ``prime-traces serve --store none`` of this tree,
on the same episodes (the load test's templates and sizes). It prints each
run, then this tree over the other per pair and the median ratio of wall time
and of the upload thread's CPU per MB: ratios of one run, as the machine's
speed drifts between runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from _loadgen import production_sizes
from _loadtest_parts import Service
from loadtest import make_templates

HERE = Path(__file__).resolve().parents[1]


def produce(tree: Path, tmp: str, templates: Path, sizes: Path, run_id: str) -> dict[str, float]:
    """One producer of ``tree`` against a fresh service; its wall time and CPU per MB."""
    service = Service(tmp)
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PRIME_", "PYTHONPATH", "RANK"))}
        env.update(PRIME_TRACES_URL=service.url, PRIME_API_KEY="bench", PRIME_RUNS_MODE="online")
        work = tempfile.mkdtemp(dir=tmp)
        command = [str(tree / ".venv" / "bin" / "python"), str(tree / "tools" / "_loadtest_producer.py")]
        command += ["--sdk", "ours", "--templates", str(templates), "--sizes", str(sizes), "--run-id", run_id]
        command += ["--dir", work, "--asyncio"]
        done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=work, timeout=900, check=True)
        report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        service.stop()
    per_mb = 1e3 / (report["json_bytes"] / 1e6)
    if report["stored"] != report["episodes"]:
        raise RuntimeError(f"{tree}: {report['stored']} of {report['episodes']} stored")
    return {
        "wall_s": report["wall_s"],
        "upload_ms_per_mb": report["upload_thread_cpu_s"] * per_mb,
        "cpu_ms_per_mb": report["cpu_s"] * per_mb,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", required=True, type=Path, help="another checkout, with its .venv")
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--scale", type=float, default=0.1)
    args = parser.parse_args()
    trees = {"this": HERE, "other": args.against.resolve()}
    with tempfile.TemporaryDirectory(prefix="paired-") as tmp:
        templates, sizes = Path(tmp) / "templates.json", Path(tmp) / "sizes.json"
        make_templates(templates)
        sizes.write_text(json.dumps(production_sizes(args.episodes, scale=args.scale)))
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
        for pair in range(args.pairs):
            order = list(trees) if pair % 2 == 0 else list(trees)[::-1]
            for name in order:
                run = produce(trees[name], tmp, templates, sizes, f"run-{name}-{pair}")
                runs[name].append(run)
                print(pair, name, {key: round(value, 2) for key, value in run.items()}, flush=True)
    for key in ("wall_s", "upload_ms_per_mb", "cpu_ms_per_mb"):
        ratios = [mine[key] / theirs[key] for mine, theirs in zip(runs["this"], runs["other"])]
        shown = ", ".join(f"{r:.3f}" for r in ratios)
        print(f"{key}: this tree / the other, per pair: {shown}; median {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
