"""The load test: production-sized episodes through our SDK and the published prime-runs 0.1.4, side by side.

    python tools/loadtest.py [--scenarios a,b,c,d,e,f,v] [--episodes 1000] [--scale 0.1] [--skip-published]
                             [--json FILE] [--markdown docs/benchmarks.md] [--smoke]

Every scenario starts ``prime-traces serve --store none`` (light validation
unless stated) in its own process and one or two producer processes
(``tools/_loadtest_producer.py``) that log the workload (``tools/_loadgen.py``:
the production size distribution times ``--scale``) one ``log_episodes()``
per episode as fast as they can, then ``finish()`` with a 60 s budget.
Delivered counts come from the service. Scenarios:

- a: ``--episodes`` episodes, no network time; ours with its defaults and with
  gzip forced, and the published SDK, each beside a 1 ms event-loop lag probe;
- b: the same episodes at 100 ms and 100 MB/s per request, ours at
  ``max_in_flight`` 1, 4 and 8;
- c: 500 episodes, one of them unencodable (NaN);
- d: a service that hangs every upload: ``finish()`` must end in its budget;
- e: two producers of ``--e-episodes`` (1,000) each at once, per-credential
  limit 8, on a network (200 ms and 1 MB/s per request) on which one alone is
  network-bound, with two credentials and with one shared (as ranks of one
  job do); ~30 uploads each, so the shared limit binds past the slow start;
- f: ``--f-episodes`` (10,000) episodes of 2.2 MB, ours, for peak memory;
- v: ``--v-episodes`` (12) verifiers ``Episode`` objects of 7.4 MB shaped like
  real rollouts (token ids and logprobs on every node), logged as objects and
  as their ``to_record()`` dicts, ours and the published SDK, each in a
  virtualenv with verifiers 0.4.0, beside the event-loop lag probe. Not in
  the default list: ``--scenarios v`` (it installs verifiers once, under
  ``~/.cache/prime-traces-bench``).

The machine's ceiling (``_loadtest_parts``) and the floors it sets for a
caller's thread with no SDK (``_loadtest_floors``) are measured in the same
run; ratios, not absolute times, are the claims. ``--smoke``: a and c, small.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _loadgen import Templates, production_sizes
from _loadtest_floors import measure_call_floor, measure_lag_floor, measure_pauses
from _loadtest_parts import Service, measure_ceiling, start_producer, verifiers_python, wait_producer
from _loadtest_report import MARK_BEGIN, MARK_END, line, markdown

from prime_runs.cli.workload import generate_episode

FINISH_BUDGET_S = 60.0
PRODUCER_TIMEOUT_S = 3600.0
# 8 in flight at 1 MB/s of body each: one producer alone gets ~8 MB/s on the wire (~30 MB/s of JSON), CPU to spare.
SLOW_NETWORK = ["--latency-ms", "200", "--bandwidth-mb-s", "1"]
#: Scenario v's episodes: 7.4 MB of JSON each, as measured of real rollouts.
VERIFIERS_EPISODE_BYTES = 7_400_000


def make_templates(path: Path) -> Templates:
    """Member traces of about 2 MB, 400 KB, 60 KB and 10 KB from the realistic generator, and an envelope."""
    import orjson

    traces, envelope = [], None
    for seed, target in ((1, 8_000_000), (2, 1_600_000), (3, 240_000), (4, 40_000)):
        episode = generate_episode(seed, target_bytes=target, now=time.time())  # inside the service's window
        member = max(episode["traces"], key=lambda t: len(orjson.dumps(t)))
        traces.append({"size": len(orjson.dumps(member)), "trace": member})
        envelope = envelope or {k: v for k, v in episode.items() if k != "traces"}
    document = {"envelope": envelope, "traces": traces}
    path.write_bytes(orjson.dumps(document))
    return Templates(document)


class LoadTest:
    def __init__(self, args: argparse.Namespace, tmp: str) -> None:
        self.args, self.tmp = args, tmp
        self.templates_path = Path(tmp) / "templates.json"
        self.templates = make_templates(self.templates_path)
        self.rows: list[dict[str, Any]] = []
        self._sizes_files: dict[str, str] = {}
        self._workload_rss: dict[str, float] = {}

    def sizes(self, name: str, sizes: list[int]) -> str:
        path = Path(self.tmp) / f"sizes-{name}.json"
        path.write_text(json.dumps(sizes))
        self._sizes_files[name] = str(path)
        return str(path)

    def workload_rss_mb(self, sizes_file: str, python: Path | None = None, form: list[str] | None = None) -> float:
        """The producer's peak RSS for the workload alone (no SDK), once per workload."""
        key = (sizes_file, str(python), " ".join(form or []))
        if key not in self._workload_rss:
            service = Service(self.tmp)
            try:
                proc = start_producer(
                    "none",
                    service,
                    str(self.templates_path),
                    sizes_file,
                    key="none",
                    run_id="run-none",
                    workdir=tempfile.mkdtemp(dir=self.tmp),
                    args=list(form or []),
                    python=python,
                )
                self._workload_rss[key] = wait_producer(proc, PRODUCER_TIMEOUT_S).report["peak_rss_mb"]
            finally:
                service.stop()
        return self._workload_rss[key]

    def run(
        self,
        scenario: str,
        variant: str,
        sizes_file: str,
        producers: list[tuple[str, str, list[str]]],
        *,
        flags: list[str] | None = None,
        validate: str = "light",
        python: Path | None = None,
        form: list[str] | None = None,
    ) -> list[dict[str, Any]]:
        """One row per producer: ``producers`` are (sdk, key, extra args), all started at once.

        ``python`` runs the producers (by default this one, or the published SDK's); ``form``: arguments
        that make the workload itself (``--verifiers``), given to the workload-only producer too.
        """
        service = Service(self.tmp, validate=validate, flags=flags)
        try:
            cpu0, faults0, rss0_mb = service.cpu_s(), service.page_faults(), service.rss_mb()
            procs = [
                start_producer(
                    sdk,
                    service,
                    str(self.templates_path),
                    sizes_file,
                    key=key,
                    run_id=f"run-{scenario}-{n}",
                    workdir=tempfile.mkdtemp(dir=self.tmp),
                    args=["--finish-timeout-s", str(FINISH_BUDGET_S), *(form or []), *extra],
                    python=python,
                )
                for n, (sdk, key, extra) in enumerate(producers)
            ]
            done = [wait_producer(proc, PRODUCER_TIMEOUT_S) for proc in procs]
            stats = service.stats()
            service_cpu = service.cpu_s() - cpu0
            service_faults = service.page_faults() - faults0
            service_peak_mb = service.peak_rss_mb()
        finally:
            service.stop()
        workload_mb = self.workload_rss_mb(sizes_file, python, form)
        # Lost: neither delivered nor kept on disk for a sync, whatever the SDK's own counters say.
        logged = sum(p.report["episodes"] for p in done)
        lost = logged - stats["lines"] - sum(p.report["spooled"] for p in done)
        rows = []
        for (sdk, key, extra), producer in zip(producers, done):
            report = producer.report
            row = {
                "scenario": scenario,
                "variant": variant,
                "sdk": sdk,
                "key": key,
                "args": " ".join(extra),
                **report,
                "exit_s": producer.exit_s,
                "exit_killed": producer.killed,
                "mb_s": report["json_bytes"] / report["wall_s"] / 1e6,
                "episodes_s": report["episodes"] / report["wall_s"],
                "rss_above_workload_mb": report["peak_rss_mb"] - workload_mb,
                # Shared by the producers of one row: the service's view.
                "delivered_all": stats["lines"],
                "episodes_all": logged,
                "lost_all": lost,
                "wire_mb_all": stats["wire_bytes"] / 1e6,
                "uploads_all": stats["uploads"],
                "service_cpu_s_all": service_cpu,
                "service_page_faults_all": service_faults,
                "service_peak_rss_mb_all": service_peak_mb,
                "service_rss_at_start_mb_all": rss0_mb,
            }
            rows.append(row)
            print(line(row), file=sys.stderr, flush=True)
        self.rows += rows
        return rows

    # -- scenarios ---------------------------------------------------------------------------------

    def a(self) -> None:
        sizes = self.sizes("a", production_sizes(self.args.episodes, scale=self.args.scale))
        self.run("a", "defaults", sizes, [("ours", "a", ["--asyncio"])])
        if not self.args.smoke:
            self.run("a", "gzip", sizes, [("ours", "a", ["--asyncio", "--compression", "gzip"])])
        if not self.args.skip_published:
            self.run("a", "published", sizes, [("published", "a", ["--asyncio"])])

    def b(self) -> None:
        sizes = self.sizes("b", production_sizes(self.args.episodes, scale=self.args.scale))
        for window in (1, 4, 8):
            flags = ["--latency-ms", "100", "--bandwidth-mb-s", "100"]
            self.run(
                "b", f"max_in_flight={window}", sizes, [("ours", "b", ["--max-in-flight", str(window)])], flags=flags
            )

    def c(self) -> None:
        count = 30 if self.args.smoke else 500
        sizes = self.sizes("c", production_sizes(count, scale=self.args.scale, seed=3))
        poison = ["--poison", str(count // 2)]
        self.run("c", "one poisoned", sizes, [("ours", "c", poison)])
        if not self.args.skip_published:
            self.run("c", "one poisoned", sizes, [("published", "c", poison)])

    def d(self) -> None:
        sizes = self.sizes("d", production_sizes(self.args.d_episodes, scale=self.args.scale, seed=4))
        self.run("d", "hung service", sizes, [("ours", "d", [])], flags=["--hang-uploads"])
        if not self.args.skip_published:
            self.run("d", "hung service", sizes, [("published", "d", [])], flags=["--hang-uploads"])

    def e(self) -> None:
        sizes = self.sizes("e", production_sizes(self.args.e_episodes, scale=self.args.scale, seed=5))
        self.run("e", "one producer", sizes, [("ours", "e1", [])], flags=SLOW_NETWORK)
        self.run("e", "two credentials", sizes, [("ours", "e1", []), ("ours", "e2", [])], flags=SLOW_NETWORK)
        self.run("e", "one shared credential", sizes, [("ours", "e1", []), ("ours", "e1", [])], flags=SLOW_NETWORK)

    def f(self) -> None:
        sizes = self.sizes("f", [2_200_000] * self.args.f_episodes)
        self.run("f", f"{self.args.f_episodes} x 2.2 MB", sizes, [("ours", "f", [])])

    def v(self) -> None:
        # verifiers' own Episode objects, as verifiers and prime-rl log them, and the same as dicts.
        sizes = self.sizes("v", [VERIFIERS_EPISODE_BYTES] * self.args.v_episodes)
        sdks = ["ours"] + ([] if self.args.skip_published else ["published"])
        for form in ("objects", "dicts"):
            for sdk in sdks:
                python = verifiers_python(sdk)
                rows = [(sdk, "v", ["--asyncio"])]
                self.run("v", f"verifiers {form}", sizes, rows, python=python, form=["--verifiers", form])

    def ceiling(self) -> dict[str, float]:
        sample = production_sizes(min(self.args.episodes, 200), scale=self.args.scale)
        return measure_ceiling([self.templates.episode(i, size) for i, size in enumerate(sample)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default="a,b,c,d,e,f")
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--scale", type=float, default=0.1)
    parser.add_argument("--d-episodes", type=int, default=100)
    parser.add_argument("--e-episodes", type=int, default=1000)
    parser.add_argument("--f-episodes", type=int, default=10_000)
    parser.add_argument("--v-episodes", type=int, default=12)
    parser.add_argument("--skip-published", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="a and c, small, ours only (the test suite's run)")
    parser.add_argument("--json", default=None, help="write every row and the ceiling here")
    parser.add_argument("--markdown", default=None, help="replace the load-test section of this file")
    args = parser.parse_args()
    if args.smoke:
        args.scenarios, args.episodes, args.scale, args.skip_published = "a,c", 20, 0.01, True
    with tempfile.TemporaryDirectory(prefix="loadtest-") as tmp:
        test = LoadTest(args, tmp)
        ceiling = test.ceiling()
        if not args.smoke:  # ~25 s, 13 beside spinning processes: what the machine leaves a caller's thread
            ceiling |= measure_pauses() | measure_lag_floor() | measure_call_floor()
        for name in args.scenarios.split(","):
            getattr(test, name.strip())()
    command = "python tools/loadtest.py " + " ".join(sys.argv[1:])
    if args.json:
        Path(args.json).write_text(json.dumps({"ceiling": ceiling, "rows": test.rows}, indent=1))
    table = markdown(test.rows, ceiling, command, args.scale)
    print(table)
    if args.markdown:
        path = Path(args.markdown)
        text = path.read_text() if path.exists() else ""
        if MARK_BEGIN in text:
            before, rest = text.split(MARK_BEGIN, 1)
            text = before + table + rest.split(MARK_END, 1)[1].lstrip("\n")
        else:
            text = text.rstrip("\n") + "\n\n" + table
        path.write_text(text)


if __name__ == "__main__":
    main()
