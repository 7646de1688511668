"""The hosted platform's run routes (contract §10): environments, evaluations and external training runs.

The platform keeps runs; the Traces service keeps their records. A
:class:`PlatformClient` creates, updates and closes runs on the platform,
resolves environments through its hub, and sends what the platform keeps of
a run beside its records (training metrics per step, legacy sample rows).
The local service (``prime-traces serve``) answers the same routes.

Where it sends, and with which key, is :func:`resolve_platform`'s
(:mod:`prime_traces.platform_config`).

Requests that are safe to repeat are retried like reads (429, 502, 503, 504,
transport errors; ``Retry-After`` honoured). Creating a run, finalizing an
evaluation and sending sample rows are not: they are retried only when the
service certainly did nothing (a refusal, or a connection never made).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson
import requests

from prime_traces._api.runs import encode_json
from prime_traces._http.retry import is_refusal, request_retrying
from prime_traces._http.transport import Transport, not_sent
from prime_traces.config import ClientConfig, quote_path_id
from prime_traces.errors import APIError, ResponseFormatError, RetryableAPIError, TransportError
from prime_traces.platform_config import (
    DEFAULT_FRONTEND_URL,
    ENV_FRONTEND_URL,
    ENV_PLATFORM_URL,
    PlatformConfig,
    configured_platform_url,
    resolve_platform,
    split_api_root,
)

__all__ = [
    "DEFAULT_FRONTEND_URL",
    "ENV_FRONTEND_URL",
    "ENV_PLATFORM_URL",
    "PlatformClient",
    "PlatformConfig",
    "configured_platform_url",
    "resolve_platform",
    "split_api_root",
]

#: Longest wait for one answer of the platform; sample uploads get longer.
PLATFORM_TIMEOUT_S = 60.0
SAMPLES_TIMEOUT_S = 300.0
DEFAULT_PLATFORM_ATTEMPTS = 5
#: The platform keeps at most this much of an evaluation's error message.
MAX_ERROR_MESSAGE_CHARS = 4096


def _may_resend(replayable: bool, error: BaseException) -> bool:
    # A request the platform may have carried out is sent again only when doing it twice is harmless.
    if isinstance(error, RetryableAPIError):
        return replayable or is_refusal(error)
    if isinstance(error, TransportError):
        return replayable or not_sent(error)
    return False


class PlatformClient:
    """Runs on the platform: create, update and close evaluations and external training runs.

    Each method is one logical request, retried per the module's rules, and
    raises the typed errors of :mod:`prime_traces.errors` (a 409 on a status
    change is not an error: it returns ``False``, the run was closed already).
    Thread-safe: each thread has its own connection. ``close()`` releases them.

    Usage::

        platform = PlatformClient()
        env_id = platform.resolve_environment("gsm8k")
        run = platform.create_evaluation({"name": "gsm8k-1", "environments": [{"id": env_id}], "tags": []})
        platform.finalize_evaluation(run["evaluation_id"], {"avg_reward": 0.7})
    """

    def __init__(
        self,
        api_key: str | None = None,
        base_url: str | None = None,
        *,
        frontend_url: str | None = None,
        timeout_s: float = PLATFORM_TIMEOUT_S,
        max_attempts: int = DEFAULT_PLATFORM_ATTEMPTS,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be greater than 0, not {timeout_s}")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, not {max_attempts}")
        self.config = resolve_platform(api_key, base_url, frontend_url=frontend_url)
        self.max_attempts = max_attempts
        self._sleep = sleep
        self._transport = Transport(
            ClientConfig(self.config.api_key, self.config.origin), timeout_s=max(timeout_s, SAMPLES_TIMEOUT_S)
        )
        self._timeout_s = timeout_s
        self._headers = {"Content-Type": "application/json"}
        if self.config.internal:
            self._headers["x-api-key"] = self.config.api_key

    def __repr__(self) -> str:
        return f"PlatformClient(base_url={self.config.api_prefix!r})"

    # -- environments -----------------------------------------------------------

    def resolve_environment(self, name: str, team_id: str | None = None) -> str:
        """The hub's id for the environment ``name`` (get-or-create, safe to repeat)."""
        body: dict[str, Any] = {"name": name}
        if team_id is not None:
            body["team_id"] = team_id
        return _environment_id(self._send("POST", ("environmentshub", "resolve"), body, replayable=True), name)

    def latest_environment(self, slug: str) -> str:
        """The hub's id for the latest version of a published ``owner/name``."""
        owner, _, name = slug.partition("/")
        if not owner or not name:
            raise ValueError(f"an environment slug is owner/name, not {slug!r}")
        return _environment_id(self._send("GET", ("environmentshub", owner, name, "@latest"), replayable=True), slug)

    # -- evaluations ------------------------------------------------------------

    def create_evaluation(self, body: Mapping[str, Any], *, deadline_s: float | None = None) -> dict[str, Any]:
        """Create an evaluation; its answer has ``evaluation_id``. Never sent twice: a replay makes a second run."""
        answer = self._send("POST", ("evaluations", ""), body, replayable=False, deadline_s=deadline_s)
        if not answer.get("evaluation_id"):
            raise ResponseFormatError("POST /evaluations/", f"no evaluation_id in the answer (keys {sorted(answer)})")
        return answer

    def update_evaluation(
        self,
        evaluation_id: str,
        *,
        metadata: Mapping[str, Any] | None = None,
        metrics: Mapping[str, Any] | None = None,
        deadline_s: float | None = None,
    ) -> None:
        """Replace the evaluation's metadata (the run's config) and metrics (its summary); with neither, no request."""
        body: dict[str, Any] = {}
        if metadata:
            body["metadata"] = dict(metadata)
        if metrics:
            body["metrics"] = dict(metrics)
        if body:
            self._send("PUT", ("evaluations", evaluation_id), body, replayable=True, deadline_s=deadline_s)

    def close_evaluation(
        self, evaluation_id: str, status: str, error: str | None = None, *, deadline_s: float | None = None
    ) -> bool:
        """Mark it ``FAILED`` or ``CANCELLED`` with ``error``; False when the platform had closed it already (409)."""
        body: dict[str, Any] = {"status": status}
        if error:
            body["error_message"] = error[:MAX_ERROR_MESSAGE_CHARS]
        return self._close(("evaluations", evaluation_id), body, deadline_s)

    def finalize_evaluation(
        self, evaluation_id: str, metrics: Mapping[str, Any] | None, *, deadline_s: float | None = None
    ) -> dict[str, Any]:
        """Complete the evaluation with its summary ``metrics``."""
        path = ("evaluations", evaluation_id, "finalize")
        return self._send("POST", path, {"metrics": dict(metrics or {})}, replayable=False, deadline_s=deadline_s)

    def post_evaluation_samples(self, evaluation_id: str, samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Send legacy sample rows (at most 25 MiB of JSON a request)."""
        path = ("evaluations", evaluation_id, "samples")
        return self._send("POST", path, {"samples": list(samples)}, replayable=False, timeout_s=SAMPLES_TIMEOUT_S)

    # -- external training runs -------------------------------------------------

    def create_training_run(self, body: Mapping[str, Any], *, deadline_s: float | None = None) -> dict[str, Any]:
        """Create an external training run; its answer has ``run.id``. Never sent twice."""
        answer = self._send("POST", ("rft", "external-runs"), body, replayable=False, deadline_s=deadline_s)
        run = answer.get("run")
        if not isinstance(run, Mapping) or not run.get("id"):
            raise ResponseFormatError("POST /rft/external-runs", f"no run id in the answer (keys {sorted(answer)})")
        return answer

    def close_training_run(
        self, run_id: str, status: str, error: str | None = None, *, deadline_s: float | None = None
    ) -> bool:
        """Set the run's status (``completed`` or ``failed``); False when it was closed already (409)."""
        body: dict[str, Any] = {"status": status}
        if error:
            body["error_message"] = error
        return self._close(("rft", "external-runs", run_id, "status"), body, deadline_s)

    def finalize_training_run(self, run_id: str, exit_code: int = 0, *, deadline_s: float | None = None) -> None:
        """Complete the run (safe to repeat: a finalized run stays finalized)."""
        body = {"run_id": run_id, "exit_code": exit_code}
        self._send("POST", ("rft", "finalize"), body, replayable=True, deadline_s=deadline_s)

    def post_training_metrics(
        self, run_id: str, metrics: Mapping[str, Any], *, deadline_s: float | None = None
    ) -> None:
        """One step's metrics (``step`` among them); the platform keeps one row per step, so a repeat is harmless."""
        body = {"run_id": run_id, "metrics": dict(metrics)}
        self._send("POST", ("rft", "metrics"), body, replayable=True, deadline_s=deadline_s)

    def presign_training_samples(self, run_id: str, step: int) -> tuple[str, str]:
        """Where to put a step's legacy sample table: ``(upload URL, storage key)``."""
        answer = self._send("POST", ("rft", "samples", "presign"), {"run_id": run_id, "step": step}, replayable=True)
        nested = answer.get("data")
        data: Mapping[str, Any] = nested if isinstance(nested, Mapping) else answer
        url = data.get("presignedUrl") or data.get("presigned_url")
        key = data.get("s3Key") or data.get("s3_key")
        if not url or not key:
            where = "POST /rft/samples/presign"
            raise ResponseFormatError(where, f"no upload URL or key in the answer (keys {sorted(data)})")
        return str(url), str(key)

    def upload_training_samples(self, url: str, data: bytes) -> None:
        """PUT a step's Parquet table to its presigned URL (storage: no platform credentials go there)."""
        retrying = request_retrying(3, resend=_storage_may_resend, sleep=self._sleep)
        retrying(_put_object, url, data)

    def confirm_training_samples(self, run_id: str, step: int, key: str) -> None:
        """Tell the platform the step's table is in storage (safe to repeat)."""
        body = {"run_id": run_id, "step": step, "s3_key": key}
        self._send("POST", ("rft", "samples", "confirm"), body, replayable=True)

    # -- the request ------------------------------------------------------------

    def _close(self, path: tuple[str, ...], body: Mapping[str, Any], deadline_s: float | None) -> bool:
        try:
            self._send("PUT", path, body, replayable=True, deadline_s=deadline_s)
        except APIError as err:
            if err.status_code == 409:
                return False
            raise
        return True

    def _send(
        self,
        method: str,
        path: tuple[str, ...],
        body: Mapping[str, Any] | None = None,
        *,
        replayable: bool,
        timeout_s: float | None = None,
        deadline_s: float | None = None,
    ) -> dict[str, Any]:
        """One request under the platform's API root; the JSON object it answers (``{}`` for no body)."""
        # "" ends the path with a slash (POST /evaluations/); "@latest" is a literal segment of the hub.
        segments = (part if part in ("", "@latest") else quote_path_id(part) for part in path)
        url = self.config.api_prefix + "/" + "/".join(segments)
        deadline = None if deadline_s is None else time.monotonic() + deadline_s
        timeout = timeout_s or self._timeout_s
        if deadline is not None:
            timeout = max(0.1, min(timeout, deadline - time.monotonic()))
        retrying = request_retrying(
            self.max_attempts,
            resend=functools.partial(_may_resend, replayable),
            deadline_monotonic=deadline,
            sleep=self._sleep,
        )
        data = encode_json(body) if body is not None else None
        resp = retrying(
            self._transport.request, method, url, data=data, headers=self._headers, timeout_s=timeout, whole=True
        )
        if not resp.content:
            return {}
        try:
            answer = orjson.loads(resp.content)
        except orjson.JSONDecodeError:
            where = f"{method} {url.removeprefix(self.config.origin)}"
            raise ResponseFormatError(where, f"answered {resp.status_code} with a body that is not JSON") from None
        return answer if isinstance(answer, dict) else {"data": answer}

    def evaluation_url(self, evaluation_id: str) -> str:
        """The evaluation's page on the dashboard."""
        return f"{self.config.frontend_url}/dashboard/evaluations/{evaluation_id}"

    def training_url(self, run_id: str) -> str:
        """The training run's page on the dashboard."""
        return f"{self.config.frontend_url}/dashboard/training/{run_id}"

    def close(self) -> None:
        """Release this client's connections."""
        self._transport.close()

    def __enter__(self) -> PlatformClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _environment_id(answer: Mapping[str, Any], what: str) -> str:
    data = answer.get("data")
    found = (data if isinstance(data, Mapping) else answer).get("id")
    if not found:
        raise ResponseFormatError("environmentshub", f"no id for environment {what!r} in the answer")
    return str(found)


def _storage_may_resend(error: BaseException) -> bool:
    return isinstance(error, (RetryableAPIError, TransportError))


def _put_object(url: str, data: bytes) -> None:
    """One PUT of ``data`` to storage, without our credentials; typed errors as the client's."""
    try:
        resp = requests.put(
            url,
            data=data,
            headers={"Content-Type": "application/parquet"},
            timeout=(10.0, SAMPLES_TIMEOUT_S),
            allow_redirects=False,
        )
    except requests.RequestException as err:
        raise TransportError(f"uploading samples failed: {type(err).__name__}") from err
    if resp.status_code >= 500 or resp.status_code == 429:
        raise RetryableAPIError(resp.status_code, None, f"uploading samples failed: HTTP {resp.status_code}")
    if resp.status_code >= 300:
        raise APIError(resp.status_code, None, f"uploading samples failed: HTTP {resp.status_code}")
