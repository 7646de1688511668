"""The read API's response models (contract §5), parsed the way 0.0.10 parses them.

Every model is a frozen dataclass with ``from_dict(d)``: each listed field is
required (a nullable one must be present as ``null``), fields the model does
not list are kept in ``extra``, and a body of the wrong shape raises
:class:`~prime_traces.errors.ResponseFormatError` naming the model and the field. Datetimes follow
pydantic v2's reading: ISO-8601 with ``Z`` or an offset gives an aware
``datetime``, a naive string a naive one, and a number is Unix seconds (or
milliseconds when its magnitude exceeds 2e10), in UTC. Lists become tuples::

    page = TraceListPage.from_dict(resp.json())
    page.items[0].created_at      # datetime(..., tzinfo=timezone.utc)
    page.items[0].extra["run_step"]
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

from prime_traces.errors import ResponseFormatError

_PARSE = "prime_traces.parse"
_OPTIONAL = "prime_traces.optional"
# pydantic v2: a number larger than this in magnitude is milliseconds, not seconds.
_MS_THRESHOLD = 2e10
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_ISO_DATETIME = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})"
    r"(?:[Tt ](\d{2}):(\d{2})(?::(\d{2})(?:[.,](\d{1,6})\d*)?)?"
    r"(?:([Zz])|([+-])(\d{2})(?::?(\d{2}))?)?)?"
)
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")

M = TypeVar("M", bound="_Model")
Parser = Callable[[Any, str], Any]


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _str(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise ResponseFormatError(path, f"expected a string, got {_kind(value)}")
    return value


def _int(value: Any, path: str) -> int:
    # 2.0 passes and 1.5 fails, as in pydantic's lax mode; a bool is not a count.
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise ResponseFormatError(path, f"expected an integer, got {value!r}")


def _float(value: Any, path: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise ResponseFormatError(path, f"expected a number, got {_kind(value)}")


def _bool(value: Any, path: str) -> bool:
    if isinstance(value, bool):
        return value
    if type(value) is int and value in (0, 1):
        return bool(value)
    raise ResponseFormatError(path, f"expected a boolean, got {value!r}")


def _str_map(value: Any, path: str) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise ResponseFormatError(path, f"expected an object of strings, got {_kind(value)}")
    for key, item in value.items():
        _str(item, f"{path}[{key!r}]")
    return dict(value)


def _from_number(number: float, path: str) -> datetime:
    seconds = number / 1000 if abs(number) > _MS_THRESHOLD else number
    try:
        return _EPOCH + timedelta(seconds=seconds)
    except OverflowError:
        raise ResponseFormatError(path, f"timestamp {number!r} is out of range") from None


def _datetime(value: Any, path: str) -> datetime:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _from_number(float(value), path)
    if not isinstance(value, str):
        raise ResponseFormatError(path, f"expected an ISO-8601 datetime, got {_kind(value)}")
    text = value.strip()
    if _NUMBER.fullmatch(text):
        return _from_number(float(text), path)
    match = _ISO_DATETIME.fullmatch(text)
    if match is None:
        raise ResponseFormatError(path, f"expected an ISO-8601 datetime, got {value!r}")
    year, month, day, hour, minute, second, frac, zulu, sign, off_h, off_m = match.groups()
    tz: timezone | None = None
    if zulu:
        tz = timezone.utc
    elif sign:
        offset = timedelta(hours=int(off_h), minutes=int(off_m or 0))
        tz = timezone(-offset if sign == "-" else offset)
    micros = int((frac or "0").ljust(6, "0"))
    try:
        return datetime(
            int(year), int(month), int(day), int(hour or 0), int(minute or 0), int(second or 0), micros, tzinfo=tz
        )
    except ValueError as err:
        raise ResponseFormatError(path, f"invalid datetime {value!r}: {err}") from None


def _opt(parse: Parser) -> Parser:
    return lambda value, path: None if value is None else parse(value, path)


def _tuple_of(parse: Parser) -> Parser:
    def parse_list(value: Any, path: str) -> tuple[Any, ...]:
        if not isinstance(value, list):
            raise ResponseFormatError(path, f"expected a list, got {_kind(value)}")
        return tuple(parse(item, f"{path}[{i}]") for i, item in enumerate(value))

    return parse_list


def _nested(model: type[_Model]) -> Parser:
    return lambda value, path: model._parse(value, path)


def _req(parse: Parser) -> Any:
    return field(metadata={_PARSE: parse})


def _lifecycle(parse: Parser) -> Any:  # §9 additions: the hosted service omits them
    return field(default=None, metadata={_PARSE: _opt(parse), _OPTIONAL: True})


def _dump(value: Any) -> Any:
    if isinstance(value, _Model):
        return value.to_dict()
    if isinstance(value, datetime):
        text = value.isoformat(timespec="microseconds" if value.microsecond % 1000 else "milliseconds")
        return text[:-6] + "Z" if text.endswith("+00:00") else text
    if isinstance(value, (tuple, list)):
        return [_dump(item) for item in value]
    return value


@dataclass(frozen=True)
class _Model:
    """Parsing and dumping shared by every model; ``extra`` holds unlisted fields."""

    extra: dict[str, Any] = field(default_factory=dict, kw_only=True, repr=False)

    @classmethod
    def from_dict(cls: type[M], d: Mapping[str, Any]) -> M:
        """Parse one JSON object; raise :class:`ResponseFormatError` if it does not fit."""
        return cls._parse(d, cls.__name__)

    @classmethod
    def _parse(cls: type[M], d: Any, path: str) -> M:
        if not isinstance(d, Mapping):
            raise ResponseFormatError(path, f"expected a JSON object, got {_kind(d)}")
        values: dict[str, Any] = {}
        listed: set[str] = set()
        for f in dataclasses.fields(cls):
            if _PARSE not in f.metadata:
                continue
            listed.add(f.name)
            if f.name in d:
                values[f.name] = f.metadata[_PARSE](d[f.name], f"{path}.{f.name}")
            elif not f.metadata.get(_OPTIONAL):
                where = path if path == cls.__name__ else f"{path} ({cls.__name__})"
                raise ResponseFormatError(where, f"missing required field {f.name!r}")
        extra = {key: value for key, value in d.items() if key not in listed}
        return cls(**values, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object this model was parsed from (datetimes as ISO-8601), extras included."""
        out = {f.name: _dump(getattr(self, f.name)) for f in dataclasses.fields(self) if _PARSE in f.metadata}
        out.update(self.extra)
        return out


