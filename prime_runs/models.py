"""The values a run is described by: its status, kind, environments, training shape and config source.

These are the published prime-runs SDK's types, with its names and fields:
:class:`RunStatus`, :data:`RunKind`, :class:`EnvironmentRef`,
:class:`TrainingSpec`, :class:`ConfigSource` and :data:`CONFIG_SOURCE_KEY`.

    run = prime_runs.init(kind="train", model="Qwen/Qwen3-4B", team_id="t-1",
                          environments=["primeintellect/gsm8k"], training=TrainingSpec(max_steps=100))
    if run.status is RunStatus.RUNNING: ...
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from prime_runs.errors import ConfigurationError

__all__ = [
    "CONFIG_SOURCE_KEY",
    "MAX_CONFIG_SOURCE_BYTES",
    "ConfigSource",
    "EnvironmentRef",
    "RunKind",
    "RunStatus",
    "TrainingSpec",
]

#: What a run is: an evaluation or a training run.
RunKind = Literal["eval", "train"]
#: Where a run's config source is kept inside its config.
CONFIG_SOURCE_KEY = "config_source"
#: The largest config source a run stores.
MAX_CONFIG_SOURCE_BYTES = 262_144

_FORMATS = {".toml": "toml", ".json": "json", ".yaml": "yaml", ".yml": "yaml"}


class RunStatus(str, enum.Enum):
    """Where a run is: ``running``, then one terminal status.

    ``failed``: the producer said so. ``cancelled``: stopped on purpose (an
    interrupt). ``crashed``: the process ended without finishing the run (the
    exit hook, or SIGTERM). A member is its string, so ``status == "failed"`` holds too.
    """

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    CRASHED = "crashed"

    def is_terminal(self) -> bool:
        """Whether the run has finished."""
        return self is not RunStatus.RUNNING

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class EnvironmentRef:
    """An environment of the run: by hub ``name``, published ``slug`` (``owner/name``) or ``id``.

    ``version_id`` pins a version. An evaluation resolves names and slugs
    through the platform's environments hub; a training run passes them on as
    they are. Raises ``ValueError`` when none of name, slug and id is given, or
    for a slug that is not ``owner/name``.
    """

    name: str | None = None
    id: str | None = None
    version_id: str | None = None
    slug: str | None = None

    def __post_init__(self) -> None:
        if not (self.name or self.slug or self.id):
            raise ValueError("EnvironmentRef needs a name, slug or id")
        if self.slug:
            owner, _, name = self.slug.partition("/")
            if not owner or not name:
                raise ValueError("EnvironmentRef slug must use owner/name format")

    @classmethod
    def coerce(cls, value: Any) -> EnvironmentRef:
        """An ``EnvironmentRef`` from itself, a string (``owner/name`` is a slug, else a name) or a dict."""
        if isinstance(value, EnvironmentRef):
            return value
        if isinstance(value, str):
            return cls(slug=value) if "/" in value else cls(name=value)
        if isinstance(value, Mapping):
            return cls(
                name=value.get("name"), id=value.get("id"), version_id=value.get("version_id"), slug=value.get("slug")
            )
        raise TypeError(f"environments entries must be a str, dict or EnvironmentRef, got {type(value).__name__}")

    @property
    def label(self) -> str:
        """How the run names it: the slug's name, the name, or the id."""
        if self.slug:
            return self.slug.partition("/")[2]
        return self.name or self.id or ""

    def to_dict(self) -> dict[str, str]:
        """The fields that are set, for ``run.json``."""
        return {k: v for k, v in vars(self).items() if v}


@dataclass(frozen=True)
class TrainingSpec:
    """The shape of a training run, shown on the platform. ``max_steps=0`` means unknown."""

    max_steps: int = 0
    batch_size: int | None = None
    rollouts_per_example: int | None = None
    seq_len: int | None = None
    wandb_project: str | None = None
    wandb_entity: str | None = None
    wandb_run_name: str | None = None

    def __post_init__(self) -> None:
        if self.max_steps < 0:
            raise ValueError("max_steps must be non-negative")

    def to_dict(self) -> dict[str, Any]:
        """The fields that are set (``max_steps`` always), for the platform and ``run.json``."""
        return {k: v for k, v in vars(self).items() if v is not None or k == "max_steps"}


@dataclass(frozen=True)
class ConfigSource:
    """The text of the file a run was started from (TOML, JSON, YAML...), kept with its config.

    ``init(config="train.toml")`` reads the file into one; a path is always a
    path, never inline text (pass ``ConfigSource(text=...)`` for text).
    At most :data:`MAX_CONFIG_SOURCE_BYTES` of UTF-8.
    """

    text: str
    format: str = "toml"
    filename: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            raise TypeError("ConfigSource.text must be a string")
        if len(self.text.encode("utf-8")) > MAX_CONFIG_SOURCE_BYTES:
            raise ConfigurationError(
                f"the config source is over the {MAX_CONFIG_SOURCE_BYTES}-byte limit for a stored run config."
            )

    def to_dict(self) -> dict[str, str]:
        """``{"format", "text"}``, and ``"filename"`` when known: what the run's config holds."""
        out = {"format": self.format, "text": self.text}
        if self.filename:
            out["filename"] = self.filename
        return out

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any]) -> ConfigSource | None:
        """The source a run's config holds, or None when ``mapping`` is not one."""
        text = mapping.get("text")
        if not isinstance(text, str):
            return None
        filename = mapping.get("filename")
        return cls(text, str(mapping.get("format") or "toml"), str(filename) if filename else None)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> ConfigSource:
        """Read ``path``; ``ConfigurationError`` when it is missing, unreadable, too large or not UTF-8."""
        where = os.fspath(path)
        try:
            data = Path(where).read_bytes()
        except FileNotFoundError:
            raise ConfigurationError(
                f"config={where!r} does not exist. Pass the path to the file the run was started from, "
                "or a ConfigSource(text=...) if it is already in memory."
            ) from None
        except OSError as err:
            raise ConfigurationError(f"config={where!r} could not be read: {err}") from err
        if len(data) > MAX_CONFIG_SOURCE_BYTES:
            raise ConfigurationError(
                f"config={where!r} is {len(data)} bytes, over the {MAX_CONFIG_SOURCE_BYTES}-byte limit "
                "for a stored run config."
            )
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigurationError(f"config={where!r} is not UTF-8 text; a run config must be readable.") from None
        suffix = Path(where).suffix.lower()
        return cls(text, _FORMATS.get(suffix, "text"), Path(where).name)

    @classmethod
    def coerce(cls, value: Any) -> ConfigSource | None:
        """None and a ``ConfigSource`` as they are; a ``str`` or path is read as a file."""
        if value is None or isinstance(value, ConfigSource):
            return value
        if isinstance(value, (str, os.PathLike)):
            return cls.from_file(value)
        raise TypeError(f"a config source must be a path or a ConfigSource, got {type(value).__name__}")


def normalize_config(value: Any) -> dict[str, Any]:
    """A run's config from ``init(config=...)``: a mapping (copied), or a file or source under the source key."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, (str, os.PathLike, ConfigSource)):
        source = ConfigSource.coerce(value)
        assert source is not None
        return {CONFIG_SOURCE_KEY: source.to_dict()}
    raise TypeError(f"config must be a path to the run's config file or a mapping, got {type(value).__name__}")
