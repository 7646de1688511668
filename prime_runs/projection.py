"""Episodes as the platform's legacy tables: v0 sample rows, their upload batches, and the training Parquet table.

Before Prime Traces, the platform stored an evaluation's episodes as rows of
a samples table and a training run's as per-step Parquet files; code that
still writes those (an account without Prime Traces, a trainer of its own)
builds them here from verifiers' ``Episode`` and ``Trace`` objects, read by
attribute (nothing here imports verifiers)::

    from prime_runs.projection import batch_samples, build_samples, encode_samples

    numbers: dict = {}                        # rollout numbers, kept across calls
    rows = build_samples(episodes, numbers)   # one row per episode, the episode in info.native_wrapper
    for batch in batch_samples(rows):         # each body within MAX_SAMPLES_PAYLOAD_BYTES
        post("/samples", encode_samples(batch))

- Sample rows: :func:`trace_to_sample`, :func:`episode_to_samples`,
  :func:`build_samples`, :func:`summary_trace_index`; NaN and the
  infinities become null.
- Upload batches: :func:`batch_samples`, :func:`encode_samples`,
  :func:`json_bytes`, :data:`MAX_SAMPLES_PAYLOAD_BYTES` (25 MiB),
  :data:`ENVELOPE_BYTES`.
- The training table (needs pyarrow, the ``train`` extra):
  :func:`parquet_available`, :func:`train_sample_schema`,
  :func:`episodes_to_parquet_bytes`.
"""

from prime_runs._records.samples import (
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
from prime_runs._records.train_table import episodes_to_parquet_bytes, parquet_available, train_sample_schema

__all__ = [
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
