"""The training samples table (``prime_runs.projection.episodes_to_parquet_bytes``), written and read back.

Writing Parquet needs pyarrow (the ``train`` extra; the ``test`` extra
installs it too). Without it the tests that write a table skip with the
reason, except under ``CI=true``, where they fail: CI must run them. What a
run without pyarrow is told is tested either way, with the import blocked.
"""

from __future__ import annotations

import io
import json
import math
import os
import sys
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
import pytest
from _episode_fakes import EnvInfo, Episode, branch, make_episode, make_trace

from prime_runs import projection


@pytest.fixture
def pa() -> Any:
    """pyarrow, with ``pyarrow.parquet`` loaded; skips without it, or fails under CI=true."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError as err:
        reason = f"pyarrow is not installed (pip install -e '.[test]'): {err}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true and the Parquet tests cannot run: {reason}", pytrace=False)
        pytest.skip(reason)
    return pyarrow


def _read(pa: Any, data: bytes | None) -> Any:
    assert isinstance(data, bytes)
    return pa.parquet.read_table(io.BytesIO(data))


def _train_episode(episode_id: str, *, idx: Any, advantage: Any = 0.5, env_id: str = "gsm8k", **trace: Any) -> Episode:
    trace.setdefault("branches", [branch("q", "a", input_tokens=7, output_tokens=5)])
    solver = make_trace(f"{episode_id}-t", idx=idx, info={"advantage": advantage}, **trace)
    return make_episode(episode_id, solver, env=EnvInfo(env_id))


def test_without_pyarrow_the_table_says_which_extra_installs_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # makes `import pyarrow` raise ImportError
    assert projection.parquet_available() is False
    with pytest.raises(ImportError, match=r"pip install 'prime-runs\[train\]'"):
        projection.train_sample_schema()
    with pytest.raises(ImportError, match="needs pyarrow") as caught:
        projection.episodes_to_parquet_bytes([_train_episode("e", idx=1)], "run-1", 10)
    assert isinstance(caught.value.__cause__, ImportError)


def test_with_pyarrow_parquet_is_available(pa):
    assert projection.parquet_available() is True


def test_the_schema_names_every_column_with_its_type(pa):
    schema = projection.train_sample_schema()
    text = pa.string()
    assert [(f.name, f.type) for f in schema] == [
        ("run_id", text),
        ("step", pa.int64()),
        ("tag", text),
        ("problem_id", pa.int64()),
        ("sample_id", pa.int64()),
        ("prompt", text),
        ("completion", text),
        ("trajectory", text),
        ("answer", text),
        ("env_name", text),
        ("task", text),
        ("info", text),
        ("reward", pa.float64()),
        ("advantage", pa.float64()),
        ("metrics", text),
        ("timing", text),
        ("num_input_tokens", pa.int64()),
        ("num_output_tokens", pa.int64()),
        ("created_at", pa.timestamp("us", tz="UTC")),
    ]


def test_a_step_is_one_row_per_episode_with_its_advantage_and_environment(pa):
    two_branches = [
        branch("q", "a1", input_tokens=3, output_tokens=2),
        branch("q", "a2", input_tokens=9, output_tokens=4),
    ]
    episodes = [
        _train_episode("e1", idx=3, advantage=0.25, metrics={"len": 2.0}),
        _train_episode("e2", idx=4, advantage=-1.0, env_id="", branches=two_branches),
    ]
    before = datetime.now(timezone.utc)
    table = _read(pa, projection.episodes_to_parquet_bytes(episodes, "run-abc", 10))
    after = datetime.now(timezone.utc)
    assert table.schema == projection.train_sample_schema()
    rows = table.to_pylist()
    assert [r["run_id"] for r in rows] == ["run-abc", "run-abc"]
    assert [r["step"] for r in rows] == [10, 10]
    assert [r["problem_id"] for r in rows] == [3, 4]
    assert [r["sample_id"] for r in rows] == [0, 1]
    assert [r["reward"] for r in rows] == [1.0, 1.0]
    assert [r["advantage"] for r in rows] == [0.25, -1.0]
    assert [r["env_name"] for r in rows] == ["gsm8k", ""]
    assert [(r["tag"], r["prompt"], r["answer"]) for r in rows] == [("", "", ""), ("", "", "")]
    assert [(r["num_input_tokens"], r["num_output_tokens"]) for r in rows] == [(7, 5), (9, 4)]  # the last branch's
    assert rows[0]["created_at"] == rows[1]["created_at"]
    assert before - timedelta(milliseconds=1) <= rows[0]["created_at"] <= after

    trajectory = json.loads(rows[1]["trajectory"])
    assert [entry["advantage"] for entry in trajectory] == [-1.0, -1.0]
    assert [[m["content"] for m in entry["messages"]] for entry in trajectory] == [["q", "a1"], ["q", "a2"]]
    assert [m["content"] for m in json.loads(rows[1]["completion"])] == ["q", "a2"]
    info = json.loads(rows[0]["info"])
    assert info["native_wrapper"]["id"] == "e1"
    assert info["native_trace_index"] == 0
    assert json.loads(rows[0]["task"]) == {"idx": 3, "prompt": "2+2?", "answer": "4"}
    assert json.loads(rows[0]["metrics"]) == {"len": 2.0}
    assert json.loads(rows[0]["timing"]) == {"start": 1.0, "agent": 2.5}
    assert rows[0]["metrics"] == '{"len": 2.0}'  # json.dumps's own spacing


def test_non_finite_values_are_null_in_the_columns_and_the_json(pa):
    episode = _train_episode("e", idx=1, advantage=math.nan, metrics={"loss": math.inf})
    [row] = _read(pa, projection.episodes_to_parquet_bytes([episode], "run-1", 0)).to_pylist()
    assert row["advantage"] is None
    assert json.loads(row["metrics"]) == {"loss": None}
    assert [entry["advantage"] for entry in json.loads(row["trajectory"])] == [None]
    assert "NaN" not in row["info"] and "Infinity" not in row["metrics"]


def test_numpy_values_are_written_as_plain_numbers(pa):
    episode = _train_episode("e", idx=np.int64(4), advantage=np.float32(0.25))
    episode.traces[0].info["curve"] = np.array([1.0, np.nan])
    episode.traces[0].metrics["len"] = np.float64(3.0)
    [row] = _read(pa, projection.episodes_to_parquet_bytes([episode], "run-1", 0)).to_pylist()
    assert (row["problem_id"], row["advantage"]) == (4, 0.25)
    assert json.loads(row["info"])["curve"] == [1.0, None]
    assert json.loads(row["metrics"]) == {"len": 3.0}
    assert [entry["advantage"] for entry in json.loads(row["trajectory"])] == [0.25]

    episode.traces[0].info["handle"] = object()
    with pytest.raises(TypeError, match="not JSON serializable"):
        projection.episodes_to_parquet_bytes([episode], "run-1", 0)


def test_sample_ids_start_at_the_offset_and_a_row_without_a_trajectory_keeps_its_number(pa):
    episodes = [
        _train_episode("e1", idx=1),
        _train_episode("e2", idx=2, branches=[]),
        Episode("no-traces"),  # no row at all, and no number
        _train_episode("e3", idx=3),
    ]
    table = _read(pa, projection.episodes_to_parquet_bytes(episodes, "run-1", 20, sample_id_offset=7))
    assert table.column("sample_id").to_pylist() == [7, 9]
    assert table.column("problem_id").to_pylist() == [1, 3]
    offset = 2**32
    table = _read(pa, projection.episodes_to_parquet_bytes(episodes[:1], "run-1", 20, sample_id_offset=offset))
    assert table.column("sample_id").to_pylist() == [offset]


def test_a_step_without_a_trajectory_has_no_file(pa):
    assert projection.episodes_to_parquet_bytes([_train_episode("e", idx=1, branches=[])], "run-1", 10) is None
    assert projection.episodes_to_parquet_bytes([Episode("no-traces")], "run-1", 10) is None
    assert projection.episodes_to_parquet_bytes([], "run-1", 10) is None


def test_the_problem_id_is_the_example_id_or_else_the_sample_id(pa):
    episodes = [_train_episode("a", idx=None), _train_episode("b", idx="abc"), _train_episode("c", idx="12")]
    table = _read(pa, projection.episodes_to_parquet_bytes(episodes, "run-1", 10, sample_id_offset=100))
    assert table.column("problem_id").to_pylist() == [100, 101, 12]


def test_the_file_is_snappy_compressed_with_dictionaries_and_statistics(pa):
    data = projection.episodes_to_parquet_bytes([_train_episode("e", idx=5)], "run-1", 10)
    metadata = pa.parquet.ParquetFile(io.BytesIO(data)).metadata
    columns = [metadata.row_group(0).column(i) for i in range(metadata.num_columns)]
    assert {column.compression for column in columns} == {"SNAPPY"}
    assert all(column.is_stats_set for column in columns)
    run_id = columns[0]
    assert run_id.path_in_schema == "run_id"
    assert any("DICTIONARY" in encoding for encoding in run_id.encodings)
