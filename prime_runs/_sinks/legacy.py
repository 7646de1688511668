"""The platform's legacy sample tables: where a run's episodes go when its account has no Prime Traces.

The Traces sink routes here for good when the service answers 403
``service_not_enabled`` before anything of the run was stored, or from the
start when the run opted out (``traces_opt_out``). An evaluation's episodes
become v0 sample rows (:mod:`prime_runs.projection`) posted to
``/evaluations/{id}/samples`` in bodies of at most 25 MiB; a training run's
become one Parquet table per step, every :data:`STEP_INTERVAL` steps, put
through the platform's presigned storage (pyarrow, the ``train`` extra).

Only episode objects (verifiers' ``Episode``, read by attribute) have a
sample row, and v0 rows (mappings with a ``sample_id``) pass as they are; any
other record is counted as failed (``no_sample_row``), as is a training
episode of a step off the cadence (``sampled_out``). A request that fails
loses its records with the error's reason: the legacy tables are not
resynced from the run directory.
"""

from __future__ import annotations

import logging
import random
import threading
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from prime_runs._records import reasons
from prime_runs._records.ledger import Ledger
from prime_runs._records.samples import batch_samples, build_samples
from prime_runs._records.sink import SinkStatus
from prime_runs._records.train_table import episodes_to_parquet_bytes, parquet_available
from prime_traces.errors import APIError, RetryableAPIError, TransportError
from prime_traces.platform import PlatformClient

logger = logging.getLogger(__name__)

#: The legacy training table keeps the episodes of every this many steps.
STEP_INTERVAL = 10
#: A step's tables are numbered apart: the n-th upload of a step starts its sample ids at n * this.
SAMPLE_ID_STRIDE = 2**32
_NO_PYARROW = "the legacy training table is Parquet: install pyarrow (pip install 'prime-runs[train]')"


def _reason(err: BaseException) -> str:
    if isinstance(err, (RetryableAPIError, TransportError)):
        return reasons.TRANSIENT
    if isinstance(err, APIError):
        return reasons.refused(err.code, err.status_code)
    return reasons.crash(reasons.SINK_ERROR, err)


class LegacySamples:
    """Writes records to one run's legacy sample table; ``write`` reports each record into the ledger."""

    def __init__(self, platform: PlatformClient, run_id: str) -> None:
        self.platform = platform
        self.run_id = run_id

    def write(self, records: Sequence[Any], indexes: Sequence[int], ledger: Ledger) -> SinkStatus:
        raise NotImplementedError


class EvalSamples(LegacySamples):
    """An evaluation's sample rows, posted in batches of at most 25 MiB; rollouts numbered across writes."""

    def __init__(self, platform: PlatformClient, run_id: str) -> None:
        super().__init__(platform, run_id)
        self._rollouts: dict[Any, int] = {}
        self._lock = threading.Lock()  # two writes may run at once: the numbering is shared

    def write(self, records: Sequence[Any], indexes: Sequence[int], ledger: Ledger) -> SinkStatus:
        owners: list[int] = []  # the ledger index of each row
        rows: list[dict[str, Any]] = []
        for index, record in zip(indexes, records):
            try:
                made = self._rows(record)
            except Exception as err:  # noqa: BLE001  (a record that cannot be projected loses only itself)
                ledger.rejected(index, reasons.INVALID_RECORD, f"no sample row: {type(err).__name__}: {err}")
                continue
            if made is None:
                ledger.failed(
                    [index], reasons.NO_SAMPLE_ROW, "only episode objects have a row in the legacy sample table"
                )
                continue
            rows += made
            owners += [index] * len(made)
        status = SinkStatus.OK
        sent = 0
        for batch in batch_samples(rows):
            batch_owners = owners[sent : sent + len(batch)]
            sent += len(batch)
            try:
                self.platform.post_evaluation_samples(self.run_id, batch)
            except Exception as err:  # noqa: BLE001  (its records are counted; the next batch still goes)
                ledger.failed(sorted(set(batch_owners)), _reason(err), str(err))
                status = SinkStatus.TRANSIENT
                continue
            ledger.stored(sorted(set(batch_owners)))
        return status

    def _rows(self, record: Any) -> list[dict[str, Any]] | None:
        if isinstance(record, Mapping):
            return [dict(record)] if "sample_id" in record else None
        if not hasattr(record, "traces"):
            return None
        with self._lock:
            return build_samples([record], self._rollouts)


def training_step(record: Any) -> int | None:
    """The step of a training episode (``run.work.step`` of a train run), read by attribute or key."""
    run = _field(record, "run")
    work = _field(run, "work")
    step = _field(work, "step")
    if _field(run, "type") != "train" or _field(work, "type") != "train":
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _field(value: Any, name: str) -> Any:
    if isinstance(value, Mapping):
        return value.get(name)
    return getattr(value, name, None)


class TrainingSamples(LegacySamples):
    """A training run's per-step Parquet tables, every :data:`STEP_INTERVAL` steps."""

    def __init__(self, platform: PlatformClient, run_id: str, *, step_interval: int = STEP_INTERVAL) -> None:
        super().__init__(platform, run_id)
        if step_interval < 1:
            raise ValueError(f"step_interval must be at least 1, not {step_interval}")
        self.step_interval = step_interval
        self._uploads: dict[int, int] = defaultdict(int)
        self._lock = threading.Lock()
        # A forked child numbers its tables apart from its parent's.
        self._first_range = 0

    def after_fork_in_child(self) -> None:
        self._first_range = random.randrange(2**20, 2**21)

    def write(self, records: Sequence[Any], indexes: Sequence[int], ledger: Ledger) -> SinkStatus:
        steps: dict[int, list[tuple[int, Any]]] = defaultdict(list)
        for index, record in zip(indexes, records):
            step = None if isinstance(record, Mapping) or not hasattr(record, "traces") else training_step(record)
            if step is None:
                ledger.failed(
                    [index], reasons.NO_SAMPLE_ROW, "only training episode objects have a row in the legacy table"
                )
            elif step % self.step_interval:
                ledger.failed([index], reasons.SAMPLED_OUT, f"step {step} is not one the legacy table keeps")
            else:
                steps[step].append((index, record))
        if steps and not parquet_available():
            for entries in steps.values():
                ledger.failed([index for index, _ in entries], reasons.LEGACY_UNAVAILABLE, _NO_PYARROW)
            return SinkStatus.OK
        status = SinkStatus.OK
        for step in sorted(steps):
            owned = [index for index, _ in steps[step]]
            try:
                self._upload(step, [record for _, record in steps[step]])
            except Exception as err:  # noqa: BLE001  (that step's episodes are counted; the next step still goes)
                ledger.failed(owned, _reason(err), str(err))
                status = SinkStatus.TRANSIENT
                continue
            ledger.stored(owned)
        return status

    def _upload(self, step: int, episodes: list[Any]) -> None:
        with self._lock:
            upload = self._uploads[step]
            self._uploads[step] += 1  # even when this one fails: its ids are spent
        offset = (self._first_range + upload) * SAMPLE_ID_STRIDE
        table = episodes_to_parquet_bytes(episodes, self.run_id, step, sample_id_offset=offset)
        if table is None:
            return
        url, key = self.platform.presign_training_samples(self.run_id, step)
        self.platform.upload_training_samples(url, table)
        self.platform.confirm_training_samples(self.run_id, step, key)


def legacy_for(kind: str, platform: PlatformClient, run_id: str) -> LegacySamples:
    """The legacy table of a ``kind`` run."""
    return (TrainingSamples if kind == "train" else EvalSamples)(platform, run_id)
