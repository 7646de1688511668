"""``prime-runs sync --retry-rejected``: send again the records the service set aside, each once.

A record the service refused is kept in the run's ``rejected-*.jsonl.zst``
with ``"by": "service"`` (refusals by this package's own rules say
``"by": "local"`` and are not sent: resending cannot change the rule). When
the service was wrong (a bug since fixed, a limit since raised), this sends
each such record again, alone, as the same bytes every time (so a repeat is
answered as a replay). What the service stores is noted in ``sync.json``
(``retried``: per rejected file, the entries stored) and never sent again;
the rejected files themselves are left as they are. Entries written before
``by`` existed count as the service's when their message says so.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from prime_runs._local.segment_reader import iter_entry_lines, scan
from prime_runs._local.sync_file import SyncStopped
from prime_runs._records.faults import RECORD, TRANSIENT, fault_of, outcome_text
from prime_traces import TracesClient
from prime_traces.errors import TraceTooLargeError, UploadError

logger = logging.getLogger(__name__)

_BY_SERVICE_MESSAGE = "refused by the service"


@dataclass
class RetryOutcome:
    """What a retry of the set-aside records did: ``stored`` now, ``refused`` again, ``stored_before``."""

    stored: int = 0
    refused: int = 0
    stored_before: int = 0


def retry_rejected(
    paths: list[str],
    client: TracesClient,
    retried: dict[str, list[int]],
    *,
    context: dict[str, str],
    save: Callable[[], None],
    restamp: Callable[[bytes, str], bytes] | None = None,
) -> RetryOutcome:
    """Send the service's refusals in ``paths`` again; ``retried`` (``sync.json``'s) is updated and saved.

    Raises :class:`SyncStopped` when the service fails or refuses the sink
    itself (nothing is counted refused for that).
    """
    outcome = RetryOutcome()
    for path in paths:
        name = os.path.basename(path)
        stored = set(retried.get(name, []))
        found = scan(path, verify_last=False)
        number = 0
        for _entry, lines in iter_entry_lines(path, found.entries, on_corrupt=lambda *_: None):
            for line in lines:
                here, number = number, number + 1
                entry = _service_refusal(line)
                if entry is None:
                    continue
                if here in stored:
                    outcome.stored_before += 1
                    continue
                if _send(client, entry, context, restamp):
                    stored.add(here)
                    retried[name] = sorted(stored)
                    save()
                    outcome.stored += 1
                else:
                    outcome.refused += 1
    return outcome


def retried_count(retried: Any) -> int:
    """How many set-aside records ``sync.json``'s ``retried`` says are stored now."""
    if not isinstance(retried, dict):
        return 0
    return sum(len(v) for v in retried.values() if isinstance(v, list))


def _service_refusal(line: bytes) -> dict[str, Any] | None:
    try:
        entry = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(entry, dict) or "record" not in entry:
        return None
    by = entry.get("by")
    if by == "service" or (by is None and str(entry.get("message", "")).startswith(_BY_SERVICE_MESSAGE)):
        return entry
    return None


def _send(
    client: TracesClient, entry: dict[str, Any], context: dict[str, str], restamp: Callable[[bytes, str], bytes] | None
) -> bool:
    """Upload one set-aside record; True if stored, False if refused for its own fault again."""
    line_format = str(entry.get("line_format") or "episode")
    line = orjson.dumps(entry["record"])
    if restamp is not None:
        line = restamp(line, line_format)
    try:
        client.upload_lines([line], line_format=line_format, context=context, learn_coding=False)
    except TraceTooLargeError as err:
        logger.warning("record %s is still refused: %s", entry.get("id"), err)
        return False
    except UploadError as err:
        failed = err.report.first_failure
        if failed is None:
            raise SyncStopped(f"could not send a refused record again: {err}", transient=True) from None
        fault = fault_of(failed)
        if fault == RECORD:
            logger.warning("record %s is still refused: %s", entry.get("id"), outcome_text(failed))
            return False
        message = f"could not send refused records again: {outcome_text(failed)}"
        raise SyncStopped(message, transient=fault == TRANSIENT) from None
    return True
