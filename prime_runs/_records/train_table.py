"""The training samples table: a step's episodes as one Parquet file of sample rows.

The platform's viewer of a training run reads, per step, Parquet files of the
schema :func:`train_sample_schema` gives: one row per v0 sample row
(:func:`~prime_runs._records.samples.build_samples`) that has a trajectory,
with the episode's advantage (its summary trace's ``info["advantage"]``) in
a column and on every branch of the trajectory, its environment's id, and the
nested parts as JSON text.

Parquet needs ``pyarrow``, which the package does not require: it is imported
only here, when a table is built, and the ``train`` extra installs it
(:data:`PYARROW_MISSING` says how). :func:`parquet_available` tells whether it
can be imported, for code that decides up front.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

from prime_runs._records.samples import build_samples, null_non_finite, summary_trace_index

#: The message of the ImportError raised when a table is asked for without pyarrow.
PYARROW_MISSING = (
    "the training samples table is written as Parquet, which needs pyarrow: "
    "pip install 'prime-runs[train]' (or pip install 'pyarrow>=15.0.0')"
)

# The columns that hold a sample row's part of the same name as JSON text.
_JSON_COLUMNS = ("completion", "task", "info", "metrics", "timing")


def parquet_available() -> bool:
    """Whether ``import pyarrow`` works, so that the training samples table can be written.

    Usage::

        if not parquet_available():
            logger.warning("no training samples table: pyarrow is not installed")
    """
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    return True


def train_sample_schema() -> Any:
    """The ``pyarrow.Schema`` of the training samples table; ImportError (:data:`PYARROW_MISSING`) without pyarrow.

    Columns, in order: ``run_id`` string, ``step`` int64, ``tag`` string,
    ``problem_id`` int64, ``sample_id`` int64; ``prompt``, ``completion``,
    ``trajectory``, ``answer``, ``env_name``, ``task`` and ``info`` strings;
    ``reward`` and ``advantage`` float64; ``metrics`` and ``timing`` strings;
    ``num_input_tokens`` and ``num_output_tokens`` int64; ``created_at``
    timestamp (microseconds, UTC).

    Usage::

        train_sample_schema().names[:3] == ["run_id", "step", "tag"]
    """
    pa = _pyarrow()
    text = pa.string()
    return pa.schema(
        [
            ("run_id", text),
            ("step", pa.int64()),
            ("tag", text),
            ("problem_id", pa.int64()),
            ("sample_id", pa.int64()),
            *((name, text) for name in ("prompt", "completion", "trajectory", "answer", "env_name", "task", "info")),
            ("reward", pa.float64()),
            ("advantage", pa.float64()),
            ("metrics", text),
            ("timing", text),
            ("num_input_tokens", pa.int64()),
            ("num_output_tokens", pa.int64()),
            ("created_at", pa.timestamp("us", tz="UTC")),
        ]
    )


def episodes_to_parquet_bytes(
    episodes: Iterable[Any], run_id: str, step: int, *, sample_id_offset: int = 0
) -> bytes | None:
    """One step's episodes as a Parquet file (snappy, dictionary encoding, statistics); None when it has no row.

    The sample rows of ``episodes`` (counted afresh: :func:`build_samples`)
    get ``sample_id`` numbers from ``sample_id_offset`` on, in order; a row
    without a trajectory is left out but still uses its number. For each row:
    ``problem_id`` is its example id as an int (its ``sample_id`` when there
    is none, or it is not a number); ``advantage`` is the episode's summary
    trace's ``info["advantage"]`` and is added to every trajectory branch;
    ``env_name`` is ``episode.env.id`` (or ""); the token counts are the last
    branch's; ``tag``, ``prompt`` and ``answer`` are ""; ``created_at`` is the
    same moment for every row. The nested parts are JSON text, NaN and the
    infinities as null, and numpy or torch values (anything with a
    ``tolist()``) as their plain values. Raises ImportError
    (:data:`PYARROW_MISSING`) without pyarrow, and TypeError for a value JSON
    cannot hold.

    Usage::

        data = episodes_to_parquet_bytes(episodes, "run-1", step=10, sample_id_offset=2**32)
        pyarrow.parquet.read_table(io.BytesIO(data)).column("reward")
    """
    pa = _pyarrow()
    import pyarrow.parquet as pq

    episodes = list(episodes)
    advantages: dict[Any, Any] = {}
    env_names: dict[Any, str] = {}
    for episode in episodes:
        if not episode.traces:
            continue
        summary = episode.traces[summary_trace_index(episode)]
        advantages[episode.id] = _plain((summary.info or {}).get("advantage"))
        env_names[episode.id] = str(getattr(getattr(episode, "env", None), "id", None) or "")

    schema = train_sample_schema()
    columns: dict[str, list[Any]] = {name: [] for name in schema.names}
    created_at = datetime.now(timezone.utc)
    for sample_id, sample in enumerate(build_samples(episodes), start=sample_id_offset):
        trajectory = sample["trajectory"]
        if not trajectory:
            continue
        episode_id = sample["episode_id"]
        advantage = advantages.get(episode_id)
        row = {
            "run_id": run_id,
            "step": step,
            "tag": "",
            "problem_id": _problem_id(sample["example_id"], sample_id),
            "sample_id": sample_id,
            "prompt": "",
            "trajectory": _json_text([{**branch, "advantage": advantage} for branch in trajectory]),
            "answer": "",
            "env_name": env_names.get(episode_id, ""),
            "reward": sample["reward"],
            "advantage": advantage,
            "num_input_tokens": trajectory[-1]["num_input_tokens"],
            "num_output_tokens": trajectory[-1]["num_output_tokens"],
            "created_at": created_at,
            **{name: _json_text(sample[name]) for name in _JSON_COLUMNS},
        }
        for name, column in columns.items():
            column.append(row[name])
    if not columns["sample_id"]:
        return None
    table = pa.Table.from_pydict(columns, schema=schema)
    out = pa.BufferOutputStream()
    pq.write_table(table, out, compression="snappy", use_dictionary=True, write_statistics=True)
    return out.getvalue().to_pybytes()


def _pyarrow() -> Any:
    try:
        import pyarrow
    except ImportError as err:
        raise ImportError(PYARROW_MISSING) from err
    return pyarrow


def _problem_id(example_id: Any, sample_id: int) -> int:
    if example_id is None:
        return sample_id
    try:
        return int(example_id)
    except (TypeError, ValueError):
        return sample_id


def _json_text(value: Any) -> str:
    # json.dumps's own spacing, as the published SDK writes these columns, so both writers' files read alike.
    return json.dumps(null_non_finite(value), default=_tolist)


def _plain(value: Any) -> Any:
    """``value`` as plain Python, non-finite as None: a trainer's advantage may be a numpy or torch scalar."""
    return null_non_finite(value.tolist() if hasattr(value, "tolist") else value)


def _tolist(value: Any) -> Any:
    if not hasattr(value, "tolist"):
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
    return _plain(value)
