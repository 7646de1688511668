"""``prime-runs demo``: the README's main job, end to end on a small workload."""

from __future__ import annotations

import re

import requests

from prime_runs.cli import main
from prime_traces.server import LocalTracesService


def test_demo_logs_finishes_and_reads_back_every_episode(tmp_path, capsys):
    code = main(
        ["demo", "--steps", "3", "--episodes-per-step", "4", "--episode-kb", "20", "--keep", str(tmp_path / "demo")]
    )
    captured = capsys.readouterr()
    out = captured.out
    assert code == 0, out
    assert re.search(r"episodes logged\s+12\n", out)
    assert re.search(r"episodes stored\s+12 \(read back from the service: 12\)", out)
    assert re.search(r"episodes dropped\s+0\n", out)
    assert re.search(r"traces stored\s+\d+ \(an episode is one rollout", out)
    assert re.search(r"run status\s+completed", out)
    db = tmp_path / "demo" / "traces.db"
    assert db.exists()
    assert f"prime-traces serve --db {db} --port 8765" in out and "prime-traces list --run-id " in out
    # It ends with the command that serves the kept database and the run's page, which that serves.
    serve, last = out.rstrip("\n").splitlines()[-2:]
    assert serve == f"  prime-traces serve --db {db} --port 8765"
    opened = re.fullmatch(r"  http://127\.0\.0\.1:8765/#/run/(train-[0-9a-f]+)", last)
    assert opened, last
    with LocalTracesService(db) as svc:
        runs = requests.get(f"{svc.url}/api/v1/_viewer/runs", headers={"Authorization": "Bearer x"}, timeout=10)
        assert [(r["run_id"], r["status"]) for r in runs.json()["items"]] == [(opened.group(1), "completed")]
    # The run's own console: where it goes, the progress while logging, and its summary.
    assert "prime-runs: logging run 'demo-grpo'" in captured.err
    assert re.search(r"demo: logged: 12/12 records", captured.err)
    assert "prime-runs: run 'demo-grpo' (id " in captured.err and "12 of 12 records stored" in captured.err


def test_demo_leaves_nothing_behind_without_keep(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # TMPDIR is read again
    assert main(["demo", "--steps", "1", "--episodes-per-step", "2", "--episode-kb", "20"]) == 0
    out = capsys.readouterr().out
    assert "deleted at the end; --keep DIR keeps it" in out and "prime-traces serve --db DIR/traces.db" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tmp"] and list((tmp_path / "tmp").iterdir()) == []


def test_demo_refuses_nonsense_sizes(tmp_path, capsys):
    assert main(["demo", "--steps", "0", "--keep", str(tmp_path)]) == 2
    assert "must be >= 1" in capsys.readouterr().err
