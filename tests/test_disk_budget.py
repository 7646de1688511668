"""The run's disk budget (max_spool_bytes): past it a write keeps what fits, and the rest is counted and told."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from _run_helpers import (  # noqa: F401  (fixtures are used by name)
    FLUSH_TIMEOUT_S,
    KEY,
    isolated,
    local_records,
    online,
    stored_episodes,
)
from test_disk_errors import _incompressible
from test_segments import lines, read_all

import prime_runs
from prime_runs import cli
from prime_runs._local.disk_budget import DEFAULT_FREE_SHARE, DiskBudget, SpoolBudgetSpent, default_max_spool_bytes
from prime_runs._local.segments import Frame, SegmentWriter, segment_files

pytestmark = pytest.mark.timeout(120)


def test_a_writer_past_its_budget_keeps_whole_lines_that_fit_and_names_the_budget(tmp_path):
    budget = DiskBudget(2_000)
    writer = SegmentWriter(str(tmp_path), "episode", budget=budget)
    writer.append([Frame(lines("a", 20, 100))])  # about 1.2 KB (hex compresses to half): within the budget
    used = budget.used_bytes
    assert 0 < used <= 2_000
    with pytest.raises(SpoolBudgetSpent) as caught:
        writer.append([Frame(lines("b", 40, 100))])  # about 2.4 KB more: only some of it fits
    err = caught.value
    assert err.errno == errno.ENOSPC and "max_spool_bytes=2000" in str(err) and err.limit_bytes == 2_000
    kept = err.durable_lines  # type: ignore[attr-defined]
    assert 0 < kept < 40
    assert used < budget.used_bytes <= 2_000
    on_disk = [line for path in segment_files(str(tmp_path), ["episode"]) for line in read_all(path)]
    assert on_disk == lines("a", 20, 100) + lines("b", 40, 100)[:kept]
    assert all(os.path.getsize(path) > 0 for path in segment_files(str(tmp_path), ["episode"]))
    writer.close()


def test_the_budget_is_shared_and_what_a_failed_write_took_is_given_back(tmp_path, monkeypatch):
    budget = DiskBudget(1_000_000)
    first = SegmentWriter(str(tmp_path), "episode", budget=budget)
    second = SegmentWriter(str(tmp_path), "trace", budget=budget)
    first.append([Frame(lines("a", 10))])
    second.append([Frame(lines("b", 10))])
    assert budget.used_bytes == sum(os.path.getsize(p) for p in segment_files(str(tmp_path), ["episode", "trace"]))
    before = budget.used_bytes

    def broken(fd, data):
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr("prime_runs._local.segments._write_all", broken)
    with pytest.raises(OSError, match="I/O error"):
        first.append([Frame(lines("c", 10))])
    assert budget.used_bytes == before
    first.close()
    second.close()


def test_the_default_budget_is_a_share_of_the_free_space_where_the_runs_go(tmp_path):
    stats = os.statvfs(tmp_path)
    free = stats.f_bavail * stats.f_frsize
    budget = default_max_spool_bytes(str(tmp_path / "not" / "yet" / "made"))
    assert budget is not None
    assert abs(budget - DEFAULT_FREE_SHARE * free) < 0.01 * free
    with pytest.raises(ValueError, match="max_spool_bytes"):
        prime_runs.init("bad", mode="offline", dir=tmp_path, max_spool_bytes=-1)


def test_an_offline_run_past_its_budget_keeps_what_fits_says_so_and_syncs_it_once(isolated, service, capsys):
    records = _incompressible(30, 75_000)  # about 76 KB each on disk (base64), 2.3 MB in all, under a 1 MB budget
    run = prime_runs.init(
        "budget",
        mode="offline",
        dir=isolated / "runs",
        environments=["e"],
        handle_signals=False,
        max_spool_bytes=1_000_000,
    )
    for record in records:
        run.log_episodes([record])
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    counts = run.stats()["sinks"]["offline"]
    saved = counts["stored"]
    assert 10 < saved < 16, counts
    assert counts["failed"] == {"spool_full": 30 - saved} and run.stats()["dropped"] == {}
    assert counts["max_spool_bytes"] == 1_000_000 and 0.9 * 1_000_000 < counts["spool_bytes"] <= 1_000_000
    assert [r["id"] for r in local_records(run.dir, "episode")] == [f"e{i}" for i in range(saved)]
    assert sum(p.stat().st_size for p in Path(run.dir).glob("episode-*.jsonl.zst")) <= 1_000_000
    err = capsys.readouterr().err
    assert "max_spool_bytes=1000000" in err and "spool_full" in err, err
    # What was kept is stored once; the exit status and the summary say the rest was lost by the run itself.
    assert cli.main(["sync", "--api-key", KEY, "--base-url", service.url, run.dir]) == 4
    assert f"{30 - saved} records the run itself could not keep (spool_full: {30 - saved})" in capsys.readouterr().out
    assert stored_episodes(service) == {f"e{i}": 1 for i in range(saved)}


def test_an_online_backlog_past_its_budget_keeps_what_fits_and_counts_the_rest(isolated, service, capsys):
    # The service answers 503 to every upload: the records wait on disk, until the budget is spent.
    service.faults.fail_fraction = 1.0
    service.faults.fail_retry_after_s = None
    records = _incompressible(30, 75_000)
    run = online(service, dir=isolated / "runs", max_spool_bytes=1_000_000)
    for record in records:
        run.log_episodes([record])
    run.finish(timeout_s=2)
    counts = run.stats()["sinks"]["traces"]
    assert 10 < counts["spooled"] < 16 and counts["stored"] == 0, counts
    assert counts["failed"] == {"spool_full": 30 - counts["spooled"]}, counts
    assert counts["max_spool_bytes"] == 1_000_000 and 0.9 * 1_000_000 < counts["spool_bytes"] <= 1_000_000
    kept = [r["id"] for r in local_records(run.dir, "episode")]
    assert len(kept) == counts["spooled"] and len(set(kept)) == len(kept)
    assert "max_spool_bytes=1000000" in capsys.readouterr().err
    service.faults.fail_fraction = 0.0
    assert cli.main(["sync", "--api-key", KEY, "--base-url", service.url, run.dir]) == 4  # the spool_full ones are lost
    assert stored_episodes(service) == {i: 1 for i in kept}
