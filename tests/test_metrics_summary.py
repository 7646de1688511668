"""``prime_runs.metrics.from_episodes``: a run's summary from its episodes, over stand-ins for verifiers' objects."""

from __future__ import annotations

import pytest
from _episode_fakes import Episode, Reward, make_episode, make_trace

from prime_runs import metrics


def test_only_trainable_traces_are_scored():
    solver = make_trace("solver", score=1.0, metrics={"turns": 2.0})
    judge = make_trace("judge", score=0.0, trainable=False, metrics={"turns": 8.0, "judge_calls": 1.0})
    summary = metrics.from_episodes([make_episode("ep", solver, judge)])
    assert summary == {"avg_reward": 1.0, "avg_metrics": {"correct": 1.0, "turns": 2.0}, "avg_error": 0.0}


def test_all_traces_count_when_none_is_trainable():
    episode = make_episode(
        "ep", make_trace("a", score=1.0, trainable=False), make_trace("b", score=0.0, trainable=False)
    )
    summary = metrics.from_episodes([episode])
    assert summary["avg_reward"] == 0.5
    assert summary["avg_metrics"] == {"correct": 0.5}


def test_sub_rewards_and_metrics_average_together_and_a_metric_replaces_a_score_of_its_name():
    first = make_trace(
        "a", rewards={"correct": Reward(1.0), "format": Reward(0.5, weight=0.5)}, metrics={"len": 10.0, "format": 0.0}
    )
    second = make_trace("b", rewards={"correct": Reward(0.0), "format": Reward(1.0, weight=0.5)}, metrics={"len": 20.0})
    summary = metrics.from_episodes([make_episode("e1", first), make_episode("e2", second)])
    assert summary["avg_reward"] == pytest.approx((1.25 + 0.5) / 2)  # the weighted totals
    # "format" is the first trace's metric (0.0), not its score (0.5), beside the second's score (1.0).
    assert summary["avg_metrics"] == {"correct": 0.5, "format": 0.5, "len": 15.0}
    assert list(summary["avg_metrics"]) == ["correct", "format", "len"]


def test_a_name_present_on_only_some_traces_averages_over_those_traces():
    traces = [
        make_trace("a", score=1.0, metrics={"tool_calls": 3.0}),
        make_trace("b", score=0.0, metrics={}),
        make_trace("c", score=1.0, metrics={"tool_calls": 5.0}),
    ]
    summary = metrics.from_episodes([make_episode("ep", *traces)])
    assert summary["avg_metrics"] == {"correct": pytest.approx(2 / 3), "tool_calls": 4.0}


def test_unscored_rewards_and_missing_metrics_are_left_out():
    scored = make_trace("a", score=1.0, metrics={"len": None, "turns": 4.0})
    unscored = make_trace("b", score=None, metrics={"len": 7.0})
    summary = metrics.from_episodes([make_episode("ep", scored, unscored)])
    assert summary["avg_reward"] == 0.5  # an unscored trace still counts, with a reward of 0
    assert summary["avg_metrics"] == {"correct": 1.0, "turns": 4.0, "len": 7.0}


def test_avg_error_counts_episodes_not_traces():
    good = make_episode("good", make_trace("g1"), make_trace("g2"), make_trace("g3"), ok=True)
    bad = make_episode("bad", make_trace("b1"), ok=False)
    assert metrics.from_episodes([good, bad])["avg_error"] == 0.5
    assert metrics.from_episodes([good, bad, good, good])["avg_error"] == 0.25


def test_traces_given_are_scored_instead_and_errors_still_come_from_the_episodes():
    episode = make_episode("ep", make_trace("in-episode", score=0.0), ok=False)
    other = make_trace("given", score=1.0, metrics={"len": 3.0})
    summary = metrics.from_episodes([episode], traces=[other])
    assert summary == {"avg_reward": 1.0, "avg_metrics": {"correct": 1.0, "len": 3.0}, "avg_error": 1.0}
    assert metrics.from_episodes([], traces=[other])["avg_error"] == 0.0


def test_an_empty_run_is_zeros_rather_than_a_division_by_zero():
    assert metrics.from_episodes([]) == {"avg_reward": 0.0, "avg_metrics": {}, "avg_error": 0.0}
    no_traces = metrics.from_episodes([Episode("empty", traces=[], ok=False)])
    assert no_traces == {"avg_reward": 0.0, "avg_metrics": {}, "avg_error": 1.0}


def test_the_summary_keys_come_in_their_order_and_the_episodes_may_be_any_iterable():
    summary = metrics.from_episodes(iter([make_episode("a"), make_episode("b", ok=False)]))
    assert list(summary) == ["avg_reward", "avg_metrics", "avg_error"]
    assert summary["avg_error"] == 0.5
    assert isinstance(summary["avg_reward"], float)
