"""What a run keeps when things go wrong: the durability scenarios, measured end to end.

    python tools/durability_check.py [--outage-s 40] [--kills 17] [--only NAME ...]

Each scenario runs a real run against the local Traces service with its fault
flags (or kills real processes), then counts, by record id, what is on the
service after the run, and after ``prime-runs sync`` when the installed
``prime_runs`` has it: logged, delivered online, on the service after sync,
lost, stored twice, and for offline runs what is readable on disk.

It uses only ``prime_runs.init`` / ``log_episodes`` / ``flush`` / ``finish`` and
reads the run's files itself, so it runs unchanged against an earlier
checkout (``PYTHONPATH=/path/to/old/checkout python tools/durability_check.py``)
for a baseline measured on the same machine in the same session.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from _wire import episode, trace

import prime_runs
from prime_runs import cli
from prime_traces.server import LocalTracesService

KEY = "check-key"
HAS_SYNC = "sync" in cli.build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]


def episodes(prefix: str, count: int, blob: str = "") -> list[dict[str, Any]]:
    extra = {"info": {"blob": blob}} if blob else {}
    return [episode(f"{prefix}{i}", [trace(f"{prefix}{i}-t")], **extra) for i in range(count)]


def stored(db: Path) -> Counter[str]:
    import sqlite3

    with contextlib.closing(sqlite3.connect(db)) as conn:
        return Counter(dict(conn.execute("SELECT episode_id, COUNT(*) FROM episodes GROUP BY episode_id")))


def sync(url: str, run_dir: str) -> str:
    if not HAS_SYNC:
        return "no sync"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = cli.main(["sync", "--api-key", KEY, "--base-url", url, run_dir])
    return f"exit {code}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve(db: Path, port: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "prime_traces.cli", "serve", "--db", str(db), "--port", str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().startswith("listening on")
    return proc


def outcome(logged: list[str], online: Counter[str], after: Counter[str], note: str) -> dict[str, Any]:
    return {
        "logged": len(logged),
        "online": sum(1 for i in logged if online[i]),
        "after sync": sum(1 for i in logged if after[i]),
        "lost": sum(1 for i in logged if not after[i]),
        "twice": sum(1 for i in logged if after[i] > 1),
        "note": note,
    }


def run_dir_of(run: Any) -> str:
    return str(run.dir or "")


# -- online scenarios ------------------------------------------------------------------


def hung_at_finish(work: Path) -> dict[str, Any]:
    db = work / "traces.db"
    logged = episodes("h", 300)
    with LocalTracesService(db, hang_uploads=True) as svc:
        run = prime_runs.init("hung", api_key=KEY, base_url=svc.url, handle_signals=False)
        run.log_episodes(logged)
        began = time.monotonic()
        run.finish(timeout_s=3)
        took = time.monotonic() - began
    online = stored(db)
    with LocalTracesService(db) as svc:
        note = sync(svc.url, run_dir_of(run)) if run.dir and os.path.isdir(run.dir) else "nothing kept"
    return outcome([e["id"] for e in logged], online, stored(db), f"finish(timeout_s=3) took {took:.1f} s; {note}")


def killed_mid_run(work: Path) -> dict[str, Any]:
    db, port = work / "traces.db", free_port()
    proc = serve(db, port)
    run = prime_runs.init("killed", api_key=KEY, base_url=f"http://127.0.0.1:{port}", handle_signals=False)
    logged = []
    for step in range(10):
        batch = episodes(f"k{step}-", 30)
        logged += [e["id"] for e in batch]
        run.log_episodes(batch)
        if step == 4:
            run.flush(60)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    run.finish(timeout_s=10)
    online = stored(db)
    with LocalTracesService(db) as svc:
        note = sync(svc.url, run_dir_of(run)) if run.dir and os.path.isdir(run.dir) else "nothing kept"
    return outcome(logged, online, stored(db), f"killed after 150 of 300; {note}")


def outage(work: Path, outage_s: float) -> dict[str, Any]:
    db, port = work / "traces.db", free_port()
    proc = serve(db, port)
    run = prime_runs.init("outage", api_key=KEY, base_url=f"http://127.0.0.1:{port}", handle_signals=False)
    logged: list[str] = []
    began = time.monotonic()
    down_at, up_at = 4.0, 4.0 + outage_s
    step = 0
    while time.monotonic() - began < up_at + 8:
        batch = episodes(f"o{step}-", 20)
        logged += [e["id"] for e in batch]
        run.log_episodes(batch)
        step += 1
        now = time.monotonic() - began
        if proc is not None and proc.poll() is None and now >= down_at:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        if proc is not None and proc.poll() is not None and now >= up_at:
            proc = serve(db, port)
        time.sleep(2.0)
    run.finish(timeout_s=60)
    proc.terminate()
    proc.wait()
    online = stored(db)
    with LocalTracesService(db) as svc:
        note = sync(svc.url, run_dir_of(run)) if run.dir and os.path.isdir(run.dir) else "nothing kept"
    return outcome(logged, online, stored(db), f"{outage_s:.0f} s outage that ends before finish(); {note}")


# -- offline scenarios -------------------------------------------------------------------


PRODUCER = str(Path(__file__).resolve().parents[1] / "tests" / "_crash_producer.py")


def read_disk(run_dir: Path) -> tuple[Counter[str], int, int]:
    """Ids readable in a run directory's record files (old JSONL or zstd segments), corrupt and unended lines."""
    ids: Counter[str] = Counter()
    corrupt = unended = 0
    for path in sorted(run_dir.rglob("*")):
        name = path.name
        if not path.is_file() or name.startswith("rejected") or "local" in path.parts[len(run_dir.parts) :]:
            continue
        if name.endswith(".jsonl.zst"):
            with path.open("rb") as handle:
                try:
                    data = zstandard.ZstdDecompressor().stream_reader(handle, read_across_frames=True).read()
                except zstandard.ZstdError:
                    corrupt += 1
                    continue
        elif name.endswith(".jsonl"):
            data = path.read_bytes()
        else:
            continue
        if data and not data.endswith(b"\n"):
            unended += 1
        for line in data.split(b"\n"):
            if not line.strip():
                continue
            try:
                ids[orjson.loads(line)["id"]] += 1
            except (orjson.JSONDecodeError, KeyError, TypeError):
                corrupt += 1
    return ids, corrupt, unended


