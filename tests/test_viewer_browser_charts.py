"""A run's charts as they change, in a real browser: new rows, a new metric, a zoom, smoothing.

Each test stores a small run in its own service and opens its page in a
fresh browser context. A running run's page polls every ``REFRESH_MS``; the
tests install Playwright's clock in the page and move it on by one period, so
they wait for the refresh itself, never for wall-clock time.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
from _browser import Page, drag_across, fail_once
from _upload_helpers import api
from _viewer_data import log, rows

from prime_traces.server import LocalTracesService

try:
    from playwright.sync_api import expect
except ImportError:  # the browser fixture then skips, or fails under CI=true, saying why
    expect = None

pytestmark = [pytest.mark.browser, pytest.mark.timeout(60)]

#: run.js's REFRESH_MS: how often a running run's page asks for new rows.
REFRESH_MS = 5000


@pytest.fixture
def running(tmp_path) -> Iterator[LocalTracesService]:
    """A service holding run ``live``, running, with no history yet."""
    with LocalTracesService(tmp_path / "traces.db") as svc:
        assert api(svc, "POST", "/runs", json={"id": "live", "name": "live", "kind": "train"}).status_code == 201
        yield svc


@pytest.fixture
def opened(browser, running) -> Iterator[Page]:
    """The page of run ``live`` under a fake clock, loaded and waiting for its first refresh."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.clock.install()
    page = Page(context, running.url)
    yield page
    context.close()
    assert not page.errors, page.errors


def open_run(page: Page) -> Any:
    p = page.open("#/run/live")
    # Both sections drawn: the refresh is scheduled in the same task, before the page goes idle.
    expect(p.locator("#run-episodes h2")).to_be_visible()
    expect(p.locator(".chart").first).to_be_visible()
    return p


def test_a_metric_first_logged_while_the_page_is_open_gets_its_chart(running, opened) -> None:
    log(running, "live", rows(range(10), loss=lambda s: 1.0 / (s + 1)))
    p = open_run(opened)
    expect(p.locator(".chart")).to_have_count(1)
    # "accuracy" starts at the last step the page has seen, then both go on.
    log(running, "live", rows(range(9, 10), accuracy=0.5))
    log(running, "live", rows(range(10, 15), loss=0.1, accuracy=lambda s: s / 20))
    p.clock.fast_forward(REFRESH_MS)
    expect(p.locator(".chart")).to_have_count(2)
    expect(p.locator('.chart[data-metric="accuracy"]')).to_have_attribute("data-points", "6")
    expect(p.locator('.chart[data-metric="loss"]')).to_have_attribute("data-points", "15")
    assert [c.get_attribute("data-metric") for c in p.locator(".chart").all()] == ["accuracy", "loss"]
    expect(p.locator('.chart[data-metric="accuracy"] canvas')).to_have_count(1)


def test_a_run_without_metrics_shows_its_first_chart_when_one_is_logged(running, opened) -> None:
    p = opened.open("#/run/live")
    expect(p.locator("#run-episodes h2")).to_be_visible()
    expect(p.get_by_text("No metrics logged.")).to_be_visible()
    expect(p.locator('select[name="smoothing"]')).to_be_hidden()
    log(running, "live", rows(range(3), loss=1.0))
    p.clock.fast_forward(REFRESH_MS)
    expect(p.locator('.chart[data-metric="loss"]')).to_have_attribute("data-points", "3")
    expect(p.get_by_text("No metrics logged.")).to_be_hidden()
    expect(p.locator('select[name="smoothing"]')).to_be_visible()


def test_new_rows_keep_a_zoomed_chart_zoomed_and_extend_the_others(running, opened) -> None:
    log(running, "live", rows(range(100), loss=lambda s: 1.0 / (s + 1), lr=1e-3))
    p = open_run(opened)
    zoomed, other = p.locator('.chart[data-metric="loss"]'), p.locator('.chart[data-metric="lr"]')
    expect(zoomed).to_have_attribute("data-x-max", "99")
    drag_across(p, zoomed, 0.3, 0.6)
    expect(zoomed).not_to_have_attribute("data-x-max", "99")
    x_min, x_max = zoomed.get_attribute("data-x-min"), zoomed.get_attribute("data-x-max")
    assert 10 < int(x_min) < int(x_max) < 80, (x_min, x_max)

    log(running, "live", rows(range(100, 150), loss=0.01, lr=1e-3))
    p.clock.fast_forward(REFRESH_MS)
    expect(zoomed).to_have_attribute("data-points", "150")
    expect(other).to_have_attribute("data-x-max", "149")  # not zoomed: it follows the new rows
    assert (zoomed.get_attribute("data-x-min"), zoomed.get_attribute("data-x-max")) == (x_min, x_max)
    zoomed.locator(".u-over").dblclick()
    expect(zoomed).to_have_attribute("data-x-max", "149")


