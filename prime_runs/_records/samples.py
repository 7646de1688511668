"""Episodes as the platform's v0 sample rows, and those rows cut into upload batches.

The legacy samples table (a JSON body ``{"samples": [...]}``) holds one flat
row per episode: its summary trace (the first trainable one) projected by
:func:`trace_to_sample`, with the whole episode kept in
``info["native_wrapper"]`` and the summary trace's position in
``info["native_trace_index"]``. An episode whose row would not fit in one
request becomes one row per trace instead, without the wrapper.

Episodes and traces are read by attribute, as verifiers' pydantic objects
carry them (nothing here imports verifiers):

- an episode: ``id``, ``env.id``, ``traces``, ``ok``, ``to_record()``;
- a trace: ``id``, ``task.data`` (with ``idx`` and ``model_dump``),
  ``agent.name``, ``agent.trainable``, ``rewards`` (name to an object with
  ``score``, or None), ``reward``, ``metrics``, ``info``, ``timing``,
  ``is_completed``, ``is_truncated``, ``last_error``, ``stop_condition``,
  ``tools``, ``usage``, and ``branches``, each with ``messages``,
  ``num_input_tokens`` and ``num_output_tokens``.

Objects with a ``model_dump`` are dumped as JSON (``mode="json"``, without
None fields); every NaN and infinity in a row becomes null.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from typing import Any

import orjson

logger = logging.getLogger(__name__)

#: The largest ``{"samples": [...]}`` body one request may carry (25 MiB).
MAX_SAMPLES_PAYLOAD_BYTES = 25 * 1024 * 1024
#: The bytes of the body around its rows: ``len(b'{"samples":[]}')``.
ENVELOPE_BYTES = len(b'{"samples":[]}')

# A trace's info and metrics are the producer's own dicts: keys that are not strings become strings
# (as the standard library's json writes them) and numpy values numbers (NaN as null), rather than
# failing the row.
_JSON_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY


def json_bytes(value: Any) -> int:
    """The size of ``value`` as compact UTF-8 JSON, as :func:`encode_samples` writes it.

    ``json_bytes({"a": [1, 2]}) == 11``. Raises TypeError for a value JSON cannot hold.
    """
    return len(orjson.dumps(value, option=_JSON_OPTIONS))


def encode_samples(batch: Sequence[Mapping[str, Any]]) -> bytes:
    """The request body for one batch: ``{"samples":[...]}`` as compact UTF-8 JSON.

    Its length is ``ENVELOPE_BYTES`` plus each row's :func:`json_bytes` plus one
    comma between rows, the sum :func:`batch_samples` keeps within the limit.
    """
    return orjson.dumps({"samples": batch}, option=_JSON_OPTIONS)


def null_non_finite(value: Any) -> Any:
    """``value`` with every NaN and infinity, at any depth, as None; tuples become lists.

    Mappings and sequences are copied, so the result shares no container with ``value``.
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {key: null_non_finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [null_non_finite(item) for item in value]
    return value


def summary_trace_index(episode: Any) -> int:
    """The position of the episode's first trace whose agent is trainable; 0 when none is."""
    return _summary_index(episode.traces)


def trace_to_sample(trace: Any, rollout_number: int = 1, episode_id: str | None = None) -> dict[str, Any]:
    """One trace as a v0 sample row.

    The keys, in order: ``sample_id`` (the trace's id), ``example_id``
    (``task.data.idx``), ``rollout_number``, ``episode_id``, ``agent``,
    ``trainable``, ``task`` (the task data), ``prompt`` (always ``[]``: the
    prompt is in the messages), ``completion`` (the last branch's messages),
    ``answer`` (the task's), ``tool_defs``, ``reward``, ``timing``,
    ``is_completed``, ``is_truncated``, ``metrics``, ``error`` (the last one),
    ``stop_condition``, ``trajectory`` (one ``{messages, num_input_tokens,
    num_output_tokens}`` per branch), ``token_usage`` and ``info``; then each
    scored sub-reward by its name, unless a column of that name exists already
    (a reward named ``reward`` does not replace the total). NaN and the
    infinities become None.

    Usage::

        row = trace_to_sample(episode.traces[0], rollout_number=2, episode_id=episode.id)
        row["completion"][-1]["content"]
    """
    task = _dump(trace.task.data)
    branches = list(trace.branches)
    messages = [[_dump(message) for message in branch.messages] for branch in branches]
    row: dict[str, Any] = {
        "sample_id": trace.id,
        "example_id": trace.task.data.idx,
        "rollout_number": rollout_number,
        "episode_id": episode_id,
        "agent": trace.agent.name,
        "trainable": trace.agent.trainable,
        "task": task,
        "prompt": [],
        "completion": messages[-1] if messages else [],
        "answer": task.get("answer"),
        "tool_defs": [_dump(tool) for tool in trace.tools] or None,
        "reward": trace.reward,
        "timing": _dump(trace.timing),
        "is_completed": trace.is_completed,
        "is_truncated": trace.is_truncated,
        "metrics": trace.metrics,
        "error": _dump(trace.last_error),
        "stop_condition": trace.stop_condition,
        "trajectory": [
            {
                "messages": branch_messages,
                "num_input_tokens": branch.num_input_tokens,
                "num_output_tokens": branch.num_output_tokens,
            }
            for branch, branch_messages in zip(branches, messages)
        ],
        "token_usage": _dump(trace.usage),
        "info": dict(trace.info or {}) or None,
    }
    for name, reward in trace.rewards.items():
        if reward is not None:
            row.setdefault(name, reward.score)
    return null_non_finite(row)


def episode_to_samples(episode: Any, rollout_number: int) -> list[dict[str, Any]]:
    """The rows of one episode: one carrying the whole episode, or one per trace when that is too large.

    The row is its summary trace's (:func:`summary_trace_index`) with
    ``sample_id`` set to the episode's id and ``native_wrapper`` (the
    episode's ``to_record()``) and ``native_trace_index`` added to ``info``.
    When that row and the body around it exceed
    :data:`MAX_SAMPLES_PAYLOAD_BYTES`, a WARNING names the episode and each
    trace becomes a row of its own, all with this ``rollout_number``. An
    episode without traces has no row.

    Usage::

        rows = episode_to_samples(episode, rollout_number=1)
    """
    traces = list(episode.traces)
    if not traces:
        return []
    index = _summary_index(traces)
    sample = trace_to_sample(traces[index], rollout_number, episode.id)
    sample["sample_id"] = episode.id
    sample["info"] = null_non_finite(
        {**(sample["info"] or {}), "native_wrapper": episode.to_record(), "native_trace_index": index}
    )
    if ENVELOPE_BYTES + json_bytes(sample) <= MAX_SAMPLES_PAYLOAD_BYTES:
        return [sample]
    logger.warning("Episode %s exceeds the platform sample limit; uploading projected traces", episode.id)
    return [trace_to_sample(trace, rollout_number, episode.id) for trace in traces]


def build_samples(
    episodes: Iterable[Any], rollout_numbers: MutableMapping[Any, int] | None = None
) -> list[dict[str, Any]]:
    """The v0 sample rows of ``episodes``, in order (:func:`episode_to_samples`); episodes without traces have none.

    An episode's ``rollout_number`` counts the episodes seen so far for the
    same example (its summary trace's ``task.data.idx``), from 1. Pass the
    same ``rollout_numbers`` dict to every call to keep counting across calls
    when episodes arrive a few at a time; without it each call counts afresh.

    Usage::

        numbers: dict = {}
        for batch in stream:
            rows = build_samples(batch, numbers)
    """
    counts: MutableMapping[Any, int] = {} if rollout_numbers is None else rollout_numbers
    samples: list[dict[str, Any]] = []
    for episode in episodes:
        traces = episode.traces
        if not traces:
            continue
        example = traces[_summary_index(traces)].task.data.idx
        counts[example] = number = counts.get(example, 0) + 1
        samples.extend(episode_to_samples(episode, number))
    return samples


def batch_samples(samples: Iterable[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """``samples`` in order, cut into batches whose body (:func:`encode_samples`) fits in one request.

    Each batch is filled greedily up to :data:`MAX_SAMPLES_PAYLOAD_BYTES`.
    A sample that does not fit even alone raises ``ValueError("sample <i> is
    too large to upload (<n> > 26214400 bytes)")``, where ``i`` is its
    position and ``n`` the body it alone would make. No samples, no batches.

    Usage::

        for batch in batch_samples(rows):
            post(encode_samples(batch))
    """
    batches: list[list[dict[str, Any]]] = []
    batch: list[dict[str, Any]] = []
    body_bytes = ENVELOPE_BYTES
    for index, sample in enumerate(samples):
        size = json_bytes(sample)
        if ENVELOPE_BYTES + size > MAX_SAMPLES_PAYLOAD_BYTES:
            raise ValueError(
                f"sample {index} is too large to upload ({ENVELOPE_BYTES + size} > {MAX_SAMPLES_PAYLOAD_BYTES} bytes)"
            )
        if batch and body_bytes + 1 + size > MAX_SAMPLES_PAYLOAD_BYTES:
            batches.append(batch)
            batch, body_bytes = [], ENVELOPE_BYTES
        body_bytes += size + (1 if batch else 0)  # the comma before every row but the first
        batch.append(sample)
    if batch:
        batches.append(batch)
    return batches


def _summary_index(traces: Sequence[Any]) -> int:
    return next((index for index, trace in enumerate(traces) if trace.agent.trainable), 0)


def _dump(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    return value if dump is None else dump(mode="json", exclude_none=True)
