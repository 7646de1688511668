"""How fast the local service ingests, against how fast one core compresses.

The service runs in its own process (``prime-traces serve --store none``),
inflating gzip with ISA-L when ``isal`` is installed (the ``server`` extra).
For gzip-1 and zstd bodies, at 1 and 4 concurrent uploads, in full and light
validation, it reports the uncompressed-JSONL ingest rate, beside the rate at
which one core of this machine compresses the same bytes at gzip level 1,
measured in the same run. The claim to check: light validation ingests
gzip-1 bodies at least 2x as fast as one core can produce them, so the
service is never what a client benchmark measures.

It also measures what one upload of many small traces costs the service
with SQLite storage and full validation (``--small-mb``, default 30 MiB of
~230-byte traces, gzip-1 as the client sends it): the time to the answer and
the growth of the service's peak resident memory (VmHWM), as a multiple of
the uncompressed body. ``--memory-only`` runs only that case.

    python tools/bench_service.py [--bodies 6] [--body-mb 30] [--small-mb 30] [--memory-only]
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests
import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _loadtest_parts import proc_status_bytes
from workload import encoded_lines, iter_episodes

ZSTD_LEVEL = 3


def build_bodies(count: int, body_mb: float, seed: int) -> list[bytes]:
    """``count`` distinct JSONL bodies of episodes, each about ``body_mb`` MB."""
    bodies = []
    episode_bytes = 2_200_000
    per_body = max(1, int(body_mb * 1e6 / episode_bytes))
    episodes = iter_episodes(count * per_body, seed=seed, target_bytes=episode_bytes, run_id="bench-service")
    lines = encoded_lines(episodes)
    for _ in range(count):
        bodies.append(b"".join(next(lines) for _ in range(per_body)))
    return bodies


def multipart_frame(coding: str) -> tuple[bytes, bytes, str]:
    """The bytes around an upload's traces part: ``(head, tail, content type)``."""
    boundary = os.urandom(16).hex()
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="metadata"\r\n'
        f"Content-Type: application/json\r\n\r\n"
        '{"schema_version": 1}\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="traces"; filename="traces.jsonl"\r\n'
        f"Content-Type: application/x-ndjson\r\nContent-Encoding: {coding}\r\n\r\n"
    ).encode()
    return head, f"\r\n--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def small_trace_body(mib: float) -> bytes:
    """About ``mib`` MiB of JSONL traces of ~230 bytes: the columns the service extracts, little else."""
    now = time.time()
    lines, size, i = [], 0, 0
    while size < mib * 2**20:
        line = (
            b'{"id":"t-%08d","run":{"id":"run-1","type":"eval","work":{"step":%d}},'
            b'"agent":{"name":"agent-a","config":{"model":"m-1"}},"task":{"key":"task-%d"},'
            b'"rewards":{"r":{"score":1.0,"weight":1.0}},"stop_condition":"completed","ok":true,'
            b'"timing":{"start":%.3f,"scoring":{"end":%.3f}}}'
        ) % (i, i // 100, i % 50, now, now + 1.5)
        lines.append(line)
        size += len(line) + 1
        i += 1
    return b"\n".join(lines) + b"\n"


def _gzip_upload(raw: bytes) -> tuple[bytes, dict[str, str]]:
    head, tail, content_type = multipart_frame("gzip")
    headers = {
        "Content-Type": content_type,
        "Authorization": "Bearer bench",
        "Idempotency-Key": "sha256:" + hashlib.sha256(raw).hexdigest(),
    }
    return head + gzip.compress(raw, compresslevel=1, mtime=0) + tail, headers


def ingest_memory(raw: bytes, tmp: str) -> tuple[float, int]:
    """``(seconds to the answer, growth of the service's peak RSS)`` for one upload of ``raw``."""
    data, headers = _gzip_upload(raw)
    proc, url = start_service(os.path.join(tmp, "small.db"), "full", store="sqlite")
    try:
        warm, warm_headers = _gzip_upload(small_trace_body(0.01))  # every code path loaded first
        requests.post(f"{url}/api/v1/traces", data=warm, headers=warm_headers, timeout=60).raise_for_status()
        before = proc_status_bytes(proc.pid, "VmHWM")
        start = time.perf_counter()
        resp = requests.post(f"{url}/api/v1/traces", data=data, headers=headers, timeout=600)
        elapsed = time.perf_counter() - start
        grown = proc_status_bytes(proc.pid, "VmHWM") - before
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    if resp.status_code != 201:
        raise RuntimeError(f"upload failed: {resp.status_code} {resp.text[:200]}")
    return elapsed, grown


def start_service(db: str, validate: str, store: str = "none") -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "prime_traces.cli",
            "serve",
            "--port",
            "0",
            "--db",
            db,
            "--store",
            store,
            "--validate",
            validate,
            "--max-uploads-in-flight",
            "16",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith("listening on "):
        proc.kill()
        raise RuntimeError(f"service did not start: {line!r}")
    return proc, line.removeprefix("listening on ")


def ingest_rate_mb_s(
    url: str, requests_: list[tuple[bytes, dict[str, str]]], raw_bytes: int, concurrency: int
) -> float:
    """Uncompressed MB/s while ``concurrency`` threads send every request once."""
    pending = list(range(len(requests_)))
    lock = threading.Lock()
    errors: list[str] = []

    def worker() -> None:
        session = requests.Session()
        while True:
            with lock:
                if not pending:
                    return
                index = pending.pop(0)
            data, headers = requests_[index]
            resp = session.post(f"{url}/api/v1/traces", data=data, headers=headers, timeout=300)
            if resp.status_code != 201:
                errors.append(f"{resp.status_code} {resp.text[:200]}")

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"uploads failed: {errors[:3]}")
    return raw_bytes / elapsed / 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bodies", type=int, default=6, help="distinct bodies per run (default 6)")
    parser.add_argument("--body-mb", type=float, default=30.0, help="uncompressed MB per body (default 30)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--small-mb", type=float, default=30.0, help="MiB of small traces in the memory case (default 30)"
    )
    parser.add_argument("--memory-only", action="store_true", help="run only the memory case")
    args = parser.parse_args()

    small = small_trace_body(args.small_mb)
    with tempfile.TemporaryDirectory() as tmp:
        seconds, grown = ingest_memory(small, tmp)
    traces = small.count(b"\n")
    print(
        f"Memory: one upload of {traces} small traces, {len(small) / 2**20:.1f} MiB of JSONL "
        f"(gzip-1), store sqlite, full validation: answered in {seconds:.2f} s; the service's peak RSS "
        f"grew by {grown / 2**20:.0f} MiB = {grown / len(small):.2f}x the body.\n"
    )
    if args.memory_only:
        return 0

    print(f"building {args.bodies} bodies of ~{args.body_mb} MB ...", file=sys.stderr)
    bodies = build_bodies(args.bodies, args.body_mb, args.seed)
    raw_bytes = sum(len(b) for b in bodies)

    cpu0 = time.process_time()
    gzipped = [gzip.compress(b, compresslevel=1, mtime=0) for b in bodies]
    gzip_core_mb_s = raw_bytes / (time.process_time() - cpu0) / 1e6
    zstd_c = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    zstded = [zstd_c.compress(b) for b in bodies]

    encoded: dict[str, list[tuple[bytes, dict[str, str]]]] = {}
    for coding, compressed in (("gzip", gzipped), ("zstd", zstded)):
        encoded[coding] = []
        for raw, comp in zip(bodies, compressed):
            head, tail, content_type = multipart_frame(coding)
            headers = {
                "Content-Type": content_type,
                "Authorization": "Bearer bench",
                "Idempotency-Key": "sha256:" + hashlib.sha256(raw).hexdigest(),
                "X-Prime-Line-Format": "episode",
            }
            encoded[coding].append((head + comp + tail, headers))

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for validate in ("full", "light"):
            for coding in ("gzip", "zstd"):
                for concurrency in (1, 4):
                    db = os.path.join(tmp, f"{validate}-{coding}-{concurrency}.db")
                    proc, url = start_service(db, validate)
                    try:
                        rate = ingest_rate_mb_s(url, encoded[coding], raw_bytes, concurrency)
                    finally:
                        proc.terminate()
                        proc.wait(timeout=30)
                    rows.append((validate, coding, concurrency, rate))
                    print(f"  {validate:5} {coding:4} x{concurrency}: {rate:8.1f} MB/s", file=sys.stderr)

    wire = {c: sum(len(d) for d, _ in encoded[c]) for c in encoded}
    print(
        f"\nWorkload: {args.bodies} episode-format bodies, {raw_bytes / 1e6:.0f} MB of JSONL "
        f"(gzip-1 on the wire: {wire['gzip'] / 1e6:.0f} MB, zstd-{ZSTD_LEVEL}: {wire['zstd'] / 1e6:.0f} MB)\n"
    )
    print(f"Baseline: one core compresses this JSONL at gzip level 1 at {gzip_core_mb_s:.1f} MB/s.\n")
    print("| validation | coding | concurrent uploads | ingest (MB/s of JSONL) | ratio to one core's gzip-1 |")
    print("|---|---|---|---|---|")
    for validate, coding, concurrency, rate in rows:
        print(f"| {validate} | {coding} | {concurrency} | {rate:.1f} | {rate / gzip_core_mb_s:.2f}x |")
    # The service's capacity is its rate under concurrent uploads, as a client
    # with several requests in flight sends them; the one-upload rate is shown too.
    light_gzip = {n: rate for v, c, n, rate in rows if v == "light" and c == "gzip"}
    capacity = max(light_gzip.values())
    ok = capacity >= 2 * gzip_core_mb_s
    print(
        f"\nlight validation, gzip-1: {capacity / gzip_core_mb_s:.2f}x one core's gzip-1 rate at "
        f"{max(light_gzip, key=light_gzip.get)} concurrent uploads, {light_gzip[1] / gzip_core_mb_s:.2f}x "
        f"with one (target >= 2x): {'PASS' if ok else 'FAIL'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
