"""Runs, metrics and episodes for the browser tests of the viewer, stored through HTTP.

:func:`store_rl_run` writes a train run with three metrics over 1,000 steps
(NaN in one of them) and 50 one-trace episodes with distinct rewards;
:func:`store_big_episode` a run holding one episode of about 35 MB;
:func:`store_hostile_episode` an episode whose records hold markup;
:func:`log` posts history rows (built by :func:`rows`) to a run::

    rl = store_rl_run(svc)
    page.goto(f"{svc.url}/#/run/{rl.run_id}")
    log(svc, rl.run_id, rows(range(1000, 1010), loss=0.1))
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from _upload_helpers import api, committed, make_episode, make_trace, upload

METRIC_NAMES = ("loss", "reward/mean", "entropy")
STEPS = 1000
NAN_STEPS = (100, 500, 501)
EPISODES = 50
#: The roles of every episode's messages, in order (a tool call and its result included).
ROLES = ("system", "user", "assistant", "tool", "assistant")
HOSTILE_TEXTS = (
    "<img src=x onerror=\"window.__pwned('img')\">",
    "<script>window.__pwned('script')</script>",
)
BIG_TRACES = 5
BIG_MESSAGES_PER_TRACE = 140
BIG_MESSAGE_CHARS = 50_000


@dataclass
class StoredRun:
    run_id: str
    name: str
    episode_rewards: dict[str, float] = field(default_factory=dict)


def rows(steps: range, **metrics: Any) -> list[dict[str, Any]]:
    """One history row per step; each metric a function of the step (or a constant)."""
    return [
        {"step": s, "time": 1.7e9 + s, "metrics": {k: f(s) if callable(f) else f for k, f in metrics.items()}}
        for s in steps
    ]


def log(svc: Any, run_id: str, history: list[dict[str, Any]]) -> None:
    """Post ``history`` to run ``run_id``'s metrics."""
    resp = api(svc, "POST", f"/runs/{run_id}/metrics", json={"rows": history})
    assert resp.status_code == 200, resp.text


def conversation(episode: int, answer: str = "4") -> list[dict[str, Any]]:
    """Five nodes, one per role of :data:`ROLES`, each saying which episode and turn it is."""
    messages = [
        {"role": "system", "content": f"episode {episode}: you are a careful solver"},
        {"role": "user", "content": f"episode {episode}: what is 2 + 2?"},
        {
            "role": "assistant",
            "content": f"episode {episode}: let me compute",
            "tool_calls": [
                {"id": f"call-{episode}", "type": "function", "function": {"name": "calc", "arguments": '{"x": "2+2"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": f"call-{episode}", "content": f"episode {episode}: 4"},
        {"role": "assistant", "content": f"episode {episode}: the answer is {answer}"},
    ]
    return [
        {"message": m, "parent": i - 1 if i else None, "sampled": m["role"] == "assistant"}
        for i, m in enumerate(messages)
    ]


def _trace(trace_id: str, run_id: str, step: int, reward: float, nodes: list[dict[str, Any]], start: float) -> Any:
    trace = make_trace(trace_id, start=start, run_id=run_id, run_type="train", step=step, reward=reward)
    trace["nodes"] = nodes
    return trace


def store_rl_run(svc: Any, run_id: str = "rl-run", token: str = "alice") -> StoredRun:
    """A train run: metrics over :data:`STEPS` steps and :data:`EPISODES` episodes."""
    name = "gsm8k-grpo"
    resp = api(
        svc, "POST", "/runs", json={"id": run_id, "name": name, "kind": "train", "config": {"lr": 3e-6}}, token=token
    )
    assert resp.status_code == 201, resp.text
    rows = []
    for step in range(STEPS):
        metrics: dict[str, Any] = {
            "loss": 2.0 / (1 + step / 50),
            "reward/mean": step / STEPS,
            "entropy": 1 - step / 2000,
        }
        if step in NAN_STEPS:
            metrics["loss"] = "NaN"
        rows.append({"step": step, "time": 1.7e9 + step, "metrics": metrics})
    resp = api(svc, "POST", f"/runs/{run_id}/metrics", json={"rows": rows}, token=token)
    assert resp.status_code == 200, resp.text
    stored = StoredRun(run_id, name)
    start = time.time() - 3600
    lines = []
    for i in range(EPISODES):
        # Distinct rewards in an order that is neither the upload order nor its reverse.
        reward = round(((i * 37) % EPISODES) / EPISODES, 3)
        episode_id = f"ep-{i:02d}"
        stored.episode_rewards[episode_id] = reward
        trace = _trace(f"tr-{i:02d}", run_id, i, reward, conversation(i), start + i)
        lines.append(make_episode(episode_id, [trace], run_id=run_id, run_type="train"))
    committed(upload(svc.url, lines, episode=True, token=token))
    resp = api(
        svc, "PATCH", f"/runs/{run_id}", json={"summary": {"reward/mean": 0.999}, "status": "completed"}, token=token
    )
    assert resp.status_code == 200, resp.text
    return stored


def _filler(trace: int, message: int) -> str:
    head = f"trace {trace} message {message}: "
    block = "".join(f"token{(trace * 7919 + message * 104729 + k) % 9973} " for k in range(200))
    return (head + block * (BIG_MESSAGE_CHARS // len(block) + 1))[:BIG_MESSAGE_CHARS]


def store_big_episode(svc: Any, run_id: str = "big-run", episode_id: str = "big-episode") -> int:
    """One episode of :data:`BIG_TRACES` traces, about 35 MB in all; returns its stored bytes."""
    start = time.time() - 1800
    traces = []
    for t in range(BIG_TRACES):
        roles = ("user", "assistant")
        nodes = [
            {"message": {"role": roles[m % 2], "content": _filler(t, m)}, "parent": m - 1 if m else None}
            for m in range(BIG_MESSAGES_PER_TRACE)
        ]
        traces.append(_trace(f"big-{t}", run_id, t, 0.5, nodes, start + t))
    line = make_episode(episode_id, traces, run_id=run_id, run_type="train")
    committed(upload(svc.url, [line], episode=True, coding=None))
    detail = api(svc, "GET", f"/_viewer/runs/{run_id}/episodes").json()["items"][0]
    return int(detail["bytes"])


def store_hostile_episode(svc: Any, run_id: str = "hostile-run", episode_id: str = "hostile-episode") -> None:
    """A run named with markup and an episode whose messages and tool calls hold :data:`HOSTILE_TEXTS`."""
    resp = api(svc, "POST", "/runs", json={"id": run_id, "name": HOSTILE_TEXTS[0], "kind": "eval"})
    assert resp.status_code == 201, resp.text
    nodes = conversation(0)
    nodes[1]["message"]["content"] = HOSTILE_TEXTS[0]
    nodes[2]["message"]["tool_calls"][0]["function"]["arguments"] = HOSTILE_TEXTS[1]
    nodes[4]["message"]["content"] = HOSTILE_TEXTS[1]
    trace = _trace("hostile-trace", run_id, 0, 1.0, nodes, time.time() - 60)
    committed(upload(svc.url, [make_episode(episode_id, [trace], run_id=run_id)], episode=True))
