"""Where the platform's run routes are (contract §10), and with which key.

:func:`resolve_platform` reads, in order: the ``base_url`` argument, then
``PRIME_API_BASE_URL``, then ``PRIME_BASE_URL``, then ``base_url`` in
``~/.prime/config.json``, then the Traces service's own URL when one is
configured (``PRIME_TRACES_URL`` or ``traces_url``: one setting points both
at a local service), then :data:`~prime_traces.config.DEFAULT_BASE_URL`. A
base ending in ``/api/internal`` is a hosted run's internal root: requests go
under it and also carry the key in ``x-api-key``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from prime_traces.config import (
    DEFAULT_BASE_URL,
    ENV_API_KEY,
    ENV_TRACES_URL,
    _clean_api_key,
    _file_str,
    _read_config_file,
)

__all__ = [
    "DEFAULT_FRONTEND_URL",
    "ENV_FRONTEND_URL",
    "ENV_PLATFORM_URL",
    "INTERNAL_API_PATH",
    "PUBLIC_API_PATH",
    "PlatformConfig",
    "configured_platform_url",
    "environment_platform_url",
    "resolve_platform",
    "split_api_root",
]

ENV_PLATFORM_URL = "PRIME_API_BASE_URL"
_ENV_PLATFORM_URL_ALIAS = "PRIME_BASE_URL"
ENV_FRONTEND_URL = "PRIME_FRONTEND_URL"
DEFAULT_FRONTEND_URL = "https://app.primeintellect.ai"
PUBLIC_API_PATH = "/api/v1"
INTERNAL_API_PATH = "/api/internal"
_API_SUFFIXES = (
    ("/api/internal/rft", INTERNAL_API_PATH),
    ("/api/internal", INTERNAL_API_PATH),
    ("/api/v1/rft", PUBLIC_API_PATH),
    ("/api/v1", PUBLIC_API_PATH),
)


def split_api_root(base_url: str) -> tuple[str, str]:
    """``(origin, api_path)`` of a base URL: ``https://h/api/internal/rft`` is ``("https://h", "/api/internal")``.

    Only the path is read (query and fragment are dropped); without one of the
    platform's API roots at its end, the public root ``/api/v1`` is meant.
    """
    parts = urlsplit(base_url.strip())
    path = parts.path.rstrip("/")
    api_path = PUBLIC_API_PATH
    for suffix, root in _API_SUFFIXES:
        if path.endswith(suffix):
            path, api_path = path[: -len(suffix)], root
            break
    return f"{parts.scheme}://{parts.netloc}{path}", api_path


@dataclass(frozen=True)
class PlatformConfig:
    """Where platform requests go and with which key; its ``repr`` never shows the key."""

    api_key: str = field(repr=False)
    origin: str = DEFAULT_BASE_URL
    api_path: str = PUBLIC_API_PATH
    frontend_url: str = DEFAULT_FRONTEND_URL

    @property
    def internal(self) -> bool:
        """Whether requests go under a hosted run's internal root."""
        return self.api_path == INTERNAL_API_PATH

    @property
    def api_prefix(self) -> str:
        return self.origin + self.api_path


def resolve_platform(
    api_key: str | None = None,
    base_url: str | None = None,
    *,
    frontend_url: str | None = None,
    environ: Mapping[str, str] | None = None,
    config_path: str | os.PathLike[str] | None = None,
) -> PlatformConfig:
    """Resolve the platform's address, key and dashboard origin (see the module docstring for the order).

    The key is resolved as the Traces client's is: the argument when not
    ``None``, then ``PRIME_API_KEY``, then the file's ``api_key``. The
    dashboard origin: ``frontend_url``, then ``PRIME_FRONTEND_URL``, then the
    file's ``frontend_url``, then :data:`DEFAULT_FRONTEND_URL`.
    """
    env = os.environ if environ is None else environ
    values = _read_config_file(config_path)
    url = (
        base_url
        or env.get(ENV_PLATFORM_URL)
        or env.get(_ENV_PLATFORM_URL_ALIAS)
        or _file_str(values, "base_url")
        or env.get(ENV_TRACES_URL)
        or _file_str(values, "traces_url")
        or DEFAULT_BASE_URL
    )
    if api_key is not None:
        key = _clean_api_key(api_key, "the api_key argument")
    else:
        key = _clean_api_key(env.get(ENV_API_KEY) or "", ENV_API_KEY) or _clean_api_key(
            _file_str(values, "api_key"), "api_key in ~/.prime/config.json"
        )
    origin, api_path = split_api_root(url)
    # Another platform than the hosted one (the local service) serves its run pages from its own origin.
    default_front = DEFAULT_FRONTEND_URL if origin == DEFAULT_BASE_URL else origin
    front = frontend_url or env.get(ENV_FRONTEND_URL) or _file_str(values, "frontend_url") or default_front
    return PlatformConfig(key, origin, api_path, front.rstrip("/"))


def configured_platform_url(
    *, environ: Mapping[str, str] | None = None, config_path: str | os.PathLike[str] | None = None
) -> str | None:
    """The platform's URL when the environment or the config file names one (``None``: the fallbacks apply)."""
    return environment_platform_url(environ) or _file_str(_read_config_file(config_path), "base_url") or None


def environment_platform_url(environ: Mapping[str, str] | None = None) -> str | None:
    """The platform's URL when the environment names one (``PRIME_API_BASE_URL``, then ``PRIME_BASE_URL``)."""
    env = os.environ if environ is None else environ
    return env.get(ENV_PLATFORM_URL) or env.get(_ENV_PLATFORM_URL_ALIAS) or None
