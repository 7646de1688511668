"""The per-credential in-flight limit (contract §9) and concurrent identical uploads.

Uploads are held inside the service by ``faults.before_upload`` (called on the
request thread after the body is read, i.e. while the upload counts as in
flight), so every interleaving here is decided by the test, not by timing.
"""

from __future__ import annotations

import hashlib
import threading
from concurrent.futures import Future, ThreadPoolExecutor, as_completed

import pytest
import requests
from _wire import ACCEPT_ENCODING, jsonl, post_upload, trace

from prime_traces.server import LocalTracesService
from prime_traces.server._http import producer_of

WAIT_S = 10.0


class Gate:
    """A ``before_upload`` hook: counts uploads that reach it and holds them until opened.

    Holding is bounded by ``WAIT_S``, so a failing test cannot deadlock the service.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.arrived = 0
        self.opened = threading.Event()

    def __call__(self) -> None:
        with self._cond:
            self.arrived += 1
            self._cond.notify_all()
        self.opened.wait(WAIT_S)

    def wait_arrivals(self, n: int) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: self.arrived >= n, WAIT_S), f"{self.arrived} of {n} arrived"

    def open(self) -> None:
        self.opened.set()


def saturated(resp: requests.Response, retry_after: float) -> None:
    assert resp.status_code == 503, resp.text
    assert resp.json()["error"]["code"] == "writer_pool_saturated"
    assert float(resp.headers["Retry-After"]) == retry_after
    assert resp.headers.get("Accept-Encoding") == ACCEPT_ENCODING


def test_sixteen_uploads_against_a_limit_of_eight(tmp_path):
    docs = [[trace(f"t-{i}")] for i in range(16)]
    gate = Gate()
    with (
        LocalTracesService(
            tmp_path / "t.db", max_uploads_in_flight=8, saturated_retry_after_s=2.5, before_upload=gate
        ) as svc,
        ThreadPoolExecutor(16) as pool,
    ):
        try:
            futures: dict[Future[requests.Response], int] = {
                pool.submit(post_upload, svc.url, d): i for i, d in enumerate(docs)
            }
            gate.wait_arrivals(8)
            # Eight are held inside the service, so the other eight are answered now.
            done = as_completed(futures, timeout=WAIT_S)
            refused = [futures[next(done)] for _ in range(8)]
            assert svc.stats()["in_flight"] == {producer_of("test-token"): 8}
            assert gate.arrived == 8
        finally:
            gate.open()
        for future, i in futures.items():
            resp = future.result(WAIT_S)
            if i in refused:
                saturated(resp, 2.5)
            else:
                assert resp.status_code == 201, resp.text
        for i in refused:  # the client retries with the same bytes and key
            assert post_upload(svc.url, docs[i]).status_code == 201
        stats = svc.stats()
        assert (stats["uploads"], stats["replays"]) == (16, 0)
        assert stats["rejections"] == {"writer_pool_saturated": 8}
        assert stats["in_flight"] == {}
        assert stats["max_in_flight"] == {producer_of("test-token"): 8}


def test_credentials_do_not_share_a_limit(tmp_path):
    gate = Gate()
    a, b = producer_of("token-a"), producer_of("token-b")
    with (
        LocalTracesService(tmp_path / "t.db", max_uploads_in_flight=2, before_upload=gate) as svc,
        ThreadPoolExecutor(4) as pool,
    ):
        try:
            held = [pool.submit(post_upload, svc.url, [trace(f"a-{i}")], token="token-a") for i in range(2)]
            gate.wait_arrivals(2)
            saturated(post_upload(svc.url, [trace("a-2")], token="token-a"), 1.0)
            # token-a is at its limit; token-b still gets two uploads in.
            held += [pool.submit(post_upload, svc.url, [trace(f"b-{i}")], token="token-b") for i in range(2)]
            gate.wait_arrivals(4)
            saturated(post_upload(svc.url, [trace("b-2")], token="token-b"), 1.0)
            assert svc.stats()["in_flight"] == {a: 2, b: 2}
        finally:
            gate.open()
        assert [f.result(WAIT_S).status_code for f in held] == [201] * 4
        stats = svc.stats()
        assert stats["in_flight"] == {}
        assert stats["max_in_flight"] == {a: 2, b: 2}


def test_every_kind_of_answer_gives_its_slot_back(tmp_path):
    # With a limit of 1, a slot leaked by any path would refuse the final upload.
    with LocalTracesService(tmp_path / "t.db", max_uploads_in_flight=1) as svc:
        docs = [trace("t-1")]
        assert post_upload(svc.url, docs, key="sha256:bad").status_code == 400
        assert post_upload(svc.url, [b"not json"]).status_code == 400
        assert post_upload(svc.url, docs, coding="br").status_code == 415
        assert post_upload(svc.url, docs, encoded=b"not gzip").status_code == 400
        svc.faults.fail_count = 1
        assert post_upload(svc.url, docs).status_code == 503
        svc.faults.drop_after_body = 1
        with pytest.raises(requests.ConnectionError):
            post_upload(svc.url, docs)
        assert svc.stats()["in_flight"] == {}
        assert post_upload(svc.url, docs).status_code == 200  # committed before the drop
        assert post_upload(svc.url, [trace("t-2")]).status_code == 201
        assert svc.stats()["max_in_flight"] == {producer_of("test-token"): 1}


def test_identical_uploads_at_once_commit_once(tmp_path):
    barrier = threading.Barrier(2, timeout=WAIT_S)
    docs = [trace(f"t-{i}") for i in range(50)]
    with LocalTracesService(tmp_path / "t.db", before_upload=barrier.wait) as svc, ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(post_upload, svc.url, docs) for _ in range(2)]
        answers = sorted((f.result(WAIT_S) for f in futures), key=lambda r: r.status_code)
        assert [r.status_code for r in answers] == [200, 201]
        assert answers[0].json() == answers[1].json()
        stats = svc.stats()
        assert (stats["uploads"], stats["replays"], stats["lines"]) == (1, 1, len(docs))
        with svc.state.store.reader() as conn:
            assert conn.execute("SELECT COUNT(*) FROM traces").fetchone()[0] == len(docs)
            assert conn.execute("SELECT COUNT(*) FROM uploads").fetchone()[0] == 1
        assert answers[1].json()["upload_id"] == hashlib.sha256(jsonl(docs)).hexdigest()
