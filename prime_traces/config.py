"""Where the client sends requests and with which credentials (contract §1).

:func:`resolve_config` merges constructor arguments, the environment and
``~/.prime/config.json`` into a :class:`ClientConfig`; :func:`api_url`,
:func:`default_headers` and :func:`encode_query` turn it into the pieces of a
request. Nothing here talks HTTP.
"""

from __future__ import annotations

import enum
import json
import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from prime_traces.errors import ErrorCode, UnauthorizedError

__all__ = [
    "CONNECT_TIMEOUT_S",
    "DEFAULT_BASE_URL",
    "DEFAULT_CONFIG_PATH",
    "ENV_API_KEY",
    "ENV_TEAM_ID",
    "ENV_TRACES_URL",
    "READ_TIMEOUT_S",
    "USER_AGENT",
    "ClientConfig",
    "api_url",
    "configured_traces_url",
    "default_headers",
    "encode_query",
    "normalize_base_url",
    "quote_path_id",
    "require_api_key",
    "resolve_config",
]

DEFAULT_BASE_URL = "https://api.primeintellect.ai"
DEFAULT_CONFIG_PATH = "~/.prime/config.json"
#: The published 0.0.10 client's agent string; the hosted service and
#: prime-runs' TracesSink both expect this exact product token (contract §1).
USER_AGENT = f"prime-traces/0.0.10 python/{platform.python_version()}"
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 120.0

ENV_API_KEY = "PRIME_API_KEY"
ENV_TRACES_URL = "PRIME_TRACES_URL"
ENV_TEAM_ID = "PRIME_TEAM_ID"

_API_PREFIX = "/api/v1"


@dataclass(frozen=True)
class ClientConfig:
    """The resolved address, key and team of one client.

    Immutable and safe to share between threads. Its ``repr`` never shows the
    key, only whether one is set::

        config = resolve_config(api_key="pk-...")
        config.base_url   # 'https://api.primeintellect.ai'
        repr(config)      # "ClientConfig(api_key=<set>, base_url=..., team_id='')"
    """

    api_key: str = field(repr=False)
    base_url: str = DEFAULT_BASE_URL
    team_id: str = ""

    def __repr__(self) -> str:
        key_state = "<set>" if self.api_key else "<unset>"
        return f"ClientConfig(api_key={key_state}, base_url={self.base_url!r}, team_id={self.team_id!r})"


def resolve_config(
    api_key: str | None = None,
    base_url: str | None = None,
    team_id: str | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    config_path: str | os.PathLike[str] | None = None,
) -> ClientConfig:
    """Resolve the client's configuration with the precedence of contract §1.

    - ``base_url``: the argument if truthy, then ``PRIME_TRACES_URL`` if
      non-empty, then ``traces_url`` in the config file, then
      :data:`DEFAULT_BASE_URL`. ``PRIME_API_BASE_URL``, ``PRIME_BASE_URL`` and
      the file's ``base_url`` are never read: they address the platform, not
      the Traces service.
    - ``api_key``: the argument if not ``None`` (``""`` included), then
      ``PRIME_API_KEY`` if non-empty, then the file's ``api_key``, then ``""``.
      Surrounding whitespace is stripped first (so a blank ``PRIME_API_KEY``
      counts as empty); a key that still holds anything but visible ASCII
      raises ``ValueError`` naming where it came from, never the key.
    - ``team_id``: the argument if not ``None``, then ``PRIME_TEAM_ID`` if set
      at all (even empty), then the file's ``team_id``, then ``""``.

    ``environ`` defaults to :data:`os.environ` and ``config_path`` to
    ``~/.prime/config.json``; an unreadable file, or one that is not a JSON
    object, counts as empty. An empty key is not an error here: it fails in
    :func:`require_api_key`, before the first request.
    """
    env = os.environ if environ is None else environ
    file_values = _read_config_file(config_path)

    if base_url:
        resolved_url = base_url
    else:
        resolved_url = env.get(ENV_TRACES_URL) or _file_str(file_values, "traces_url") or DEFAULT_BASE_URL

    if api_key is not None:
        resolved_key = _clean_api_key(api_key, "the api_key argument")
    else:
        resolved_key = _clean_api_key(env.get(ENV_API_KEY) or "", ENV_API_KEY)
        if not resolved_key:
            file_source = f"api_key in {_config_file_path(config_path)}"
            resolved_key = _clean_api_key(_file_str(file_values, "api_key"), file_source)

    if team_id is not None:
        resolved_team = team_id
    elif ENV_TEAM_ID in env:
        resolved_team = env[ENV_TEAM_ID]
    else:
        resolved_team = _file_str(file_values, "team_id")

    return ClientConfig(
        api_key=resolved_key,
        base_url=normalize_base_url(resolved_url),
        team_id=resolved_team,
    )


def configured_traces_url(
    *, environ: Mapping[str, str] | None = None, config_path: str | os.PathLike[str] | None = None
) -> str | None:
    """The Traces service's URL when the environment or the config file names one (``None``: the default applies)."""
    env = os.environ if environ is None else environ
    return env.get(ENV_TRACES_URL) or _file_str(_read_config_file(config_path), "traces_url") or None


