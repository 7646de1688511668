"""``prime_runs.projection``: episodes as v0 sample rows and their upload batches.

The episodes and traces are stand-ins for verifiers' objects (``_episode_fakes``).

The Parquet table has its own tests (``test_train_table.py``).
"""

from __future__ import annotations

import logging
import math

import numpy as np
import orjson
import pytest
from _episode_fakes import Episode, Model, Reward, branch, make_episode, make_trace

from prime_runs import projection
from prime_runs.projection import (
    ENVELOPE_BYTES,
    MAX_SAMPLES_PAYLOAD_BYTES,
    batch_samples,
    build_samples,
    encode_samples,
    episode_to_samples,
    json_bytes,
    summary_trace_index,
    trace_to_sample,
)

ROW_KEYS = [
    "sample_id",
    "example_id",
    "rollout_number",
    "episode_id",
    "agent",
    "trainable",
    "task",
    "prompt",
    "completion",
    "answer",
    "tool_defs",
    "reward",
    "timing",
    "is_completed",
    "is_truncated",
    "metrics",
    "error",
    "stop_condition",
    "trajectory",
    "token_usage",
    "info",
]


def test_the_module_exports_the_projection_and_its_limits():
    assert sorted(projection.__all__) == [
        "ENVELOPE_BYTES",
        "MAX_SAMPLES_PAYLOAD_BYTES",
        "batch_samples",
        "build_samples",
        "encode_samples",
        "episode_to_samples",
        "episodes_to_parquet_bytes",
        "json_bytes",
        "parquet_available",
        "summary_trace_index",
        "trace_to_sample",
        "train_sample_schema",
    ]
    assert MAX_SAMPLES_PAYLOAD_BYTES == 26_214_400
    assert ENVELOPE_BYTES == len(b'{"samples":[]}') == 14


def test_a_trace_becomes_the_flat_row_with_its_keys_in_order():
    trace = make_trace(
        "t-9",
        idx=7,
        agent="prover",
        metrics={"len": 12.0},
        info={"seed": 1},
        errors=[Model(type="Timeout", message="slow", traceback=None)],
        stop_condition="max_turns",
        is_truncated=True,
        tools=[Model(name="calc", description=None)],
        usage=Model(prompt_tokens=10, completion_tokens=5, cost=None),
        branches=[branch("2+2?", "4", input_tokens=10, output_tokens=5)],
    )
    row = trace_to_sample(trace, rollout_number=3, episode_id="ep-2")
    messages = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    assert row == {
        "sample_id": "t-9",
        "example_id": 7,
        "rollout_number": 3,
        "episode_id": "ep-2",
        "agent": "prover",
        "trainable": True,
        "task": {"idx": 7, "prompt": "2+2?", "answer": "4"},
        "prompt": [],
        "completion": messages,
        "answer": "4",
        "tool_defs": [{"name": "calc"}],
        "reward": 1.0,
        "timing": {"start": 1.0, "agent": 2.5},
        "is_completed": True,
        "is_truncated": True,
        "metrics": {"len": 12.0},
        "error": {"type": "Timeout", "message": "slow"},
        "stop_condition": "max_turns",
        "trajectory": [{"messages": messages, "num_input_tokens": 10, "num_output_tokens": 5}],
        "token_usage": {"prompt_tokens": 10, "completion_tokens": 5},
        "info": {"seed": 1},
        "correct": 1.0,
    }
    assert list(row) == [*ROW_KEYS, "correct"]


def test_the_defaults_and_what_a_bare_trace_leaves_empty():
    row = trace_to_sample(make_trace("t-1", score=None, info={}))
    assert (row["rollout_number"], row["episode_id"]) == (1, None)
    assert (row["tool_defs"], row["error"], row["token_usage"], row["info"]) == (None, None, None, None)
    assert row["reward"] == 0
    assert list(row) == ROW_KEYS  # the unscored sub-reward has no column


def test_sub_rewards_become_columns_and_unscored_ones_are_left_out():
    trace = make_trace("t", rewards={"correct": Reward(1.0), "format": Reward(0.25, weight=2.0), "judge": None})
    row = trace_to_sample(trace)
    assert (row["correct"], row["format"]) == (1.0, 0.25)  # the score, not the weighted value
    assert "judge" not in row
    assert row["reward"] == 1.5


def test_a_sub_reward_never_replaces_a_column():
    trace = make_trace("t", rewards={"reward": Reward(0.2), "agent": Reward(0.3), "task": Reward(0.4)})
    row = trace_to_sample(trace)
    assert row["reward"] == pytest.approx(0.9)
    assert row["agent"] == "solver"
    assert row["task"]["idx"] == 3
    assert list(row) == ROW_KEYS


