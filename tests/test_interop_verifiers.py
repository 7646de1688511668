"""verifiers 0.4.0 and this project in one virtualenv, installed in either order; verifiers' and prime-rl's runs.

``pip install`` of verifiers (which needs ``prime-runs>=0.1.4``) and of this
project's two distributions leaves ours the code that runs, with ``pip
check`` clean, whichever goes first. verifiers' own platform hooks push an
evaluation of its ``Episode`` objects, whose stored records read back as its
``WireEpisode``; prime-rl's monitor logs a training run, against the local
service and against a platform that answers only its own routes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from _fake_platform import FakePlatform
from _interop import OURS, REPO, VERIFIERS, pip_check, python_at_least, run_script, virtualenv

from prime_traces.platform import PlatformClient
from prime_traces.server import LocalTracesService

pytestmark = [pytest.mark.interop, pytest.mark.timeout(1800)]

KEY = "verifiers-key"
SCRIPT = REPO / "tests" / "_verifiers_runs.py"
ORDERS = {"ours-first": [list(OURS), [VERIFIERS]], "verifiers-first": [[VERIFIERS], list(OURS)]}


@pytest.fixture(scope="module", params=list(ORDERS))
def venv(request: Any) -> Path:
    return virtualenv(f"verifiers-{request.param}", python_at_least(11), ORDERS[request.param])


@pytest.fixture(scope="module")
def verifiers_venv() -> Path:
    order = "verifiers-first"  # the order that used to leave the published packages in charge
    return virtualenv(f"verifiers-{order}", python_at_least(11), ORDERS[order])


@pytest.fixture
def local(tmp_path) -> Iterator[LocalTracesService]:
    with LocalTracesService(tmp_path / "traces.db") as svc:
        yield svc


def run(venv: Path, svc: LocalTracesService, home: Path, *args: str, **env: str) -> dict[str, Any]:
    home.mkdir(exist_ok=True)
    base = {"PRIME_API_KEY": KEY, "PRIME_TRACES_URL": svc.url, "HOME": str(home), "PRIME_TEAM_ID": "team-1"}
    return json.loads(run_script(venv, SCRIPT, *args, env={**base, **env}).splitlines()[-1])


def remote(svc: LocalTracesService, path: str) -> Any:
    resp = requests.get(f"{svc.url}/api/v1/{path}", headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_either_install_order_leaves_this_project_in_charge_with_pip_check_clean(venv, local, tmp_path):
    assert pip_check(venv) == "No broken requirements found."
    said = run(venv, local, tmp_path / "home", "check")
    assert said["prime_runs"] == str(REPO / "prime_runs" / "__init__.py")
    assert said["prime_traces"] == str(REPO / "prime_traces" / "__init__.py")
    from prime_traces.version import __version__

    assert said["version"] == __version__


def test_verifiers_pushes_an_evaluation_whose_records_read_back_as_its_own(verifiers_venv, local, tmp_path):
    said = run(verifiers_venv, local, tmp_path / "home", "eval")
    assert (said["status"], said["finished"], said["errors"], said["failed"], said["incomplete"]) == (
        "completed",
        True,
        [],
        {},
        None,
    )
    assert said["assigned"] == said["id"] and said["url"]  # the eval's records carry the run's id
    summary = remote(local, f"runs/{said['id']}")
    assert (summary["kind"], summary["status"], summary["episode_count"]) == ("eval", "completed", 4)
    assert summary["summary"]["avg_reward"] == 1.0 and summary["summary"]["avg_metrics"] == {"correct": 1.0, "len": 2.0}
    read = run(verifiers_venv, local, tmp_path / "home", "validate", said["id"])
    assert read["validated"] == 4 and read["tokens"] == [5]  # prompt_tokens 3 + completion_tokens 2


def test_verifiers_aborts_an_evaluation_as_failed(verifiers_venv, local, tmp_path):
    said = run(verifiers_venv, local, tmp_path / "home", "abort")
    assert (said["status"], said["finished"]) == ("failed", True)
    summary = remote(local, f"runs/{said['id']}")
    assert (summary["status"], summary["error"]) == ("failed", "RuntimeError: the eval broke")


def test_prime_rls_monitor_logs_a_training_run_to_the_local_service(verifiers_venv, local, tmp_path):
    said = run(verifiers_venv, local, tmp_path / "home", "train", PLATFORM_URL=local.url)
    assert (said["status"], said["attached"], said["errors"]) == ("completed", False, [])
    summary = remote(local, f"runs/{said['id']}")
    assert (summary["kind"], summary["status"], summary["episode_count"]) == ("train", "completed", 6)
    rows = remote(local, f"runs/{said['id']}/metrics")["rows"]
    assert [r["step"] for r in rows] == [0, 1, 2] and rows[1]["metrics"] == {"loss": 0.5, "entropy": 0.5}
    read = run(verifiers_venv, local, tmp_path / "home", "validate", said["id"])
    assert read["validated"] == 6 and read["by_step"] == {"0": 2, "1": 2, "2": 2}
    assert sorted(read["steps"].values()) == [0, 0, 1, 1, 2, 2]  # each episode keeps its own step


def test_prime_rls_monitor_attaches_to_a_launched_run(verifiers_venv, local, tmp_path):
    with PlatformClient(KEY, local.url) as platform:
        made = platform.create_training_run(
            {"base_model": "m", "max_steps": 3, "environments": [], "team_id": "team-1", "name": "launched"}
        )
    run_id = made["run"]["id"]
    said = run(verifiers_venv, local, tmp_path / "home", "train", run_id, PLATFORM_URL=local.url)
    assert (said["id"], said["attached"], said["status"]) == (run_id, True, "completed")
    summary = remote(local, f"runs/{run_id}")
    assert (summary["name"], summary["status"], summary["episode_count"]) == ("launched", "completed", 6)


def test_prime_rls_monitor_against_the_hosted_routes_only(verifiers_venv, local, tmp_path):
    with FakePlatform() as platform:
        said = run(verifiers_venv, local, tmp_path / "home", "train", PLATFORM_URL=platform.url)
        steps = platform.runs[said["id"]].steps
        status = platform.runs[said["id"]].status
        paths = platform.paths()
    assert (said["status"], status, sorted(steps)) == ("completed", "COMPLETED", [0, 1, 2])
    assert paths[0] == "POST /api/v1/rft/external-runs" and paths[-1] == "POST /api/v1/rft/finalize"
    assert all("/rft/" in path for path in paths), paths
    stats = local.stats()
    assert stats["requests"] == stats["upload_attempts"]  # the Traces service saw record uploads only
    assert len(remote(local, f"episodes?run_id={said['id']}&limit=100")["items"]) == 6
