"""``prime-runs sync`` and ``ls`` against the local service: exactly once, resumable, nothing lost."""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import Any

import orjson
import pytest
import zstandard
from _run_helpers import (  # noqa: F401
    KEY,
    MARKER,
    episodes,
    get_run,
    isolated,
    local_records,
    stored_episodes,
    synced_id,
)
from _wire import trace

import prime_runs
from prime_runs import cli
from prime_runs._console.progress import Progress
from prime_runs._local.rundir import RunDirectory
from prime_runs._local.segment_reader import scan
from prime_runs._local.segments import Frame, SegmentWriter, segment_files
from prime_traces import TracesClient
from prime_traces.server import LocalTracesService

pytestmark = pytest.mark.timeout(120)


def offline(root: Path, name: str = "offline-run", **options: Any) -> prime_runs.Run:
    """An offline run with what the platform needs to create it at the sync (an environment, a model, a team)."""
    options.setdefault("handle_signals", False)
    options.setdefault("environments", ["test-env"])
    options.setdefault("model", "test-model")
    options.setdefault("team_id", "test-team")
    return prime_runs.init(name, mode="offline", dir=root, **options)


def sync(capsys: Any, svc: LocalTracesService | None, *args: str) -> tuple[int, str, str]:
    """``prime-runs sync ARGS`` in this process, against ``svc``; (exit status, stdout, stderr)."""
    capsys.readouterr()
    extra = ["--api-key", KEY, "--base-url", svc.url] if svc is not None else []
    code = cli.main(["sync", *extra, *args])
    out, err = capsys.readouterr()
    return code, out, err


def uploads(svc: LocalTracesService) -> int:
    return svc.stats()["upload_attempts"]


def log_steps(run: prime_runs.Run, steps: int, per_step: int, prefix: str = "e") -> list[str]:
    ids = []
    for step in range(steps):
        batch = episodes(f"{prefix}{step}-", per_step, members=2)
        run.log_episodes(batch)
        run.log({"reward": step / 10, "loss": 1 / (step + 1)}, step=step)
        ids += [e["id"] for e in batch]
    return ids


def test_an_offline_run_arrives_whole_and_a_second_sync_stores_nothing(isolated, service, capsys):
    run = offline(isolated / "runs", kind="eval", config={"lr": 1e-6}, tags=["t1"])
    ids = log_steps(run, 4, 10)
    run.log_traces([trace("bare-1"), trace("bare-2")])
    run.finish()
    code, out, err = sync(capsys, service, run.dir)
    assert code == 0, err
    assert f"{run.id}: 42 records uploaded" in out and "status completed" in out
    assert stored_episodes(service) == {i: 1 for i in ids}
    with service.state.store.reader() as conn:
        bare = [r[0] for r in conn.execute("SELECT trace_id FROM traces WHERE episode_id IS NULL")]
    assert sorted(bare) == ["bare-1", "bare-2"]
    remote = get_run(service, synced_id(run.dir, service))
    assert (remote["name"], remote["kind"], remote["status"], remote["tags"]) == (
        "offline-run",
        "eval",
        "completed",
        ["t1"],
    )
    assert remote["config"] == {"lr": 1e-6}
    counts = {"_records/logged": 42, "_records/saved": 42, "_records/dropped": 0, "_records/failed": 0}
    written = {"prime_runs": {"traces_episodes_written": 40}}  # the episodes the sync stored (not the 2 traces)
    assert remote["summary"] == {"reward": 0.3, "loss": 0.25, "step": 3, **counts, **written}
    assert remote["context"] == {"source": "prime-runs", "run_type": "eval", "model": "test-model"}
    before = service.stats()
    code, out, _ = sync(capsys, service, run.dir)
    assert code == 0 and "nothing new to upload" in out
    after = service.stats()
    assert after["upload_attempts"] == before["upload_attempts"] and after["requests"] == before["requests"]


