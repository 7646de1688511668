"""The run's lifecycle on the service (contract §9) and how a process finds its run.

Online, rank 0 (or a process with no ``RANK``) creates the run, or attaches
to ``id`` when given, and exports ``PRIME_RUN_ID`` so that processes it
starts log into the same run. Other ranks, and processes that attach through
an inherited ``PRIME_RUN_ID``, only upload: they never create or finish the
run, unless told to own it (``init(owner=True)`` / ``PRIME_RUN_OWNER=1``).
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from prime_runs.errors import PrimeRunsError
from prime_traces.config import api_url
from prime_traces._transport import Transport
from prime_traces.errors import APIError, PrimeTracesError

logger = logging.getLogger(__name__)

ENV_RUN_ID = "PRIME_RUN_ID"
ENV_RANK = "RANK"
#: ``1`` makes the process own the run it attaches to (a launcher that created it for rank 0); ``0`` never.
ENV_OWNER = "PRIME_RUN_OWNER"
ENV_MODE = "PRIME_RUNS_MODE"
MODES = ("online", "offline", "disabled")
KINDS = ("train", "eval")
TERMINAL_STATUSES = ("completed", "failed", "cancelled", "crashed")


@dataclass(frozen=True)
class RankInfo:
    """This process's rank and whether it owns the run's lifecycle."""

    rank: int | None
    owner: bool
    run_id: str | None


# Run ids this process exported to PRIME_RUN_ID, by pid: a later init() in the
# same process starts a new run instead of attaching to its own earlier one.
_exported: dict[str, int] = {}


def export_run_id(run_id: str) -> None:
    """Publish ``run_id`` to processes this one starts."""
    os.environ[ENV_RUN_ID] = run_id
    _exported[run_id] = os.getpid()


def _told(value: str | None) -> bool | None:
    text = (value or "").strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    return None


def rank_info(explicit_id: str | None, environ: Mapping[str, str] | None = None, *,
              owner: bool | None = None) -> RankInfo:  # fmt: skip
    """Who owns the run, that is, creates it and records its terminal status.

    ``owner`` (else ``PRIME_RUN_OWNER=1``/``0``) decides when given. Otherwise
    a process with ``RANK`` other than 0 never owns the run, and neither does
    a process that attaches to the run named by an inherited ``PRIME_RUN_ID``
    (a worker started by the run's process, or rank 0 of a launcher that
    created the run: that launcher says ``PRIME_RUN_OWNER=1``). A process that
    starts a new run, or names one with ``id=``, owns it.
    """
    env = os.environ if environ is None else environ
    raw = env.get(ENV_RANK)
    inherited = env.get(ENV_RUN_ID) or None
    if inherited is not None and _exported.get(inherited) == os.getpid():
        inherited = None
    run_id = explicit_id or inherited
    told = owner if owner is not None else _told(env.get(ENV_OWNER))
    rank: int | None = None
    if raw is not None and raw.strip() != "":
        try:
            rank = int(raw)
        except ValueError:
            raise PrimeRunsError(f"{ENV_RANK}={raw!r} is not an integer") from None
    if rank not in (None, 0) and run_id is None:
        raise PrimeRunsError(
            f"{ENV_RANK}={rank} but no run to attach to: start this process from rank 0 after "
            f"prime_runs.init() (which exports {ENV_RUN_ID}), or pass id= / set {ENV_RUN_ID}"
        )
    if told is not None:
        return RankInfo(rank, told, run_id)
    attaching = explicit_id is None and inherited is not None
    return RankInfo(rank, rank in (None, 0) and not attaching, run_id)


def resolve_mode(mode: str | None, *, online_configured: bool, environ: Mapping[str, str] | None = None) -> str:
    """Argument, else ``PRIME_RUNS_MODE``, else online when a key or URL is configured."""
    env = os.environ if environ is None else environ
    chosen = mode or env.get(ENV_MODE) or ("online" if online_configured else "offline")
    if chosen not in MODES:
        source = "mode" if mode else ENV_MODE
        raise ValueError(f"{source} must be one of {', '.join(MODES)}, not {chosen!r}")
    return chosen


def new_run_id() -> str:
    return f"run-{uuid.uuid4().hex[:12]}"


class RunLifecycle:
    """``POST`` / ``PATCH /api/v1/runs`` through a client's transport."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self.base_url = transport.config.base_url

    def create(
        self,
        *,
        name: str | None,
        kind: str,
        config: Mapping[str, Any] | None,
        tags: list[str] | None,
        run_id: str | None,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """Create the run, or return the existing one with ``run_id`` unchanged."""
        body: dict[str, Any] = {"name": name, "kind": kind, "config": dict(config or {}), "tags": list(tags or [])}
        if run_id:
            body["id"] = run_id
        return self._send("POST", api_url(self.base_url, "runs"), body, timeout_s)

    def update(
        self,
        run_id: str,
        *,
        config: Mapping[str, Any] | None = None,
        summary: Mapping[str, Any] | None = None,
        status: str | None = None,
        error: str | None = None,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """Merge ``config`` / ``summary``; with ``status``, finish the run."""
        body: dict[str, Any] = {}
        if config:
            body["config"] = dict(config)
        if summary:
            body["summary"] = dict(summary)
        if status is not None:
            if status not in TERMINAL_STATUSES:
                raise ValueError(f"status must be one of {', '.join(TERMINAL_STATUSES)}, not {status!r}")
            body["status"] = status
            if error is not None:
                body["error"] = error
        return self._send("PATCH", api_url(self.base_url, "runs", run_id), body, timeout_s)

    def post_metrics(self, run_id: str, rows: list[dict[str, Any]], timeout_s: float | None = None) -> dict[str, Any]:
        """Append rows to the run's metrics history (contract §9); a replay changes nothing."""
        return self._send("POST", api_url(self.base_url, "runs", run_id, "metrics"), {"rows": rows}, timeout_s)

    def _send(self, method: str, url: str, body: dict[str, Any], timeout_s: float | None) -> dict[str, Any]:
        resp = self.transport.request(
            method,
            url,
            # Whatever a user put in a config or summary: int keys, numpy scalars, sets. No value may stop
            # the run's status from being recorded.
            data=orjson.dumps(body, default=_jsonable, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY),
            headers={"Content-Type": "application/json"},
            timeout_s=timeout_s,
            whole=True,  # a trickled answer must not hold the run past its timeout
        )
        payload = orjson.loads(resp.content) if resp.content else {}
        if not isinstance(payload, dict):
            raise PrimeRunsError(f"{method} {url} answered {resp.status_code} with a non-object body")
        return payload


def _jsonable(value: Any) -> Any:
    """Config values orjson cannot encode become their ``str()`` (configs are for people)."""
    return str(value)


def describe(err: BaseException) -> str:
    """A short, key-free description of a lifecycle failure for a log line."""
    if isinstance(err, APIError):
        return f"HTTP {err.status_code} {err.code or ''}".strip()
    if isinstance(err, PrimeTracesError):
        return str(err)
    return f"{type(err).__name__}: {err}"
