"""The published prime-runs 0.1.4, unchanged and in a virtualenv of its own, against the local service.

Each of its runs must be created, get its episodes and metrics, and end with
its final status, as on the hosted platform; the local service shows them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from _interop import PUBLISHED_SDK, REPO, python_at_least, run_script, virtualenv

from prime_traces import TracesClient
from prime_traces.platform import PlatformClient
from prime_traces.server import LocalTracesService

pytestmark = [pytest.mark.interop, pytest.mark.timeout(900)]

KEY = "published-sdk-key"
SCRIPT = REPO / "tests" / "_published_sdk.py"


@pytest.fixture(scope="module")
def published() -> Path:
    return virtualenv("published-prime-runs", python_at_least(10), [[PUBLISHED_SDK]])


@pytest.fixture
def local(tmp_path) -> Iterator[LocalTracesService]:
    with LocalTracesService(tmp_path / "traces.db") as svc:
        yield svc


def run(venv: Path, svc: LocalTracesService, home: Path, *args: str) -> dict[str, Any]:
    home.mkdir(exist_ok=True)
    env = {"PRIME_API_KEY": KEY, "PRIME_API_BASE_URL": svc.url, "PRIME_TRACES_URL": svc.url, "HOME": str(home)}
    return json.loads(run_script(venv, SCRIPT, *args, env=env).splitlines()[-1])


def remote(svc: LocalTracesService, path: str) -> Any:
    resp = requests.get(f"{svc.url}/api/v1/{path}", headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_an_evaluation_with_an_environment_by_name_is_created_stored_and_completed(published, local, tmp_path):
    said = run(published, local, tmp_path / "home", "eval")
    assert (said["status"], said["finished"], said["errors"], said["failed"]) == ("completed", True, [], {})
    assert said["url"] and said["id"] in said["url"]
    summary = remote(local, f"runs/{said['id']}")
    assert (summary["name"], summary["kind"], summary["status"]) == ("published-eval", "eval", "completed")
    assert summary["episode_count"] == 3 and summary["config"] == {"lr": 1e-6}
    assert summary["summary"]["avg_reward"] == 0.5 and summary["summary"]["seen"] == 3
    assert summary["summary"]["prime_runs"] == {"traces_episodes_written": 3}
    assert summary["platform"]["environments"][0]["id"]  # resolved through the hub
    with TracesClient(KEY, local.url) as client:
        traces = list(client.iter(run_id=said["id"]))
    assert len(traces) == 3 and all(t.total_tokens == 10 for t in traces)  # prompt + completion


def test_an_evaluation_that_failed_is_recorded_failed(published, local, tmp_path):
    said = run(published, local, tmp_path / "home", "eval-failed")
    assert said["status"] == "failed"
    summary = remote(local, f"runs/{said['id']}")
    assert (summary["status"], summary["error"], summary["episode_count"]) == ("failed", "ValueError: boom", 1)


def test_a_training_run_for_a_team_gets_every_step_and_is_finalized(published, local, tmp_path):
    said = run(published, local, tmp_path / "home", "train")
    assert (said["status"], said["errors"]) == ("completed", [])
    summary = remote(local, f"runs/{said['id']}")
    assert (summary["kind"], summary["status"], summary["episode_count"]) == ("train", "completed", 6)
    assert summary["platform"]["team_id"] == "team-1" and summary["platform"]["max_steps"] == 3
    rows = remote(local, f"runs/{said['id']}/metrics")["rows"]
    assert [r["step"] for r in rows] == [0, 1, 2] and rows[2]["metrics"] == {"loss": 1 / 3, "reward": 1.0}
    steps = remote(local, f"episodes?run_id={said['id']}&run_step=2&limit=100")["items"]
    assert sorted(e["episode_id"] for e in steps) == ["pt-2-0", "pt-2-1"]


def test_an_attached_run_logs_into_the_run_its_launcher_made_and_finalizes_it(published, local, tmp_path):
    with PlatformClient(KEY, local.url) as platform:
        made = platform.create_training_run(
            {"base_model": "m", "max_steps": 1, "environments": [], "team_id": "team-1", "name": "launched"}
        )
    run_id = made["run"]["id"]
    said = run(published, local, tmp_path / "home", "attach", run_id)
    assert (said["id"], said["attached"], said["status"]) == (run_id, True, "completed")
    summary = remote(local, f"runs/{run_id}")
    assert (summary["name"], summary["status"], summary["episode_count"]) == ("launched", "completed", 1)
    assert [r["step"] for r in remote(local, f"runs/{run_id}/metrics")["rows"]] == [0]
