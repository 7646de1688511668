"""Test helpers for the read tests: uploads through ``_wire``, and parameterised §7 documents.

``upload()`` builds the multipart body the published client sends (metadata
part, then the ``traces`` part with a per-part ``Content-Encoding``), so
tests exercise the service through HTTP the way a real client does::

    resp = upload(svc.url, [make_trace("t-1", run_id="r-1", step=3)])
    assert resp.status_code == 201
"""

from __future__ import annotations

import time
from typing import Any

import requests
from _wire import DEFAULT_TOKEN, auth, jsonl, post_upload  # noqa: F401  (re-exported)


def upload(
    url: str,
    lines: list[dict[str, Any] | bytes],
    *,
    episode: bool = False,
    context: dict[str, str] | None = None,
    token: str = DEFAULT_TOKEN,
    coding: str | None = "gzip",
) -> requests.Response:
    """POST one upload of ``lines`` to the service at ``url`` (its base URL)."""
    return post_upload(
        url, lines, line_format="episode" if episode else None, context=context, token=token, coding=coding or "none"
    )


def make_trace(
    trace_id: str,
    *,
    start: float | None = None,
    run_id: str | None = None,
    run_type: str = "eval",
    step: int | None = None,
    reward: float | None = 1.0,
    model: str = "qwen/qwen3-8b",
    base_url: str = "https://api.pinference.ai/api/v1",
    agent: str = "solver",
    task_key: str | None = "task-0",
    ok: bool = True,
    errors: list[dict[str, Any]] | None = None,
    stop_condition: str = "completed",
    total_tokens: int = 120,
    duration_s: float = 2.5,
    text: str = "What is 2 + 2?",
) -> dict[str, Any]:
    """A verifiers v1 trace record (contract §7) started ``start`` (default: a minute ago)."""
    start = time.time() - 60 if start is None else start
    trace: dict[str, Any] = {
        "version": 1,
        "id": trace_id,
        "task": {"type": "qa", "data": {"idx": 0, "name": "arith"}},
        "agent": {"name": agent, "trainable": False, "config": {"model": model, "client": {"base_url": base_url}}},
        "nodes": [
            {"message": {"role": "user", "content": text}, "parent": None, "sampled": False},
            {"message": {"role": "assistant", "content": "4"}, "parent": 0, "sampled": True},
        ],
        "calls": [
            {
                "node": 1,
                "model": model,
                "endpoint": "chat",
                "finish_reason": "stop",
                "usage": {"input_tokens": total_tokens - 20, "completion_tokens": 20, "total_tokens": total_tokens},
                "time": {"start": start + 0.5, "end": start + 1.5},
            }
        ],
        "tools": [],
        "rewards": {} if reward is None else {"correct": {"score": reward, "weight": 1.0}},
        "metrics": {},
        "info": {},
        "is_completed": True,
        "ok": ok,
        "stop_condition": stop_condition,
        "errors": errors or [],
        "timing": {
            "start": start,
            "boot": 0.1,
            "setup": 0.1,
            "agent": 1.5,
            "finalize": 0.1,
            "scoring": {"start": start + duration_s - 0.2, "end": start + duration_s},
        },
    }
    if task_key is not None:
        trace["task"]["key"] = task_key
    if run_id is not None:
        trace["run"] = {"id": run_id, "type": run_type, "name": "test run"}
        if step is not None:
            trace["run"]["work"] = {"type": "rollout", "step": step}
    return trace


def make_episode(
    episode_id: str,
    traces: list[dict[str, Any]],
    *,
    env: str | None = "env-math",
    run_id: str | None = None,
    run_type: str = "eval",
    outcome: str | None = "solved",
    ok: bool = True,
    errors: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """An episode envelope (contract §7) with ``traces`` as its members."""
    envelope: dict[str, Any] = {
        "version": 1,
        "id": episode_id,
        "task": {"type": "qa", "data": {"idx": 0}},
        "group": {"id": f"group-{episode_id}"},
        "ok": ok,
        "errors": errors or [],
        "traces": traces,
        "info": {},
        "outcome": outcome,
    }
    if env is not None:
        envelope["env"] = {"id": env, "name": env}
    if run_id is not None:
        envelope["run"] = {"id": run_id, "type": run_type}
    return envelope


# -- plain requests to the service ---------------------------------------------


def api(
    svc: Any, method: str, path: str, params: Any = None, json: Any = None, token: str = DEFAULT_TOKEN
) -> requests.Response:
    return requests.request(
        method, f"{svc.url}/api/v1{path}", params=params, json=json, headers=auth(token), timeout=30
    )


def ok(svc: Any, path: str, params: Any = None) -> Any:
    resp = api(svc, "GET", path, params)
    assert resp.status_code == 200, resp.text
    return resp.json()


def error_code(resp: requests.Response) -> str:
    return resp.json()["error"]["code"]


def committed(resp: requests.Response) -> str:
    assert resp.status_code in (200, 201), resp.text
    return resp.json()["upload_id"]
