"""A finished run holds no lock: ``prime-runs sync`` from the same process right after ``finish()`` works."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from _run_helpers import KEY, episodes, isolated, online, stored_episodes  # noqa: F401
from test_disk_errors import _incompressible

from prime_runs import cli

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("fault", ["502", "hang", "slow-link"])
def test_a_sync_right_after_finish_in_the_same_process_uploads_what_the_run_kept(isolated, service, capsys, fault):
    options: dict[str, Any] = {}
    batch = episodes("e", 20)
    if fault == "hang":
        service.faults.hang_uploads = True  # the run's uploads, and its drain from disk at finish(), never answered
    elif fault == "502":
        service.faults.fail_status = 502  # every upload fails, and the drain finish() starts retries them
        service.faults.fail_fraction = 1.0
    else:  # the run logs faster than the link takes: its backlog on disk is uploaded from there, still at finish
        service.faults.link_mb_s = 1.0
        options["max_queued_bytes"] = 2_000_000
        batch = _incompressible(30, 200_000)
    run = online(service, dir=isolated / "runs", console="off", **options)
    pace = threading.Event()  # never set: the training loop's own pace
    for record in batch:
        run.log_episodes([record])
        pace.wait(0.05 if fault == "slow-link" else 0)
    run.finish(timeout_s=3)
    assert run.stats()["dropped"] == {}
    counts = run.stats()["sinks"]["traces"]
    assert counts["stored"] + counts["spooled"] == len(batch) and counts["spooled"] > 0, counts
    service.faults.hang_uploads = False
    service.faults.fail_fraction = 0.0
    service.faults.link_mb_s = None
    capsys.readouterr()
    started = time.monotonic()
    code = cli.main(["sync", "--api-key", KEY, "--base-url", service.url, str(run.dir)])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert time.monotonic() - started < 30  # an order of magnitude: not a wait on the hung requests
    assert stored_episodes(service) == {e["id"]: 1 for e in batch}, out + err
    drains = [t for t in threading.enumerate() if t.name == "prime-runs-resync"]
    for thread in drains:
        thread.join(10)
    assert not any(t.is_alive() for t in drains), "the run's drain outlived finish() and the sync"
