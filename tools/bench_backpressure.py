"""A client at 8 in flight against a service that allows fewer, beside a client at the limit.

For each service limit (1, 2, 4 uploads in flight per credential), the same
lines are uploaded twice in one run, each time to a fresh local service whose
body reads are capped (so concurrency, not CPU, sets the pace): once by a
client configured at the limit (the baseline), once by a client at 8 whose
in-flight window must find the limit from the refusals. Prints, per limit,
both times, their ratio, and the refusals as a share of upload attempts.

    python tools/bench_backpressure.py [--batches-per-slot 100]
"""

from __future__ import annotations

import argparse
import sys
import time

import orjson

from prime_traces import TracesClient
from prime_traces.server import LocalTracesService

BATCH_BYTES = 300_000
BANDWIDTH_MB_S = 5.0


def _lines(count: int) -> list[bytes]:
    now = time.time()
    pad = "x" * (BATCH_BYTES - 400)
    return [orjson.dumps({"id": f"t-{i}", "timing": {"start": now}, "info": {"pad": pad}}) for i in range(count)]


def _upload(limit: int, max_in_flight: int, lines: list[bytes]) -> tuple[float, dict, int]:
    with LocalTracesService(
        None, store="none", validate="light", max_uploads_in_flight=limit, bandwidth_mb_s=BANDWIDTH_MB_S
    ) as svc:
        with TracesClient(api_key="bench", base_url=svc.url, max_in_flight=max_in_flight, compression="none") as client:
            started = time.monotonic()
            client.upload_lines(lines, target_batch_bytes=BATCH_BYTES)
            elapsed = time.monotonic() - started
            window = client.upload_stats()
        served = svc.stats()
    assert served["uploads"] == len(lines), served
    return elapsed, window, served["upload_attempts"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches-per-slot", type=int, default=100, help="batches per allowed upload")
    args = parser.parse_args(argv)
    print(f"{BATCH_BYTES // 1000} KB batches, service body reads capped at {BANDWIDTH_MB_S:g} MB/s per upload")
    print("| service limit | batches | client at limit | client at 8 | ratio | refused attempts |")
    print("|---|---|---|---|---|---|")
    for limit in (1, 2, 4):
        lines = _lines(args.batches_per_slot * limit)
        baseline, _, _ = _upload(limit, limit, lines)
        at_eight, window, accepted = _upload(limit, 8, lines)
        refused = window["refusals"]
        share = refused / (accepted + refused)
        print(
            f"| {limit} | {len(lines)} | {baseline:.2f} s | {at_eight:.2f} s | {at_eight / baseline:.2f}× "
            f"| {refused} of {accepted + refused} ({share:.1%}) |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
