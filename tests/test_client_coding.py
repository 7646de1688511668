"""Body coding end to end: auto's gzip probe, then zstd; a service that stops taking zstd (contract §2, §9)."""

from __future__ import annotations

import hashlib
import http.server
import threading

import orjson
import requests
from _client_helpers import client_for, lines_of, producer, stored_trace_ids

from prime_traces._upload.batching import iter_batches
from prime_traces.server import LocalTracesService


def test_auto_compression_sends_zstd_only_after_the_service_advertises_it(tmp_path):
    import prime_traces.server._upload as upload_route

    seen: list[tuple[str, int]] = []
    original = upload_route._process

    def capture(req, wire, digest, raw_format):
        coding = b"Content-Encoding: zstd" in wire[0] and "zstd" or "gzip"
        seen.append((coding, svc.stats()["max_in_flight"].get(producer(), 0)))
        return original(req, wire, digest, raw_format)

    upload_route._process = capture
    try:
        with LocalTracesService(tmp_path / "db") as svc:
            with client_for(svc, max_in_flight=4) as client:
                client.upload_lines(lines_of(8, pad=900), target_batch_bytes=2_000)
    finally:
        upload_route._process = original
    # The first batch asks alone, in gzip; once zstd is advertised, the rest go in zstd.
    assert seen[0] == ("gzip", 1)
    assert [coding for coding, _ in seen[1:]] == ["zstd"] * 7


def test_zstd_uploads_decode_to_the_same_bytes(service, monkeypatch):
    import prime_traces.server._upload as upload_route

    zstd_parts: list[bool] = []
    original = upload_route._process

    def capture(req, wire, digest, raw_format):
        zstd_parts.append(b"Content-Encoding: zstd" in wire[0])
        return original(req, wire, digest, raw_format)

    monkeypatch.setattr(upload_route, "_process", capture)
    with client_for(service, compression="zstd") as client:
        (receipt,) = client.upload_lines(lines_of(4))
    assert zstd_parts == [True]
    # The service checks the key against what it decoded: the same bytes.
    assert receipt.upload_id == hashlib.sha256(b"".join(line + b"\n" for line in lines_of(4))).hexdigest()


class _ZstdRefusingGateway:
    """A gateway in front of the service that passes uploads on, until ``refuse`` is set.

    From then on it answers 415 (with ``Accept-Encoding: gzip``) to an upload
    whose ``traces`` part is zstd, and its answers advertise gzip only: a
    service that stopped taking zstd. ``seen`` is ``(coding, key, status)``
    per upload, in order.
    """

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.refuse = threading.Event()
        self.seen: list[tuple[str, str, int]] = []
        gateway = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                gateway.answer(self)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), name="zstd-gateway")
        self.thread.start()

    def answer(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        body = handler.rfile.read(int(handler.headers["Content-Length"]))
        coding = "zstd" if b"\r\nContent-Encoding: zstd\r\n" in body else "gzip"
        if coding == "zstd" and self.refuse.is_set():
            status = 415
            content = orjson.dumps({"error": {"code": "unsupported_content_encoding", "message": "use gzip"}})
        else:
            passed = {k: v for k, v in handler.headers.items() if k.lower() not in ("host", "content-length")}
            resp = requests.post(self.upstream + handler.path, data=body, headers=passed, timeout=30)
            status, content = resp.status_code, resp.content
        accepted = "gzip" if self.refuse.is_set() else "zstd, gzip"
        self.seen.append((coding, handler.headers["Idempotency-Key"], status))
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Accept-Encoding", accepted)
        handler.send_header("Content-Length", str(len(content)))
        handler.end_headers()
        handler.wfile.write(content)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(30)


def test_a_service_that_stops_taking_zstd_gets_the_refused_batch_again_in_gzip(service):
    gateway = _ZstdRefusingGateway(service.url)
    before, after = lines_of(4, pad=900, prefix="a"), lines_of(4, pad=900, prefix="b")
    try:
        with client_for(gateway, max_in_flight=1) as client:
            client.upload_lines(before, target_batch_bytes=2_000)
            gateway.refuse.set()
            receipts = client.upload_lines(after, target_batch_bytes=2_000)
    finally:
        gateway.close()
    a, b = ([x.key for x in iter_batches(lines, target_batch_bytes=2_000)] for lines in (before, after))
    assert len(a) == len(b) == 4
    # "auto": the first batch asks in gzip, then zstd once the service advertises it.
    assert gateway.seen[:4] == [("gzip", a[0], 201), *(("zstd", key, 201) for key in a[1:])]
    # Refused once, that batch goes again, the same bytes under the same key, in gzip; the rest follow in gzip.
    assert gateway.seen[4:] == [("zstd", b[0], 415), *(("gzip", key, 201) for key in b)]
    assert [r.upload_id for r in receipts] == [key.removeprefix("sha256:") for key in b]
    assert stored_trace_ids(service) == {f"{p}-{i}" for p in "ab" for i in range(4)}
    assert service.stats()["uploads"] == 8 and service.stats()["replays"] == 0


def test_auto_compression_asks_with_a_small_first_batch(tmp_path, monkeypatch):
    import prime_traces._upload.uploader as uploader
    import prime_traces.server._upload as upload_route

    monkeypatch.setattr(uploader, "PROBE_BATCH_BYTES", 2_000)  # stands for 1 MiB beside 30 MiB batches
    seen: list[tuple[str, int]] = []
    original = upload_route._process

    def capture(req, wire, digest, raw_format):
        seen.append(("zstd" if b"Content-Encoding: zstd" in wire[0] else "gzip", len(wire[0])))
        return original(req, wire, digest, raw_format)

    monkeypatch.setattr(upload_route, "_process", capture)
    with LocalTracesService(tmp_path / "db") as svc:
        with client_for(svc, max_in_flight=4) as client:
            sizes: list[int] = []
            client.upload_lines(
                lines_of(20, pad=900),
                target_batch_bytes=20_000,
                on_batch=lambda b, _r: sizes.append(len(b.line_indexes)),
            )
            # Once the coding is known, no upload of this client asks again.
            client.upload_lines(lines_of(20, pad=900), target_batch_bytes=20_000)
    # The first batch asked in gzip, holding what fits 2,000 bytes; the rest went in zstd, in full batches,
    # and the second upload, with the coding known, did not ask again.
    first = [len(b.line_indexes) for b in iter_batches(lines_of(20, pad=900), target_batch_bytes=2_000)][0]
    full = [len(b.line_indexes) for b in iter_batches(lines_of(20, pad=900), target_batch_bytes=20_000)]
    assert sizes[0] == first < full[0] and sum(sizes) == 20
    assert [coding for coding, _ in seen] == ["gzip"] + ["zstd"] * (len(seen) - 1)
    assert len(seen) == len(sizes) + len(full)