@dataclass(frozen=True)
class UploadReceipt(_Model):
    """The answer to an upload: ``upload_id`` (64 hex, no prefix) and ``status``."""

    upload_id: str = _req(_str)
    status: str = _req(_str)


@dataclass(frozen=True)
class ModelInfo(_Model):
    provider: str | None = _req(_opt(_str))
    id: str | None = _req(_opt(_str))


@dataclass(frozen=True)
class Score(_Model):
    """``reward`` is ``None`` when the trace is unscored (not 0)."""

    reward: float | None = _req(_opt(_float))
    outcome: str | None = _req(_opt(_str))


@dataclass(frozen=True)
class Execution(_Model):
    has_error: bool = _req(_bool)
    is_truncated: bool = _req(_bool)


@dataclass(frozen=True)
class TraceSummary(_Model):
    """One stored trace as the service indexes it (contract §5, extraction in §7)."""

    trace_id: str = _req(_str)
    upload_id: str = _req(_str)
    episode_id: str | None = _req(_opt(_str))
    created_at: datetime = _req(_datetime)
    ingested_at: datetime = _req(_datetime)
    run_id: str | None = _req(_opt(_str))
    environment_id: str | None = _req(_opt(_str))
    model: ModelInfo = _req(_nested(ModelInfo))
    task_id: str | None = _req(_opt(_str))
    agent_name: str | None = _req(_opt(_str))
    score: Score = _req(_nested(Score))
    execution: Execution = _req(_nested(Execution))
    duration_ms: int = _req(_int)
    total_tokens: int = _req(_int)
    size_bytes: int = _req(_int)
    context: dict[str, str] = _req(_str_map)


@dataclass(frozen=True)
class TraceListPage(_Model):
    """A page of traces, newest first; ``next_cursor`` is ``None`` on the last page."""

    items: tuple[TraceSummary, ...] = _req(_tuple_of(_nested(TraceSummary)))
    next_cursor: str | None = _req(_opt(_str))


@dataclass(frozen=True)
class EpisodeError(_Model):
    type: str | None = _req(_opt(_str))
    message: str | None = _req(_opt(_str))


