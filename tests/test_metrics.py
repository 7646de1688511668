"""run.log(): every row kept, online and offline, on a lane large uploads cannot delay, and shown."""

from __future__ import annotations

import base64
import math
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np
import pytest
from _run_helpers import FLUSH_TIMEOUT_S, KEY, REPO, isolated, online, synced_id  # noqa: F401
from _wire import episode, trace

import prime_runs
from prime_traces import TracesClient
from prime_traces.server import LocalTracesService


class _TorchLike:
    """What a torch scalar tensor offers: ``.item()`` and ``numel()``."""

    def __init__(self, value: float) -> None:
        self.value = value

    def item(self) -> float:
        return self.value

    def numel(self) -> int:
        return 1


def rows_of(url: str, run_id: str) -> list[Any]:
    with TracesClient(KEY, url) as client:
        return list(client.iter_metrics(run_id, limit=10_000))


def test_rows_arrive_long_before_large_episodes_against_a_slow_service(tmp_path):
    # A training run's rows go one step a request (the platform's route): a few ms each, 100 steps well under
    # a second on a loaded machine, against 3-4 s for the episodes.
    STEPS = 100
    with LocalTracesService(tmp_path / "db", bandwidth_mb_s=16.0) as slow:
        run = online(slow, console="off", max_in_flight=2, kind="train")
        big = base64.b64encode(os.urandom(26_250_000)).decode()  # 35 MB that compression cannot shrink much
        run.log_episodes([episode(f"big-{i}", [trace(f"big-{i}-t")], info={"blob": big}) for i in range(2)])
        started = time.monotonic()
        for step in range(STEPS):
            run.log({"reward": step / STEPS, "loss": 1 / (step + 1)}, step=step)
        assert run._metrics is not None and run._metrics.flush(time.monotonic() + FLUSH_TIMEOUT_S)
        rows_done = time.monotonic() - started
        assert run.flush(timeout_s=120)
        episodes_done = time.monotonic() - started
        run.finish(timeout_s=FLUSH_TIMEOUT_S)
        rows = rows_of(slow.url, run.id)
    assert [r.step for r in rows] == list(range(STEPS))
    assert rows[STEPS - 1].metrics == {"reward": (STEPS - 1) / STEPS, "loss": 1 / STEPS}
    assert run.stats()["metrics"]["stored"] == STEPS and run.stats()["sinks"]["traces"]["stored"] == 2
    assert rows_done < episodes_done / 3, (rows_done, episodes_done)  # about 53 MB on the wire at 16 MB/s: 3-4 s


def test_the_shapes_training_code_logs_arrive_as_numbers_and_names(service, capsys):
    run = online(service, console="on", kind="train")
    run.log(
        {
            "train": {"loss": np.float32(0.25), "tokens": np.int64(7)},
            3: 1.0,
            "grad": _TorchLike(0.5),
            "diverged": float("nan"),
            "up": float("inf"),
            "hist": [1, 2],
            "flag": True,
        },
        step=0,
    )
    run.log({"reward": 1.0}, step=5)
    run.log({"reward": 2.0}, step=5)  # the same step again: the later value is kept
    run.log({"reward": 3.0})  # no step: the next one
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    rows = rows_of(service.url, run.id)
    assert [(r.step, r.metrics) for r in rows] == [
        (
            0,
            {
                "train/loss": 0.25,
                "train/tokens": 7,
                "3": 1.0,
                "grad": 0.5,
                "flag": True,  # NaN and the infinities stay in the run's summary: the platform keeps numbers
            },
        ),
        (5, {"reward": 2.0}),
        (6, {"reward": 3.0}),
    ]
    err = capsys.readouterr().err
    assert err.count("run.log(): hist (a list, not a scalar) is not logged; the rest of the row is") == 1
    assert run.stats()["metrics"] == {
        "logged": 4,
        "stored": 4,
        "dropped": 0,
        "failed": 0,
        "spooled": 0,
        "queued": 0,
        "last_error": None,
    }
    # The summary's last values, NaN as the contract's string.
    assert run.summary["diverged"] == "NaN" and run.summary["reward"] == 3.0


def test_a_bad_step_or_a_non_mapping_never_raises(service, capsys):
    run = online(service, console="on", kind="train")
    run.log({"a": 1.0}, step="seven")  # type: ignore[arg-type]
    run.log([1, 2])  # type: ignore[arg-type]
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    assert [(r.step, r.metrics) for r in rows_of(service.url, run.id)] == [(0, {"a": 1.0})]
    err = capsys.readouterr().err
    assert "step='seven' is not an integer" in err and "the metrics (not a mapping) is not logged" in err


def _same_run(run: prime_runs.Run) -> None:
    for step in range(200):
        run.log({"reward": math.sin(step / 20), "loss": float("nan") if step == 150 else 1 / (step + 1)}, step=step)
    run.log({"eval/acc": 0.5}, step=199)


