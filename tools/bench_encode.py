"""Measure what chunked record encoding costs and what it buys.

For episodes of several sizes from ``tools/workload.py``, compares one
``orjson.dumps`` call with ``prime_traces._lines.encoder.encode_record_parts`` (chunked
above ``CHUNK_THRESHOLD_BYTES``; the pieces go to the batcher unjoined, as on
the upload path, where either result is copied once into the batch body) on
two counts, and prints a markdown table:

- CPU per episode: thread CPU seconds, best of ``--repeat`` runs of each in
  a row, the chunked/dumps ratio, and the minor page faults of one run (on
  this VM a first touch of a 4 KiB page costs ~2 µs, a quarter of one dumps
  of 35 MB); then the ratio again with the two alternating, run after run,
  which changes what memory the allocator hands each of them (fresh or
  reused), and so their cost;
- the worst gap of an asyncio probe (a loop of ``await asyncio.sleep(0.001)``
  on the main thread, measuring the longest interval between wakeups) while
  another thread encodes the episode: the median and the max over ``--repeat``
  runs, next to the same for a second thread that only sleeps.

It exits 1 when the 35 MB episode misses the issue's targets (a median worst
gap of at most 5 ms, at most 15% more CPU than one dumps); the table is still
printed.

    python tools/bench_encode.py --sizes 8.5e6 35e6 133e6 --repeat 5
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workload import generate_episode

from prime_traces._lines.encoder import encode_record, encode_record_parts

_PROBE_INTERVAL_S = 0.001
_NOW = 1_750_000_000.0
_TARGET_EPISODE_BYTES = 35e6  # the targets, for this size
_TARGET_GAP_MS = 5.0
_TARGET_CPU_RATIO = 1.15


def _cpu_ratio_interleaved(dumps: Callable[[], object], chunked: Callable[[], object], repeat: int) -> float:
    """Best chunked CPU over best dumps CPU, the two run alternately ``repeat`` times each."""
    best = {dumps: float("inf"), chunked: float("inf")}
    for _ in range(repeat):
        for encode in best:
            began = time.thread_time()
            result = encode()
            best[encode] = min(best[encode], time.thread_time() - began)
            del result
    return best[chunked] / best[dumps]


def _cpu_s(encode: Callable[[], bytes], repeat: int) -> tuple[float, int]:
    """Best CPU seconds of ``repeat`` runs, and the page faults of the last one."""
    best, faults = float("inf"), 0
    for _ in range(repeat):
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        began = time.thread_time()
        result = encode()
        best = min(best, time.thread_time() - began)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        del result  # freed outside the measurement, as the caller would later
    return best, faults


async def _probe(stop: threading.Event) -> float:
    worst, last = 0.0, time.perf_counter()
    while not stop.is_set():
        await asyncio.sleep(_PROBE_INTERVAL_S)
        now = time.perf_counter()
        worst, last = max(worst, now - last), now
    return worst


def _worst_gap_s(encode: Callable[[], object] | None) -> float:
    """The probe's worst gap while a thread runs encode (or sleeps 50 ms if None)."""

    async def main() -> float:
        stop = threading.Event()
        probe = asyncio.ensure_future(_probe(stop))
        await asyncio.sleep(0.02)  # the probe is in its loop before the encoder starts

        kept = []  # freeing a big result holds the GIL too: that happens after the probe stops

        def work() -> None:
            try:
                kept.append(time.sleep(0.05) if encode is None else encode())
            finally:
                stop.set()

        thread = threading.Thread(target=work, name="bench-encode", daemon=True)
        thread.start()
        worst = await probe
        thread.join()
        kept.clear()
        return worst

    return asyncio.run(main())


def _gaps_ms(encode: Callable[[], object] | None, repeat: int) -> list[float]:
    return sorted(_worst_gap_s(encode) * 1e3 for _ in range(repeat))


def _show(gaps: list[float]) -> str:
    return f"{statistics.median(gaps):.1f} / {gaps[-1]:.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[8.5e6, 35e6, 133e6], help="episode bytes")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    print(
        f"Python {sys.version.split()[0]}, orjson {orjson.__version__}; probe: a loop of "
        f"asyncio.sleep({_PROBE_INTERVAL_S}); gaps are the median / max over {args.repeat} runs of each run's "
        f"worst gap; with an idle second thread: {_show(_gaps_ms(None, args.repeat))} ms\n"
    )
    print(
        "| episode | encoded bytes | CPU ms, one dumps | CPU ms, chunked | CPU ratio | page faults, dumps / chunked "
        "| CPU ratio, interleaved | worst gap ms, one dumps | worst gap ms, chunked |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    verdicts = []
    for size in args.sizes:
        episode = generate_episode(args.seed, target_bytes=int(size), now=_NOW)
        whole = orjson.dumps(episode)
        encoded_bytes = len(whole)
        assert encode_record(episode, 0) == whole, "chunked encoding differs from one orjson.dumps"
        del whole
        dumps_cpu, dumps_faults = _cpu_s(lambda ep=episode: orjson.dumps(ep), args.repeat)
        chunked_cpu, chunked_faults = _cpu_s(lambda ep=episode: encode_record_parts(ep, 0), args.repeat)
        interleaved = _cpu_ratio_interleaved(
            lambda ep=episode: orjson.dumps(ep), lambda ep=episode: encode_record_parts(ep, 0), args.repeat
        )
        gaps_dumps = _gaps_ms(lambda ep=episode: orjson.dumps(ep), args.repeat)
        gaps_chunked = _gaps_ms(lambda ep=episode: encode_record_parts(ep, 0), args.repeat)
        cpu = f"{dumps_cpu * 1e3:.1f} | {chunked_cpu * 1e3:.1f} | {chunked_cpu / dumps_cpu:.2f}"
        faults, gaps = f"{dumps_faults:,} / {chunked_faults:,}", f"{_show(gaps_dumps)} | {_show(gaps_chunked)}"
        print(f"| {size / 1e6:g} MB | {encoded_bytes:,} | {cpu} | {faults} | {interleaved:.2f} | {gaps} |")
        del episode
        if size == _TARGET_EPISODE_BYTES:
            gap_ms, ratio = statistics.median(gaps_chunked), chunked_cpu / dumps_cpu
            verdicts.append(
                f"median worst gap {gap_ms:.1f} ms (target <= {_TARGET_GAP_MS:g} ms): "
                f"{'met' if gap_ms <= _TARGET_GAP_MS else 'MISSED'}"
            )
            verdicts.append(
                f"CPU ratio {ratio:.2f} (target <= {_TARGET_CPU_RATIO:g}): "
                f"{'met' if ratio <= _TARGET_CPU_RATIO else 'MISSED'}"
            )
    if verdicts:
        print(f"\nTargets for the {_TARGET_EPISODE_BYTES / 1e6:g} MB episode: " + "; ".join(verdicts))
    return 1 if any("MISSED" in verdict for verdict in verdicts) else 0


if __name__ == "__main__":
    sys.exit(main())
