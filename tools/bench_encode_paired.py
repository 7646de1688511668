"""Compare the record encoder with its version at a git revision, record by record.

A change to the encoder moves its CPU by a few percent, less than this
machine's noise between two runs. So both versions encode the same records
here, in one process: each record through each encoder in turn (the order
rotating from record to record), timed with the thread's CPU clock, for
``--passes`` passes. The older version is the encoder, its chunker (where it
exists) and its sizing (``prime_traces/_lines/``, or earlier ``prime_traces/_encode.py``
and its neighbours) as committed at
``--against``, loaded as modules of their own beside the working tree's. One ``orjson.dumps`` runs beside them
as a yardstick. It prints, per set of records, each encoder's CPU per MB and
its ratio to the older version: the mean over the passes and their range.

The sets: the load test's episodes (production sizes times 0.1, from the
same templates), generated episodes of 0.3-3.5 MB and of 20-300 KB, chat
records of 10-700 messages, chat records whose last message is long (a guess
from the first and last items overshoots them), and rows of a few hundred
bytes.

    python tools/bench_encode_paired.py --against HEAD~1 --passes 6
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _loadgen import production_sizes
from loadtest import make_templates

from prime_runs.cli.workload import generate_episode
from prime_traces._lines import encoder as _encode

ROOT = Path(__file__).resolve().parents[1]
_NOW = 1_750_000_000.0
_RUN_SWITCH_INTERVAL_S = 0.0005  # as while a run uploads: the encoder yields with sched_yield

Encode = Callable[[Any, int], object]


# Where the encoder's modules are, newest layout first; in import order (no chunker in older revisions).
LAYOUTS = (
    {
        "sizing": "prime_traces._lines.sizing",
        "chunker": "prime_traces._lines.chunker",
        "encoder": "prime_traces._lines.encoder",
    },
    {"sizing": "prime_traces._sizing", "chunker": "prime_traces._chunker", "encoder": "prime_traces._encode"},
)
# What an older encoder imports from modules that have moved since: where it is now.
MOVED = {"prime_traces._batching": "prime_traces._lines.parts", "prime_traces._locate": "prime_traces._lines.locate"}


def _source_at(revision: str, module: str) -> str | None:
    path = module.replace(".", "/") + ".py"
    shown = subprocess.run(["git", "-C", str(ROOT), "show", f"{revision}:{path}"], capture_output=True, text=True)
    return shown.stdout if shown.returncode == 0 else None


def encoder_at(revision: str, directory: Path) -> ModuleType:
    """The encoder module as committed at ``revision``, importing the encoder's other modules of that revision."""
    layout = next((layout for layout in LAYOUTS if _source_at(revision, layout["encoder"]) is not None), None)
    if layout is None:
        raise SystemExit(f"no encoder found at {revision}")
    for name, module in layout.items():
        source = _source_at(revision, module)
        if source is None:
            if name == "chunker":
                continue
            raise SystemExit(f"git show {revision}: {module} failed")
        for other, other_module in layout.items():
            source = source.replace(f"from {other_module} import", f"from older_{other} import")
        for moved, now in MOVED.items():
            source = source.replace(f"from {moved} import", f"from {now} import")
        (directory / f"older_{name}.py").write_text(source)
    sys.path.insert(0, str(directory))
    try:
        spec = importlib.util.spec_from_file_location("older_encoder", directory / "older_encoder.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(directory))
        for name in layout:  # the module keeps its own references
            sys.modules.pop(f"older_{name}", None)
    return module


def record_sets(directory: Path) -> dict[str, list[Any]]:
    templates = make_templates(directory / "templates.json")
    return {
        "load test's episodes (x0.1)": [
            templates.episode(i, size) for i, size in enumerate(production_sizes(200, scale=0.1))
        ],
        "generated, 0.3-3.5 MB": [
            generate_episode(i, target_bytes=s, now=_NOW)
            for i, s in enumerate([300_000, 640_000, 850_000, 1_700_000, 3_500_000] * 3)
        ],
        "generated, 20-300 KB": [
            generate_episode(i, target_bytes=s, now=_NOW)
            for i, s in enumerate([20_000, 40_000, 60_000, 100_000, 150_000, 200_000, 240_000, 300_000] * 20)
        ],
        "chat, 10-700 messages": [
            {"id": f"c-{k}-{i}", "messages": [{"role": "user", "content": "m" * 300} for _ in range(k)]}
            for k in (10, 50, 200, 400, 700)
            for i in range(40)
        ],
        "chat, 10-40 messages, the last long": [
            {
                "id": f"l-{count}-{i}",
                "messages": [{"role": "user", "content": "m" * 500} for _ in range(count - 1)]
                + [{"role": "assistant", "content": "a" * last}],
            }
            for count, last in ((40, 4_000), (20, 8_000), (10, 20_000))
            for i in range(100)
        ],
        "rows of a few hundred bytes": [
            {"id": f"r-{i}", "step": i, "loss": i / 1e4, "info": {"note": "z" * (i % 900)}, "vals": [0.1] * (i % 50)}
            for i in range(20_000)
        ],
    }


def compare(encoders: dict[str, Encode], records: list[Any], passes: int) -> dict[str, tuple[float, ...]]:
    """Per encoder: CPU ms per MB (mean over passes), and its ratio to ``older``: mean, lowest, highest pass."""
    megabytes = sum(len(orjson.dumps(record)) for record in records) / 1e6
    named = list(encoders.items())
    totals: list[dict[str, float]] = []
    for _ in range(passes):
        spent = dict.fromkeys(encoders, 0.0)
        for index, record in enumerate(records):
            turn = index % len(named)
            for name, encode in named[turn:] + named[:turn]:
                started = time.thread_time()
                result = encode(record, index)
                spent[name] += time.thread_time() - started
                del result
        totals.append(spent)
    out = {}
    for name in encoders:
        ratios = [spent[name] / spent["older"] for spent in totals]
        mean_ms = sum(spent[name] for spent in totals) / passes / megabytes * 1e3
        older_ms = sum(spent["older"] for spent in totals) / passes / megabytes * 1e3
        out[name] = (mean_ms, mean_ms / older_ms, min(ratios), max(ratios))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default="HEAD", help="the git revision of the older encoder (default HEAD)")
    parser.add_argument("--passes", type=int, default=6)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        older = encoder_at(args.against, Path(tmp))
        sets = record_sets(Path(tmp))
        encoders: dict[str, Encode] = {
            "one dumps": lambda record, _index: orjson.dumps(record),
            "older": older.encode_record_parts,
            "this tree": _encode.encode_record_parts,
        }
        for records in sets.values():  # the same bytes, or the comparison means nothing
            for index, record in enumerate(records[:20]):
                expected = orjson.dumps(record)
                assert older.encode_record(record, index) == _encode.encode_record(record, index) == expected
        sys.setswitchinterval(_RUN_SWITCH_INTERVAL_S)
        gc.disable()  # a collection would land on whichever encoder ran when it came due
        print(f"| records | one dumps, ms/MB | older ({args.against}), ms/MB | this tree, ms/MB | this tree / older |")
        print("|---|---:|---:|---:|---|")
        for label, records in sets.items():
            result = compare(encoders, records, args.passes)
            dumps, old, new = result["one dumps"], result["older"], result["this tree"]
            print(
                f"| {label} | {dumps[0]:.2f} | {old[0]:.2f} | {new[0]:.2f} | "
                f"{new[1]:.3f} (passes {new[2]:.3f}-{new[3]:.3f}) |"
            )


if __name__ == "__main__":
    main()
