"""How soon after SIGTERM is everything a run logged on disk or on the service?

A child process logs ``--records`` episodes of ``--record-mb`` MB each
against ``prime-traces serve --link-mb-s 1`` (a link that takes almost none
of it), prints ``logged``, and keeps training. The parent sends SIGTERM at
once and polls, every 20 ms, the lines fsynced in the run directory (counted
from the segments' metadata, nothing decompressed); it reports when they and
the records stored before the signal first cover everything logged, and how
long the child took to end (it uploads from disk until ``finish_timeout_s``
or the SIGKILL ``--grace-s`` after SIGTERM). A kill at that moment would lose nothing.

    python tools/bench_preempt.py --records 300 --record-mb 1
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import requests

from prime_runs._local.segment_reader import scan
from prime_runs._local.segments import segment_files

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _serve import start_serve

CHILD = """
import random, sys
import prime_runs
sys.path.insert(0, {tests!r})
from _wire import episode, trace

count, size = int(sys.argv[2]), int(float(sys.argv[3]) * 1e6)
rng = random.Random(3)
pads = [[round(rng.random(), 6) for _ in range(size // 10)] for _ in range(8)]
run = prime_runs.init("preempt", environments=["e"], dir=sys.argv[1], console="off")
for i in range(count):
    run.log_episodes([episode(f"ep-{{i}}", [trace(f"t-{{i}}", info={{"pad": pads[i % 8]}})])])
print(run.id, flush=True)
sys.stdin.readline()
"""


def _on_disk(run_dir: Path) -> int:
    lines = 0
    for path in segment_files(str(run_dir), ["episode"]):
        try:
            lines += scan(path, verify_last=False).lines
        except OSError:
            pass
    return lines


def _on_service(url: str) -> int:
    return int(requests.get(f"{url}/api/v1/_stats", timeout=10).json().get("lines", 0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=300)
    parser.add_argument("--record-mb", type=float, default=1.0)
    parser.add_argument("--link-mb-s", type=float, default=1.0)
    parser.add_argument("--grace-s", type=float, default=30.0, help="SIGKILL this long after SIGTERM")
    args = parser.parse_args()
    tests = str(Path(__file__).resolve().parent.parent / "tests")
    with tempfile.TemporaryDirectory() as tmp:
        server, url = start_serve(os.path.join(tmp, "bench.db"), "--link-mb-s", str(args.link_mb_s))
        env = dict(os.environ, PRIME_TRACES_URL=url, PRIME_API_KEY="bench")
        runs = Path(tmp) / "runs"
        child = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(CHILD.format(tests=tests)), str(runs), str(args.records),
             str(args.record_mb)],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert child.stdout is not None
        run_id = child.stdout.readline().strip()
        # Stored before the signal: uploaded live, never on disk. Whatever was in flight then is kept on disk.
        stored_before = _on_service(url)
        signalled = time.monotonic()
        child.send_signal(signal.SIGTERM)
        covered_s = None
        while covered_s is None and time.monotonic() - signalled < 120:
            if _on_disk(runs / run_id) + stored_before >= args.records:
                covered_s = time.monotonic() - signalled
            else:
                time.sleep(0.02)
        try:
            child.wait(max(0.0, args.grace_s - (time.monotonic() - signalled)))
        except subprocess.TimeoutExpired:
            child.kill()  # the scheduler's SIGKILL at the end of the grace period
            child.wait()
        finally:
            server.terminate()
        logged_mb = args.records * args.record_mb
        print(
            f"{args.records} records ({logged_mb:.0f} MB) logged; after SIGTERM everything was on disk or on the "
            f"service in {covered_s if covered_s is None else round(covered_s, 2)} s; the process ended after "
            f"{time.monotonic() - signalled:.1f} s (it uploads from disk for finish_timeout_s, or until the SIGKILL "
            f"at {args.grace_s:.0f} s)"
        )


if __name__ == "__main__":
    main()
