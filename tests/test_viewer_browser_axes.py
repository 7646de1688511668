"""The charts' axes in a real browser: y labels drawn whole, x ticks only at whole steps.

uPlot draws the axes on the chart's canvas, so each chart keeps what its axes
last drew in its ``data-axes`` attribute (JSON: each axis's tick values and
labels; for y also the width its labels have left of their ticks and the
font they are drawn in). The tests read it and measure every y label in the
page with that font. They also record every text drawn on a canvas, with
where its ink starts and ends: a label that does not fit its axis is drawn
partly left of the canvas, where it is cut.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Any

import pytest
from _browser import Page, drag_across
from _upload_helpers import api
from _viewer_data import log, rows

from prime_traces.server import LocalTracesService

try:
    from playwright.sync_api import expect
except ImportError:  # the browser fixture then skips, or fails under CI=true, saying why
    expect = None

pytestmark = [pytest.mark.browser, pytest.mark.timeout(60)]

#: Per metric of run ``wide``: its value at each of 26 steps, and a label its y axis must show.
WIDE = {
    "tokens": (lambda s: s * 1000, "20,000"),
    "margin": (lambda s: -1_234_567 * s / 25, "-1,000,000"),
    "tiny": (lambda s: 0.0001 + s * 0.000002, "0.00012"),
    "huge": (lambda s: s * 4e19, "1e+21"),
    "lr": (lambda s: 1e-6 * (1 + s / 5), "4e-6"),
}

MEASURE = """([font, labels]) => {
  const ctx = document.createElement("canvas").getContext("2d");
  ctx.font = font;
  return labels.map((text) => ctx.measureText(text).width);
}"""
# Every text drawn on a canvas, kept on the canvas with its horizontal extent in canvas pixels:
# what was drawn, whatever the page's code says about it.
TEXT_RECORDER = """
const fillText = CanvasRenderingContext2D.prototype.fillText;
CanvasRenderingContext2D.prototype.fillText = function (text, x, y, ...rest) {
  const m = this.measureText(text);
  const t = this.getTransform();
  (this.canvas.drawnTexts ||= []).push({
    text: String(text),
    left: t.e + t.a * (x - m.actualBoundingBoxLeft),
    right: t.e + t.a * (x + m.actualBoundingBoxRight),
    rotated: t.b !== 0 || t.c !== 0,
  });
  return fillText.call(this, text, x, y, ...rest);
};
"""
LAYOUT = """(box) => ({
  inner: box.clientWidth,
  wrap: box.querySelector(".u-wrap").offsetWidth,
  plotLeft: box.querySelector(".u-over").offsetLeft,
  plotWidth: box.querySelector(".u-over").offsetWidth,
})"""


def store_run(svc: LocalTracesService, run_id: str, *histories: list[dict[str, Any]]) -> None:
    """A completed train run ``run_id`` holding ``histories``."""
    assert api(svc, "POST", "/runs", json={"id": run_id, "name": run_id, "kind": "train"}).status_code == 201
    for history in histories:
        log(svc, run_id, history)
    assert api(svc, "PATCH", f"/runs/{run_id}", json={"status": "completed"}).status_code == 200


@pytest.fixture(scope="module")
def svc(tmp_path_factory) -> Iterator[LocalTracesService]:
    with LocalTracesService(tmp_path_factory.mktemp("axes") / "traces.db") as svc:
        store_run(svc, "wide", rows(range(26), **{name: f for name, (f, _) in WIDE.items()}))
        # "lr" starts a step later than "loss": a chart of 2 steps beside one of 3.
        store_run(svc, "short", rows(range(3), loss=lambda s: 1.0 / (s + 1)), rows(range(1, 3), lr=3e-6))
        store_run(svc, "long", rows(range(100), loss=lambda s: 1.0 / (s + 1)))
        yield svc


@pytest.fixture
def page(browser, svc) -> Iterator[Page]:
    # en-US: the labels group thousands with commas whatever the machine's locale.
    context = browser.new_context(viewport={"width": 1280, "height": 900}, locale="en-US")
    context.add_init_script(TEXT_RECORDER)
    opened = Page(context, svc.url)
    yield opened
    context.close()
    assert not opened.errors, opened.errors


def chart_of(p: Any, metric: str) -> Any:
    chart = p.locator(f'.chart[data-metric="{metric}"]')
    expect(chart.locator("canvas")).to_have_count(1)
    return chart


def axes_of(chart: Any) -> dict[str, Any]:
    """What the chart's axes last drew (its ``data-axes``)."""
    expect(chart).to_have_attribute("data-axes", re.compile(r"."))
    return json.loads(chart.get_attribute("data-axes"))


