"""Headless Chromium for the viewer's browser tests, driven through Playwright's Python API.

The browser is the operating system's ``chromium`` (``apt-get install
chromium``), or the executable named by ``PRIME_TRACES_CHROMIUM``; Playwright's
own browser downloads are never used. When no browser can be started the
tests skip with the reason, except under ``CI=true``, where they fail: CI
must run them. :class:`Page` is a page in its own browser context that keeps
the log of its requests and errors.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import pytest

CHROMIUM_ENV = "PRIME_TRACES_CHROMIUM"
_CANDIDATES = ("chromium", "chromium-browser", "google-chrome")


def _unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true and the browser tests cannot run: {reason}", pytrace=False)
    pytest.skip(reason)


def chromium_path() -> str | None:
    """The browser to drive: ``$PRIME_TRACES_CHROMIUM``, else the first Chromium on PATH."""
    named = os.environ.get(CHROMIUM_ENV)
    if named:
        return named
    return next((path for path in map(shutil.which, _CANDIDATES) if path), None)


@contextmanager
def launched_chromium() -> Iterator[Any]:
    """A headless Chromium for the duration of the block; skips (fails under CI) without one."""
    try:
        from playwright.sync_api import Error, sync_playwright
    except ImportError as err:
        _unavailable(f"playwright is not installed ({err}); pip install -e '.[test]'")
    path = chromium_path()
    if path is None:
        _unavailable(f"no Chromium found (apt-get install chromium, or set {CHROMIUM_ENV})")
    if not os.access(path, os.X_OK):
        _unavailable(f"{path} is not an executable (apt-get install chromium, or set {CHROMIUM_ENV})")
    with sync_playwright() as playwright:
        try:
            # --no-sandbox: CI containers run as root, where Chromium's sandbox refuses to start.
            browser = playwright.chromium.launch(executable_path=path, args=["--no-sandbox"])
        except Error as err:
            _unavailable(f"Chromium at {path} did not start: {err}")
        try:
            yield browser
        finally:
            browser.close()


_RESTARTING = '{"error": {"code": null, "message": "restarting"}}'


class Page:
    """A page in a fresh browser context, with the log of every request it made."""

    def __init__(self, context: Any, base_url: str) -> None:
        self.context = context
        self.page = context.new_page()
        self.base_url = base_url
        self.requests: list[Any] = []
        self.errors: list[str] = []
        self.page.on("request", lambda request: self.requests.append(request))
        self.page.on("pageerror", lambda err: self.errors.append(str(err)))
        # A Content-Security-Policy refusal or a failed load is a console error.
        self.page.on("console", lambda msg: msg.type == "error" and self.errors.append(msg.text))

    def open(self, route: str = "") -> Any:
        self.page.goto(f"{self.base_url}/{route}")
        return self.page

    def foreign_requests(self) -> list[str]:
        return [r.url for r in self.requests if not r.url.startswith(self.base_url + "/")]


def fail_once(page: Any, url_glob: str) -> None:
    """Answer the page's next request to ``url_glob`` with a 503 in the error envelope; pass on the rest."""
    failed = False

    def handle(route: Any) -> None:
        nonlocal failed
        if failed:
            route.continue_()
            return
        failed = True
        route.fulfill(status=503, content_type="application/json", body=_RESTARTING)

    page.route(url_glob, handle)


def drag_across(page: Any, chart: Any, start: float, end: float) -> None:
    """Drag over ``chart`` from ``start`` to ``end`` (fractions of its plot's width): a zoom."""
    box = chart.locator(".u-over").bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * start, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * end, y, steps=5)
    page.mouse.up()
