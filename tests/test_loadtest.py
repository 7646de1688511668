"""The load test's smoke run: every episode accounted for, by the service and by the run (never a time)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from _run_helpers import REPO

pytestmark = pytest.mark.timeout(300)


def test_the_smoke_scenarios_deliver_every_good_episode_and_account_for_the_poisoned_one(tmp_path):
    out = tmp_path / "loadtest.json"
    subprocess.run(
        [sys.executable, str(REPO / "tools" / "loadtest.py"), "--smoke", "--json", str(out)],
        check=True,
        timeout=280,
        capture_output=True,
        text=True,
    )
    rows = {row["scenario"]: row for row in json.loads(out.read_text())["rows"]}
    assert sorted(rows) == ["a", "c"]
    for scenario, failed in (("a", 0), ("c", 1)):
        row = rows[scenario]
        assert row["sdk"] == "ours"
        # The service's count, the run's count, and the accounting identity, each on its own.
        assert row["delivered_all"] == row["episodes"] - failed
        assert row["stored"] == row["episodes"] - failed
        # Lost is what neither reached the service nor waits on disk: the poisoned record, reported as failed.
        assert (row["dropped"], row["failed"], row["spooled"], row["lost_all"]) == (0, failed, 0, failed)
        assert row["submitted"] == row["stored"] + row["dropped"] + row["failed"] + row["spooled"]
        assert not row["exit_killed"]
    assert list(rows["c"]["failure_details"]) == ["invalid_record"]
    assert "is NaN" in next(iter(rows["c"]["failure_details"].values()))
