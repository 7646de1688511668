"""``kill -9`` of a run while it uploads, from disk, what it kept during an outage; then a sync: each record once.

The run's own drain cuts its batches as ``prime-runs sync`` does, from the
file alone, so a sync after the kill sends the very same batches and the
service answers replays for those it had stored.
"""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
from _run_helpers import REPO, stored_episodes
from test_run_processes import PRELUDE as SCRIPT_PRELUDE
from test_run_processes import finish_process, first_line, script_env, spawn
from test_sync_kill import SYNC, KillAfter

from prime_traces.server import LocalTracesService

pytestmark = pytest.mark.timeout(300)

RECORDS = 300


class KeysUntil(KillAfter):
    """:class:`KillAfter` that also keeps the key of every upload it saw."""

    def __init__(self, uploads: int) -> None:
        super().__init__(uploads)
        self.keys: list[str] = []

    def __call__(self, key: str) -> None:
        self.keys.append(key)
        super().__call__(key)


SCRIPT = f"""
import threading
import prime_runs._local.sync_file as sync_file
sync_file.DEFAULT_TARGET_BATCH_BYTES = 64 * 1024  # as the sync below (SYNC): many small batches
run = prime_runs.init("resync-kill", environments=["e"], model="m", team_id="t", finish_timeout_s=120)
print(run.id, flush=True)
waiting = threading.Event()
records = episodes("e", {RECORDS})
run.log_episodes(records[:10])
while run.stats()["sinks"]["traces"]["spooled"] < 10:  # every upload fails: the run is in an outage
    waiting.wait(0.05)
run.log_episodes(records[10:])  # straight to disk, until the service answers again
while run.stats()["sinks"]["traces"]["spooled"] < {RECORDS}:
    waiting.wait(0.05)
print("spooled", flush=True)
sys.stdin.readline()  # the service is back: finish() uploads them from disk
run.finish()
print("finished", flush=True)
"""


def test_a_run_killed_while_it_uploads_what_it_kept_then_synced_stores_every_record_once(tmp_path):
    with LocalTracesService(tmp_path / "db") as service:
        service.faults.fail_status = 502
        service.faults.fail_fraction = 1.0
        proc = spawn([sys.executable, "-c", SCRIPT_PRELUDE + SCRIPT], service, tmp_path, stdin=subprocess.PIPE)
        run_id = first_line(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "spooled"
        service.faults.fail_fraction = 0.0
        service.faults.latency_ms = 1000  # an answer held back: the run is killed before it hears of a commit
        hook = KeysUntil(random.Random(19).randint(2, 5))
        service.faults.on_upload = hook
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        reached = hook.reached.wait(120)
        proc.kill()
        _out, err = finish_process(proc)
        assert reached, err
        before = stored_episodes(service)
        assert len(before) < RECORDS, "the kill came after the drain ended"
        drain_keys = list(hook.keys)
        sent_again: list[str] = []
        service.faults.on_upload = sent_again.append
        service.faults.latency_ms = 0
        run_dir = tmp_path / "prime-runs" / run_id
        done = subprocess.run(
            [sys.executable, "-c", SYNC, "sync", str(run_dir), "--base-url", service.url],
            env=script_env(service, tmp_path),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        stored = stored_episodes(service)
    # The batch in flight at the kill (its answer was held back a second) went again as the same upload.
    assert drain_keys[-1] in sent_again, (drain_keys, sent_again)
    assert sorted(stored) == sorted(f"e{i}" for i in range(RECORDS))
    assert {i: n for i, n in stored.items() if n != 1} == {}, "records stored more than once"
