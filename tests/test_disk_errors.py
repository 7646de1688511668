"""Disk errors on real filesystems: a full one keeps what fits, a read-only one or a file in the way is said at init().

The full and read-only filesystems are small tmpfs mounts (the suite runs as
root, as CI does); each test unmounts its own.
"""

from __future__ import annotations

import base64
import os
import random
import subprocess
from collections.abc import Iterator
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
from _wire import episode, trace

import prime_runs
from prime_runs import RunDirectoryError, cli

pytestmark = pytest.mark.timeout(120)


def _mount(target: Path, *options: str) -> None:
    target.mkdir(exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs", str(target)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (root is needed): {done.stderr.strip()}")


@pytest.fixture
def small_fs(tmp_path) -> Iterator[Path]:
    """A 3 MB filesystem."""
    target = tmp_path / "small"
    _mount(target, "size=3m")
    yield target
    subprocess.run(["umount", "-l", str(target)], check=False)


@pytest.fixture
def read_only_fs(tmp_path) -> Iterator[Path]:
    target = tmp_path / "ro"
    _mount(target, "size=1m", "ro")
    yield target
    subprocess.run(["umount", "-l", str(target)], check=False)


def _incompressible(count: int, size: int) -> list[dict]:
    rng = random.Random(7)
    return [
        episode(f"e{i}", [trace(f"e{i}-t", info={"blob": base64.b64encode(rng.randbytes(size)).decode()})])
        for i in range(count)
    ]


def _fill(fs: Path) -> None:
    """Take every free byte of ``fs``."""
    fd = os.open(fs / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)


def test_an_offline_run_on_a_full_disk_keeps_what_fits_says_errno_and_path_and_syncs_it_once(
    isolated, small_fs, service, capsys
):
    records = _incompressible(60, 75_000)  # 100 KB each, 6 MB in all, on 3 MB
    # A budget past the disk's size: the disk itself fills (the default, 90% of the free space, would stop first).
    run = prime_runs.init(
        "full", mode="offline", dir=small_fs / "runs", environments=["e"], handle_signals=False, max_spool_bytes=10**12
    )
    for record in records:
        run.log_episodes([record])
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    stats = run.stats()
    counts = stats["sinks"]["offline"]
    saved = counts["stored"]
    assert 10 < saved < 60, counts
    assert counts["failed"] == {"disk_error": 60 - saved} and stats["dropped"] == {}
    # What fits is kept, in order, readable whole; no empty file is left to trip zstdcat.
    assert [r["id"] for r in local_records(run.dir, "episode")] == [f"e{i}" for i in range(saved)]
    sizes = {path.name: path.stat().st_size for path in Path(run.dir).iterdir() if path.is_file()}
    assert all(sizes[name] > 0 for name in sizes if name.endswith(".jsonl.zst")), sizes
    err = capsys.readouterr().err
    assert "[Errno 28] No space left on device" in err and str(small_fs) in err, err
    subprocess.run(["mount", "-o", "remount,size=20m", str(small_fs)], check=True)  # room for sync.json
    assert cli.main(["sync", "--api-key", KEY, "--base-url", service.url, run.dir]) == 4, capsys.readouterr().err
    assert f"the run itself could not keep (disk_error: {60 - saved})" in capsys.readouterr().out
    assert stored_episodes(service) == {f"e{i}": 1 for i in range(saved)}


@pytest.mark.parametrize("how", ["read-only", "a file in the way"])
def test_an_unwritable_runs_directory_is_refused_offline_and_said_online(isolated, read_only_fs, service, how, capsys):
    if how == "read-only":
        root, told = read_only_fs / "runs", "[Errno 30] Read-only file system"
    else:
        (isolated / "file").write_bytes(b"")
        root, told = isolated / "file" / "runs", "[Errno 20] Not a directory"
    with pytest.raises(RunDirectoryError, match=r"cannot be written") as caught:
        prime_runs.init("offline", mode="offline", dir=root, handle_signals=False)
    assert told in str(caught.value) and isinstance(caught.value.cause, OSError)
    with pytest.raises(RunDirectoryError):
        online(service, dir=root, save_local=True)  # local copies asked for: nowhere to put them
    # Online, the records go to the service; only what it could not take would need the directory.
    run = online(service, dir=root)
    assert run.log_episodes(_incompressible(3, 1_000))
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    err = capsys.readouterr().err
    assert f"the runs directory {root} cannot be written ({told}" in err, err
    assert "prime-runs sync" not in err.split("cannot be written", 1)[1].split("\n", 1)[1], err
    assert stored_episodes(service) == {"e0": 1, "e1": 1, "e2": 1}
    assert not os.path.exists(root)


def test_metrics_rows_the_full_disk_did_not_keep_get_no_sparkline(isolated, small_fs, capsys):
    run = prime_runs.init("rows", mode="offline", dir=small_fs / "runs", environments=["e"], handle_signals=False)
    for step in range(20):
        run.log({"kept": float(step)}, step=step)
    assert run._metrics is not None and run._metrics.flush(None)
    assert run._metrics.writer is not None
    run._metrics.writer().close()  # the next rows start a new file (as past a segment's size), on a full disk
    _fill(small_fs)
    for step in range(20, 40):
        run.log({"lost": float(step)}, step=step)
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    rows = run.stats()["metrics"]
    assert (rows["stored"], rows["failed"]) == (20, 20), rows
    summary = capsys.readouterr().err.split("completed in", 1)[1]
    assert "prime-runs:   kept " in summary and "prime-runs:   lost " not in summary, summary


def test_the_default_disk_budget_stops_a_run_short_of_filling_the_disk(isolated, small_fs, capsys):
    stats = os.statvfs(small_fs)
    free = stats.f_bavail * stats.f_frsize
    run = prime_runs.init("budget", mode="offline", dir=small_fs / "runs", environments=["e"], handle_signals=False)
    for record in _incompressible(60, 75_000):
        run.log_episodes([record])
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    counts = run.stats()["sinks"]["offline"]
    assert set(counts["failed"]) == {"spool_full"} and counts["stored"] + counts["failed"]["spool_full"] == 60
    assert counts["max_spool_bytes"] == pytest.approx(0.9 * free, rel=0.01)
    assert counts["spool_bytes"] <= counts["max_spool_bytes"]
    after = os.statvfs(small_fs)
    assert after.f_bavail * after.f_frsize > 0.05 * free  # the disk is left with room
    assert "max_spool_bytes=" in capsys.readouterr().err
