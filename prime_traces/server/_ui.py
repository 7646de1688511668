"""The web viewer's files: ``/`` is its page, ``/ui/<file>`` its scripts, styles and licence.

The files ship inside the package (``prime_traces/server/ui``, package data)
and are answered without credentials: they hold no data, and the page must
load before it can ask for a key. Like every route, they are answered only
to a local ``Host`` when the service has no key (``_hosts``), so a page on
another origin cannot load the viewer through a rebound name either. Every answer carries a
Content-Security-Policy that admits scripts, styles, images and requests
from this origin only, no inline script or style, no plugins, no framing;
record content the page shows is text, so even a policy bypass would find
no HTML to run. ``LocalTracesService(ui=False)`` (``serve --no-ui``) leaves
these routes out.
"""

from __future__ import annotations

import functools
import logging
import re
from importlib import resources

from prime_traces.errors import ErrorCode
from prime_traces.server._http import HTTPError, Request, Response, page_route

logger = logging.getLogger(__name__)

UI_PATH = "/ui/"
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".txt": "text/plain; charset=utf-8",
    ".png": "image/png",
    ".svg": "image/svg+xml",
}
# One or two plain segments: no "..", no hidden files, nothing a browser would reinterpret.
_FILE_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*(?:/[A-Za-z0-9_-][A-Za-z0-9_.-]*)?")


@functools.lru_cache(maxsize=64)
def _read(name: str) -> bytes | None:
    """The bytes of the packaged file ``name`` (relative to ``ui/``), or None."""
    node = resources.files("prime_traces.server").joinpath("ui")
    for part in name.split("/"):
        node = node.joinpath(part)
    if not node.is_file():
        return None
    return node.read_bytes()


def _headers() -> dict[str, str]:
    return {
        "Content-Security-Policy": CONTENT_SECURITY_POLICY,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-cache",
    }


def _file(name: str) -> Response:
    suffix = name[name.rfind(".") :] if "." in name else ""
    body = _read(name) if _FILE_RE.fullmatch(name) and suffix in _CONTENT_TYPES else None
    if body is None:
        raise HTTPError(404, ErrorCode.NOT_FOUND, f"no such file: {UI_PATH}{name}", headers=_headers())
    return Response(200, body, content_type=_CONTENT_TYPES[suffix], headers=_headers())


def get_page(req: Request) -> Response:
    """``GET /``: the viewer's one page."""
    return _file("index.html")


def get_file(req: Request) -> Response:
    """``GET /ui/<file>``: a script, style sheet or licence of the viewer, or 404."""
    return _file(req.path[len(UI_PATH) :])


def get_dashboard_link(req: Request) -> Response:
    """``GET /dashboard/{evaluations,training}/<id>``: the platform's run page, as the viewer's page of that run.

    A client that builds the platform's dashboard link from this service's
    origin (a run it attached to by id) lands on the viewer.
    """
    run_id = req.path.rsplit("/", 1)[-1]
    return Response(302, b"", content_type=None, headers={"Location": f"/#/run/{run_id}", **_headers()})


ROUTES = [
    page_route("/", get_page),
    page_route(r"/ui/.+", get_file),
    page_route(r"/dashboard/(?:evaluations|training)/[^/]+", get_dashboard_link),
]