def test_an_offline_history_synced_equals_the_online_one(isolated, tmp_path):
    with LocalTracesService(tmp_path / "a.db") as first, LocalTracesService(tmp_path / "b.db") as second:
        spec: dict[str, Any] = {"kind": "train", "environments": ["e"], "model": "m", "team_id": "t"}
        live = prime_runs.init("twin", **spec, api_key=KEY, base_url=first.url, handle_signals=False, console="off")
        _same_run(live)
        live.finish(timeout_s=FLUSH_TIMEOUT_S)
        offline = prime_runs.init(
            "twin", **spec, mode="offline", dir=isolated / "runs", handle_signals=False, console="off"
        )
        _same_run(offline)
        offline.finish(timeout_s=FLUSH_TIMEOUT_S)
        assert offline.stats()["metrics"]["stored"] == 201
        env = {"PRIME_API_KEY": KEY, "PATH": ""}
        for _ in range(2):  # a second sync sends the rows again: nothing changes
            done = subprocess.run(
                [sys.executable, "-m", "prime_runs.cli", "sync", str(offline.dir), "--base-url", second.url],
                env=env,
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert done.returncode == 0, done.stderr
        synced = synced_id(offline.dir, second)
        online_rows = [r.to_dict() for r in rows_of(first.url, live.id)]
        synced_rows = [r.to_dict() for r in rows_of(second.url, synced)]
        with TracesClient(KEY, first.url) as a, TracesClient(KEY, second.url) as b:
            summaries = a.get_run(live.id).metrics, b.get_run(synced).metrics
    assert "201 metrics rows" not in done.stdout  # the file was sent whole by the first sync
    strip = [{"step": r["step"], "metrics": r["metrics"]} for r in online_rows]
    assert strip == [{"step": r["step"], "metrics": r["metrics"]} for r in synced_rows]
    # The platform keeps numbers: a NaN stays in the run's own history (run.json, sparklines), not there.
    assert len(strip) == 200 and "loss" not in strip[150]["metrics"] and strip[149]["metrics"]["loss"] == 1 / 150
    assert summaries[0] == summaries[1]


def test_show_prints_one_sparkline_per_metric(service, capsys):
    from prime_runs.cli import main

    run = online(service, console="off", kind="train")
    for step in range(1000):
        run.log({"reward": step / 1000, "loss": 1 / (step + 1), "lr": 1e-6}, step=step)
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    assert main(["show", run.id, "--base-url", service.url, "--api-key", KEY]) == 0
    out = capsys.readouterr().out.splitlines()
    charts = [line for line in out if line.startswith("  ")]
    assert [line.split()[0] for line in charts] == ["reward", "loss", "lr"], out
    assert all("steps 0..999 (1,000)" in line for line in charts)
    assert "▁" in charts[0] and "█" in charts[0] and "last 0.999" in charts[0]
    assert out[0].startswith(f"run 'test-run' (id {run.id})  train  completed")
    assert main(["show", run.id, "--base-url", service.url, "--api-key", KEY, "--json"]) == 0
    import orjson

    document = orjson.loads(capsys.readouterr().out)
    assert len(document["rows"]) == 1000 and document["run"]["status"] == "completed"


def test_the_finish_summary_shows_the_sparklines(service, capsys):
    run = online(service, console="on", kind="train")
    for step in range(100):
        run.log({"reward": step}, step=step)
    run.finish(timeout_s=FLUSH_TIMEOUT_S)
    err = capsys.readouterr().err
    [chart] = [line for line in err.splitlines() if line.startswith("prime-runs:   reward ")]
    assert "▁" in chart and "█" in chart and "last 99" in chart and "steps 0..99 (100)" in chart


@pytest.mark.parametrize("mode", ["online", "offline"])
def test_rows_not_sent_by_the_deadline_are_kept_for_the_sync(isolated, tmp_path, mode):
    options: dict[str, Any] = {"mode": mode, "dir": isolated / "runs", "handle_signals": False, "console": "off"}
    with LocalTracesService(tmp_path / "db") as svc:
        if mode == "online":
            options.update(api_key=KEY, base_url=svc.url)
        run = prime_runs.init("kept", kind="train", environments=["e"], model="m", team_id="t", **options)
    # The service is gone: every send fails from here on.
    for step in range(50):
        run.log({"reward": step}, step=step)
    run.finish(timeout_s=2)
    counts = run.stats()["metrics"]
    assert counts["logged"] == 50 and counts["queued"] == 0
    assert counts["spooled" if mode == "online" else "stored"] == 50, counts
    with LocalTracesService(tmp_path / "db") as back:
        done = subprocess.run(
            [sys.executable, "-m", "prime_runs.cli", "sync", str(run.dir), "--base-url", back.url],
            env={"PRIME_API_KEY": KEY, "PATH": ""},
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        run_id = run.id if mode == "online" else synced_id(run.dir, back)
        assert [r.step for r in rows_of(back.url, run_id)] == list(range(50))
