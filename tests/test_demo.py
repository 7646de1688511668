"""``prime-runs demo``: the README's main job, end to end on a small workload."""

from __future__ import annotations

import re

from prime_runs.cli import main


def test_demo_logs_finishes_and_reads_back_every_episode(tmp_path, capsys):
    code = main(["demo", "--steps", "3", "--episodes-per-step", "4", "--episode-kb", "20",
                 "--dir", str(tmp_path / "demo")])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert re.search(r"episodes logged\s+12\n", out)
    assert re.search(r"episodes stored\s+12 \(read back from the service: 12\)", out)
    assert re.search(r"episodes dropped\s+0\n", out)
    assert re.search(r"run status\s+completed", out)
    assert (tmp_path / "demo" / "traces.db").exists()


def test_demo_refuses_nonsense_sizes(tmp_path, capsys):
    assert main(["demo", "--steps", "0", "--dir", str(tmp_path)]) == 2
