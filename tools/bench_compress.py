"""Measure the CPU cost and output size of each request coding on trace-like JSONL.

Builds one batch-sized JSONL body (episodes from ``tools/workload.py`` when it
is importable, else a built-in generator of verifiers-shaped traces), then
compresses it with gzip and zstd at several levels and prints a markdown
table: CPU seconds per MiB of input (process time, single thread), output
size, and the CPU to decompress. It ends with the lowest zstd level whose
output is no larger than gzip-1, and that level's CPU as a ratio to gzip-1,
which is how ``prime_traces._upload.compress.DEFAULT_ZSTD_LEVEL`` is chosen.

    python tools/bench_compress.py --mib 30 --repeat 3
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import random
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import zstandard

_MIB = 1024**2
_WORDS = (
    "the of and to in is that for it as with was on be by this are or from at which an "
    "not have has but were their they can all one more also would there its if been "
    "function return value error model reward episode trace step token answer question "
    "result compute number list string import def class self print assert file path "
    "because therefore first second next then finally let we need check whether the "
    "solution correct output input test case loop index array sum total count"
).split()
_ROLES = ("system", "user", "assistant", "tool")
_CLIENT_URL = "https://api.pinference.ai/api/v1"
# Zipf-like word frequencies: real prose and code repeat a few tokens a lot.
_CUM_WEIGHTS = list(itertools.accumulate(1.0 / rank**1.1 for rank in range(1, len(_WORDS) + 1)))


def _text(rng: random.Random, words: int) -> str:
    picks = rng.choices(_WORDS, cum_weights=_CUM_WEIGHTS, k=words)
    for i in range(0, len(picks), rng.randint(8, 20)):
        picks[i] = picks[i].capitalize() if rng.random() < 0.7 else str(rng.randint(0, 99999))
    return " ".join(picks)


def _builtin_episode(seed: int, target_bytes: int) -> dict:
    """A verifiers-shaped episode envelope of roughly ``target_bytes`` (contract §7)."""
    rng = random.Random(seed)
    start = 1_750_000_000 + seed * 37.5
    traces, size = [], 0
    while size < target_bytes:
        trace_id = f"t-{seed}-{len(traces)}-{rng.getrandbits(64):016x}"
        nodes, calls = [], []
        for turn in range(rng.randint(2, 8)):
            role = _ROLES[min(turn, 1) if turn < 2 else rng.choice((2, 3))]
            message = {"role": role, "content": _text(rng, rng.randint(20, 400))}
            if role == "assistant":
                message["reasoning_content"] = _text(rng, rng.randint(50, 600))
                if rng.random() < 0.4:
                    message["tool_calls"] = [
                        {
                            "id": f"call_{rng.getrandbits(48):012x}",
                            "type": "function",
                            "function": {
                                "name": rng.choice(("python", "search", "bash")),
                                "arguments": json.dumps({"code": _text(rng, 40)}),
                            },
                        }
                    ]
                calls.append(
                    {
                        "node": turn,
                        "model": "qwen3-8b",
                        "endpoint": "chat",
                        "finish_reason": rng.choice(("stop", "stop", "tool_calls", "length")),
                        "usage": {
                            "input_tokens": rng.randint(100, 8000),
                            "completion_tokens": rng.randint(10, 2000),
                            "total_tokens": rng.randint(200, 10000),
                        },
                        "time": {"start": start + turn, "end": start + turn + rng.random() * 5},
                    }
                )
            parent = turn - 1 if turn else None
            nodes.append({"message": message, "parent": parent, "sampled": role == "assistant"})
        trace = {
            "version": 1,
            "id": trace_id,
            "task": {
                "type": "math",
                "data": {"idx": rng.randint(0, 10**5), "name": "gsm8k"},
                "key": f"gsm8k/{rng.randint(0, 10**5)}",
            },
            "agent": {
                "name": "solver",
                "trainable": True,
                "config": {"model": "qwen3-8b", "client": {"base_url": _CLIENT_URL}},
            },
            "run": {
                "id": f"run-{seed % 7}",
                "type": "train",
                "work": {"type": "rollout", "step": seed % 500},
            },
            "nodes": nodes,
            "calls": calls,
            "rewards": {"correct": {"score": rng.random(), "weight": 1.0}, "format": None},
            "metrics": {"latency_s": rng.random() * 30, "tokens": rng.randint(100, 20000)},
            "is_completed": True,
            "ok": rng.random() > 0.05,
            "stop_condition": rng.choice(("completed", "max_turns", "max_output_tokens")),
            "errors": [],
            "timing": {"start": start, "scoring": {"start": start + 40, "end": start + 41.5}},
        }
        size += len(json.dumps(trace, separators=(",", ":")))
        traces.append(trace)
    return {
        "version": 1,
        "id": f"ep-{seed}",
        "env": {"id": "gsm8k-env"},
        "run": {"id": f"run-{seed % 7}", "type": "train"},
        "ok": True,
        "errors": [],
        "outcome": "completed",
        "traces": traces,
        "info": {},
    }


def _episode_source() -> tuple[str, Callable[[int, int], object]]:
    tools_dir = Path(__file__).resolve().parent
    sys.path.insert(0, str(tools_dir))
    try:
        from workload import generate_episode  # type: ignore[import-not-found]
    except ImportError:
        return "built-in generator", _builtin_episode
    finally:
        sys.path.remove(str(tools_dir))
    return "tools/workload.py", lambda seed, size: generate_episode(seed, target_bytes=size)


def _encode(record: object) -> bytes:
    try:
        import orjson
    except ImportError:
        return json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode()
    return orjson.dumps(record)


def build_body(total_bytes: int, episode_bytes: int, seed: int = 0) -> tuple[str, bytes]:
    """A JSONL body of about ``total_bytes``: one compact JSON episode per line."""
    source, generate = _episode_source()
    lines, size, index = [], 0, seed
    while size < total_bytes:
        episode = generate(index, episode_bytes)
        if isinstance(episode, str):
            line = episode.encode()
        elif isinstance(episode, (bytes, bytearray)):
            line = bytes(episode)
        else:
            line = _encode(episode)
        line = line.rstrip(b"\n") + b"\n"
        lines.append(line)
        size += len(line)
        index += 1
    return source, b"".join(lines)


def _codecs() -> dict[str, tuple[Callable[[bytes], bytes], Callable[[bytes], bytes]]]:
    def gz(level: int):
        return (
            lambda b: gzip.compress(b, compresslevel=level, mtime=0),
            lambda c: zlib.decompress(c, wbits=31),
        )

    def zs(level: int):
        compressor = zstandard.ZstdCompressor(level=level, write_content_size=True)
        decompressor = zstandard.ZstdDecompressor()
        return (compressor.compress, decompressor.decompress)

    codecs = {
        "gzip-1": gz(1),
        "gzip-6": gz(6),
        "gzip-9": gz(9),
        "zstd--1": zs(-1),
        "zstd-1": zs(1),
        "zstd-2": zs(2),
        "zstd-3": zs(3),
    }
    try:  # what the client sends as gzip when the isal package is installed
        from isal import isal_zlib
    except ImportError:
        return codecs
    codecs["isal-gzip-1"] = (lambda b: isal_zlib.compress(b, 1, wbits=31), lambda c: zlib.decompress(c, wbits=31))
    return codecs


def _cpu_s(fn: Callable[[bytes], bytes], data: bytes, repeat: int) -> tuple[float, bytes]:
    best, out = float("inf"), b""
    for _ in range(repeat):
        started = time.process_time()
        out = fn(data)
        best = min(best, time.process_time() - started)
    return best, out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=30.0, help="body MiB (default 30: one batch)")
    parser.add_argument("--episode-kib", type=int, default=2148, help="approximate KiB per line")
    parser.add_argument("--repeat", type=int, default=3, help="runs per codec; the fastest counts")
    args = parser.parse_args(argv)

    source, body = build_body(int(args.mib * _MIB), args.episode_kib * 1024)
    mib = len(body) / _MIB
    rows = []
    for name, (enc, dec) in _codecs().items():
        cpu, out = _cpu_s(enc, body, args.repeat)
        dcpu, back = _cpu_s(dec, out, args.repeat)
        assert back == body, name
        rows.append((name, cpu / mib, len(out), len(out) / len(body), dcpu / mib))

    line_count = body.count(b"\n")
    print(
        f"Body: {mib:.1f} MiB, {line_count} JSONL lines from {source}; "
        f"best of {args.repeat} runs, one thread, process CPU time.\n"
    )
    print("| coding | compress CPU s/MiB | output bytes | ratio | decompress CPU s/MiB |")
    print("|---|---:|---:|---:|---:|")
    for name, cpu, size, ratio, dcpu in rows:
        print(f"| {name} | {cpu:.4f} | {size:,} | {ratio:.3f} | {dcpu:.4f} |")

    by_name = {row[0]: row for row in rows}
    gzip1 = by_name["gzip-1"]
    zstd_rows = sorted((r for r in rows if r[0].startswith("zstd-")), key=lambda r: int(r[0][5:]))
    winner = next((r for r in zstd_rows if r[2] <= gzip1[2]), None)
    print()
    if winner is None:
        print("No measured zstd level is as small as gzip-1.")
    else:
        print(
            f"Lowest zstd level at least as small as gzip-1: {winner[0]} "
            f"({winner[2] / gzip1[2]:.3f}x gzip-1's size, {winner[1] / gzip1[1]:.3f}x its CPU)."
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
