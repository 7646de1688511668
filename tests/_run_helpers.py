"""Shared pieces of the Run tests: an isolated environment, a gate on uploads, builders."""

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import requests
import zstandard
from _wire import episode, trace

import prime_runs
from prime_runs import Run
from prime_traces.server import LocalTracesService

REPO = Path(__file__).resolve().parents[1]
KEY = "test-key"
GATE_TIMEOUT_S = 30.0
FLUSH_TIMEOUT_S = 30.0
MARKER = "POISON-7d41"
ENV_NAMES = (
    "PRIME_API_KEY",
    "PRIME_TRACES_URL",
    "PRIME_TEAM_ID",
    "PRIME_RUNS_MODE",
    "PRIME_RUN_ID",
    "PRIME_RUN_KIND",
    "RANK",
    "PRIME_API_BASE_URL",
    "PRIME_BASE_URL",
    "PRIME_FRONTEND_URL",
    "PRIME_TRACES_OPT_OUT",
)


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path) -> Path:
    """No configuration from the machine; ``PRIME_RUN_ID`` that ``init`` exports is undone after the test."""
    for name in ENV_NAMES:
        monkeypatch.setenv(name, "")  # records the original, so teardown restores it
        monkeypatch.delenv(name)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


class Gate:
    """A ``before_upload`` hook: uploads wait (bounded) until ``open()``; ``entered`` is set on arrival.

    With ``hold_first_only`` only the first upload is held.
    """

    def __init__(self, *, hold_first_only: bool = False) -> None:
        self._open = threading.Event()
        self.entered = threading.Event()
        self.hold_first_only = hold_first_only
        self._arrived = threading.Condition()
        self.arrivals = 0

    def __call__(self) -> None:
        with self._arrived:
            self.arrivals += 1
            first = self.arrivals == 1
            self._arrived.notify_all()
        self.entered.set()
        if first or not self.hold_first_only:
            self._open.wait(GATE_TIMEOUT_S)

    def wait_arrivals(self, count: int) -> bool:
        """Wait (bounded) until ``count`` uploads in all have reached the gate."""
        with self._arrived:
            return self._arrived.wait_for(lambda: self.arrivals >= count, GATE_TIMEOUT_S)

    def open(self) -> None:
        self._open.set()

    def close(self) -> None:
        self.entered.clear()
        self._open.clear()


@pytest.fixture
def gate(service) -> Iterator[Gate]:
    """The service's uploads wait on this gate; it opens before the service stops."""
    hold = Gate()
    service.faults.before_upload = hold
    yield hold
    hold.open()


def online(svc: LocalTracesService, name: str = "test-run", **options: Any) -> Run:
    """A run on ``svc`` (which plays the platform and the Traces service); an evaluation unless told otherwise."""
    options.setdefault("handle_signals", False)
    options.setdefault("environments", ["test-env"])
    options.setdefault("model", "test-model")
    options.setdefault("team_id", "test-team")
    return prime_runs.init(name, api_key=KEY, base_url=svc.url, **options)


def no_disk(tmp_path: Path) -> Path:
    """A runs directory that cannot be created (a file is in the way): the run keeps nothing on disk.

    With no disk to put a backlog on, a full queue drops: the queue's bounds alone are under test.
    """
    blocker = tmp_path / "no-disk"
    blocker.write_bytes(b"")
    return blocker / "runs"


def synced_id(run_dir: str | Path, svc: LocalTracesService) -> str:
    """The id on ``svc`` of a run directory that ``prime-runs sync`` uploaded there (``sync.json`` keeps it)."""
    state = orjson.loads((Path(run_dir) / "sync.json").read_bytes())
    return str(state["services"][svc.url]["platform_id"])


def get_run(svc: LocalTracesService, run_id: str) -> dict[str, Any]:
    resp = requests.get(f"{svc.url}/api/v1/runs/{run_id}", headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    assert resp.status_code == 200, resp.text
    return resp.json()


def list_runs(svc: LocalTracesService) -> list[str]:
    resp = requests.get(f"{svc.url}/api/v1/runs", headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    assert resp.status_code == 200, resp.text
    return [item["run_id"] for item in resp.json()["items"]]


def episodes(prefix: str, count: int, poisoned: tuple[int, ...] = (), members: int = 1) -> list[dict[str, Any]]:
    """Small episodes (about 1.2 KB per member); ``poisoned`` ones carry the service's reject marker."""
    out = []
    for i in range(count):
        extra = {"info": {"note": MARKER}} if i in poisoned else {}
        out.append(episode(f"{prefix}{i}", [trace(f"{prefix}{i}-t{k}") for k in range(members)], **extra))
    return out


def stored_episodes(svc: LocalTracesService) -> dict[str, int]:
    """Stored rows per episode id (a record uploaded twice shows as 2)."""
    with svc.state.store.reader() as conn:
        return dict(conn.execute("SELECT episode_id, COUNT(*) FROM episodes GROUP BY episode_id").fetchall())


def local_records(run_dir: Path | str, kind: str) -> list[dict[str, Any]]:
    """The records in a run directory's ``kind`` segments (``episode``, ``trace``, ``rejected``), as zstdcat reads."""
    out = []
    for path in sorted(Path(run_dir).glob(f"{kind}-*.jsonl.zst")):
        with path.open("rb") as handle:
            data = zstandard.ZstdDecompressor().stream_reader(handle, read_across_frames=True).read()
        assert data.endswith(b"\n") or not data
        out += [orjson.loads(line) for line in data.split(b"\n")[:-1]]
    return out


def identity_holds(run: Run, sink: str = "traces") -> bool:
    assert run._worker is not None
    return run._worker.accounting.unaccounted(sink) == 0


def sink_counts(run: Run, sink: str = "traces") -> dict[str, Any]:
    return run.stats()["sinks"][sink]


def assert_buckets(
    run: Run,
    sink: str = "traces",
    *,
    submitted: int,
    stored: int,
    dropped: dict[str, int] | None = None,
    failed: dict[str, int] | None = None,
    spooled: dict[str, int] | None = None,
) -> None:
    """Every bucket of ``sink`` holds what the scenario implies (empty unless given), and the identity closes.

    The identity alone cannot fail when a record is counted in the wrong
    bucket; the numbers here come from the test, not from the counters.
    ``spooled`` is by reason; a run that resynced records itself is checked by hand.
    """
    stats = run.stats()
    counts = stats["sinks"][sink]
    assert counts["resynced"] == 0, "resynced records: check this run's buckets by hand"
    actual = {
        "submitted": stats["submitted"],
        "stored": counts["stored"],
        "dropped": stats["dropped"],
        "failed": counts["failed"],
        "spooled": counts["spooled_reasons"],
    }
    expected = {
        "submitted": submitted,
        "stored": stored,
        "dropped": dropped or {},
        "failed": failed or {},
        "spooled": spooled or {},
    }
    assert actual == expected
    assert identity_holds(run, sink)