def whole_step_ticks(axis: dict[str, Any], first: int, last: int) -> list[int]:
    """The x ticks, checked: whole steps an integer apart over ``first``..``last``, each labelled with its step."""
    ticks = axis["ticks"]
    assert ticks and all(type(t) is int for t in ticks), axis
    incr = ticks[1] - ticks[0] if len(ticks) > 1 else 1
    assert incr >= 1, axis
    assert first <= ticks[0] < first + incr and ticks == list(range(ticks[0], last + 1, incr)), (first, last, axis)
    assert axis["labels"] == [f"{t:,}" for t in ticks], axis
    return ticks


def test_y_labels_are_drawn_whole_for_large_negative_tiny_and_huge_values(page) -> None:
    p = page.open("#/run/wide")
    for metric, (_, must_show) in WIDE.items():
        chart = chart_of(p, metric)
        # First what the canvas was given, which needs nothing from the chart: every label inside it.
        width, texts = chart.locator("canvas").evaluate("c => [c.width, c.drawnTexts]")
        cut = [t for t in texts if t["rotated"] or t["left"] < 0 or t["right"] > width]
        assert not cut, f"{metric}: texts drawn across the edges of a {width} px canvas: {cut}"
        y = axes_of(chart)["y"]
        assert must_show in y["labels"], (metric, y["labels"])
        assert len(y["labels"]) == len(y["ticks"]) >= 3, (metric, y)
        for tick, label in zip(y["ticks"], y["labels"], strict=True):
            assert math.isclose(float(label.replace(",", "")), tick, rel_tol=1e-9, abs_tol=1e-12), (metric, y)
        widths = p.evaluate(MEASURE, [y["font"], y["labels"]])
        too_wide = {label: w for label, w in zip(y["labels"], widths, strict=True) if w > y["labelSpacePx"]}
        assert not too_wide, f"{metric}: labels wider than the {y['labelSpacePx']} px they have: {too_wide}"
        layout = chart.evaluate(LAYOUT)
        assert layout["wrap"] <= layout["inner"], (metric, layout)
        assert layout["plotLeft"] + layout["plotWidth"] <= layout["wrap"], (metric, layout)
        assert layout["plotWidth"] >= layout["wrap"] / 2, (metric, layout)


def test_x_ticks_are_whole_steps_on_runs_of_two_and_three_steps(page) -> None:
    p = page.open("#/run/short")
    assert whole_step_ticks(axes_of(chart_of(p, "loss"))["x"], 0, 2) == [0, 1, 2]
    assert whole_step_ticks(axes_of(chart_of(p, "lr"))["x"], 1, 2) == [1, 2]


def test_a_narrow_zoom_shows_whole_steps_only(page) -> None:
    p = page.open("#/run/long")
    chart = chart_of(p, "loss")
    expect(chart).to_have_attribute("data-x-max", "99")
    # About one step wide, its ends between steps: the zoom widens to the whole steps around it.
    drag_across(p, chart, 0.4, 0.41)
    expect(chart).not_to_have_attribute("data-x-max", "99")
    x = axes_of(chart)["x"]
    first, last = int(chart.get_attribute("data-x-min")), int(chart.get_attribute("data-x-max"))
    assert 30 < first < last <= first + 2 < 50, (first, last)
    assert whole_step_ticks(x, first, last) == list(range(first, last + 1))
    # A zoom over a few steps: whole steps still, none between.
    chart.locator(".u-over").dblclick()
    expect(chart).to_have_attribute("data-x-max", "99")
    drag_across(p, chart, 0.2, 0.25)
    expect(chart).not_to_have_attribute("data-x-max", "99")
    first, last = int(chart.get_attribute("data-x-min")), int(chart.get_attribute("data-x-max"))
    assert 3 <= last - first <= 8, (first, last)
    assert len(whole_step_ticks(axes_of(chart)["x"], first, last)) >= 2
