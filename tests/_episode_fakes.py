"""Stand-ins for verifiers' Episode and Trace: plain objects with the attributes the projection and the summary read.

``Model`` plays a pydantic model: ``model_dump(mode="json", exclude_none=True)``
returns its fields, without the None ones. ``make_trace`` and ``make_episode``
build records with every attribute set, overridable by keyword.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class Model:
    """Fields set by keyword; dumped as a dict the way the projection asks verifiers' models to be."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)

    def model_dump(self, *, mode: str, exclude_none: bool) -> dict[str, Any]:
        assert mode == "json"
        return {name: value for name, value in vars(self).items() if not (exclude_none and value is None)}


@dataclass
class Reward:
    score: float
    weight: float = 1.0


@dataclass
class Agent:
    name: str = "solver"
    trainable: bool = True


@dataclass
class Task:
    data: Model


@dataclass
class Branch:
    messages: list[Model]
    num_input_tokens: int = 0
    num_output_tokens: int = 0


@dataclass
class EnvInfo:
    id: str = ""


@dataclass
class Trace:
    id: str
    task: Task
    agent: Agent = field(default_factory=Agent)
    rewards: dict[str, Reward | None] = field(default_factory=dict)
    metrics: dict[str, float | None] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    timing: Model = field(default_factory=lambda: Model(start=1.0, agent=2.5))
    is_completed: bool = True
    is_truncated: bool = False
    errors: list[Model] = field(default_factory=list)
    stop_condition: str | None = "done"
    tools: list[Model] = field(default_factory=list)
    branches: list[Branch] = field(default_factory=list)
    usage: Model | None = None

    @property
    def reward(self) -> float:
        return sum(reward.score * reward.weight for reward in self.rewards.values() if reward is not None)

    @property
    def last_error(self) -> Model | None:
        return self.errors[-1] if self.errors else None

    def to_record(self) -> dict[str, Any]:
        return {"id": self.id, "reward": self.reward}


@dataclass
class Episode:
    id: str
    traces: list[Trace] = field(default_factory=list)
    ok: bool = True
    env: EnvInfo = field(default_factory=EnvInfo)
    extra: dict[str, Any] = field(default_factory=dict)  # added to to_record(), to make it large or odd

    def to_record(self) -> dict[str, Any]:
        return {"id": self.id, "traces": [trace.to_record() for trace in self.traces], **self.extra}


def message(role: str, content: str) -> Model:
    return Model(role=role, content=content, name=None)


def branch(*contents: str, input_tokens: int = 10, output_tokens: int = 5) -> Branch:
    """A branch of a user message and the assistant's replies."""
    return Branch(
        [message("user", contents[0]), *(message("assistant", text) for text in contents[1:])],
        num_input_tokens=input_tokens,
        num_output_tokens=output_tokens,
    )


def make_trace(
    trace_id: str = "t-1",
    *,
    idx: Any = 3,
    score: float | None = 1.0,
    trainable: bool = True,
    agent: str = "solver",
    branches: list[Branch] | None = None,
    **fields: Any,
) -> Trace:
    """A scored trace of one branch for task ``idx`` (answer "4"); ``fields`` override any attribute."""
    fields.setdefault("rewards", {"correct": None if score is None else Reward(score)})
    return Trace(
        id=trace_id,
        task=Task(Model(idx=idx, prompt="2+2?", answer="4", hint=None)),
        agent=Agent(agent, trainable),
        branches=[branch("2+2?", "4")] if branches is None else branches,
        **fields,
    )


def make_episode(episode_id: str = "ep-1", *traces: Trace, ok: bool = True, **fields: Any) -> Episode:
    """An episode of ``traces`` (one trace of its own when none is given)."""
    members = list(traces) if traces else [make_trace(f"{episode_id}-t")]
    return Episode(episode_id, members, ok=ok, **fields)