def test_an_offline_run_arrives_as_the_same_run_online_would_have(isolated, tmp_path, capsys):
    logged = episodes("e", 5, members=2)

    def same_run(run: prime_runs.Run) -> None:
        run.log_episodes(logged)
        run.log({"reward": 0.5}, step=1)
        run.update_config({"batch": 16})
        run.finish(summary={"final": True}, status="failed", error="diverged")

    with LocalTracesService(tmp_path / "a.db") as first, LocalTracesService(tmp_path / "b.db") as second:
        online_run = prime_runs.init(
            "twin",
            environments=["test-env"],
            model="test-model",
            team_id="test-team",
            kind="eval",  # an evaluation: the platform keeps its summary (not a training run's)
            config={"lr": 1},
            api_key=KEY,
            base_url=first.url,
            handle_signals=False,
        )
        same_run(online_run)
        offline_run = offline(isolated / "runs", name="twin", kind="eval", config={"lr": 1})
        same_run(offline_run)
        code, _out, err = sync(capsys, second, offline_run.dir)
        assert code == 0, err
        ids = (online_run.id, synced_id(offline_run.dir, second))
        a, b = get_run(first, ids[0]), get_run(second, ids[1])
        fields = (
            "name",
            "kind",
            "status",
            "config",
            "summary",
            "tags",
            "error",
            "trace_count",
            "episode_count",
            "context",
            "step_min",
            "step_max",
            "avg_reward",
        )
        # The summary's record counts differ by mode: stored online, saved (to the run directory) offline.
        assert a["summary"].pop("_records/stored") == b["summary"].pop("_records/saved") == 5
        assert a["summary"].pop("_records/spooled") == 0
        assert {f: a[f] for f in fields} == {f: b[f] for f in fields}
        assert b["status"] == "failed" and b["error"] == "diverged" and b["summary"]["final"] is True
        docs = []
        for svc, run_id in zip((first, second), ids):
            with svc.state.store.reader() as conn:
                raw = (bytes(r[0]).replace(run_id.encode(), b"RUN") for r in conn.execute("SELECT raw FROM trace_docs"))
                docs.append(sorted(raw))
        assert docs[0] == docs[1]  # byte for byte, stamping included (each under its own id there)


@pytest.mark.parametrize("omit_line", [False, True], ids=["located", "bisected"])
def test_refused_lines_are_set_aside_and_the_rest_goes_on(isolated, tmp_path, capsys, omit_line):
    run = offline(isolated / "runs")
    records = episodes("e", 40, poisoned=(3, 17, 18, 39))
    run.log_episodes(records)
    run.finish()
    with LocalTracesService(tmp_path / "db", reject_marker=MARKER, reject_omit_line=omit_line) as svc:
        code, out, err = sync(capsys, svc, run.dir)
        assert code == 3, err
        assert "4 records refused (4 just now)" in out
        assert sorted(stored_episodes(svc)) == sorted(
            r["id"] for i, r in enumerate(records) if i not in (3, 17, 18, 39)
        )
        kept = local_records(run.dir, "rejected")
        assert sorted(k["id"] for k in kept) == ["e17", "e18", "e3", "e39"]
        assert {k["reason"] for k in kept} == {"rejected:invalid_trace"}
        assert all(k["record"]["info"]["note"] == MARKER for k in kept)
        attempts = uploads(svc)
        # A named line costs one request; an unnamed one about two per halving of the batch.
        assert attempts <= (5 if not omit_line else 1 + 4 * 2 * 6)
        code, out, _ = sync(capsys, svc, run.dir)  # set aside for good: never sent again
        assert code == 3 and "nothing new" in out and uploads(svc) == attempts
        assert len(local_records(run.dir, "rejected")) == 4


def test_an_interrupted_sync_resumes_and_stores_nothing_twice(isolated, service, capsys, monkeypatch):
    monkeypatch.setattr("prime_runs._local.sync_file.DEFAULT_TARGET_BATCH_BYTES", 16 * 1024)  # many batches
    run = offline(isolated / "runs")
    ids = log_steps(run, 6, 10)
    run.finish()
    committed = []

    def fail_after_three(key: str) -> None:
        committed.append(key)
        if len(committed) == 3:  # the service goes down for the rest of this sync
            service.faults.fail_status = 502
            service.faults.fail_fraction = 1.0
            service.faults.fail_retry_after_s = 0

    service.faults.on_upload = fail_after_three
    code, out, err = sync(capsys, service, run.dir)
    assert code == 1 and "left: run prime-runs sync" in out and "could not upload" in err
    first = stored_episodes(service)
    assert 0 < len(first) < len(ids)
    service.faults.fail_fraction = 0.0
    service.faults.on_upload = None
    code, out, err = sync(capsys, service, run.dir)
    assert code == 0, err
    assert stored_episodes(service) == {i: 1 for i in ids}
    code, out, _ = sync(capsys, service, run.dir)
    assert code == 0 and "nothing new" in out


