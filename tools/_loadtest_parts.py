"""The pieces of the load test: the service and producer processes, the published SDK, the machine's ceiling.

``tools/loadtest.py`` puts them together into scenarios; each piece measures
one thing and knows nothing of the others.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import venv
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import requests
import zstandard

from prime_traces._lines.sizing import check_numbers
from prime_traces.encoding import encode_record_parts
from prime_traces.server._ingest import count_records
from prime_traces.server._upload import _check_utf8 as check_utf8

TOOLS = Path(__file__).resolve().parent
PRODUCER = TOOLS / "_loadtest_producer.py"
PUBLISHED_RUNS = "prime-runs==0.1.4"
VERIFIERS = "verifiers==0.4.0"
BENCH_CACHE = Path.home() / ".cache" / "prime-traces-bench"
PUBLISHED_VENV = BENCH_CACHE / "venv-prime-runs-0.1.4"
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
#: How long a producer may take to exit once it reported, before it counts as hung and is killed.
EXIT_LIMIT_S = 30.0


def _proc_stat(pid: int) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command's name, from ``state`` (field 3) on."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _proc_cpu_s(pid: int) -> float:
    fields = _proc_stat(pid)
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime + stime


def _proc_page_faults(pid: int) -> int:
    """Minor page faults so far: each a page of memory the process touched for the first time."""
    return int(_proc_stat(pid)[7])  # minflt


def proc_status_bytes(pid: int, key: str) -> int:
    """A size from ``/proc/PID/status``, such as ``VmRSS`` (now) or ``VmHWM`` (the peak so far)."""
    with open(f"/proc/{pid}/status") as file:
        for line in file:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024  # kB
    raise RuntimeError(f"no {key} in /proc/{pid}/status (Linux only)")


class Service:
    """``prime-traces serve --store none`` in its own process, on a fresh database, with fault flags."""

    def __init__(self, tmp: str, *, validate: str = "light", flags: list[str] | None = None) -> None:
        db = os.path.join(tempfile.mkdtemp(dir=tmp), "traces.db")
        command = [sys.executable, "-m", "prime_traces.cli", "serve", "--port", "0", "--db", db, "--store", "none"]
        command += ["--validate", validate, *(flags or [])]
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line.startswith("listening on "):
            self.proc.kill()
            raise RuntimeError(f"the service did not start: {line!r}")
        self.url = line.removeprefix("listening on ")

    def cpu_s(self) -> float:
        return _proc_cpu_s(self.proc.pid)

    def page_faults(self) -> int:
        return _proc_page_faults(self.proc.pid)

    def rss_mb(self) -> float:
        return proc_status_bytes(self.proc.pid, "VmRSS") / 2**20

    def peak_rss_mb(self) -> float:
        return proc_status_bytes(self.proc.pid, "VmHWM") / 2**20

    def stats(self) -> dict[str, Any]:
        resp = requests.get(f"{self.url}/api/v1/_stats", headers={"Authorization": "Bearer loadtest"}, timeout=30)
        resp.raise_for_status()
        return resp.json()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def published_python() -> Path:
    """The Python of a virtualenv holding only the published prime-runs 0.1.4 (and orjson-free deps)."""
    return _virtualenv(PUBLISHED_VENV, [PUBLISHED_RUNS])


def verifiers_python(sdk: str) -> Path:
    """A virtualenv with verifiers 0.4.0 and ``sdk``: ``ours`` (this tree, editable) or ``published``.

    verifiers requires prime-runs>=0.1.4: with ours installed after it, ours is
    the one imported (the README's "Moving from prime-runs 0.1.x").
    """
    if sdk == "published":
        return _virtualenv(BENCH_CACHE / "venv-verifiers-published", [VERIFIERS, PUBLISHED_RUNS])
    repo = TOOLS.parent
    ours = ["-e", str(repo / "packaging" / "prime-traces"), "-e", str(repo)]
    return _virtualenv(BENCH_CACHE / "venv-verifiers-ours", [VERIFIERS], ours)


def _virtualenv(path: Path, *steps: list[str]) -> Path:
    """The Python of a virtualenv at ``path`` in which each of ``steps`` was ``pip install``-ed, in order."""
    python = path / "bin" / "python"
    marker = path / "installed.txt"
    wanted = json.dumps(steps)
    if marker.exists() and marker.read_text() == wanted:
        return python
    venv.create(path, with_pip=True, clear=True)
    for step in steps:
        done = subprocess.run(
            [str(python), "-I", "-m", "pip", "install", "--quiet", *step], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise RuntimeError(f"pip install {' '.join(step)} failed:\n{done.stderr[-3000:]}")
    marker.write_text(wanted)
    return python


@dataclass
class Producer:
    """One producer process: its report, and how long it took to exit after reporting."""

    report: dict[str, Any]
    exit_s: float
    stderr_tail: str = ""
    killed: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def start_producer(
    sdk: str,
    service: Service,
    templates: str,
    sizes: str,
    *,
    key: str,
    run_id: str,
    workdir: str,
    args: list[str],
    python: Path | None = None,
) -> subprocess.Popen[str]:
    """Start a producer (``ours``, ``published`` or ``none``) against ``service``; see ``wait_producer``.

    ``python``: the interpreter to run it with; by default this one, or the published SDK's.
    """
    if python is None:
        python = published_python() if sdk == "published" else Path(sys.executable)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PRIME_", "PYTHONPATH", "RANK"))}
    env.update(PRIME_TRACES_URL=service.url, PRIME_API_KEY=key, PRIME_RUNS_MODE="online")
    command = [str(python), str(PRODUCER), "--sdk", sdk, "--templates", templates, "--sizes", sizes, "--run-id", run_id]
    command += ["--dir", workdir, *args]
    stderr = tempfile.TemporaryFile(mode="w+", dir=workdir)
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=workdir, env=env)
    proc._loadtest_stderr = stderr  # type: ignore[attr-defined]
    return proc


def wait_producer(proc: subprocess.Popen[str], timeout_s: float) -> Producer:
    """The producer's report; its exit is timed from the report on, and bounded by ``EXIT_LIMIT_S``."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    line = ""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line or line.startswith("{"):
            break
    reported = time.monotonic()
    killed = False
    try:
        proc.wait(timeout=EXIT_LIMIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        killed = True
    exit_s = time.monotonic() - reported
    stderr = proc._loadtest_stderr  # type: ignore[attr-defined]
    stderr.seek(0)
    tail = stderr.read()[-3000:]
    stderr.close()
    if not line.startswith("{"):
        raise RuntimeError(f"the producer reported nothing (exit {proc.returncode}):\n{tail}")
    return Producer(json.loads(line), exit_s, tail, killed)


def measure_ceiling(episodes: list[dict[str, Any]], zstd_level: int = 1) -> dict[str, float]:
    """CPU seconds per MB of JSON, on one core, of what the wire contract makes the client and the service do.

    Client: ``orjson.dumps``, the SHA-256 of the JSON (the idempotency key is
    over the uncompressed bytes, contract §2) and zstd at ``zstd_level``.
    Service (light validation): decompression, the service's own UTF-8 check
    (decoded in 64 KiB slices, the cheapest exact check measured), the
    SHA-256 of the JSON against the key, and counting its lines (the
    service's own count, a ``find`` per line). Two cores
    share both, so the machine cannot go faster than ``2 / (client + service)`` MB/s.
    """
    json_bytes = client_s = service_s = 0.0
    compressor = zstandard.ZstdCompressor(level=zstd_level)
    decompressor = zstandard.ZstdDecompressor()
    for episode in episodes:
        started = time.process_time()
        line = orjson.dumps(episode)
        hashlib.sha256(line).digest()
        body = compressor.compress(line)
        client_s += time.process_time() - started
        started = time.process_time()
        data = decompressor.decompress(body)
        check_utf8(data)  # the service's own check
        hashlib.sha256(data).digest()
        count_records(data)  # the service's own count: bytes.count(b"\n") costs ten times as much
        service_s += time.process_time() - started
        json_bytes += len(line)
    mb = json_bytes / 1e6
    client, service = client_s / mb, service_s / mb
    return {
        "client_s_per_mb": client,
        "service_s_per_mb": service,
        "ceiling_mb_s": 2 / (client + service),
        **_gil_bound(episodes, mb),
    }


def _gil_bound(episodes: list[dict[str, Any]], mb: float) -> dict[str, float]:
    """One core's CPU per MB for ``orjson.dumps`` and for this SDK's encoder, best of three.

    Both run under the GIL (the encoder hands it over between pieces, but
    moves none of its work to another core), so no number of cores lets one
    process encode faster than ``1 / encoder_s_per_mb``: the part of the
    ceiling one producer can never spread over two cores.
    """

    dumps_s = encoder_s = walk_s = float("inf")
    for _ in range(3):
        started = time.process_time()
        for episode in episodes:
            orjson.dumps(episode)
        dumps_s = min(dumps_s, time.process_time() - started)
        started = time.process_time()
        for index, episode in enumerate(episodes):
            encode_record_parts(episode, index)
        encoder_s = min(encoder_s, time.process_time() - started)
        started = time.process_time()
        for episode in episodes:
            walk_record(episode)
        walk_s = min(walk_s, time.process_time() - started)
    return {"dumps_s_per_mb": dumps_s / mb, "encoder_s_per_mb": encoder_s / mb, "walk_s_per_mb": walk_s / mb}


def walk_record(value: Any) -> None:
    """The least a Python encoder over orjson must add to refuse NaN: visit every value once, sum number lists.

    orjson writes NaN and ±Infinity as ``null``, and no serializer measured
    both refuses them and runs near orjson's speed (see docs/benchmarks.md),
    so a floor for any encoder here is one ``orjson.dumps`` plus this walk.
    """
    stack = [value]
    while stack:
        v = stack.pop()
        t = type(v)
        if t is dict:
            stack.extend(v.values())
        elif t is list:
            numbers = v and type(v[0]) in (int, float) and type(v[-1]) in (int, float)
            if not (numbers and check_numbers(v)):  # the encoder's own sum, which raises on NaN and ±Infinity
                stack.extend(v)
        elif t is float and v - v != 0.0:  # NaN and ±Infinity
            raise ValueError(v)