def test_the_completion_is_the_last_branch_and_the_trajectory_has_one_entry_per_branch():
    first = branch("q", "draft", input_tokens=8, output_tokens=2)
    second = branch("q", "draft", "final", input_tokens=12, output_tokens=6)
    row = trace_to_sample(make_trace("t", branches=[first, second]))
    assert [m["content"] for m in row["completion"]] == ["q", "draft", "final"]
    assert [[m["content"] for m in entry["messages"]] for entry in row["trajectory"]] == [
        ["q", "draft"],
        ["q", "draft", "final"],
    ]
    assert [(e["num_input_tokens"], e["num_output_tokens"]) for e in row["trajectory"]] == [(8, 2), (12, 6)]
    assert row["completion"] is not row["trajectory"][-1]["messages"]  # no shared list in the row

    bare = trace_to_sample(make_trace("t", branches=[]))
    assert (bare["completion"], bare["trajectory"]) == ([], [])


def test_non_finite_floats_become_null_at_any_depth_and_tuples_become_lists():
    trace = make_trace(
        "t",
        rewards={"correct": Reward(math.nan), "format": Reward(0.5)},
        metrics={"loss": math.inf, "len": 3.0},
        info={"curve": (1.0, -math.inf, {"deep": [math.nan]}), "label": "x"},
    )
    row = trace_to_sample(trace)
    assert row["reward"] is None
    assert row["correct"] is None
    assert row["format"] == 0.5
    assert row["metrics"] == {"loss": None, "len": 3.0}
    assert row["info"] == {"curve": [1.0, None, {"deep": [None]}], "label": "x"}
    assert math.isinf(trace.metrics["loss"])  # the trace itself is left as it was
    assert isinstance(trace.info["curve"], tuple)
    orjson.loads(encode_samples([row]))


def test_numpy_values_and_keys_that_are_not_strings_are_written_as_json_would():
    trace = make_trace("t", info={"curve": np.array([0.5, np.nan]), 7: np.float32(np.inf)}, metrics={"n": np.int64(2)})
    row = trace_to_sample(trace)
    assert orjson.loads(encode_samples([row]))["samples"][0]["info"] == {"curve": [0.5, None], "7": None}
    assert json_bytes(row) == len(encode_samples([row])) - ENVELOPE_BYTES
    assert json_bytes(row["metrics"]) == len(b'{"n":2}')
    with pytest.raises(TypeError):
        json_bytes({"handle": object()})


def test_an_episode_is_one_row_carrying_the_whole_episode():
    solver = make_trace("t-solver", idx=4, info={"seed": 9, "ratio": math.nan})
    episode = make_episode("ep-1", solver, make_trace("t-judge", trainable=False))
    [row] = episode_to_samples(episode, rollout_number=2)
    assert row["sample_id"] == "ep-1"
    assert row["episode_id"] == "ep-1"
    assert (row["example_id"], row["rollout_number"], row["agent"]) == (4, 2, "solver")
    assert row["info"] == {
        "seed": 9,
        "ratio": None,
        "native_wrapper": episode.to_record(),
        "native_trace_index": 0,
    }
    assert list(row) == [*ROW_KEYS, "correct"]


def test_the_native_wrapper_is_made_finite_too():
    episode = make_episode("ep", extra={"score": math.inf, "pairs": (1, 2)})
    [row] = episode_to_samples(episode, 1)
    assert row["info"]["native_wrapper"]["score"] is None
    assert row["info"]["native_wrapper"]["pairs"] == [1, 2]


def test_the_summary_trace_is_the_first_trainable_one():
    judge = make_trace("judge", idx=1, trainable=False)
    first, second = make_trace("first", idx=2), make_trace("second", idx=3)
    episode = make_episode("ep", judge, first, second)
    assert summary_trace_index(episode) == 1
    [row] = episode_to_samples(episode, 1)
    assert (row["info"]["native_trace_index"], row["example_id"], row["agent"]) == (1, 2, "solver")

    untrained = make_episode("ep2", make_trace("a", idx=5, trainable=False), make_trace("b", trainable=False))
    assert summary_trace_index(untrained) == 0
    assert episode_to_samples(untrained, 1)[0]["example_id"] == 5


def _padded_episode(padding: int) -> Episode:
    return make_episode("ep-big", make_trace("t-a"), make_trace("t-b", idx=8), extra={"pad": "x" * padding})


def test_an_episode_whose_row_fits_exactly_is_one_row(caplog):
    slack = MAX_SAMPLES_PAYLOAD_BYTES - ENVELOPE_BYTES - json_bytes(episode_to_samples(_padded_episode(0), 1)[0])
    with caplog.at_level(logging.WARNING, logger="prime_runs"):
        [row] = episode_to_samples(_padded_episode(slack), 1)
    assert ENVELOPE_BYTES + json_bytes(row) == MAX_SAMPLES_PAYLOAD_BYTES
    assert row["sample_id"] == "ep-big"
    assert caplog.records == []


