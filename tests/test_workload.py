"""The benchmark workload generator: deterministic, sized, shaped like contract §7, realistic."""

from __future__ import annotations

import random
import sys
import zlib
from pathlib import Path

import orjson
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "tools"))
import workload
from workload import encoded_lines, generate_episode, iter_episodes

NOW = 1_750_000_000.0
_YEAR_S = 365 * 86400


def encoded(episode: dict) -> bytes:
    return orjson.dumps(episode)


def test_same_seed_gives_the_same_episode():
    first = encoded(generate_episode(11, target_bytes=80_000, now=NOW))
    assert encoded(generate_episode(11, target_bytes=80_000, now=NOW)) == first
    assert encoded(generate_episode(12, target_bytes=80_000, now=NOW)) != first


def test_a_random_instance_is_advanced_in_place():
    rng = random.Random(3)
    first = encoded(generate_episode(rng, target_bytes=20_000, now=NOW))
    second = encoded(generate_episode(rng, target_bytes=20_000, now=NOW))
    assert first != second
    assert encoded(generate_episode(random.Random(3), target_bytes=20_000, now=NOW)) == first


def test_global_random_state_is_neither_used_nor_disturbed():
    random.seed(99)
    expected = random.random()
    random.seed(99)
    generate_episode(0, target_bytes=20_000, now=NOW)
    assert random.random() == expected


@pytest.mark.parametrize("target", [10_000, 60_000, 700_000, 2_200_000])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_encoded_size_is_within_ten_percent_of_target(target, seed):
    size = len(encoded(generate_episode(seed, target_bytes=target, now=NOW)))
    assert abs(size / target - 1) <= workload.SIZE_TOLERANCE


@pytest.mark.slow
def test_a_35_mb_episode_is_within_tolerance():
    size = len(encoded(generate_episode(4, target_bytes=35_000_000, now=NOW)))
    assert abs(size / 35_000_000 - 1) <= workload.SIZE_TOLERANCE


def test_too_small_a_target_is_refused():
    with pytest.raises(ValueError, match="target_bytes"):
        generate_episode(0, target_bytes=1_000, now=NOW)


def test_episode_envelope_shape():
    episode = generate_episode(5, target_bytes=300_000, run_id="run-x", step=7, now=NOW)
    assert episode["version"] == 1
    assert isinstance(episode["id"], str) and episode["id"]
    assert set(episode["env"]) >= {"id", "name"} and set(episode["group"]) == {"id"}
    assert episode["run"]["id"] == "run-x" and episode["run"]["work"] == {"type": "step", "step": 7}
    assert episode["ok"] is True and episode["errors"] == [] and episode["info"] == {}
    assert isinstance(episode["outcome"], str) and episode["outcome"]
    assert isinstance(episode["traces"], list) and episode["traces"]


@pytest.mark.parametrize("target", [10_000, 1_500_000])
def test_member_traces_are_verifiers_shaped(target):
    episode = generate_episode(6, target_bytes=target, run_id="run-y", step=3, now=NOW)
    for trace in episode["traces"]:
        assert isinstance(trace["id"], str) and trace["id"]
        assert trace["run"]["id"] == "run-y" and trace["run"]["work"] == {"type": "step", "step": 3}
        assert trace["task"] == episode["task"]
        assert set(trace["agent"]) >= {"name", "trainable", "config"}
        assert isinstance(trace["agent"]["config"]["model"], str)
        assert trace["agent"]["config"]["client"]["base_url"].startswith("https://")
        timing = trace["timing"]
        assert isinstance(timing["start"], float)
        assert NOW - _YEAR_S <= timing["start"] <= NOW + 300
        assert NOW - 3600 <= timing["start"] <= timing["scoring"]["start"] <= timing["scoring"]["end"]
        assert all(isinstance(timing[k], float) for k in ("boot", "setup", "agent", "finalize"))
        for reward in trace["rewards"].values():
            assert reward is None or set(reward) == {"score", "weight"}
        assert trace["stop_condition"] and isinstance(trace["is_completed"], bool) and trace["errors"] == []
        nodes, calls = trace["nodes"], trace["calls"]
        assert [n["message"]["role"] for n in nodes[:2]] == ["system", "user"]
        assert all(0 <= n["parent"] < i for i, n in enumerate(nodes) if i)
        assert calls
        for call in calls:
            sampled = nodes[call["node"]]
            assert sampled["sampled"] is True and sampled["message"]["role"] == "assistant"
            usage = call["usage"]
            assert usage["completion_tokens"] == len(call["token_ids"]) == len(call["logprobs"]) > 0
            assert usage["total_tokens"] == usage["input_tokens"] + usage["completion_tokens"]
            assert all(type(t) is int and 0 <= t < 151_936 for t in call["token_ids"])
            assert all(type(p) is float and p <= 0 for p in call["logprobs"])
            assert timing["start"] <= call["time"]["start"] <= call["time"]["end"] <= timing["scoring"]["start"]
        assert calls[-1]["finish_reason"] in ("stop", "length")
        assert all(c["finish_reason"] == "tool_calls" for c in calls[:-1])


