"""Records to JSONL lines, on the worker's threads: run stamping and lazy encoding.

Records are stamped with the run (contract §7: ``run.id`` and ``run.type``
on the envelope and on every member trace, other ``run`` keys kept) on
shallow copies, so the caller's objects are never mutated, and the copying
happens here, off the caller's thread. Encoding is lazy: a sink pulls lines
as it needs them, so a backlog is never held twice in memory.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from prime_runs._records import reasons
from prime_runs._records.footprint import expansion
from prime_runs._records.ledger import Ledger
from prime_runs._records.size_meter import SizeMeter
from prime_traces.encoding import (
    MAX_LINE_BYTES,
    LineError,
    LineParts,
    encode_record_parts,
    is_episode,
    line_size,
    record_form,
)

logger = logging.getLogger(__name__)


def detect_line_format(records: Sequence[Any]) -> str:
    """The format of a write, from its first record (as prime-runs always did)."""
    return "episode" if records and is_episode(records[0]) else "trace"


@dataclass(frozen=True)
class RunStamp:
    """The run every record is stamped with (contract §7).

    A record's own ``run`` is kept whole (its ``type``, ``name`` and ``work``,
    with the step, included); only its ``id`` becomes this run's, which is how
    the service joins the record to the run. A record without a ``type`` gets
    this run's kind. Each member trace of an episode is stamped the same way;
    a member without a ``run`` of its own carries the envelope's.
    """

    run_id: str
    run_type: str

    def _run(self, run: Any) -> dict[str, Any]:
        merged = dict(run) if isinstance(run, Mapping) else {}
        merged["id"] = self.run_id
        merged.setdefault("type", self.run_type)
        return merged

    def apply(self, record: Mapping[str, Any], line_format: str) -> dict[str, Any]:
        """A stamped shallow copy of ``record``; the original is untouched."""
        stamped = dict(record)
        run = stamped["run"] = self._run(record.get("run"))
        members = record.get("traces")
        if line_format == "episode" and isinstance(members, (list, tuple)):
            stamped["traces"] = [
                {**m, "run": self._run(m.get("run") or run)} if isinstance(m, Mapping) else m for m in members
            ]
        return stamped


class UserCodeError(ValueError):
    """A record's own method raised: the message names the method and what it raised."""


def _call_user(method: Any, name: str) -> Any:
    try:
        return method()
    except BaseException as err:  # the record fails alone, whatever it raises
        raise UserCodeError(f"{name} raised {type(err).__name__}: {err}") from err


def as_mapping(record: Any, index: int) -> Mapping[str, Any]:
    """The record as a mapping (:func:`~prime_traces.encoding.record_form`; ``to_json()`` bytes parsed)."""
    form = record_form(record, index, _call_user)
    return _parsed(form, index) if isinstance(form, bytes) else form


def _parsed(line: bytes, index: int) -> dict[str, Any]:
    value = orjson.loads(line)
    if not isinstance(value, dict):
        raise TypeError(f"record {index}: to_json() is a JSON {type(value).__name__}, not an object")
    return value


def carries_run(line: bytes, stamp: RunStamp) -> bool:
    """Whether a ``to_json()`` line already names the run: then it is used as it is, never parsed.

    Parsing a 14 MB document to stamp it holds the GIL for ~180 ms; counting
    the run's id in its bytes takes a few ms. A producer that serialises its
    own records with the run in them pays nothing.
    """
    return line.find(b'"id":"' + stamp.run_id.encode() + b'"') >= 0


