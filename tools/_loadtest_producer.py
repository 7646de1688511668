"""One producer of the load test, in its own process: log the episodes as fast as possible, finish, report.

    python tools/_loadtest_producer.py --sdk ours|published|none --templates T.json --sizes S.json \
        [--asyncio] [--poison INDEX] [--finish-timeout-s 60] [--run-id ID] [--dir DIR] [--max-in-flight N]

The service comes from ``PRIME_TRACES_URL`` / ``PRIME_API_KEY``. ``ours`` is
``prime_runs.init()`` of this project; ``published`` is the published
prime-runs 0.1.4 (its ``UploadWorker``, ``TracesSink`` and prime-traces
client, as its ``init()`` wires them, without the platform registration the
local service does not serve), run from a virtualenv holding only it;
``none`` builds and walks the same episodes without any SDK, for the memory
and time the workload costs on its own. With ``--asyncio`` the episodes are
logged from a coroutine while a probe beside it on the same event loop
measures how late each 1 ms sleep wakes (the loop's lag), while the episodes
are logged and while ``finish()`` drains them on a helper thread. One JSON object
on the last line of stdout holds every measure.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import resource
import sys
import time
from collections.abc import Callable
from typing import Any

from _loadgen import Templates, poisoned

PROBE_INTERVAL_S = 0.001


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _sys_s() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


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

    def log(self, episode: dict[str, Any]) -> None:
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

    def log(self, episode: dict[str, Any]) -> None:
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

    def log(self, episode: dict[str, Any]) -> None:
        self.submitted += len(episode["traces"]) > 0

    def finish(self, timeout_s: float) -> dict[str, Any]:
        return {"submitted": self.submitted, "dropped": 0, "failed": 0, "spooled": 0}


SDKS: dict[str, Callable[[argparse.Namespace], Any]] = {"ours": Ours, "published": Published, "none": NoSdk}


def log_one(sdk: Any, templates: Templates, index: int, size: int, poison: int | None, call_s: list[float]) -> None:
    """Build episode ``index`` (unencodable when it is ``poison``) and log it, timing the call alone."""
    episode = templates.episode(index, size)
    if index == poison:
        episode = poisoned(episode)
    started = time.perf_counter()
    sdk.log(episode)
    call_s.append(time.perf_counter() - started)


def produce(sdk: Any, templates: Templates, sizes: list[int], poison: int | None, call_s: list[float]) -> None:
    for index, size in enumerate(sizes):
        log_one(sdk, templates, index, size, poison, call_s)


async def produce_beside_a_probe(
    sdk: Any, templates: Templates, sizes: list[int], poison: int | None, call_s: list[float], timeout_s: float
) -> tuple[list[float], dict[str, Any], float]:
    """Log, then finish on a helper thread (as ``afinish()`` does), the probe running all along."""
    lags: list[float] = []
    done = asyncio.Event()
    counts: dict[str, Any] = {}
    logged_at = 0.0

    async def probe() -> None:
        loop = asyncio.get_running_loop()
        while not done.is_set():
            asked = loop.time()
            await asyncio.sleep(PROBE_INTERVAL_S)
            lags.append(max(0.0, loop.time() - asked - PROBE_INTERVAL_S))

    async def producer() -> None:
        for index, size in enumerate(sizes):
            log_one(sdk, templates, index, size, poison, call_s)
            await asyncio.sleep(0)  # the training loop's other work: the probe gets its turn
        nonlocal logged_at
        logged_at = time.monotonic()
        # The loop stays free while the uploads drain: the lag measured here is the SDK's doing.
        counts.update(await asyncio.get_running_loop().run_in_executor(None, sdk.finish, timeout_s))
        done.set()

    await asyncio.gather(probe(), producer())
    return lags, counts, logged_at


class GcPauses:
    """The garbage collector's pauses (``gc.callbacks``): a call that allocates may pay for one."""

    def __init__(self) -> None:
        self.pauses_s: list[tuple[float, int]] = []  # (seconds, generation)
        self._started = 0.0
        gc.callbacks.append(self._note)

    def _note(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses_s.append((time.perf_counter() - self._started, info["generation"]))

    def report(self) -> dict[str, Any]:
        longest = max(self.pauses_s, default=(0.0, 0))
        return {"gc_max_ms": longest[0] * 1e3, "gc_max_generation": longest[1], "gc_collections": len(self.pauses_s)}


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


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
    args = parser.parse_args()
    templates = Templates.load(args.templates)
    with open(args.sizes, encoding="utf-8") as file:
        sizes = [int(size) for size in json.load(file)]
    rss_before_mb = _peak_rss_mb()
    sdk = SDKS[args.sdk](args)
    call_s: list[float] = []
    lags: list[float] = []
    gc_pauses = GcPauses()
    cpu0, sys0, started = _cpu_s(), _sys_s(), time.monotonic()
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
        "log_slowest": sorted(((round(t * 1e3, 2), i) for i, t in enumerate(call_s)), reverse=True)[:5],
        "log_p99_ms": _quantile(call_s, 0.99) * 1e3,
        "lag_p99_ms": _quantile(lags, 0.99) * 1e3,
        "lag_max_ms": max(lags, default=0.0) * 1e3,
        "lag_samples": len(lags),
        "log_s": logged_at - started,
        "finish_s": finished_at - logged_at,
        "wall_s": finished_at - started,
        "cpu_s": _cpu_s() - cpu0,
        "sys_cpu_s": _sys_s() - sys0,
        "peak_rss_mb": _peak_rss_mb(),
        "rss_at_start_mb": rss_before_mb,
        **gc_pauses.report(),
        **counts,
    }
    # The parent times the exit from this line on: an SDK that holds the process up shows there.
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
