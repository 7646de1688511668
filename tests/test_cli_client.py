"""The client commands of ``prime-traces``, run through ``prime_traces.cli.main`` against the local service."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from _upload_helpers import make_trace, upload

from prime_traces.cli import main
from prime_traces.server import LocalTracesService

pytestmark = pytest.mark.timeout(60)

KEY = "pk-cli-secret-0123456789"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Nothing from the machine's own configuration may leak into a test.
    for name in ("PRIME_API_KEY", "PRIME_TRACES_URL", "PRIME_TEAM_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


@pytest.fixture
def svc(tmp_path: Path) -> Iterator[LocalTracesService]:
    with LocalTracesService(tmp_path / "cli.db", api_key=KEY) as service:
        now = time.time()
        resp = upload(service.url, [
            make_trace("t-1", start=now - 20, run_id="run-1", reward=0.5),
            make_trace("t-2", start=now - 10, run_id="run-1", ok=False, text="ünï ✓"),
            make_trace("t-3", start=now - 5, run_id="run-2"),
        ], context={"source": "cli"}, token=KEY)  # fmt: skip
        assert resp.status_code == 201, resp.text
        yield service


def run(svc: LocalTracesService, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main([*argv, "--api-key", KEY, "--base-url", svc.url])
    out, err = capsys.readouterr()
    assert KEY not in out and KEY not in err
    return code, out, err


def test_list_table_and_json(svc: LocalTracesService, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(svc, capsys, "list", "--run-id", "run-1")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["TRACE", "ID", "CREATED"]
    assert [line.split()[0] for line in lines[1:]] == ["t-2", "t-1"]

    code, out, _ = run(svc, capsys, "list", "--no-has-error", "--context", "source=cli", "--limit", "1", "--json")
    assert code == 0
    page = json.loads(out)
    assert [t["trace_id"] for t in page["items"]] == ["t-3"]
    assert page["items"][0]["created_at"].endswith("Z")
    cursor = page["next_cursor"]
    assert cursor

    code, out, _ = run(svc, capsys, "list", "--no-has-error", "--context", "source=cli", "--limit", "1",
                       "--cursor", cursor, "--json")  # fmt: skip
    assert [t["trace_id"] for t in json.loads(out)["items"]] == ["t-1"]

    code, out, _ = run(svc, capsys, "list", "--has-error", "--limit", "1")
    assert out.splitlines()[1].split()[0] == "t-2"
    code, out, _ = run(svc, capsys, "list", "--run-id", "nothing")
    assert (code, out) == (0, "no traces\n")


def test_get_summary_json_and_raw(svc: LocalTracesService, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(svc, capsys, "get", "t-1")
    assert code == 0
    fields = dict(line.split(None, 1) for line in out.splitlines())
    assert fields["trace_id"] == "t-1" and fields["run_id"] == "run-1" and fields["reward"] == "0.5"
    assert fields["context"] == "source=cli"

    code, out, _ = run(svc, capsys, "get", "t-1", "--json")
    assert json.loads(out)["score"] == {"reward": 0.5, "outcome": "completed"}

    code, out, _ = run(svc, capsys, "get", "t-2", "--raw")
    assert code == 0
    assert orjson.loads(out)["id"] == "t-2"
    assert "ünï ✓" in out  # the stored UTF-8 bytes, written through unchanged


def test_download_and_delete(svc: LocalTracesService, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    dest = tmp_path / "t-1.json"
    code, out, _ = run(svc, capsys, "download", "t-1", str(dest))
    assert code == 0 and out.startswith(f"saved {dest} (")
    assert orjson.loads(dest.read_bytes())["id"] == "t-1"

    code, out, _ = run(svc, capsys, "delete", "t-1")
    assert (code, out) == (0, "deleted trace t-1\n")
    code, out, _ = run(svc, capsys, "delete-run", "run-1")
    assert (code, out) == (0, "deleted the traces of run run-1\n")
    code, out, _ = run(svc, capsys, "list", "--json")
    assert [t["trace_id"] for t in json.loads(out)["items"]] == ["t-3"]


def test_errors_are_one_line_on_stderr(svc: LocalTracesService, capsys: pytest.CaptureFixture[str],
                                       tmp_path: Path) -> None:  # fmt: skip
    code, out, err = run(svc, capsys, "get", "missing")
    assert (code, out) == (1, "")
    assert err.count("\n") == 1 and err.startswith("prime-traces: ")
    assert "trace_not_found" in err and "Traceback" not in err

    dest = tmp_path / "never.json"
    code, out, err = run(svc, capsys, "download", "missing", str(dest))
    assert code == 1 and err.count("\n") == 1 and not dest.exists()

    code, out, err = run(svc, capsys, "delete", "missing")
    assert code == 1 and err.startswith("prime-traces: HTTP 404")


def test_a_wrong_key_is_never_printed(svc: LocalTracesService, capsys: pytest.CaptureFixture[str]) -> None:
    wrong = "pk-wrong-key-987654"
    code = main(["list", "--api-key", wrong, "--base-url", svc.url])
    out, err = capsys.readouterr()
    assert code == 1 and out == ""
    assert err.startswith("prime-traces: HTTP 401") and err.count("\n") == 1
    assert wrong not in err and KEY not in err


def test_no_key_fails_locally(svc: LocalTracesService, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["list", "--base-url", svc.url])
    out, err = capsys.readouterr()
    assert code == 1 and out == ""
    assert err.startswith("prime-traces: ") and "no API key" in err and err.count("\n") == 1


def test_key_and_url_come_from_the_environment(svc: LocalTracesService, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv("PRIME_API_KEY", KEY)
    monkeypatch.setenv("PRIME_TRACES_URL", svc.url + "/api/v1/")
    assert main(["get", "t-3", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["trace_id"] == "t-3" and err == ""


def _jsonl(*docs: dict) -> bytes:
    return b"".join(orjson.dumps(d) + b"\n" for d in docs)


@pytest.mark.parametrize("tail", [b'{"id": "t-torn", "timing": {"sta', b""], ids=["torn-last-line", "whole"])
def test_upload_sets_a_torn_last_line_aside_and_uploads_the_rest(svc, capsys, tmp_path, tail):
    now = time.time()
    path = tmp_path / "traces.jsonl"
    path.write_bytes(_jsonl(make_trace("u-1", start=now), make_trace("u-2", start=now)) + tail)
    code, out, err = run(svc, capsys, "upload", str(path))
    assert code == 0, err
    assert out.endswith(f"1 batch(es) committed from {path}\n")
    assert run(svc, capsys, "get", "u-2")[0] == 0
    if tail:
        assert "the last line is torn" in err and f"set aside in {path}.torn" in err
        assert (tmp_path / "traces.jsonl.torn").read_bytes() == tail
    else:
        assert err == "" and not (tmp_path / "traces.jsonl.torn").exists()


def test_upload_keeps_a_whole_last_line_without_its_newline(svc, capsys, tmp_path):
    now = time.time()
    path = tmp_path / "traces.jsonl"
    path.write_bytes(_jsonl(make_trace("v-1", start=now)) + orjson.dumps(make_trace("v-2", start=now)))
    code, _out, err = run(svc, capsys, "upload", str(path))
    assert (code, err) == (0, "")
    assert run(svc, capsys, "get", "v-2")[0] == 0