_TORN_TAILS = {
    "mid-frame": None,  # the last entry, cut 9 bytes short
    "missing-newline": zstandard.ZstdCompressor().compress(b'{"id": "x"}'),
    "empty-frame": zstandard.ZstdCompressor().compress(b""),
}


@pytest.mark.parametrize("how", sorted(_TORN_TAILS))
def test_torn_tails_are_cut_reported_and_every_whole_entry_uploaded(isolated, service, capsys, how):
    run = offline(isolated / "runs")
    first = episodes("a", 5)
    run.log_episodes(first)
    run.flush()
    run.log_episodes(episodes("b", 5))
    run.finish()
    _as_if_its_writer_died(run.dir)
    [path] = segment_files(run.dir, ["episode"])
    entries = scan(path).entries
    tail = _TORN_TAILS[how]
    if tail is None:
        os.truncate(path, entries[-1].data_offset + entries[-1].data_bytes - 9)
        kept = first
    else:
        with open(path, "ab") as handle:
            handle.write(tail)
        kept = first + episodes("b", 5)
    before = Path(path).read_bytes()
    code, out, err = sync(capsys, service, run.dir)
    assert code == 0, err
    assert f"{path} ended in a torn entry" in err and f"kept the {len(kept)} whole lines" in err
    # Cut off, not deleted: the file and what was set aside are the bytes it held.
    assert Path(path).read_bytes() + Path(f"{path}.torn").read_bytes() == before
    assert sorted(stored_episodes(service)) == sorted(e["id"] for e in kept)


def _as_if_its_writer_died(run_dir: str) -> None:
    """``run.json`` as a process that died before closing its files leaves it: no file known closed whole."""
    rundir = RunDirectory(run_dir)
    document = rundir.read_run()
    assert document is not None and document["sealed_files"], document
    rundir.write_run({**document, "sealed_files": {}})


def _client(svc: LocalTracesService) -> TracesClient:
    return TracesClient(api_key=KEY, base_url=svc.url)


@pytest.mark.parametrize("as_batch", [True, False], ids=["batch-entry", "plain-entries"])
def test_a_batch_of_unknown_fate_is_sent_again_as_the_same_upload(isolated, service, capsys, as_batch):
    # The records of an upload whose answer never came were stored after all.
    lines = [orjson.dumps(r) for r in episodes("u", 4)]
    with _client(service) as client:
        [receipt] = client.upload_lines(lines, line_format="episode")
    run_dir = isolated / "runs" / "run-unknown"
    writer = SegmentWriter(str(run_dir), "episode")
    before = [orjson.dumps(r) for r in episodes("p", 3)]
    writer.append([Frame(before), Frame(lines, batch=as_batch), Frame([orjson.dumps(r) for r in episodes("q", 3)])])
    writer.close()
    assert hashlib.sha256(b"".join(line + b"\n" for line in lines)).hexdigest() == receipt.upload_id
    code, _out, err = sync(capsys, service, str(run_dir))
    assert code == 0, err
    counts = stored_episodes(service)
    if as_batch:
        assert counts == {i: 1 for i in ["u0", "u1", "u2", "u3", "p0", "p1", "p2", "q0", "q1", "q2"]}
        assert service.stats()["replays"] == 1
    else:  # the same lines batched with others: a new upload, stored twice
        assert counts["u0"] == 2


def test_a_run_still_being_written_is_synced_in_passes(isolated, service, capsys):
    run = offline(isolated / "runs")
    first = log_steps(run, 2, 5, prefix="a")
    run.flush()
    code, out, _ = sync(capsys, service, run.dir)
    assert code == 0 and "status" not in out  # still running: its own finish records the status
    assert get_run(service, synced_id(run.dir, service))["status"] == "running"
    second = log_steps(run, 2, 5, prefix="b")
    run.flush()
    assert sync(capsys, service, run.dir)[0] == 0
    run.finish()
    code, out, _ = sync(capsys, service, run.dir)
    assert code == 0 and "status completed" in out
    assert stored_episodes(service) == {i: 1 for i in first + second}