def test_an_episode_too_large_for_one_request_becomes_one_row_per_trace(caplog):
    slack = MAX_SAMPLES_PAYLOAD_BYTES - ENVELOPE_BYTES - json_bytes(episode_to_samples(_padded_episode(0), 1)[0])
    episode = _padded_episode(slack + 1)
    with caplog.at_level(logging.WARNING, logger="prime_runs"):
        rows = episode_to_samples(episode, rollout_number=4)
    assert rows == [trace_to_sample(trace, 4, "ep-big") for trace in episode.traces]
    assert [row["sample_id"] for row in rows] == ["t-a", "t-b"]
    assert [row["example_id"] for row in rows] == [3, 8]
    assert all(row["info"] is None for row in rows)  # no native wrapper
    assert [record.getMessage() for record in caplog.records] == [
        "Episode ep-big exceeds the platform sample limit; uploading projected traces"
    ]
    assert caplog.records[0].levelno == logging.WARNING


def test_build_samples_gives_one_row_per_episode_in_order():
    episodes = [make_episode("ep-1"), make_episode("ep-2")]
    rows = build_samples(episodes)
    assert [row["sample_id"] for row in rows] == ["ep-1", "ep-2"]
    assert [row["info"]["native_wrapper"]["id"] for row in rows] == ["ep-1", "ep-2"]
    assert [row["info"]["native_trace_index"] for row in rows] == [0, 0]


def test_rollout_numbers_count_per_example_and_continue_across_calls():
    numbers: dict = {}
    first = build_samples(
        [make_episode("a", make_trace("a", idx=4)), make_episode("b", make_trace("b", idx=5))], numbers
    )
    second = build_samples([make_episode("c", make_trace("c", idx=4))], numbers)
    assert [(row["sample_id"], row["rollout_number"]) for row in first + second] == [("a", 1), ("b", 1), ("c", 2)]
    assert numbers == {4: 2, 5: 1}
    # Without a counter of its own, each call counts from 1.
    assert [row["rollout_number"] for row in build_samples([make_episode("d", make_trace("d", idx=4))])] == [1]


def test_the_rollout_number_follows_the_summary_traces_example():
    episode = make_episode("ep", make_trace("judge", idx=1, trainable=False), make_trace("solver", idx=2))
    numbers: dict = {}
    build_samples([episode, episode], numbers)
    assert numbers == {2: 2}


def test_episodes_without_traces_have_no_row_and_take_no_rollout_number():
    numbers: dict = {}
    rows = build_samples([Episode("empty"), make_episode("full", make_trace("t", idx=6))], numbers)
    assert [row["sample_id"] for row in rows] == ["full"]
    assert numbers == {6: 1}
    assert episode_to_samples(Episode("empty"), 1) == []
    assert build_samples([]) == []


def _sample_of_size(size: int, name: str = "s") -> dict:
    sample = {"id": name, "pad": ""}
    sample["pad"] = "y" * (size - json_bytes(sample))
    assert json_bytes(sample) == size
    return sample


def test_batches_fill_up_to_the_ceiling_and_no_further():
    half = (MAX_SAMPLES_PAYLOAD_BYTES - ENVELOPE_BYTES - 1) // 2  # two of these and a comma fill a body
    exact = [_sample_of_size(half, "a"), _sample_of_size(MAX_SAMPLES_PAYLOAD_BYTES - ENVELOPE_BYTES - 1 - half, "b")]
    [batch] = batch_samples(exact)
    assert batch == exact
    assert len(encode_samples(batch)) == MAX_SAMPLES_PAYLOAD_BYTES

    over = [exact[0], _sample_of_size(json_bytes(exact[1]) + 1, "b"), _sample_of_size(100, "c")]
    batches = batch_samples(over)
    assert [[sample["id"] for sample in batch] for batch in batches] == [["a"], ["b", "c"]]
    assert [len(encode_samples(batch)) for batch in batches] == [
        ENVELOPE_BYTES + half,
        ENVELOPE_BYTES + json_bytes(over[1]) + 1 + 100,
    ]


def test_small_samples_share_one_batch():
    samples = [_sample_of_size(50, f"s{i}") for i in range(5)]
    [batch] = batch_samples(iter(samples))
    assert batch == samples
    assert len(encode_samples(batch)) == ENVELOPE_BYTES + 5 * 50 + 4


def test_a_sample_that_cannot_fit_any_request_is_refused_by_its_position():
    largest = _sample_of_size(MAX_SAMPLES_PAYLOAD_BYTES - ENVELOPE_BYTES, "fits")
    assert batch_samples([largest]) == [[largest]]
    too_large = _sample_of_size(MAX_SAMPLES_PAYLOAD_BYTES - ENVELOPE_BYTES + 1, "no")
    with pytest.raises(ValueError) as caught:
        batch_samples([_sample_of_size(40), too_large])
    assert str(caught.value) == "sample 1 is too large to upload (26214401 > 26214400 bytes)"


def test_no_samples_no_batches():
    assert batch_samples([]) == []


def test_sizes_are_of_compact_utf8_json():
    assert json_bytes({"a": [1, 2]}) == len(b'{"a":[1,2]}')
    assert json_bytes({"name": "é✓"}) == len('{"name":"é✓"}'.encode())
    assert json_bytes({1: None}) == len(b'{"1":null}')
    assert encode_samples([{"a": 1}]) == b'{"samples":[{"a":1}]}'
