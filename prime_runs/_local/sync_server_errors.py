"""A sync's 500s: the service's fault until one record is located while its neighbour is stored.

As in the run (``_sinks/server_errors.py``), with what a sync can do: it
sends a file's lines in order and records its progress, so

- a batch answered 500 is sent once more as it was (a replay, if the
  service had stored it);
- a second 500 asks the service whether it holds the batch's first record
  (a batch commits whole): if it does, the batch was stored and only its
  answer failed; if not, the batch is cut in two (the cut saved before
  anything depends on it), and each half is sent in turn;
- a single line answered 500 twice is located only if the line after it is
  stored: that line is sent alone (cuts around it saved first, so the
  in-order sync later sends it as the very same upload and the service
  answers a replay). Stored: the record is set aside
  (``rejected:http_500``, ``--retry-rejected`` sends it again). Answered
  500 too, or nothing to send after it: the service is failing, and the sync
  stops as in any outage (exit status 1), rejecting nothing.
"""

from __future__ import annotations

import collections
from typing import Any, Protocol

from prime_runs._records.faults import outcome_text, rejection_reason
from prime_traces.errors import PrimeTracesError
from prime_traces.report import BatchOutcome


class FileSync(Protocol):
    """What of ``sync_file.FileSync`` this uses."""

    path: str
    total: int
    p: Any  # FileProgress
    server_errors: collections.Counter[tuple[int, ...]]

    def save(self) -> None: ...
    def stored_already(self, number: int) -> bool | None: ...
    def mark_stored(self, batch: list[int]) -> None: ...
    def in_batch_entry(self, number: int) -> bool: ...
    def send_alone(self, number: int) -> None: ...
    def keep_rejected(self, number: int, reason: str, message: str) -> None: ...


def settle_server_error(sync: FileSync, batch: list[int], failed: BatchOutcome) -> str | None:
    """A batch of ``sync``'s file (its line numbers) was answered 500: replay, cut, set aside, or stop.

    Returns why the sync must stop (the service is failing), or ``None`` to go on.
    """
    key = tuple(batch)
    sync.server_errors[key] += 1
    if sync.server_errors[key] < 2:
        return None  # the loop sends the same batch again
    # Stored after all (the answer failed, not the upload)? Resending its records in other batches would store
    # them twice: a batch commits whole, so its first record tells.
    stored = sync.stored_already(batch[0])
    if stored is None:
        return f"the service fails (HTTP 500) on a batch of {sync.path}, and cannot say whether it stored it"
    if stored:
        sync.mark_stored(batch)
        return None
    if len(batch) > 1:
        sync.p.cuts.add(batch[len(batch) // 2])
        sync.save()
        return None
    line = batch[0]
    failing = f"the service fails (HTTP 500) on {sync.path} line {line + 1}"
    probe = line + 1
    horizon = sync.p.horizon if sync.p.horizon is not None else sync.total
    if probe >= horizon or sync.p.skip_test()(probe) or sync.in_batch_entry(probe):
        return f"{failing}, and no record after it tells whether it is that record or the service"
    sync.p.cuts.update({probe, probe + 1})
    sync.save()  # before the probe: every later sync sends that line alone, as these very bytes
    try:
        sync.send_alone(probe)
    except PrimeTracesError as err:
        return f"{failing} and on the record after it: the service is failing ({err})"
    sync.keep_rejected(line, rejection_reason(failed), outcome_text(failed))
    return None