def test_a_spool_without_run_json_is_uploaded_under_its_directorys_run(isolated, service, capsys):
    run_dir = isolated / "runs" / "rank-run"
    writer = SegmentWriter(str(run_dir), "trace")
    writer.append(
        [Frame([orjson.dumps({**trace(f"t{i}"), "run": {"id": "rank-run", "type": "eval"}}) for i in range(3)])]
    )
    writer.close()
    code, out, err = sync(capsys, service, str(run_dir))
    assert code == 0, err
    remote = get_run(service, "rank-run")
    assert remote["trace_count"] == 3 and remote["status"] is None  # its lifecycle is the owner's
    assert remote["context"] == {"source": "prime-runs", "run_type": "eval"}  # no run.json: nothing more known


def test_sync_of_a_directory_of_runs_and_its_exit_statuses(isolated, service, capsys, monkeypatch):
    root = isolated / "runs"
    runs = [offline(root, name=f"r{i}") for i in range(2)]
    for run in runs:
        run.log_episodes(episodes(f"{run.name}-", 3))
        run.finish()
    monkeypatch.setenv("PRIME_RUNS_DIR", str(root))
    code, out, err = sync(capsys, service)  # no PATH: every run in $PRIME_RUNS_DIR
    assert code == 0, err
    assert out.count("3 records uploaded") == 2
    assert len(stored_episodes(service)) == 6
    assert sync(capsys, service, str(root / "missing"))[0] == 2
    code, _out, err = sync(capsys, None, str(root))  # no key anywhere
    assert code == 1 and "no API key" in err and "Traceback" not in err


def test_a_stray_file_among_the_runs_is_passed_over_by_sync_and_ls(isolated, service, capsys):
    root = isolated / "runs"
    run = offline(root, name="beside-notes")
    run.log_episodes(episodes("e", 3))
    run.finish()
    (root / "notes.txt").write_text("not a run")
    code, out, err = sync(capsys, service, str(root))
    assert code == 0 and "Traceback" not in err, err
    assert f"skipped {root / 'notes.txt'}: a file, not a run directory" in err
    assert "3 records uploaded" in out and len(stored_episodes(service)) == 3
    assert cli.main(["ls", str(root), "--json"]) == 0
    listed = capsys.readouterr()
    [row] = orjson.loads(listed.out)
    assert row["id"] == run.id and "skipped" in listed.err