SMOOTH_STEPS = 21
NAN_STEP = 10


def zigzag(step: int) -> Any:
    """0, 1, 0, 1, ... with NaN at :data:`NAN_STEP`."""
    return "NaN" if step == NAN_STEP else float(step % 2)


def smoothed(weight: float, upto: int) -> float:
    """The chart's smoothing of :func:`zigzag` at step ``upto``: an EMA that skips the NaN."""
    last = None
    for step in range(upto + 1):
        if step == NAN_STEP:
            continue
        value = float(step % 2)
        last = value if last is None else last * weight + (1 - weight) * value
    assert last is not None
    return last


def legend_at(p: Any, chart: Any, step: int) -> list[str]:
    """The legend's step, value and not-finite texts with the cursor over ``step``."""
    over = chart.locator(".u-over")
    box = over.bounding_box()
    over.hover(position={"x": box["width"] * step / (SMOOTH_STEPS - 1), "y": box["height"] / 2})
    values = chart.locator(".u-legend .u-value")
    expect(values.first).to_have_text(str(step))
    return [values.nth(i).inner_text() for i in range(3)]


def test_smoothing_changes_the_drawn_line_and_keeps_the_nan_marks(running, opened) -> None:
    log(running, "live", rows(range(SMOOTH_STEPS), zigzag=zigzag))
    assert api(running, "PATCH", "/runs/live", json={"status": "completed"}).status_code == 200
    p = opened.open("#/run/live")
    chart = p.locator('.chart[data-metric="zigzag"]')
    expect(chart).to_have_attribute("data-marks", "1")
    canvas = chart.locator("canvas")
    drawn = canvas.evaluate("c => c.toDataURL()")
    assert legend_at(p, chart, 15) == ["15", "1", "—"]
    assert legend_at(p, chart, NAN_STEP) == [str(NAN_STEP), "—", "NaN"]

    p.select_option('select[name="smoothing"]', "0.9")
    p.wait_for_function(
        "([c, before]) => c.toDataURL() !== before", arg=[canvas.element_handle(), drawn], timeout=5_000
    )
    _, value, mark = legend_at(p, chart, 15)
    assert math.isclose(float(value), smoothed(0.9, 15), rel_tol=1e-3), value
    assert mark == "—"
    # The line still breaks at the NaN, and its mark is still drawn there.
    assert legend_at(p, chart, NAN_STEP) == [str(NAN_STEP), "—", "NaN"]
    expect(chart).to_have_attribute("data-marks", "1")

    p.select_option('select[name="smoothing"]', "0")
    p.wait_for_function(
        "([c, before]) => c.toDataURL() === before", arg=[canvas.element_handle(), drawn], timeout=5_000
    )
    assert legend_at(p, chart, 15)[1] == "1"


def test_a_failed_refresh_is_said_and_tried_again(running, opened) -> None:
    log(running, "live", rows(range(5), loss=1.0))
    p = open_run(opened)
    chart = p.locator('.chart[data-metric="loss"]')
    fail_once(p, "**/api/v1/runs/live/metrics?*")
    log(running, "live", rows(range(5, 10), loss=0.5))
    p.clock.fast_forward(REFRESH_MS)
    stale = p.locator(".refresh-error")
    expect(stale).to_have_text("refresh failed (restarting); trying again")
    expect(chart).to_have_attribute("data-points", "5")
    p.clock.fast_forward(REFRESH_MS)
    expect(chart).to_have_attribute("data-points", "10")
    expect(stale).to_be_hidden()
    opened.errors[:] = [e for e in opened.errors if "503" not in e]