class EncodedWrite:
    """The lines of one write, encoded one at a time as they are pulled.

    A record that cannot be encoded (or, with ``check``, breaks a line rule)
    is reported rejected in the ledger (it loses only itself) and skipped.
    ``indexes[i]`` is the index in the ledger's write of ``records[i]``
    (default ``i``); ``line_records[j]`` is the position in ``records`` of the
    ``j``-th line produced, so a sink can map a rejected line back.

    ``release(position)``, when given, is called once a record is encoded
    (never for a rejected one): its caller lets go of the record there, and
    this write holds no reference to it either, so a record the caller no
    longer holds is freed as soon as it is a line.
    """

    def __init__(
        self,
        records: Sequence[Any],
        line_format: str,
        stamp: RunStamp | None,
        meter: SizeMeter | None,
        ledger: Ledger,
        *,
        indexes: Sequence[int] | None = None,
        check: Callable[[Mapping[str, Any]], object] | None = None,
        release: Callable[[int], None] | None = None,
    ) -> None:
        # With ``release``, a list of its own, whose entries it clears as it encodes them.
        self._own: list[Any] | None = None if release is None else list(records)
        self.records: Sequence[Any] = records if self._own is None else self._own
        self.release = release
        self.line_format = line_format
        self.stamp = stamp
        self.meter = meter
        self.ledger = ledger
        self.indexes = indexes
        self.check = check
        self.line_records: list[int] = []
        self.errors: list[tuple[int, str]] = []

    def __iter__(self) -> Iterator[bytes | LineParts]:
        for position in range(len(self.records)):
            line = self._line(position)  # no local here holds the record while the line waits to be pulled
            if line is None:
                continue
            self.line_records.append(position)
            if self.release is not None and self._own is not None:
                self._own[position] = None
                self.release(position)
            yield line

    def _line(self, position: int) -> bytes | LineParts | None:
        """The record at ``position`` as a line; None when it is rejected (the ledger is told)."""
        record = self.records[position]
        index = position if self.indexes is None else self.indexes[position]
        measure = self.meter is not None and index >= self.ledger.measured  # each record once (Ledger.measured)
        if measure and index == self.ledger.measured:
            self.ledger.measured = index + 1
        if self.meter is not None and self.meter.expansion_due():
            ratio = expansion(record)  # what the queue holds per byte of JSON, now and then
            if ratio is not None:
                self.meter.observe_expansion(ratio)
        record_id: str | None = None
        try:
            form = record_form(record, index, _call_user)
            if isinstance(form, bytes) and (self.stamp is None or carries_run(form, self.stamp)):
                line: bytes | LineParts = form  # already the run's: used as it is (the service checks it)
            else:
                mapping = _parsed(form, index) if isinstance(form, bytes) else form
                record_id = id_of(mapping)
                if self.stamp is not None:
                    mapping = self.stamp.apply(mapping, self.line_format)
                if self.check is not None:
                    self.check(mapping)
                line = encode_record_parts(mapping, index)
        except LineError as err:
            self._invalid(position, reasons.rejected(err.code), err.message, record_id)
            return None
        except BaseException as err:  # noqa: BLE001  (a user's to_record() may raise anything: it fails alone)
            self._invalid(position, reasons.INVALID_RECORD, _cause(err, index), record_id or id_of(record))
            return None
        size = line_size(line)
        if size > MAX_LINE_BYTES:
            self._invalid(
                position,
                reasons.RECORD_TOO_LARGE,
                f"{size} bytes encoded, over the limit of {MAX_LINE_BYTES} for one record",
                record_id,
            )
            return None
        if measure and self.meter is not None:
            self.meter.observe(size + 1)
        return line

    def _invalid(self, position: int, reason: str, message: str, record_id: str | None) -> None:
        index = position if self.indexes is None else self.indexes[position]
        self.ledger.rejected(index, reason, message, record_id)
        self.errors.append((position, message))
        logger.debug("record %d not logged: %s", index, message)


def releaser(records: Sequence[Any], indexes: Sequence[int]) -> Callable[[int], None] | None:
    """Clear ``records[indexes[position]]`` once that record is encoded; None when ``records`` is not a list."""
    if not isinstance(records, list):
        return None
    held: list[Any] = records

    def release(position: int) -> None:
        held[indexes[position]] = None

    return release


def id_of(record: Any) -> str | None:
    """The record's ``id`` when it has a string one; never raises (it may be any object)."""
    try:
        value = record.get("id") if isinstance(record, Mapping) else getattr(record, "id", None)
    except Exception:  # noqa: BLE001
        return None
    return value if isinstance(value, str) and value else None


def _cause(err: BaseException, index: int) -> str:
    """Why a record could not be encoded, without the ``record N:`` the encoder starts with."""
    if isinstance(err, (TypeError, ValueError)) and not isinstance(err, orjson.JSONDecodeError):
        text = str(err)
        prefix = f"record {index}: "
        return text[len(prefix) :] if text.startswith(prefix) else text
    if isinstance(err, orjson.JSONDecodeError):
        return f"to_json() is not valid JSON: {err}"
    return f"{type(err).__name__} while reading the record: {err}"


def restamped(line: bytes, stamp: RunStamp, line_format: str) -> bytes:
    """``line`` stamped with ``stamp``'s run: as it is when it names that run already, else parsed and stamped.

    Deterministic, so a line sent again is byte-identical (and replays).
    """
    if carries_run(line, stamp):
        return line
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        return line  # the service refuses it, as it would have
    if not isinstance(record, dict):
        return line
    return orjson.dumps(stamp.apply(record, line_format))