def _clean_api_key(key: str, source: str) -> str:
    """``key`` without surrounding whitespace; ValueError for any character but visible ASCII.

    Keys filled from secret files often end in a newline. Sent as is, such a
    key makes ``requests`` raise an error whose text quotes the whole header,
    key included. The message names ``source``, never the key.
    """
    key = key.strip()
    for index, char in enumerate(key):
        if not "!" <= char <= "~":  # HTTP headers carry visible ASCII; anything else breaks or leaks
            raise ValueError(
                f"the API key from {source} contains whitespace, a control character or a "
                f"non-ASCII character (U+{ord(char):04X} at position {index + 1}); an API key is one "
                "token of visible ASCII characters: copy it again without the extra character"
            )
    return key


def _config_file_path(config_path: str | os.PathLike[str] | None) -> Path:
    return Path(DEFAULT_CONFIG_PATH if config_path is None else config_path).expanduser()


def _read_config_file(config_path: str | os.PathLike[str] | None) -> dict[str, Any]:
    path = _config_file_path(config_path)
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        # ValueError covers both bad JSON and undecodable bytes: an unreadable
        # file must not stop a client that has its settings from elsewhere.
        return {}
    return data if isinstance(data, dict) else {}


def _file_str(values: Mapping[str, Any], name: str) -> str:
    value = values.get(name)
    return value if isinstance(value, str) else ""


def normalize_base_url(url: str) -> str:
    """Strip trailing ``/`` and then one trailing ``/api/v1`` from ``url``."""
    return url.rstrip("/").removesuffix(_API_PREFIX)


def require_api_key(config: ClientConfig) -> str:
    """Return the key, or raise :class:`UnauthorizedError` when it is empty.

    Called before any request, so a missing key fails locally and at once
    rather than as a 401 from the service after a batch was built and sent.
    """
    if not config.api_key:
        raise UnauthorizedError(
            401,
            ErrorCode.UNAUTHENTICATED.value,
            "no API key configured (checked locally, no request was sent); "
            f"set {ENV_API_KEY}, pass api_key=, or add api_key to {DEFAULT_CONFIG_PATH}",
        )
    return config.api_key


def default_headers(config: ClientConfig) -> dict[str, str]:
    """The headers every request carries (contract §1).

    Raises :class:`UnauthorizedError` when the key is empty, so no request
    can go out with ``Authorization: Bearer `` and nothing else.
    """
    headers = {
        "User-Agent": USER_AGENT,
        "Authorization": f"Bearer {require_api_key(config)}",
    }
    if config.team_id:
        headers["X-Prime-Team-ID"] = config.team_id
    return headers


def quote_path_id(value: str) -> str:
    """Percent-encode ``value`` as exactly one path segment.

    ``.`` and ``..`` are encoded too, because URL normalisation (RFC 3986
    §5.2.4) would otherwise turn them into a different route. Values with a
    ``/`` are refused rather than encoded, as the 0.0.10 client does.
    """
    if not isinstance(value, str):
        raise TypeError(f"path id must be a str, not {type(value).__name__}")
    if not value:
        raise ValueError("path id must not be empty")
    if "/" in value:
        raise ValueError(f"path id must not contain '/': {value!r}")
    if value == ".":
        return "%2E"
    if value == "..":
        return "%2E%2E"
    return quote(value, safe="")


def api_url(base_url: str, *parts: str) -> str:
    """Build ``{base_url}/api/v1/{part}/{part}...`` with each part one segment.

    ``base_url`` is taken as already normalised (:attr:`ClientConfig.base_url`)::

        api_url("http://127.0.0.1:8083", "traces", "t/1")   # ValueError
        api_url("http://127.0.0.1:8083", "traces", "a b")   # .../api/v1/traces/a%20b
    """
    path = "/".join(quote_path_id(part) for part in parts)
    return f"{base_url}{_API_PREFIX}/{path}" if path else f"{base_url}{_API_PREFIX}"


def _query_scalar(name: str, value: Any) -> str:
    if isinstance(value, enum.Enum):
        value = value.value
    # bool first: it is an int subclass and must read true/false, not True/1.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, (int, float)):
        return str(value)
    raise TypeError(f"query parameter {name!r} has unsupported type {type(value).__name__}")


def encode_query(params: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Encode query parameters as contract §1 does, in the mapping's order.

    ``None`` is omitted, booleans become ``true``/``false``, numbers use
    ``str()`` (so ``1e-07`` can occur), a list or tuple repeats its key, and
    the mapping under ``context`` becomes ``context.<key>=<value>`` pairs::

        encode_query({"upload_id": ["a", "b"], "has_error": False, "limit": None})
        # [("upload_id", "a"), ("upload_id", "b"), ("has_error", "false")]
    """
    pairs: list[tuple[str, str]] = []
    for name, value in params.items():
        if value is None:
            continue
        if name == "context" and isinstance(value, Mapping):
            for key, item in value.items():
                if item is not None:
                    pairs.append((f"context.{key}", _query_scalar(f"context.{key}", item)))
        elif isinstance(value, (list, tuple)):
            pairs.extend((name, _query_scalar(name, item)) for item in value if item is not None)
        else:
            pairs.append((name, _query_scalar(name, value)))
    return pairs