def killed_producer(work: Path, kills: int, large: bool) -> dict[str, Any]:
    confirmed: list[str] = []
    rng = random.Random(1201)
    small = [] if large else ["--small"]
    for seed in range(kills):
        proc = subprocess.Popen(
            [sys.executable, PRODUCER, str(seed), *small], cwd=work, stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.05, 0.6))
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate()
        confirmed += [i for line in out.splitlines() for i in line.split()]
    run_dir = work / "prime-runs" / "crashy-run"
    on_disk, corrupt, unended = read_disk(run_dir)
    with LocalTracesService(work / "traces.db") as svc:
        note = sync(svc.url, str(run_dir))
    after = stored(work / "traces.db")
    result = outcome(confirmed, Counter(), after if HAS_SYNC else on_disk, note)
    result["note"] = (
        f"{kills} kills{' (records up to 1.2 MB)' if large else ''}: {corrupt} corrupt and {unended} "
        f"unended lines on disk; {note}"
    )
    result["logged"] = f"{len(confirmed)} confirmed"
    return result


WRITER = """
import sys
sys.path.insert(0, {tests!r})
import prime_runs
from _wire import episode, trace
who = sys.argv[1]
run = prime_runs.init("shared", mode="offline", id="shared-run", handle_signals=False)
big = who * 1_200_000
for i in range(60):
    run.log_episodes([episode(f"{{who}}-{{i}}", [trace(f"{{who}}-{{i}}-t")], info={{"big": big}})])
run.finish()
"""


def two_writers(work: Path) -> dict[str, Any]:
    code = WRITER.format(tests=str(Path(__file__).resolve().parents[1] / "tests"))
    procs = [subprocess.Popen([sys.executable, "-c", code, who], cwd=work, stderr=subprocess.DEVNULL) for who in "ab"]
    for proc in procs:
        proc.wait()
    on_disk, corrupt, unended = read_disk(work / "prime-runs" / "shared-run")
    logged = [f"{w}-{i}" for w in "ab" for i in range(60)]
    with LocalTracesService(work / "traces.db") as svc:
        note = sync(svc.url, str(work / "prime-runs" / "shared-run"))
    after = stored(work / "traces.db") if HAS_SYNC else on_disk
    result = outcome(logged, Counter(), after, f"{corrupt} corrupt lines of 120 on disk; {note}")
    return result


def escaping_id(work: Path) -> dict[str, Any]:
    os.environ["PRIME_RUN_ID"] = "../../escaped"
    try:
        run = prime_runs.init("escape", mode="offline", handle_signals=False)
        run.log_episodes(episodes("x", 1))
        run.finish()
        outside = [str(p) for p in work.parent.rglob("*escaped*")]
        note = f"wrote outside the runs directory: {outside}" if outside else "nothing outside"
    except Exception as err:  # noqa: BLE001
        note = f"refused: {type(err).__name__}: {str(err)[:90]}"
    finally:
        del os.environ["PRIME_RUN_ID"]
    return {"logged": 1, "online": "-", "after sync": "-", "lost": "-", "twice": "-", "note": note}


@contextlib.contextmanager
def scenario_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="durability-") as tmp:
        work = Path(tmp) / "work" / "inner"
        work.mkdir(parents=True)
        cwd = os.getcwd()
        os.chdir(work)
        try:
            yield work
        finally:
            os.chdir(cwd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outage-s", type=float, default=40.0)
    parser.add_argument("--kills", type=int, default=17)
    parser.add_argument("--only", nargs="*", default=None)
    args = parser.parse_args()
    for name in ("PRIME_API_KEY", "PRIME_TRACES_URL", "PRIME_RUN_ID", "PRIME_RUNS_DIR", "PRIME_RUNS_MODE", "RANK"):
        os.environ.pop(name, None)
    scenarios = {
        "hung-at-finish": hung_at_finish,
        "killed-mid-run": killed_mid_run,
        "outage": lambda w: outage(w, args.outage_s),
        "kill-9-producer": lambda w: killed_producer(w, args.kills, large=False),
        "kill-9-producer-large": lambda w: killed_producer(w, 5, large=True),
        "two-writers": two_writers,
        "escaping-id": escaping_id,
    }
    print(f"prime_runs from {os.path.dirname(prime_runs.__file__)} (sync: {'yes' if HAS_SYNC else 'no'})")
    print("| scenario | logged | on the service after the run | after sync | lost | stored twice | notes |")
    print("|---|---|---|---|---|---|---|")
    for name, scenario in scenarios.items():
        if args.only and name not in args.only:
            continue
        with scenario_dir() as work:
            row = scenario(work)
        print(
            f"| {name} | {row['logged']} | {row['online']} | {row['after sync']} | {row['lost']} | "
            f"{row['twice']} | {row['note']} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