def test_token_arrays_are_most_of_the_bytes():
    episode = generate_episode(7, target_bytes=2_200_000, now=NOW)
    calls = [call for trace in episode["traces"] for call in trace["calls"]]
    arrays = sum(len(orjson.dumps(call["token_ids"])) + len(orjson.dumps(call["logprobs"])) for call in calls)
    assert 0.4 < arrays / len(encoded(episode)) < 0.9


def test_text_looks_like_text():
    data = encoded(generate_episode(8, target_bytes=500_000, now=NOW)).decode()
    assert any(ch in data for ch in "éüïçñ")
    assert any("\u4e00" <= ch <= "\u9fff" for ch in data)
    assert any(ord(ch) >= 0x1F300 for ch in data)
    assert "def " in data and "return " in data and " the " in data


# A small document has less to repeat than a big one, as real JSON does.
@pytest.mark.parametrize(("target", "low", "high"), [(10_000, 2.3, 6.0), (300_000, 3.0, 6.0), (2_200_000, 3.0, 6.0)])
@pytest.mark.parametrize("seed", [0, 9])
def test_gzip_1_ratio_is_like_real_json(target, low, high, seed):
    data = encoded(generate_episode(seed, target_bytes=target, now=NOW))
    ratio = len(data) / len(zlib.compress(data, 1))
    assert low <= ratio <= high


def test_ids_are_unique_across_episodes_and_traces():
    episodes = list(iter_episodes(25, seed=1, target_bytes=30_000, now=NOW))
    episode_ids = [e["id"] for e in episodes]
    trace_ids = [t["id"] for e in episodes for t in e["traces"]]
    assert len(set(episode_ids)) == len(episode_ids)
    assert len(set(trace_ids)) == len(trace_ids)
    assert not set(episode_ids) & set(trace_ids)


def test_no_container_is_shared_within_an_episode():
    # Callers stamp run ids on every trace; a shared dict would stamp them all.
    episode = generate_episode(10, target_bytes=400_000, now=NOW)
    seen: set[int] = set()
    stack: list = [episode]
    while stack:
        value = stack.pop()
        if isinstance(value, (dict, list)):
            assert id(value) not in seen
            seen.add(id(value))
            stack.extend(value.values() if isinstance(value, dict) else value)


def test_iter_episodes_is_deterministic_and_spreads_steps():
    first = [encoded(e) for e in iter_episodes(6, seed=4, target_bytes=15_000, run_id="run-z", steps=3, now=NOW)]
    again = [encoded(e) for e in iter_episodes(6, seed=4, target_bytes=15_000, run_id="run-z", steps=3, now=NOW)]
    assert first == again
    episodes = [orjson.loads(line) for line in first]
    assert [e["run"]["work"]["step"] for e in episodes] == [0, 0, 1, 1, 2, 2]
    assert {e["run"]["id"] for e in episodes} == {"run-z"}
    assert len(set(first)) == 6


def test_now_defaults_to_the_current_time():
    import time

    before = time.time()
    episode = generate_episode(2, target_bytes=20_000)
    assert before - 3600 <= episode["traces"][0]["timing"]["start"] <= time.time()


def test_encoded_lines_are_compact_jsonl():
    episodes = list(iter_episodes(3, seed=2, target_bytes=12_000, now=NOW))
    lines = list(encoded_lines(episodes))
    assert len(lines) == 3
    for line, episode in zip(lines, episodes):
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        assert line[:-1] == orjson.dumps(episode)
        assert orjson.loads(line) == episode
