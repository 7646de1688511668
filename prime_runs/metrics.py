"""A run's summary from its episodes: the mean reward, each metric's mean, and the share of failed episodes.

What an evaluation hands ``run.finish()`` as its summary, computed from
verifiers' ``Episode`` and ``Trace`` objects, read by attribute (nothing
here imports verifiers)::

    from prime_runs import metrics

    summary = metrics.from_episodes(episodes)  # {"avg_reward": ..., "avg_metrics": {...}, "avg_error": ...}
    run.finish(summary)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypedDict

__all__ = ["RunSummary", "from_episodes"]


class RunSummary(TypedDict):
    """A run's averages, keys in this order: ``avg_reward``, ``avg_metrics``, ``avg_error``."""

    avg_reward: float
    avg_metrics: dict[str, float]
    avg_error: float


def from_episodes(episodes: Iterable[Any], traces: Iterable[Any] | None = None) -> RunSummary:
    """The averages of a run's episodes, over the traces of trainable agents (all traces when none is).

    - ``avg_reward``: the mean of the scored traces' ``reward``.
    - ``avg_metrics``: per name, the mean over the scored traces that have it
      of their sub-reward scores (``rewards[name].score``) and metrics
      (``metrics[name]``), a metric replacing a sub-reward of the same name
      within a trace; None values are left out.
    - ``avg_error``: the share of ``episodes`` whose ``ok`` is false.

    ``traces`` defaults to every episode's traces, in order; when given, they
    are scored instead, and ``avg_error`` still counts ``episodes``. An empty
    run gives ``{"avg_reward": 0.0, "avg_metrics": {}, "avg_error": 0.0}``.

    Usage::

        from_episodes([ok_episode, failed_episode])["avg_error"] == 0.5
    """
    episodes = list(episodes)
    pool = [trace for episode in episodes for trace in episode.traces] if traces is None else list(traces)
    scored = [trace for trace in pool if trace.agent.trainable] or pool
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for trace in scored:
        values = {name: reward.score for name, reward in (trace.rewards or {}).items() if reward is not None}
        values.update((name, value) for name, value in (trace.metrics or {}).items() if value is not None)
        for name, value in values.items():
            sums[name] = sums.get(name, 0.0) + value
            counts[name] = counts.get(name, 0) + 1
    failed = sum(1 for episode in episodes if not episode.ok)
    return {
        "avg_reward": sum(trace.reward for trace in scored) / len(scored) if scored else 0.0,
        "avg_metrics": {name: total / counts[name] for name, total in sums.items()},
        "avg_error": failed / len(episodes) if episodes else 0.0,
    }
