"""Writing runs (contract §9): create a run, update or finish it, append to its metrics history.

:class:`RunsAPI` is a mixin of :class:`~prime_traces.TracesClient`, beside the
reads of ``_api.reads``. Each call is one request, sent once and never retried
here: whoever calls decides whether to send it again (a finish with the same
status, and metrics rows that carry a step, are safe to repeat). Bodies are
encoded so that no value a user logs can stop a run's status from being
recorded, and the whole answer is bounded by ``timeout_s``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from prime_traces._http.transport import Transport
from prime_traces.config import api_url
from prime_traces.errors import ResponseFormatError

RUN_KINDS = ("train", "eval")
#: The statuses that finish a run; a finished run keeps its status (contract §9).
TERMINAL_STATUSES = ("completed", "failed", "cancelled", "crashed")
#: The most metrics rows one request may carry (contract §9).
MAX_METRIC_ROWS_PER_REQUEST = 10_000


def _as_str(value: Any) -> str:
    # A config is for people: a value orjson cannot encode (a set, a path, a tensor) becomes its str().
    return str(value)


def encode_json(body: Mapping[str, Any]) -> bytes:
    """``body`` as JSON, whatever a user put in it: int keys, numpy scalars and arrays, other objects as ``str()``."""
    return orjson.dumps(body, default=_as_str, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY)


def _check_timeout(timeout_s: float | None) -> None:
    if timeout_s is not None and not timeout_s > 0:
        raise ValueError(f"timeout_s must be greater than 0, not {timeout_s}")


class RunsAPI:
    """Creates runs, records their config, summary and terminal status, and appends metrics rows.

    Thread-safe as the client's transport is. Every call blocks until the
    service answers, at most ``timeout_s`` for the whole answer (default: the
    client's timeout), and raises the typed errors of
    :mod:`prime_traces.errors`: :class:`RunFinishedError` when a finished run
    is given another status, :class:`NotFoundError` for an unknown run,
    :class:`APITimeoutError` when the answer does not come in time, and
    :class:`ResponseFormatError` when a 2xx body is not a JSON object::

        run = client.create_run("grpo-math", config={"lr": 1e-6})
        client.post_metrics(run["id"], [{"step": 0, "time": time.time(), "metrics": {"loss": 2.0}}])
        client.update_run(run["id"], summary={"loss": 0.1}, status="completed")
    """

    _transport: Transport
    _base_url: str

    def create_run(
        self,
        name: str | None = None,
        *,
        kind: str = "train",
        config: Mapping[str, Any] | None = None,
        tags: Sequence[str] | None = None,
        run_id: str | None = None,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """Create a run and return the service's answer (``id``, ``name``, ``url``, ``status``, ...).

        With ``run_id`` naming a run that exists, that run is returned
        unchanged (``"created": false`` on the local service), so creating
        again with the same id is harmless. Raises ``ValueError`` for a
        ``kind`` other than ``"train"`` or ``"eval"``, before any request.
        """
        if kind not in RUN_KINDS:
            raise ValueError(f"kind must be one of {', '.join(RUN_KINDS)}, not {kind!r}")
        _check_timeout(timeout_s)
        body: dict[str, Any] = {"name": name, "kind": kind, "config": dict(config or {}), "tags": list(tags or [])}
        if run_id:
            body["id"] = run_id
        return self._send_run("POST", api_url(self._base_url, "runs"), body, timeout_s)

    def update_run(
        self,
        run_id: str,
        *,
        config: Mapping[str, Any] | None = None,
        summary: Mapping[str, Any] | None = None,
        status: str | None = None,
        error: str | None = None,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """Merge ``config`` and ``summary`` into the run (top-level keys replace); with ``status``, finish it.

        ``status`` is one of :data:`TERMINAL_STATUSES`, and ``error`` (the
        reason a run failed) goes with it. Finishing again with the status
        the run has is harmless; another one raises :class:`RunFinishedError`
        and changes nothing. Merging into a finished run is allowed. Values
        JSON cannot hold are sent anyway: numpy scalars and arrays as numbers,
        non-string keys as strings, any other object as its ``str()``.
        Returns the run as the service answers it. Raises ``ValueError`` for
        an unknown ``status``, or an ``error`` without one, before any request::

            client.update_run(run_id, status="failed", error="CUDA out of memory")
        """
        if status is not None and status not in TERMINAL_STATUSES:
            raise ValueError(f"status must be one of {', '.join(TERMINAL_STATUSES)}, not {status!r}")
        if error is not None and status is None:
            raise ValueError("error can only be given with a terminal status")
        _check_timeout(timeout_s)
        body: dict[str, Any] = {}
        if config:
            body["config"] = dict(config)
        if summary:
            body["summary"] = dict(summary)
        if status is not None:
            body["status"] = status
            if error is not None:
                body["error"] = error
        return self._send_run("PATCH", api_url(self._base_url, "runs", run_id), body, timeout_s)

    def post_metrics(
        self, run_id: str, rows: Sequence[Mapping[str, Any]], timeout_s: float | None = None
    ) -> dict[str, Any]:
        """Append ``rows`` to the run's metrics history; read them back with :meth:`list_metrics`.

        Each row is ``{"step": int, "time": float, "metrics": {name: value}}``,
        at most :data:`MAX_METRIC_ROWS_PER_REQUEST` a call. A row with a step
        replaces the earlier row of that step for the names it carries, so
        sending the same rows again changes nothing; rows without a step are
        appended, and a repeat would duplicate them. Values are numbers,
        booleans, strings or ``None``; give a non-finite float as the string
        ``"NaN"``, ``"Infinity"`` or ``"-Infinity"`` (JSON has no NaN: as a
        float it would arrive as null). Returns the answer,
        ``{"accepted": N}``; an unknown run is :class:`NotFoundError`.
        """
        if isinstance(rows, (str, bytes, Mapping)):
            raise TypeError("rows must be a sequence of row mappings, not a single str, bytes or mapping")
        _check_timeout(timeout_s)
        return self._send_run(
            "POST", api_url(self._base_url, "runs", run_id, "metrics"), {"rows": list(rows)}, timeout_s
        )

    def _send_run(self, method: str, url: str, body: dict[str, Any], timeout_s: float | None) -> dict[str, Any]:
        resp = self._transport.request(
            method,
            url,
            data=encode_json(body),
            headers={"Content-Type": "application/json"},
            timeout_s=timeout_s,
            whole=True,  # a trickled answer must not hold a finishing run past its timeout
        )
        where = f"{method} {url.split('?', 1)[0]}"
        try:
            payload = orjson.loads(resp.content) if resp.content else {}
        except orjson.JSONDecodeError:
            raise ResponseFormatError(where, f"answered {resp.status_code} with a body that is not JSON") from None
        if not isinstance(payload, dict):
            raise ResponseFormatError(where, f"answered {resp.status_code} with a body that is not a JSON object")
        return payload
