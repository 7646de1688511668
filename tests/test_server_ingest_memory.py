"""Ingest memory: an upload of many small traces costs about its body, not 20 times it.

The service validates every line before it stores any (all or nothing), then
stores the rows in chunks inside one transaction; it never holds every
parsed line and its row at once. Peak memory is measured with tracemalloc
around one upload to the service running in this process.
"""

from __future__ import annotations

import time
import tracemalloc

import pytest
import requests
from _upload_checks import MIB, committed, counts
from _wire import auth, build_upload, episode, jsonl, post_upload, trace

from prime_traces.server import LocalTracesService

pytestmark = pytest.mark.timeout(120)


def small_trace(i: int, now: float) -> bytes:
    """A ~230-byte trace line: the columns the service extracts, little else."""
    return (
        b'{"id":"t-%08d","run":{"id":"run-1","type":"eval","work":{"step":%d}},'
        b'"agent":{"name":"agent-a","config":{"model":"m-1"}},"task":{"key":"task-%d"},'
        b'"rewards":{"r":{"score":1.0,"weight":1.0}},"stop_condition":"completed","ok":true,'
        b'"timing":{"start":%.3f,"scoring":{"end":%.3f}}}'
    ) % (i, i // 100, i % 50, now, now + 1.5)


def small_body(target_bytes: int) -> bytes:
    now = time.time()
    lines, size, i = [], 0, 0
    while size < target_bytes:
        line = small_trace(i, now)
        lines.append(line)
        size += len(line) + 1
        i += 1
    return b"\n".join(lines) + b"\n"


@pytest.mark.parametrize("coding", ["gzip", "none"])
def test_peak_memory_of_an_upload_of_small_traces_is_near_its_body(tmp_path, coding):
    body = small_body(10 * MIB)
    request = build_upload(body, coding=coding)  # built before measuring: the client's copies are not the service's
    with LocalTracesService(tmp_path / "t.db") as svc:
        post_upload(svc.url, [trace("t-warm")])  # every code path loaded before measuring
        tracemalloc.start()
        try:
            baseline = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            resp = post_upload(svc.url, request=request, timeout=120)
            peak = tracemalloc.get_traced_memory()[1] - baseline
        finally:
            tracemalloc.stop()
        committed(resp, body)
        assert counts(svc)["traces"] == 1 + body.count(b"\n")
    assert peak < 4 * len(body), f"peak traced memory {peak / MIB:.0f} MiB for a {len(body) / MIB:.0f} MiB body"


def test_rows_stored_in_chunks_keep_their_own_documents(tmp_path):
    # Enough rows for several insert chunks, after a delete (AUTOINCREMENT never reuses a seq).
    with LocalTracesService(tmp_path / "t.db") as svc:
        first = [trace(f"old-{i}", run={"id": "run-old", "type": "eval"}) for i in range(10)]
        committed(post_upload(svc.url, first), jsonl(first))
        deleted = requests.delete(f"{svc.url}/api/v1/traces", params={"run_id": "run-old"}, headers=auth(), timeout=30)
        assert deleted.status_code == 202
        body = small_body(MIB)
        committed(post_upload(svc.url, body), body)
        episodes = [episode(f"ep-{e}", [trace(f"m-{e}-{i}") for i in range(700)]) for e in range(4)]
        committed(post_upload(svc.url, episodes, line_format="episode"), jsonl(episodes))
        with svc.state.store.reader() as conn:
            rows = conn.execute(
                "SELECT t.seq, t.trace_id, t.size_bytes, t.episode_id, d.raw "
                "FROM traces t JOIN trace_docs d USING (seq) ORDER BY t.seq"
            ).fetchall()
            episode_rows = conn.execute(
                "SELECT e.seq, e.episode_id, "
                "(SELECT COUNT(*) FROM traces t WHERE t.episode_seq = e.seq) AS members "
                "FROM episodes e ORDER BY e.seq"
            ).fetchall()
            docs = conn.execute("SELECT COUNT(*) FROM trace_docs").fetchone()[0]
        lines = body.splitlines()
        assert len(rows) == docs == len(lines) + 4 * 700
        assert min(r["seq"] for r in rows) > 10
        for row, line in zip(rows, lines):
            assert bytes(row["raw"]) == line
            assert row["trace_id"].encode() in line and row["size_bytes"] == len(line)
        for row in rows[len(lines) :]:
            assert row["trace_id"].encode() in bytes(row["raw"])
            assert row["trace_id"].startswith(f"m-{row['episode_id'].removeprefix('ep-')}-")
        assert [(r["episode_id"], r["members"]) for r in episode_rows] == [(f"ep-{e}", 700) for e in range(4)]
        raw = requests.get(f"{svc.url}/api/v1/traces/t-00000123", params={"raw": "true"}, headers=auth(), timeout=30)
        assert raw.content == lines[123]
