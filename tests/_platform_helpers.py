"""Requests to the platform's run routes (contract §10) of a local service, as the published SDK sends them.

Bodies are compact JSON with ``Content-Type: application/json``, the token in
``Authorization: Bearer``, and on the internal root also in ``x-api-key``::

    evaluation = create_eval(svc, "gsm8k-run", ["env-1"])
    resp = call(svc, "POST", f"/evaluations/{evaluation['evaluation_id']}/finalize", {"metrics": {}})
"""

from __future__ import annotations

from typing import Any

import requests
from _wire import DEFAULT_TOKEN

INTERNAL_ROOT = "/api/internal"


def call(
    svc: Any,
    method: str,
    path: str,
    body: Any = None,
    *,
    token: str | None = DEFAULT_TOKEN,
    root: str = "/api/v1",
    headers: dict[str, str] | None = None,
) -> requests.Response:
    """``method`` ``root + path`` with ``body`` as JSON (None: no body); ``token=None`` sends no credential."""
    sent = dict(headers or {})
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
        if root == INTERNAL_ROOT:
            sent["x-api-key"] = token
    return requests.request(method, f"{svc.url}{root}{path}", json=body, headers=sent, timeout=30)


def answer(resp: requests.Response, status: int = 200) -> Any:
    assert resp.status_code == status, resp.text
    return resp.json()


def error_of(resp: requests.Response, status: int) -> dict[str, Any]:
    """The error envelope's ``error`` object, after checking the status."""
    assert resp.status_code == status, resp.text
    return resp.json()["error"]


def resolve_env(svc: Any, name: str, team_id: str | None = None) -> str:
    body: dict[str, Any] = {"name": name}
    if team_id is not None:
        body["team_id"] = team_id
    return answer(call(svc, "POST", "/environmentshub/resolve", body))["data"]["id"]


def create_eval(svc: Any, name: str, env_ids: list[str], **fields: Any) -> dict[str, Any]:
    """A new evaluation (``POST /evaluations/``, trailing slash and all), as answered."""
    body = {"name": name, "environments": [{"id": env} for env in env_ids], "tags": [], **fields}
    return answer(call(svc, "POST", "/evaluations/", body), 201)


def create_train(svc: Any, **fields: Any) -> dict[str, Any]:
    """A new external training run (``POST /rft/external-runs``); its ``run`` object."""
    body = {"base_model": "qwen/qwen3-8b", "max_steps": 100, "environments": [{"id": "env-1"}], "team_id": "team-1"}
    return answer(call(svc, "POST", "/rft/external-runs", {**body, **fields}), 201)["run"]


def run_summary(svc: Any, run_id: str) -> dict[str, Any]:
    return answer(call(svc, "GET", f"/runs/{run_id}"))
