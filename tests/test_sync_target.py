"""Where ``prime-runs sync`` uploads: ``--base-url``, then ``PRIME_TRACES_URL``, then the run's own URL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _run_helpers import KEY, episodes, isolated, stored_episodes  # noqa: F401

import prime_runs
from prime_runs import cli
from prime_runs.cli.sync_target import SyncTarget
from prime_traces.server import LocalTracesService

pytestmark = pytest.mark.timeout(120)

DEAD_URL = "http://127.0.0.1:9"  # the discard port: nothing listens, a connection is refused at once


def stranded_run(root: Path, db: Path) -> tuple[prime_runs.Run, list[str]]:
    """An online run whose service went away before its episodes were sent: all of them spooled."""
    with LocalTracesService(db) as svc:
        run = prime_runs.init(
            "stranded", kind="train", environments=["e"], model="m", team_id="t", dir=root,
            api_key=KEY, base_url=svc.url, handle_signals=False, console="off",
        )  # fmt: skip
    batch = episodes("s-", 12)
    run.log_episodes(batch)
    run.finish(timeout_s=3)
    assert run.stats()["sinks"]["traces"]["spooled"] == 12, run.stats()
    return run, [e["id"] for e in batch]


def sync(capsys: Any, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli.main(["sync", "--api-key", KEY, *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_prime_traces_url_beats_the_url_the_run_recorded(isolated, tmp_path, capsys, monkeypatch):
    run, ids = stranded_run(isolated / "runs", tmp_path / "db")
    with LocalTracesService(tmp_path / "db") as back:  # the same service, back on another port
        monkeypatch.setenv("PRIME_TRACES_URL", back.url)
        code, out, err = sync(capsys, str(run.dir))
        assert code == 0, err
        assert f"uploading to {back.url} (from PRIME_TRACES_URL), not to the run's own" in out
        assert stored_episodes(back) == {i: 1 for i in ids}


def test_base_url_beats_prime_traces_url(isolated, tmp_path, capsys, monkeypatch):
    run, ids = stranded_run(isolated / "runs", tmp_path / "db")
    with LocalTracesService(tmp_path / "db") as back:
        monkeypatch.setenv("PRIME_TRACES_URL", DEAD_URL)
        code, out, err = sync(capsys, "--base-url", back.url, str(run.dir))
        assert code == 0, err
        assert "(from --base-url)" in out and DEAD_URL not in out + err
        assert stored_episodes(back) == {i: 1 for i in ids}


def test_the_runs_own_url_is_used_without_a_word_when_nothing_overrides_it():
    document = {"service_url": "http://a:1", "platform_url": "http://a:1/api/v1"}
    target = SyncTarget.of(None, document, environ={})
    assert (target.traces_url, target.platform_url, target.note) == ("http://a:1", "http://a:1/api/v1", None)


def test_a_hosted_platform_stays_when_only_the_traces_url_moves():
    document = {"service_url": "https://traces.example", "platform_url": "https://api.example/api/v1"}
    target = SyncTarget.of(None, document, environ={"PRIME_TRACES_URL": "https://other.example"})
    assert (target.traces_url, target.platform_url) == ("https://other.example", "https://api.example/api/v1")
    env = {"PRIME_TRACES_URL": "https://other.example", "PRIME_API_BASE_URL": "https://api2.example"}
    assert SyncTarget.of(None, document, environ=env).platform_url == "https://api2.example"
    assert SyncTarget.of("http://flag:1", document, environ=env).platform_url == "http://flag:1"


def test_an_offline_run_without_urls_takes_the_environments():
    target = SyncTarget.of(None, {}, environ={"PRIME_TRACES_URL": "http://t:1"})
    assert (target.traces_url, target.platform_url, target.note) == ("http://t:1", None, None)
