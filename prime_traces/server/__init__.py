"""The local Traces service: the wire contract served from SQLite.

Start it from the shell with ``prime-traces serve``, or in-process::

    from prime_traces.server import LocalTracesService

    with LocalTracesService("traces.db") as svc:
        print(svc.url)

The same port serves a read-only web viewer at ``/`` (``ui=False``, or
``serve --no-ui``, turns it off; ``svc.viewer_url`` is its address).

Faults (latency, bandwidth caps, 429/503 storms, rejected lines, hung or
dropped uploads) are keyword arguments, and fields of ``svc.faults`` while
it runs; see :class:`Faults`.
"""

from prime_traces.server._faults import DEFAULT_MAX_UPLOADS_IN_FLIGHT, Faults
from prime_traces.server._hosts import is_loopback
from prime_traces.server._service import LocalTracesService

__all__ = ["DEFAULT_MAX_UPLOADS_IN_FLIGHT", "Faults", "LocalTracesService", "is_loopback"]
