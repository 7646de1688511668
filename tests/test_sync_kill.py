"""``kill -9`` of ``prime-runs sync`` mid-upload, three times, then a sync: every record stored once.

A real sync process is killed while its batches are on the wire (the service
commits some of them after the client died); the next sync must send the very
same batches, so the service answers replays and stores nothing twice.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from _run_helpers import KEY, episodes, isolated, stored_episodes  # noqa: F401

import prime_runs
from prime_traces.server import LocalTracesService

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[1]
#: Small batches, so that a sync is many uploads and a kill lands between and inside them.
SYNC = (
    "import sys, prime_runs._local.sync_file as f; f.DEFAULT_TARGET_BATCH_BYTES = 64 * 1024; "
    "from prime_runs import cli; sys.exit(cli.main(sys.argv[1:]))"
)


class KillAfter:
    """An ``on_upload`` hook: ``reached`` is set once ``uploads`` uploads of this sync have arrived."""

    def __init__(self, uploads: int) -> None:
        self.uploads = uploads
        self.seen = 0
        self.reached = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, _key: str) -> None:
        with self._lock:
            self.seen += 1
            if self.seen >= self.uploads:
                self.reached.set()


def test_a_sync_killed_three_times_mid_upload_then_run_again_stores_every_record_once(isolated, tmp_path):
    run = prime_runs.init(
        "killed-sync", mode="offline", dir=isolated / "runs", handle_signals=False, console="off",
        environments=["e"], model="m", team_id="t",
    )  # fmt: skip
    ids = []
    pad = random.Random(7)
    for step in range(20):
        batch = episodes(f"s{step}-", 10)
        for record in batch:
            record["info"] = {"pad": pad.randbytes(6_000).hex()}  # ~12 KB a record, ~2.5 MB the run
        run.log_episodes(batch)
        ids += [e["id"] for e in batch]
    run.finish()
    env = {**os.environ, "PRIME_API_KEY": KEY}
    rng = random.Random(int(os.environ.get("SYNC_KILL_SEED", "19")))
    with LocalTracesService(tmp_path / "db", latency_ms=100) as service:
        command = [sys.executable, "-c", SYNC, "sync", str(run.dir), "--base-url", service.url]
        stored_after_kills = []
        for _ in range(3):
            hook = KillAfter(rng.randint(2, 12))
            service.faults.on_upload = hook
            proc = subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            reached = hook.reached.wait(120)
            proc.kill()
            out, err = proc.communicate(timeout=60)
            assert reached, (out, err)
            stored_after_kills.append(len(stored_episodes(service)))
        service.faults.on_upload = None
        done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        stored = stored_episodes(service)
    assert stored_after_kills[-1] < len(ids), stored_after_kills  # the kills came before the end
    assert sorted(stored) == sorted(ids)
    assert {i: n for i, n in stored.items() if n != 1} == {}, "records stored more than once"
