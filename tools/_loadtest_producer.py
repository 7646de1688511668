"""One producer of the load test, in its own process: log the episodes as fast as possible, finish, report.

    python tools/_loadtest_producer.py --sdk ours|published|none --templates T.json --sizes S.json \
        [--asyncio] [--poison INDEX] [--finish-timeout-s 60] [--run-id ID] [--dir DIR] [--max-in-flight N]
        [--verifiers objects|dicts]

The service comes from ``PRIME_TRACES_URL`` / ``PRIME_API_KEY``. ``ours`` is
``prime_runs.init()`` of this project; ``published`` is the published
prime-runs 0.1.4 (its ``UploadWorker``, ``TracesSink`` and prime-traces
client, as its ``init()`` wires them, without the platform registration the
local service does not serve), run from a virtualenv holding only it;
``none`` builds and walks the same episodes without any SDK, for the memory
and time the workload costs on its own. With ``--asyncio`` the episodes are
logged from a coroutine while a probe beside it on the same event loop
measures how late each 1 ms sleep wakes (the loop's lag), while the episodes
are logged and while ``finish()`` drains them on a helper thread. With
``--verifiers`` the episodes are verifiers ``Episode`` objects shaped like real
rollouts (``_loadgen_verifiers``), built before the clock starts, and logged as
the objects or as their ``to_record()`` dicts (the producer's Python must
have verifiers). One JSON object on the last line of stdout holds every measure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import time
from collections.abc import Callable
from typing import Any

from _loadgen import Templates, poisoned
from _loadtest_probes import GcPauses, UploadThreadCpu, probe_lag, quantile


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _sys_s() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


def _page_faults() -> int:
    """Minor page faults so far: each a page of memory this process touched for the first time."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


class Ours:
    def __init__(self, args: argparse.Namespace) -> None:
        import prime_runs

        self.run = prime_runs.init(
            "loadtest",
            kind="train",
            id=args.run_id,
            dir=args.dir,
            console="off",
            max_in_flight=args.max_in_flight,
            compression=args.compression,
            finish_timeout_s=args.finish_timeout_s,
            handle_signals=False,
        )

    def log(self, episode: Any) -> None:
        self.run.log_episodes([episode])

    def finish(self, timeout_s: float) -> dict[str, Any]:
        self.run.finish(timeout_s=timeout_s)
        stats = self.run.stats()
        counts = stats["sinks"]["traces"]
        return {
            "submitted": stats["submitted"],
            "dropped": sum(stats["dropped"].values()),
            "failed": sum(counts["failed"].values()),
            "spooled": counts["spooled"],
            "stored": counts["stored"],
            "failure_details": counts.get("failure_details", {}),
        }


class Published:
    def __init__(self, args: argparse.Namespace) -> None:
        from prime_runs.sinks.traces import TracesSink
        from prime_runs.worker import UploadWorker

        self.sink = TracesSink(api_key=os.environ["PRIME_API_KEY"])
        self.sink.start(args.run_id, {"source": "prime-runs", "run_type": "train"})
        self.worker = UploadWorker([self.sink])
        self.worker.start()
        self.submitted = 0

    def log(self, episode: Any) -> None:
        self.submitted += 1
        self.worker.submit([episode])

    def finish(self, timeout_s: float) -> dict[str, Any]:
        self.worker.close(timeout=timeout_s)
        failed = sum(self.worker.failed_records.values())
        return {"submitted": self.submitted, "dropped": self.worker.dropped, "failed": failed, "spooled": 0}


