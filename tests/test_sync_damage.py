"""Damage is not a tear: a file cut short or a flipped byte is counted, set aside, and a distinct exit status."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson
import pytest
from _run_helpers import KEY, episodes, isolated, stored_episodes  # noqa: F401

import prime_runs
from prime_runs import cli
from prime_runs._local.rundir import RunDirectory
from prime_runs._local.segment_reader import scan
from prime_runs._local.segments import segment_files

pytestmark = pytest.mark.timeout(120)

EXIT_DAMAGED = 4


def finished_run(root: Path, records: int, chunk: int = 10) -> tuple[prime_runs.Run, list[str]]:
    run = prime_runs.init(
        "damaged", mode="offline", dir=root, handle_signals=False, console="off",
        environments=["e"], model="m", team_id="t",
    )  # fmt: skip
    batch = episodes("e", records)
    for start in range(0, records, chunk):  # entries of 10 records: a cut at half the file falls between whole ones
        run.log_episodes(batch[start : start + chunk])
        run.flush()
    run.finish()
    return run, [e["id"] for e in batch]


def sync(capsys: Any, url: str, *paths: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli.main(["sync", "--api-key", KEY, "--base-url", url, *paths])
    out, err = capsys.readouterr()
    return code, out, err


def ls_damaged(capsys: Any, root: Path) -> int:
    capsys.readouterr()
    assert cli.main(["ls", str(root), "--json"]) == 0
    [row] = orjson.loads(capsys.readouterr().out)
    return int(row["records_damaged"])


def test_run_json_records_each_file_its_writer_closed_whole(isolated):
    run, ids = finished_run(isolated / "runs", 30)
    [path] = segment_files(run.dir, ["episode"])
    document = RunDirectory(run.dir).read_run()
    assert document is not None
    assert document["sealed_files"] == {os.path.basename(path): [os.path.getsize(path), len(ids)]}


def test_a_file_cut_to_half_is_damage_set_aside_and_never_deleted(isolated, service, capsys):
    run, ids = finished_run(isolated / "runs", 200)
    [path] = segment_files(run.dir, ["episode"])
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        original = handle.read()
    os.truncate(path, size // 2)
    code, out, err = sync(capsys, service.url, run.dir)
    kept = scan(path).lines
    assert 0 < kept < 200
    assert code == EXIT_DAMAGED, out + err
    assert f"{path} is damaged: 200 records were written to it ({size} bytes), {kept} can be read" in err
    assert f"{200 - kept} are lost; the bytes that do not read are kept in {path}.damaged" in err
    assert f"{200 - kept} records lost to damage on disk" in out and "cannot bring them back" in out
    # Nothing deleted: the whole entries plus what was set aside are the half the disk kept, byte for byte.
    with open(path, "rb") as head, open(f"{path}.damaged", "rb") as tail:
        assert head.read() + tail.read() == original[: size // 2]
    assert sorted(stored_episodes(service)) == sorted(ids[:kept])
    # Again: the same damage, the same status, nothing new sent, nothing more set aside.
    code, out, _err = sync(capsys, service.url, run.dir)
    assert code == EXIT_DAMAGED and "nothing new to upload" in out and f"{200 - kept} records lost" in out
    assert not os.path.exists(f"{path}.damaged-2")
    assert ls_damaged(capsys, isolated / "runs") == 200 - kept


def test_a_flipped_byte_loses_one_small_frame_not_the_run(isolated, service, capsys):
    run, ids = finished_run(isolated / "runs", 200, chunk=200)  # one write: cut into frames of 100 records
    [path] = segment_files(run.dir, ["episode"])
    entries = scan(path).entries
    assert len(entries) >= 2 and max(e.lines for e in entries) <= 100  # frames of at most 100 records
    hit = entries[0]
    assert hit.lines == 100
    with open(path, "r+b") as handle:  # 100 bytes flipped inside the first frame's data
        handle.seek(hit.data_offset + hit.data_bytes // 2)
        chunk = handle.read(100)
        handle.seek(hit.data_offset + hit.data_bytes // 2)
        handle.write(bytes(b ^ 0xFF for b in chunk))
    code, out, err = sync(capsys, service.url, run.dir)
    assert code == EXIT_DAMAGED, out + err
    assert f"{hit.lines} records lost to damage on disk" in out
    assert sorted(stored_episodes(service)) == sorted(ids[hit.lines :])
    assert ls_damaged(capsys, isolated / "runs") == hit.lines
    code, _out, _err = sync(capsys, service.url, run.dir)
    assert code == EXIT_DAMAGED  # not "run it again": again cannot help
