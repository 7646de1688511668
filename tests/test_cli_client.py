"""The client commands of ``prime-traces``, run through ``prime_traces.cli.main`` against the local service."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from _upload_helpers import make_trace, upload

from prime_traces.cli import build_parser, main
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
        resp = upload(
            service.url,
            [
                make_trace("t-1", start=now - 20, run_id="run-1", reward=0.5),
                make_trace("t-2", start=now - 10, run_id="run-1", ok=False, text="ünï ✓"),
                make_trace("t-3", start=now - 5, run_id="run-2"),
            ],
            context={"source": "cli"},
            token=KEY,
        )
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

    code, out, _ = run(
        svc, capsys, "list", "--no-has-error", "--context", "source=cli", "--limit", "1", "--cursor", cursor, "--json"
    )
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


def test_errors_are_one_line_on_stderr(
    svc: LocalTracesService, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
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


def test_key_and_url_come_from_the_environment(
    svc: LocalTracesService, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
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


# -- --json on every command, failures included -------------------------------------


def test_download_and_the_deletes_print_one_json_document(
    svc: LocalTracesService, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    dest = tmp_path / "t-1.json"
    code, out, err = run(svc, capsys, "download", "t-1", str(dest), "--json")
    assert (code, err) == (0, "")
    assert json.loads(out) == {"trace_id": "t-1", "path": str(dest), "size_bytes": dest.stat().st_size}

    code, out, err = run(svc, capsys, "delete", "t-1", "--json")
    assert (code, err) == (0, "")
    assert json.loads(out) == {"deleted": "trace", "trace_id": "t-1", "created_at": None}
    code, out, err = run(svc, capsys, "delete-run", "run-1", "--json")
    assert (code, err) == (0, "")
    assert json.loads(out) == {"deleted": "run", "run_id": "run-1"}


@pytest.mark.parametrize(
    "argv, code, status",
    [
        (["get", "missing"], "trace_not_found", 404),
        (["download", "missing", "DEST"], "trace_not_found", 404),
        (["delete", "missing"], "trace_not_found", 404),
        (["delete-run", "no-such-run"], "run_not_found", 404),
        (["list", "--cursor", "not-a-cursor"], "invalid_cursor", 400),
        (["upload", "no-such-file.jsonl"], None, None),
    ],
    ids=["get", "download", "delete", "delete-run", "list", "upload"],
)
def test_a_failure_under_json_is_an_error_document_and_one_line_on_stderr(svc, capsys, tmp_path, argv, code, status):
    argv = [str(tmp_path / a) if a in ("DEST", "no-such-file.jsonl") else a for a in argv]
    exit_status, out, err = run(svc, capsys, *argv, "--json")
    assert exit_status == 1
    error = json.loads(out)["error"]
    assert (error["code"], error["status"]) == (code, status)
    assert err == f"prime-traces: {error['message']}\n"
    assert "Traceback" not in err


def test_a_wrong_key_under_json_is_neither_in_the_document_nor_on_stderr(svc, capsys):
    wrong = "pk-wrong-key-987654"
    code = main(["list", "--json", "--api-key", wrong, "--base-url", svc.url])
    out, err = capsys.readouterr()
    assert code == 1
    assert json.loads(out)["error"]["status"] == 401 and err.startswith("prime-traces: HTTP 401")
    assert wrong not in out + err and KEY not in out + err


# -- what can be checked locally is, before any request ------------------------------


def refused(svc: LocalTracesService, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[str, str]:
    """``main(argv)`` must exit 2 on the command line alone: no request reaches ``svc``."""
    before = svc.stats()["requests"]
    with pytest.raises(SystemExit) as stop:
        main([*argv, "--api-key", KEY, "--base-url", svc.url])
    out, err = capsys.readouterr()
    assert stop.value.code == 2
    assert svc.stats()["requests"] == before
    assert KEY not in out + err
    return out, err


@pytest.mark.parametrize(
    "argv, problem",
    [
        (["list", "--limit", "0"], "argument --limit: must be between 1 and 100, not 0"),
        (["list", "--limit", "101"], "argument --limit: must be between 1 and 100, not 101"),
        (["list", "--limit", "ten"], "argument --limit: expected an integer, got 'ten'"),
        (["list", "--created-after", "yesterday"], "argument --created-after: expected an ISO 8601 time"),
        (["list", "--created-before", "2026-13-01T00:00:00Z"], "argument --created-before: expected an ISO 8601"),
        (["list", "--reward-min", "0.9", "--reward-max", "0.1"], "--reward-min 0.9 is above --reward-max 0.1"),
        (["list", "--reward-max", "nan"], "argument --reward-max: expected a finite number, got 'nan'"),
        (["list", "--sort", "created_at desc"], "argument --sort: expected a sort key without blanks"),
        (["list", "--sort", ""], "argument --sort: expected a sort key without blanks"),
        (["delete", "t-1", "--created-at", "noon"], "argument --created-at: expected an ISO 8601 time"),
        (["upload", "x.jsonl", "--max-in-flight", "9"], "argument --max-in-flight: must be between 1 and 8, not 9"),
    ],
)
def test_bad_arguments_exit_2_before_any_request(svc, capsys, argv, problem):
    out, err = refused(svc, capsys, *argv)
    assert out == ""
    lines = err.splitlines()
    assert lines[0].startswith("usage: prime-traces ")
    assert lines[-1].startswith(f"prime-traces {argv[0]}: error: {problem}")

    out, err = refused(svc, capsys, *argv, "--json")
    error = json.loads(out)["error"]
    assert error["message"].startswith(problem) and (error["code"], error["status"]) == (None, None)
    assert err.splitlines()[-1] == f"prime-traces {argv[0]}: error: {error['message']}"


def test_arguments_that_pass_the_local_checks_reach_the_service(svc, capsys):
    code, out, err = run(
        svc,
        capsys,
        "list",
        "--created-after",
        "2020-01-01T00:00:00Z",
        "--created-before",
        "2100-01-01T00:00:00+00:00",
        "--reward-min",
        "0.5",
        "--reward-max",
        "0.5",
        "--limit",
        "100",
        "--json",
    )
    assert (code, err) == (0, "")
    assert [t["trace_id"] for t in json.loads(out)["items"]] == ["t-1"]


def test_log_level_is_an_option_of_prime_traces_and_still_of_serve(svc, capsys):
    # (Its effect on the log is shown in a process of its own: test_cli_processes.py.)
    assert main(["--log-level", "info", "get", "t-3", "--api-key", KEY, "--base-url", svc.url]) == 0
    args = build_parser().parse_args(["serve", "--log-level", "debug"])
    assert (args.serve_log_level, args.log_level) == ("DEBUG", "WARNING")
    with pytest.raises(SystemExit) as stop:
        main(["--log-level", "chatty", "list"])
    assert stop.value.code == 2 and "argument --log-level: unknown level 'chatty'" in capsys.readouterr().err
