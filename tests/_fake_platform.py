"""A stand-in for the hosted platform: only the run routes of contract §10, 404 for anything else.

It records every request (method, path, headers, JSON body) and answers the
way the hosted platform does, so a test can check what a client sent and that
it asked for no route the platform lacks. ``fail`` queues answers to give
instead, per route::

    with FakePlatform() as platform:
        platform.fail["POST /api/v1/evaluations/"] = [502]
        ...
        assert platform.paths() == ["POST /api/v1/environmentshub/resolve", ...]
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import requests


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class PlatformRun:
    kind: str
    body: dict[str, Any]
    status: str = "RUNNING"
    metadata: dict[str, Any] | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    steps: dict[int, dict[str, Any]] = field(default_factory=dict)
    samples: list[dict[str, Any]] = field(default_factory=list)


_ROOT = r"/api/(?:v1|internal)"


class FakePlatform:
    """The hosted routes on an ephemeral loopback port; thread-safe; a context manager."""

    def __init__(self, *, frontend: str = "https://app.example") -> None:
        self.frontend = frontend
        self.seen: list[Seen] = []
        self.runs: dict[str, PlatformRun] = {}
        self.environments: dict[str, str] = {}
        #: Statuses to answer instead, in order, per "METHOD path" (the path as requested).
        self.fail: dict[str, list[int]] = defaultdict(list)
        #: Where record uploads (``POST /api/v1/traces``) are passed on to: a local Traces service's URL.
        self.traces_upstream: str | None = None
        #: The answer to record uploads once ``traces_refuse_after`` were passed on: (status, error code);
        #: ``(403, "service_not_enabled")`` is an account without Prime Traces.
        self.traces_refusal: tuple[int, str] | None = None
        self.traces_refuse_after = 0
        self._traces_passed = 0
        #: Legacy training tables put to the presigned URL, by storage key.
        self.objects: dict[str, bytes] = {}
        self.confirmed: list[dict[str, Any]] = []
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        platform = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: Any) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                content_type = self.headers.get("Content-Type") or ""
                body = json.loads(raw) if raw and content_type.startswith("application/json") else raw or None
                status, answer = platform._answer(self.command, self.path, dict(self.headers.items()), body)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-platform", daemon=True)

    def __enter__(self) -> FakePlatform:
        self._thread.start()
        return self

    def __exit__(self, *_exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def paths(self) -> list[str]:
        with self._lock:
            return [f"{s.method} {s.path}" for s in self.seen]

    def bodies(self, method: str, pattern: str) -> list[Any]:
        """The bodies of the requests whose path matches ``pattern`` (a regular expression)."""
        with self._lock:
            return [s.body for s in self.seen if s.method == method and re.fullmatch(pattern, s.path)]

    def _new_id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._ids)}"

    def _answer(self, method: str, path: str, headers: dict[str, str], body: Any) -> tuple[int, Any]:
        if path == "/api/v1/traces" and method == "POST":
            return self._traces(headers, body)
        with self._lock:
            self.seen.append(Seen(method, path, headers, body))
            queued = self.fail.get(f"{method} {path}")
            if queued:
                return queued.pop(0), {"detail": "injected failure"}
            if path.startswith("/storage/") and method == "PUT":
                self.objects[path.removeprefix("/storage/")] = body or b""
                return 200, {}
            if not headers.get("Authorization", "").startswith("Bearer "):
                return 401, {"detail": "Not authenticated"}
            return self._route(method, path.split("?", 1)[0], body or {})

    def _route(self, method: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        if match := re.fullmatch(_ROOT + r"/environmentshub/([^/]+)/([^/]+)/@latest", path):
            if method == "GET":
                return 200, {"data": {"id": self._environment(f"{match[1]}/{match[2]}")}}
        if re.fullmatch(_ROOT + r"/environmentshub/resolve", path) and method == "POST":
            return 200, {"data": {"id": self._environment(body["name"])}}
        if re.fullmatch(_ROOT + r"/evaluations/", path) and method == "POST":
            run_id = self._new_id("eval")
            self.runs[run_id] = PlatformRun("eval", body, metadata=body.get("metadata"))
            viewer = f"{self.frontend}/dashboard/evaluations/{run_id}"
            return 201, {"evaluation_id": run_id, "name": body.get("name"), "status": "RUNNING", "viewer_url": viewer}
        if match := re.fullmatch(_ROOT + r"/evaluations/([^/]+)(/finalize|/samples)?", path):
            return self._evaluation(method, match[1], match[2] or "", body)
        if re.fullmatch(_ROOT + r"/rft/external-runs", path) and method == "POST":
            run_id = self._new_id("run")
            self.runs[run_id] = PlatformRun("train", body)
            return 201, {"run": {"id": run_id, "name": body.get("name"), "status": "RUNNING"}}
        if match := re.fullmatch(_ROOT + r"/rft/external-runs/([^/]+)/status", path):
            if method == "PUT":
                return self._close(match[1], body.get("status", "").upper(), body.get("error_message"))
        if re.fullmatch(_ROOT + r"/rft/finalize", path) and method == "POST":
            run = self.runs.get(body.get("run_id", ""))
            if run is None:
                return 404, {"detail": "run not found"}
            run.status = "COMPLETED"
            return 200, {"data": {"status": "success"}}
        if re.fullmatch(_ROOT + r"/rft/samples/presign", path) and method == "POST":
            key = f"runs/{body['run_id']}/step-{body['step']}-{len(self.objects)}.parquet"
            return 200, {"data": {"presignedUrl": f"{self.url}/storage/{key}", "s3Key": key, "expiresIn": 900}}
        if re.fullmatch(_ROOT + r"/rft/samples/confirm", path) and method == "POST":
            self.confirmed.append(body)
            return 200, {"data": {"status": "success"}}
        if re.fullmatch(_ROOT + r"/rft/metrics", path) and method == "POST":
            run = self.runs.get(body.get("run_id", ""))
            if run is None:
                return 404, {"detail": "run not found"}
            metrics = dict(body.get("metrics") or {})
            run.steps[int(metrics.get("step", -1))] = metrics
            return 200, {"data": {"status": "success"}}
        return 404, {"detail": "Not Found"}

    def _traces(self, headers: dict[str, str], body: Any) -> tuple[int, Any]:
        with self._lock:
            self.seen.append(Seen("POST", "/api/v1/traces", headers, None))
            refusal = self.traces_refusal if self._traces_passed >= self.traces_refuse_after else None
            if refusal is None:
                self._traces_passed += 1
        if refusal is not None:
            status, code = refusal
            return status, {"error": {"code": code, "message": f"refused by the test ({code})"}}
        if self.traces_upstream is None:
            return 404, {"detail": "Not Found"}
        # Outside the lock: the upstream service may take its time, and uploads go on side by side.
        skip = {"host", "content-length", "connection", "accept-encoding"}
        passed = {name: value for name, value in headers.items() if name.lower() not in skip}
        answer = requests.post(f"{self.traces_upstream}/api/v1/traces", data=body, headers=passed, timeout=60)
        return answer.status_code, answer.json()

    def _environment(self, name: str) -> str:
        return self.environments.setdefault(name, f"env-{len(self.environments) + 1}")

    def _evaluation(self, method: str, run_id: str, action: str, body: dict[str, Any]) -> tuple[int, Any]:
        run = self.runs.get(run_id)
        if run is None or run.kind != "eval":
            return 404, {"detail": "evaluation not found"}
        if action == "/finalize" and method == "POST":
            run.status = "COMPLETED"
            run.metrics.update(body.get("metrics") or {})
            return 200, {"evaluation_id": run_id, "status": "PROCESSING"}
        if action == "/samples" and method == "POST":
            run.samples += body.get("samples") or []
            return 200, {"evaluation_id": run_id, "samples_pushed": len(body.get("samples") or []), "status": "ok"}
        if action == "" and method == "PUT":
            if "status" in body:
                return self._close(run_id, body["status"], body.get("error_message"))
            if "metadata" in body:
                run.metadata = body["metadata"]
            run.metrics.update(body.get("metrics") or {})
            return 200, {"evaluation_id": run_id, "status": run.status}
        return 404, {"detail": "Not Found"}

    def _close(self, run_id: str, status: str, error: str | None) -> tuple[int, Any]:
        run = self.runs.get(run_id)
        if run is None:
            return 404, {"detail": "run not found"}
        if run.status != "RUNNING":
            return 409, {"detail": f"run is already {run.status}"}
        run.status, run.error = status, error
        return 200, {"run": {"id": run_id, "status": status}}