@dataclass(frozen=True)
class EpisodeSummary(_Model):
    episode_id: str = _req(_str)
    upload_id: str = _req(_str)
    schema_version: int = _req(_int)
    created_at: datetime = _req(_datetime)
    ingested_at: datetime = _req(_datetime)
    run_id: str | None = _req(_opt(_str))
    environment_id: str | None = _req(_opt(_str))
    outcome: str | None = _req(_opt(_str))
    has_error: bool = _req(_bool)
    error: EpisodeError = _req(_nested(EpisodeError))


@dataclass(frozen=True)
class EpisodeTraceAggregate(_Model):
    trace_count: int = _req(_int)
    total_tokens: int = _req(_int)
    total_duration_ms: int = _req(_int)
    any_trace_error: bool = _req(_bool)
    agent_names: tuple[str, ...] = _req(_tuple_of(_str))


@dataclass(frozen=True)
class EpisodeDetail(EpisodeSummary):
    """An episode with the aggregate of its member traces."""

    traces: EpisodeTraceAggregate = _req(_nested(EpisodeTraceAggregate))


@dataclass(frozen=True)
class EpisodeListPage(_Model):
    items: tuple[EpisodeSummary, ...] = _req(_tuple_of(_nested(EpisodeSummary)))
    next_cursor: str | None = _req(_opt(_str))


@dataclass(frozen=True)
class RunSummary(_Model):
    """A run's aggregate over its traces, plus the §9 lifecycle fields when known."""

    run_id: str = _req(_str)
    first_trace_created_at: datetime = _req(_datetime)
    last_trace_created_at: datetime = _req(_datetime)
    last_trace_ingested_at: datetime = _req(_datetime)
    trace_count: int = _req(_int)
    episode_count: int = _req(_int)
    avg_reward: float | None = _req(_opt(_float))
    step_min: int | None = _req(_opt(_int))
    step_max: int | None = _req(_opt(_int))
    step_count: int = _req(_int)
    has_error: bool = _req(_bool)
    first_user_id: str | None = _req(_opt(_str))
    environment_ids: tuple[str, ...] = _req(_tuple_of(_str))
    model_ids: tuple[str, ...] = _req(_tuple_of(_str))
    context: dict[str, str] = _req(_str_map)
    name: str | None = _lifecycle(_str)
    kind: str | None = _lifecycle(_str)
    status: str | None = _lifecycle(_str)
    config: Any = _lifecycle(lambda value, path: value)
    summary: Any = _lifecycle(lambda value, path: value)
    error: str | None = _lifecycle(_str)
    created_at: datetime | None = _lifecycle(_datetime)
    finished_at: datetime | None = _lifecycle(_datetime)
    #: Per metric name: ``last``, ``min``, ``max``, ``count``, ``last_step`` (the metrics history, §9).
    metrics: Any = _lifecycle(lambda value, path: value)


def _metrics(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ResponseFormatError(path, f"expected an object, got {type(value).__name__}")
    return value


@dataclass(frozen=True)
class MetricRow(_Model):
    """One row of a run's metrics history: values as the contract carries them (NaN as ``"NaN"``)."""

    step: int | None = _req(_opt(_int))
    time: float = _req(_float)
    metrics: dict[str, Any] = _req(_metrics)


@dataclass(frozen=True)
class MetricsPage(_Model):
    rows: tuple[MetricRow, ...] = _req(_tuple_of(_nested(MetricRow)))
    next_cursor: str | None = _req(_opt(_str))


@dataclass(frozen=True)
class RunStep(_Model):
    step: int = _req(_int)
    trace_count: int = _req(_int)
    episode_count: int = _req(_int)
    avg_reward: float | None = _req(_opt(_float))


@dataclass(frozen=True)
class RunStepList(_Model):
    """Every step of a run (not paginated); empty for an unknown run."""

    step_min: int | None = _req(_opt(_int))
    step_max: int | None = _req(_opt(_int))
    step_count: int = _req(_int)
    items: tuple[RunStep, ...] = _req(_tuple_of(_nested(RunStep)))


@dataclass(frozen=True)
class RunListPage(_Model):
    items: tuple[RunSummary, ...] = _req(_tuple_of(_nested(RunSummary)))
    next_cursor: str | None = _req(_opt(_str))