class NoSdk:
    """The workload alone: each episode built and walked, then let go, as an SDK would hold none."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.submitted = 0

    def log(self, episode: Any) -> None:
        traces = episode["traces"] if isinstance(episode, dict) else episode.traces
        self.submitted += len(traces) > 0

    def finish(self, timeout_s: float) -> dict[str, Any]:
        return {"submitted": self.submitted, "dropped": 0, "failed": 0, "spooled": 0}


SDKS: dict[str, Callable[[argparse.Namespace], Any]] = {"ours": Ours, "published": Published, "none": NoSdk}


class Prebuilt:
    """verifiers episodes made before the run, handed out as ``Templates.episode`` hands out its own."""

    def __init__(self, sizes: list[int], form: str) -> None:
        import _loadgen_verifiers

        tokens = {size: _loadgen_verifiers.tokens_for(size) for size in set(sizes)}
        made = [_loadgen_verifiers.episode(index, tokens[size]) for index, size in enumerate(sizes)]
        self.episodes: list[Any] = [e.to_record() for e in made] if form == "dicts" else made

    def episode(self, index: int, _size: int) -> Any:
        return self.episodes[index]


def log_one(
    sdk: Any, templates: Templates | Prebuilt, index: int, size: int, poison: int | None, call_s: list[float]
) -> None:
    """Build episode ``index`` (unencodable when it is ``poison``) and log it, timing the call alone.

    The garbage collector's pauses inside the call go to ``_CALL_GC_S`` too:
    the collector runs in whichever call allocates when its count comes due.
    """
    episode = templates.episode(index, size)
    if index == poison:
        episode = poisoned(episode)
    # Neither read releases the GIL: one that did would let the call start with a fresh hold and move waits out.
    switches_before = _switches()
    first_pause = len(_GC.pauses)  # after the read above, which may allocate
    # The CPU clock is read inside the wall clock's window, so the call's CPU never counts time outside
    # it: an interrupt served on this thread's core between the two readings is charged to the thread.
    started = time.perf_counter()
    cpu_before = time.thread_time()
    sdk.log(episode)
    cpu_after = time.thread_time()
    ended = time.perf_counter()
    call_s.append(ended - started)
    _CALL_CPU_S.append(cpu_after - cpu_before)
    _CALL_GC_S.append(_GC.inside(first_pause, started, ended))
    waits, preempted = (after - before for after, before in zip(_switches(), switches_before))
    _CALL_SWITCHES.append((waits, preempted))


def produce(
    sdk: Any, templates: Templates | Prebuilt, sizes: list[int], poison: int | None, call_s: list[float]
) -> None:
    for index, size in enumerate(sizes):
        log_one(sdk, templates, index, size, poison, call_s)


async def produce_beside_a_probe(
    sdk: Any,
    templates: Templates | Prebuilt,
    sizes: list[int],
    poison: int | None,
    call_s: list[float],
    timeout_s: float,
) -> tuple[list[float], dict[str, Any], float]:
    """Log, then finish on a helper thread (as ``afinish()`` does), the probe running all along."""
    lags: list[float] = []
    done = asyncio.Event()
    counts: dict[str, Any] = {}
    logged_at = 0.0

    async def producer() -> None:
        for index, size in enumerate(sizes):
            log_one(sdk, templates, index, size, poison, call_s)
            await asyncio.sleep(0)  # the training loop's other work: the probe gets its turn
        nonlocal logged_at
        logged_at = time.monotonic()
        # The loop stays free while the uploads drain: the lag measured here is the SDK's doing.
        counts.update(await asyncio.get_running_loop().run_in_executor(None, sdk.finish, timeout_s))
        done.set()

    await asyncio.gather(probe_lag(lags, lambda: not done.is_set()), producer())
    return lags, counts, logged_at


_GC = GcPauses()
# Per log_episodes() call: the calling thread's CPU seconds, the collector's pauses inside it, and how
# often the thread gave up its core, waiting (for the GIL, a lock) or preempted by the kernel.
_CALL_CPU_S: list[float] = []
_CALL_GC_S: list[float] = []
_CALL_SWITCHES: list[tuple[int, int]] = []
_RUSAGE_THREAD = getattr(resource, "RUSAGE_THREAD", None)


def _switches() -> tuple[int, int]:
    """The calling thread's voluntary and involuntary context switches so far (zeros off Linux).

    Exact counters, unlike ``getrusage``'s per-thread CPU, which moves in
    clock ticks (``time.thread_time`` gives that).
    """
    if _RUSAGE_THREAD is None:
        return (0, 0)
    usage = resource.getrusage(_RUSAGE_THREAD)
    return (usage.ru_nvcsw, usage.ru_nivcsw)


def slowest_calls(call_s: list[float], count: int = 5) -> list[list[float]]:
    """The slowest calls: [ms, index, own CPU ms, GC ms, times it waited, times it was preempted]."""
    order = sorted(range(len(call_s)), key=lambda i: call_s[i], reverse=True)[:count]
    ms = [call_s, _CALL_CPU_S, _CALL_GC_S]
    return [[round(ms[0][i] * 1e3, 2), i, *(round(m[i] * 1e3, 2) for m in ms[1:]), *_CALL_SWITCHES[i]] for i in order]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sdk", choices=sorted(SDKS), required=True)
    parser.add_argument("--templates", required=True)
    parser.add_argument("--sizes", required=True, help="a JSON file holding the list of episode sizes")
    parser.add_argument("--asyncio", action="store_true")
    parser.add_argument("--poison", type=int, default=None, help="index of the episode made unencodable")
    parser.add_argument("--finish-timeout-s", type=float, default=60.0)
    parser.add_argument("--run-id", default="run-loadtest")
    parser.add_argument("--dir", default=None, help="where our SDK keeps its run directory")
    parser.add_argument("--max-in-flight", type=int, default=8)
    parser.add_argument("--compression", default="auto", help="ours only: auto, zstd, gzip or none")
    parser.add_argument("--verifiers", choices=("objects", "dicts"), default=None)
    args = parser.parse_args()
    with open(args.sizes, encoding="utf-8") as file:
        sizes = [int(size) for size in json.load(file)]
    templates = Prebuilt(sizes, args.verifiers) if args.verifiers else Templates.load(args.templates)
    rss_before_mb = _peak_rss_mb()
    sdk = SDKS[args.sdk](args)
    call_s: list[float] = []
    lags: list[float] = []
    gc_pauses = _GC
    gc_pauses.reset()  # the SDK's import and setup are not the run's
    upload_cpu = UploadThreadCpu() if sys.platform == "linux" else None
    main_cpu0 = time.thread_time()
    cpu0, sys0, faults0, started = _cpu_s(), _sys_s(), _page_faults(), time.monotonic()
    if args.asyncio:
        lags, counts, logged_at = asyncio.run(
            produce_beside_a_probe(sdk, templates, sizes, args.poison, call_s, args.finish_timeout_s)
        )
    else:
        produce(sdk, templates, sizes, args.poison, call_s)
        logged_at = time.monotonic()
        counts = sdk.finish(args.finish_timeout_s)
    finished_at = time.monotonic()
    report = {
        "sdk": args.sdk,
        "episodes": len(sizes),
        "json_bytes": sum(sizes),
        "log_max_ms": max(call_s, default=0.0) * 1e3,
        "log_slowest": slowest_calls(call_s),
        "log_p99_ms": quantile(call_s, 0.99) * 1e3,
        "log_over_1ms": sum(t > 0.001 for t in call_s),
        # The longest a call took less the collector's pauses inside it.
        "log_max_without_gc_ms": max((t - g for t, g in zip(call_s, _CALL_GC_S)), default=0.0) * 1e3,
        "lag_p99_ms": quantile(lags, 0.99) * 1e3,
        "lag_max_ms": max(lags, default=0.0) * 1e3,
        "lag_samples": len(lags),
        "log_s": logged_at - started,
        "finish_s": finished_at - logged_at,
        "wall_s": finished_at - started,
        "cpu_s": _cpu_s() - cpu0,
        "sys_cpu_s": _sys_s() - sys0,
        "page_faults": _page_faults() - faults0,
        "peak_rss_mb": _peak_rss_mb(),
        "rss_at_start_mb": rss_before_mb,
        **gc_pauses.report(),
        "main_thread_cpu_s": time.thread_time() - main_cpu0,
        **({"upload_thread_cpu_s": upload_cpu.report()} if upload_cpu is not None else {}),
        **counts,
    }
    # The parent times the exit from this line on: an SDK that holds the process up shows there.
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
