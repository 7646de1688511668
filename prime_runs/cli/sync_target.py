"""Where ``prime-runs sync`` uploads a run: a flag, then the environment, then what the run recorded.

The order every tool of this kind follows, so that a user can point a sync
elsewhere without editing the run directory:

- the Traces service: ``--base-url``, then ``PRIME_TRACES_URL``, then the
  ``service_url`` the run recorded, then ``traces_url`` in
  ``~/.prime/config.json``, then the default;
- the platform (where the run is created and its status recorded):
  ``--base-url``, then ``PRIME_API_BASE_URL`` (or ``PRIME_BASE_URL``), then
  the run's ``platform_url``, then ``base_url`` in the config file, then the
  Traces service's URL. A run whose platform and Traces service were one
  service (the local one) keeps them together: when the Traces URL is
  redirected and the run names no platform of another origin, the platform
  follows it.

When the Traces service used is not the run's own, the sync says so in one
line (``note``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from prime_traces.config import ENV_TRACES_URL
from prime_traces.platform_config import configured_platform_url, environment_platform_url


@dataclass(frozen=True)
class SyncTarget:
    """``traces_url`` (``None``: the config file's, then the default), ``platform_url`` (``None``: the Traces one)."""

    traces_url: str | None
    platform_url: str | None
    note: str | None = None

    @classmethod
    def of(
        cls, flag_url: str | None, document: Mapping[str, Any], environ: Mapping[str, str] | None = None
    ) -> SyncTarget:
        """The target of a run whose ``run.json`` is ``document``, given ``--base-url`` (``flag_url``)."""
        env = os.environ if environ is None else environ
        own_traces = _text(document.get("service_url"))
        own_platform = _text(document.get("platform_url"))
        traces: str | None
        source: str | None
        if flag_url:
            traces, source = flag_url, "--base-url"
        elif env.get(ENV_TRACES_URL):
            traces, source = env[ENV_TRACES_URL], ENV_TRACES_URL
        else:
            traces, source = own_traces, None
        moved = source is not None and own_traces is not None and _origin(traces) != _origin(own_traces)
        if own_platform is not None and moved and _origin(own_platform) == _origin(own_traces):
            own_platform = None  # one service played both parts: the platform moves with the Traces URL
        platform = flag_url or environment_platform_url(env) or own_platform or configured_platform_url(environ=env)
        note = f"uploading to {traces} (from {source}), not to the run's own {own_traces}" if moved else None
        return cls(traces, platform, note)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _origin(url: str | None) -> tuple[str, str]:
    parts = urlsplit(url or "")
    return parts.scheme.lower(), parts.netloc.lower()
