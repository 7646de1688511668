"""verifiers 0.4.0 ``Episode`` objects shaped like real rollouts, for the load test's scenario v.

An episode is one task solved by two agents; each agent's trace is a
conversation of ``TURNS`` turns, a user message then a sampled assistant
reply, and every node carries what a trainer reads: its token ids, the loss
mask, ``is_content`` and the logprob of each token (the prompt's too). Each
reply has its model call (usage, time), the trace its rewards, metrics and
timing, and the episode the training step it belongs to. The number of
tokens per node is chosen so that the episode's JSON is about the size asked
for (calibrated once on a small episode).

Runs in the producer's virtualenv, which holds verifiers (and either SDK).
"""

from __future__ import annotations

import random
import time
from typing import Any

TURNS = 24
AGENTS = 2
_CHARS_PER_TOKEN = 4


def _node(rng: random.Random, parent: int | None, role: str, tokens: int, now: float) -> Any:
    from verifiers.v1 import MessageNode
    from verifiers.v1.types import AssistantMessage, UserMessage

    text = "".join(rng.choice("abcdefghij klmnopqrst uvwxyz.,") for _ in range(tokens * _CHARS_PER_TOKEN))
    sampled = role == "assistant"
    message = AssistantMessage(content=text) if sampled else UserMessage(content=text)
    return MessageNode(
        parent=parent,
        message=message,
        sampled=sampled,
        timestamp=now,
        token_ids=[rng.randrange(151_000) for _ in range(tokens)],
        mask=[sampled] * tokens,
        is_content=[True] * tokens,
        logprobs=[-rng.expovariate(3.0) for _ in range(tokens)],
    )


def _trace(rng: random.Random, episode_id: str, agent: int, tokens: int, task: Any, now: float) -> Any:
    from verifiers.v1 import AgentConfig, Trace
    from verifiers.v1.trace import AgentInfo, ModelCall, Reward, TimeSpan
    from verifiers.v1.types import Usage

    nodes, calls = [], []
    for turn in range(TURNS):
        nodes.append(_node(rng, len(nodes) - 1 if nodes else None, "user", tokens, now))
        nodes.append(_node(rng, len(nodes) - 1, "assistant", tokens, now))
        usage = Usage(prompt_tokens=(2 * turn + 1) * tokens, completion_tokens=tokens)
        calls.append(
            ModelCall(node=len(nodes) - 1, model="Qwen/Qwen3-4B", usage=usage, time=TimeSpan(start=now, end=now + 1))
        )
    score = rng.random()
    return Trace(
        id=f"{episode_id}-a{agent}",
        task=task,
        agent=AgentInfo(config=AgentConfig(), name=f"agent-{agent}", trainable=agent == 0),
        nodes=nodes,
        calls=calls,
        rewards={"correct": Reward(score=score), "format": Reward(score=1.0, weight=0.1)},
        metrics={"turns": float(TURNS), "tokens": float(2 * TURNS * tokens)},
        ok=True,
        is_completed=True,
    )


def episode(index: int, tokens_per_node: int, *, run_id: str = "run-loadtest", step: int = 0) -> Any:
    """Episode ``index``: ``AGENTS`` traces of ``TURNS`` turns, ``tokens_per_node`` tokens on each node."""
    from verifiers.v1 import Episode, TaskData
    from verifiers.v1.episode import EnvInfo, GroupInfo, PolicySpan, TrainRunInfo, TrainWorkInfo
    from verifiers.v1.trace import TraceTask

    rng = random.Random(index)
    now = time.time()  # inside the service's window
    episode_id = f"ep-{index:06d}"
    task = TraceTask(type="TaskData", data=TaskData(idx=index, prompt=f"problem {index}"))
    traces = [_trace(rng, episode_id, agent, tokens_per_node, task, now) for agent in range(AGENTS)]
    made = Episode(
        id=episode_id, task=task, traces=traces, ok=True, env=EnvInfo(id="math"), group=GroupInfo(id=f"g{index // 8}")
    )
    work = TrainWorkInfo(step=step, policy=PolicySpan(start=step, end=step))
    made.record_run(TrainRunInfo(id=run_id, name="loadtest", work=work))
    return made


def tokens_for(size_bytes: int) -> int:
    """Tokens per node that make an episode's JSON about ``size_bytes`` (measured on two small ones)."""
    import json

    small, large = (len(json.dumps(episode(0, n).to_record(), separators=(",", ":"))) for n in (10, 110))
    per_token = (large - small) / 100
    return max(1, round(10 + (size_bytes - small) / per_token))