def test_ls_shows_what_is_left_and_when_it_was_synced(isolated, service, capsys, monkeypatch):
    root = isolated / "runs"
    run = offline(root, name="listed")
    run.log_episodes(episodes("e", 7))
    run.finish()
    monkeypatch.setenv("PRIME_RUNS_DIR", str(root))
    capsys.readouterr()
    assert cli.main(["ls"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["NAME", "ID", "STATUS", "RECORDS", "LEFT", "BYTES", "LEFT", "DAMAGED", "LAST", "SYNC"]
    assert out[1].split()[:4] == ["listed", run.id, "completed", "7"] and out[1].endswith("never")
    assert out[1].split()[6] == "0"
    sync(capsys, service, run.dir)
    assert cli.main(["ls", str(root), "--json"]) == 0
    [row] = orjson.loads(capsys.readouterr().out)
    assert (row["records_left"], row["bytes_left"], row["status"], row["records_damaged"]) == (0, 0, "completed", 0)
    assert row["last_sync"] is not None


def test_ls_failures_are_one_line_on_stderr_and_under_json_an_error_document(tmp_path, capsys):
    missing = str(tmp_path / "missing")
    capsys.readouterr()
    assert cli.main(["ls", missing]) == 2
    assert capsys.readouterr() == ("", f"prime-runs: no such directory: {missing}\n")
    assert cli.main(["ls", missing, "--json"]) == 2
    out, err = capsys.readouterr()
    assert orjson.loads(out) == {"error": {"message": f"no such directory: {missing}", "code": None, "status": None}}
    assert err == f"prime-runs: no such directory: {missing}\n"
    with pytest.raises(SystemExit) as stop:  # a bad command line: argparse's exit status and message
        cli.main(["ls", "a", "b", "--json"])
    out, err = capsys.readouterr()
    assert stop.value.code == 2 and orjson.loads(out)["error"]["message"] == "unrecognized arguments: b"
    assert err.splitlines()[-1] == "prime-runs: error: unrecognized arguments: b"


def test_a_run_whose_process_died_is_listed_and_synced_as_crashed(isolated, service, capsys):
    run = offline(isolated / "runs", name="died")
    run.log_episodes(episodes("e", 2))
    run.flush()
    rundir = RunDirectory(run.dir)
    assert rundir.owner_alive()
    run._finisher.run_file.rundir.release_owner_lock()  # what the kernel does when the process dies
    assert not rundir.owner_alive()
    code, out, _ = sync(capsys, service, run.dir)
    assert code == 0 and "status crashed" in out
    remote = get_run(service, synced_id(run.dir, service))
    assert remote["status"] == "crashed" and "ended without finishing" in remote["error"]
    run._finisher.run_file = None  # the "dead" process finishing later changes nothing here
    run.finish()


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_one_rewritten_line_on_a_terminal_and_plain_lines_elsewhere():
    clock = _Clock()
    plain = io.StringIO()
    progress = Progress("run-1", stream=plain, clock=clock)
    progress.start(100, 4_000_000)
    for _ in range(4):
        clock.now += 5.0
        progress.advance(25, 1_000_000)
    progress.close()
    lines = plain.getvalue().splitlines()
    assert lines == [
        "run-1: 50/100 records, 2.0 MB/4.0 MB, 200.0 KB/s, 0:10 left",
        "run-1: 100/100 records, 4.0 MB/4.0 MB, 200.0 KB/s",
    ]
    plain = io.StringIO()
    progress = Progress("run-1", stream=plain, clock=clock)
    progress.start(100, 4_000_000)
    clock.now += 1.0
    progress.advance(100, 4_000_000)  # done before the first line was due
    progress.close()
    assert plain.getvalue() == "run-1: 100/100 records, 4.0 MB/4.0 MB, 4.0 MB/s\n"
    tty = _Tty()
    progress = Progress("run-1", stream=tty, clock=clock)
    progress.start(10, 1000)
    clock.now += 1.0
    progress.advance(10, 1000)
    progress.close()
    assert tty.getvalue().count("\r\x1b[K") == 3 and tty.getvalue().endswith("1.0 KB/1.0 KB, 1.0 KB/s\n")


@pytest.mark.parametrize("omit_line", [False, True], ids=["located", "bisected"])
def test_a_refused_batch_followed_by_batches_that_commit_loses_none_of_its_lines(
    isolated, tmp_path, capsys, monkeypatch, omit_line
):
    # Eight batches in flight: those after the refused one commit before it is settled.
    monkeypatch.setattr("prime_runs._local.sync_file.DEFAULT_TARGET_BATCH_BYTES", 16 * 1024)
    run = offline(isolated / "runs")
    records = episodes("e", 200, poisoned=(40,))
    run.log_episodes(records)
    run.finish()
    with LocalTracesService(tmp_path / "db", reject_marker=MARKER, reject_omit_line=omit_line) as svc:
        code, out, err = sync(capsys, svc, run.dir)
        assert code == 3, err
        assert stored_episodes(svc) == {r["id"]: 1 for i, r in enumerate(records) if i != 40}
        assert sync(capsys, svc, run.dir)[:2] == (
            3,
            f"{run.id}: nothing new to upload to {svc.url}; status completed; "
            f"1 record refused, kept in {run.dir}/rejected-*.jsonl.zst\n",
        )


def test_a_batch_that_fails_while_later_ones_commit_is_bisected_and_nothing_is_stored_twice(
    isolated, service, capsys, monkeypatch
):
    monkeypatch.setattr("prime_runs._local.sync_file.DEFAULT_TARGET_BATCH_BYTES", 16 * 1024)
    run = offline(isolated / "runs")
    records = episodes("e", 200)
    run.log_episodes(records)
    run.finish()
    seen: list[str] = []

    def fail_the_third(key: str) -> None:
        if key not in seen:
            seen.append(key)
        if seen.index(key) == 2:
            raise RuntimeError("boom")  # the service answers 500 for this batch, every time

    service.faults.on_upload = fail_the_third
    code, _out, err = sync(capsys, service, run.dir)
    # Answered 500 twice and not on the service: cut in two, the halves (other bodies) are stored.
    assert code == 0, err
    assert stored_episodes(service) == {r["id"]: 1 for r in records}
    assert sync(capsys, service, run.dir)[0] == 0
    assert stored_episodes(service) == {r["id"]: 1 for r in records}


def test_an_entry_that_no_longer_decodes_loses_only_its_own_lines(isolated, service, capsys, monkeypatch):
    monkeypatch.setattr("prime_runs._local.sync_file.DEFAULT_TARGET_BATCH_BYTES", 16 * 1024)
    run_dir = isolated / "runs" / "run-x"
    writer = SegmentWriter(str(run_dir), "episode")
    writer.append([Frame([orjson.dumps(r) for r in episodes(p, n)]) for p, n in (("a", 50), ("b", 5), ("c", 5))])
    writer.close()
    other = SegmentWriter(str(run_dir), "trace")
    other.append([Frame([orjson.dumps(trace(f"bare-{i}")) for i in range(3)])])
    other.close()
    [path] = segment_files(str(run_dir), ["episode"])
    middle = scan(path).entries[1]
    with open(path, "r+b") as handle:  # the disk lost the middle entry's pages
        handle.seek(middle.data_offset + 8)
        handle.write(b"\0" * (middle.data_bytes - 8))
    for _ in range(2):  # damage: a distinct exit status, the same at every sync
        code, out, _err = sync(capsys, service, str(run_dir))
        assert code == 4 and "5 records lost to damage on disk" in out
    stored = stored_episodes(service)
    assert stored == {i: 1 for i in [f"a{n}" for n in range(50)] + [f"c{n}" for n in range(5)]}
    with service.state.store.reader() as conn:
        assert conn.execute("SELECT COUNT(*) FROM traces WHERE episode_id IS NULL").fetchone()[0] == 3
    [progress] = [
        f
        for n, f in orjson.loads((run_dir / "sync.json").read_bytes())["services"][service.url]["files"].items()
        if n.startswith("episode")
    ]
    assert progress["unreadable"] == [[50, 55]]  # recorded once, however often it is read


def test_a_batch_stored_while_its_answers_failed_is_sent_again_as_the_same_upload(
    isolated, service, capsys, monkeypatch
):
    import prime_traces.server._upload as upload

    monkeypatch.setattr("prime_runs._local.sync_file.DEFAULT_TARGET_BATCH_BYTES", 16 * 1024)
    run = offline(isolated / "runs")
    records = []
    for i in range(300):
        [record] = episodes(f"e{i}-", 1)
        # Three large lines fill a batch but leave room for one small one: where a batch
        # ends depends on the line after it.
        record["info"] = {"pad": "x" * (3800 if i < 12 else 0)}
        records.append(record)
    run.log_episodes(records)
    run.finish()
    process = upload._process
    digests: list[str] = []  # the batches in the order they first arrive (restamped with the run's id there)

    def stored_but_answer_lost(req: Any, body: bytes, digest: str, raw_format: Any) -> Any:
        answer = process(req, body, digest, raw_format)
        if digest not in digests:
            digests.append(digest)
        if digests.index(digest) == 1:
            raise RuntimeError("answer lost")  # the second batch: stored, but every answer to it is a 500
        return answer

    monkeypatch.setattr(upload, "_process", stored_but_answer_lost)
    # Answered 500 twice, but on the service (it says so when asked): counted stored, never sent in other bodies.
    assert sync(capsys, service, run.dir)[0] == 0
    assert stored_episodes(service) == {r["id"]: 1 for r in records}
    monkeypatch.setattr(upload, "_process", process)
    code, _out, err = sync(capsys, service, run.dir)
    assert code == 0, err
    assert stored_episodes(service) == {r["id"]: 1 for r in records}


def test_a_sync_of_only_some_files_uploads_their_records_and_leaves_the_run_alone(isolated, service):
    from prime_runs._local.sync_run import sync_run

    run = offline(isolated / "runs")
    records = episodes("e", 12)
    run.log_episodes(records)
    run.finish()
    names = {os.path.basename(p) for p in segment_files(run.dir, ["episode"])}
    with TracesClient(KEY, service.url) as client:
        report = sync_run(RunDirectory(run.dir), client, only=names)
    assert report.uploaded == 12 and stored_episodes(service) == {r["id"]: 1 for r in records}
    # No POST or PATCH of the run: a live run's own updates are newer than its run.json.
    assert get_run(service, run.id)["status"] is None
