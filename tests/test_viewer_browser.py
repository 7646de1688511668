"""The web viewer in a real browser: headless Chromium against the local service.

One service holds every run these tests look at (built once: a train run
with three metrics over 1,000 steps and 50 episodes, a 35 MB episode, an
episode whose records hold markup); each test opens its own browser context
and records every request the page makes.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _browser import CHROMIUM_ENV, Page, fail_once, launched_chromium
from _upload_helpers import api, committed, make_trace, upload
from _viewer_data import (
    EPISODES,
    HOSTILE_TEXTS,
    METRIC_NAMES,
    NAN_STEPS,
    ROLES,
    STEPS,
    store_big_episode,
    store_hostile_episode,
    store_rl_run,
)

from prime_traces.server import LocalTracesService
from prime_traces.server._http import producer_of

try:
    from playwright.sync_api import expect
except ImportError:  # the browser fixture then skips, or fails under CI=true, saying why
    expect = None

pytestmark = [pytest.mark.browser, pytest.mark.timeout(60)]

SCREENSHOT = Path(__file__).resolve().parent.parent / "docs" / "viewer.png"
SCREENSHOT_ENV = "PRIME_TRACES_UPDATE_SCREENSHOT"
FIRST_MESSAGE_BUDGET_MS = 2000
#: How often a page refreshes while a run is running (runs.js, run.js).
RUNS_REFRESH_MS, RUN_REFRESH_MS = 3000, 5000
# Records when the first message reaches the DOM, from the browser's clock, whatever the page's code does.
FIRST_MESSAGE_PROBE = """
window.__firstMessageAt = null;
new MutationObserver((records, observer) => {
  if (document.querySelector('.msg')) { window.__firstMessageAt = performance.now(); observer.disconnect(); }
}).observe(document, {childList: true, subtree: true});
"""
# Whatever markup in a record manages to run calls this hook.
PWNED_HOOK = "window.__pwnedCalls = []; window.__pwned = (what) => window.__pwnedCalls.push(String(what));"


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> Iterator[tuple[LocalTracesService, Any, int]]:
    with LocalTracesService(tmp_path_factory.mktemp("viewer") / "traces.db") as svc:
        rl = store_rl_run(svc)
        big_bytes = store_big_episode(svc)
        store_hostile_episode(svc)
        yield svc, rl, big_bytes


@pytest.fixture
def page(browser, stored) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.add_init_script(PWNED_HOOK)
    opened = Page(context, stored[0].url)
    yield opened
    context.close()
    assert not opened.errors, opened.errors


def test_runs_page_lists_the_run_with_its_numbers(page, stored) -> None:
    svc, rl, _ = stored
    p = page.open()
    row = p.locator(f'#runs tr[data-run-id="{rl.run_id}"]')
    expect(row).to_contain_text(rl.name)
    expect(row).to_contain_text("completed")
    expect(row.locator("td").nth(5)).to_have_text(str(EPISODES))
    expect(row.locator("canvas.spark")).to_have_count(1)
    expect(row).to_contain_text(producer_of("alice"))  # the fingerprint, never the token
    assert "alice" not in p.locator("main").inner_text()
    expect(p.locator("#runs tbody tr")).to_have_count(3)
    p.select_option('select[name="kind"]', "eval")
    expect(p.locator("#runs tbody tr")).to_have_count(1)
    p.select_option('select[name="status"]', "completed")
    expect(p.get_by_text("No runs yet.")).to_be_visible()
    assert page.foreign_requests() == []


def test_run_page_draws_one_chart_per_metric_and_sorts_episodes_by_reward(page, stored) -> None:
    svc, rl, _ = stored
    p = page.open(f"#/run/{rl.run_id}")
    charts = p.locator(".chart")
    expect(charts).to_have_count(len(METRIC_NAMES))
    for name in METRIC_NAMES:
        chart = p.locator(f'.chart[data-metric="{name}"]')
        expect(chart).to_have_attribute("data-points", str(STEPS))
        expect(chart.locator("canvas")).to_have_count(1)
    expect(p.locator('.chart[data-metric="loss"]')).to_have_attribute("data-marks", str(len(NAN_STEPS)))
    # Hovering shows the step and the value under the cursor.
    over = p.locator('.chart[data-metric="reward/mean"] .u-over')
    box = over.bounding_box()
    over.hover(position={"x": box["width"] / 2, "y": box["height"] / 2})
    legend = p.locator('.chart[data-metric="reward/mean"] .u-legend .u-value')
    expect(legend.first).to_have_text(re.compile(r"^\d+$"))
    step = int(legend.first.inner_text())
    assert 300 < step < 700
    expect(legend.nth(1)).to_have_text(re.compile(r"^0\.\d+"))
    # Dragging across a chart zooms its steps; a double-click shows them all again.
    chart = p.locator('.chart[data-metric="reward/mean"]')
    expect(chart).to_have_attribute("data-x-max", str(STEPS - 1))
    p.mouse.move(box["x"] + box["width"] * 0.25, box["y"] + box["height"] / 2)
    p.mouse.down()
    p.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] / 2, steps=5)
    p.mouse.up()
    expect(chart).not_to_have_attribute("data-x-max", str(STEPS - 1))
    assert 150 < int(chart.get_attribute("data-x-min")) < int(chart.get_attribute("data-x-max")) < 600
    over.dblclick()
    expect(chart).to_have_attribute("data-x-max", str(STEPS - 1))
    over.hover(position={"x": box["width"] / 2, "y": box["height"] / 2})
    shot = p.screenshot()
    assert shot.startswith(b"\x89PNG")
    if os.environ.get(SCREENSHOT_ENV) == "1":  # the README's picture, refreshed on request only
        SCREENSHOT.write_bytes(shot)

    # When the window changes the grid's cells, each chart follows its cell.
    before = p.locator(".chart .uplot").first.bounding_box()["width"]
    p.set_viewport_size({"width": 700, "height": 900})
    p.wait_for_function(
        """before => [...document.querySelectorAll('.chart')].every(box => {
             const width = box.querySelector('.uplot').getBoundingClientRect().width;
             return Math.abs(width - before) > 50 && Math.abs(width - (box.clientWidth - 12)) < 2;
           })""",
        arg=before,
        timeout=5_000,
    )
    p.set_viewport_size({"width": 1280, "height": 900})

    rows = p.locator("#episodes tbody tr")
    expect(rows).to_have_count(20)
    newest = rows.first.get_attribute("data-episode-id")
    assert newest == f"ep-{EPISODES - 1:02d}"
    p.click('button[data-sort="reward_desc"]')
    best = sorted(rl.episode_rewards, key=rl.episode_rewards.get, reverse=True)
    expect(rows.first).to_have_attribute("data-episode-id", best[0])
    assert [r.get_attribute("data-episode-id") for r in rows.all()] == best[:20]
    p.click("text=Older →")
    expect(rows.first).to_have_attribute("data-episode-id", best[20])
    p.click('button[data-sort="reward_asc"]')
    expect(rows.first).to_have_attribute("data-episode-id", best[-1])
    p.click('button[data-sort="reward_desc"]')
    expect(rows.first).to_have_attribute("data-episode-id", best[0])
    assert page.foreign_requests() == []


def test_episode_shows_its_messages_in_order_with_their_roles(page, stored) -> None:
    svc, rl, _ = stored
    p = page.open(f"#/run/{rl.run_id}")
    p.click("text=ep-47")
    messages = p.locator(".msg")
    expect(messages).to_have_count(len(ROLES))
    assert [m.get_attribute("data-role") for m in messages.all()] == list(ROLES)
    expect(messages.nth(1).locator(".content")).to_have_text("episode 47: what is 2 + 2?")
    expect(messages.nth(4)).to_contain_text("episode 47: the answer is 4")
    # Tool calls and results are folded until asked for.
    call = messages.nth(2).locator("details.tool-call")
    expect(call.locator(".content")).to_be_hidden()
    call.locator("summary").click()
    expect(call.locator(".content")).to_contain_text('"x": "2+2"')
    expect(messages.nth(3).locator("details.tool-result .content")).to_be_hidden()
    head = p.locator(".trace-head")
    shown = head.locator(".reward").inner_text()
    assert float(shown.removeprefix("reward ")) == rl.episode_rewards["ep-47"], shown
    expect(head.locator(".tokens")).to_have_text("120 tokens")
    p.locator("details.raw-json summary").click()
    expect(p.locator("pre.raw")).to_contain_text('"id":"tr-47"')
    with p.expect_download() as download:
        head.get_by_text("download").click()
    assert Path(download.value.path()).read_bytes().startswith(b'{"version":1,"id":"tr-47"')
    assert page.foreign_requests() == []


def test_a_35_mb_episode_shows_its_first_message_within_two_seconds(page, stored) -> None:
    _, _, big_bytes = stored
    assert big_bytes >= 35_000_000
    page.context.add_init_script(FIRST_MESSAGE_PROBE)
    p = page.open("#/episode/big-episode")
    first = p.locator(".msg").first
    expect(first).to_be_visible()
    expect(first.locator(".content")).to_contain_text("trace 0 message 0: ")
    at_ms = p.evaluate("window.__firstMessageAt")
    print(f"first message of the {big_bytes / 1e6:.1f} MB episode on screen after {at_ms:.0f} ms")
    assert at_ms < FIRST_MESSAGE_BUDGET_MS
    # Drawn lazily: a fraction of its 700 messages, and not every trace fetched.
    assert p.locator(".msg").count() < 200
    fetched = {r.url for r in page.requests if "raw=true" in r.url}
    assert 1 <= len(fetched) < 5, fetched
    drawn = p.locator(".msg").count()
    p.locator(".msg").last.scroll_into_view_if_needed()
    expect(p.locator(".msg")).not_to_have_count(drawn)


def test_markup_in_records_is_shown_as_text_and_runs_nothing(page, stored) -> None:
    p = page.open()
    expect(p.locator("#runs").get_by_text(HOSTILE_TEXTS[0])).to_be_visible()
    p.goto(f"{page.base_url}/#/episode/hostile-episode")
    messages = p.locator(".msg")
    expect(messages).to_have_count(len(ROLES))
    expect(messages.nth(1).locator(".content")).to_have_text(HOSTILE_TEXTS[0])
    expect(messages.nth(4).locator(".content")).to_have_text(HOSTILE_TEXTS[1])
    messages.nth(2).locator("details.tool-call summary").click()
    expect(messages.nth(2).locator("details.tool-call .content")).to_have_text(HOSTILE_TEXTS[1])
    assert p.locator("main img, main script").count() == 0
    assert p.evaluate("window.__pwnedCalls") == []
    assert not [r.url for r in page.requests if r.url.endswith("/x")]
    assert page.foreign_requests() == []


def test_with_an_api_key_no_data_without_it_and_the_same_pages_with_it(browser, tmp_path) -> None:
    key = "viewer-test-key-7d1f"
    with LocalTracesService(tmp_path / "traces.db", api_key=key) as svc:
        rl = store_rl_run(svc, token=key)
        context = browser.new_context()
        try:
            page = Page(context, svc.url)
            responses: list[Any] = []
            page.page.on("response", lambda response: responses.append(response))
            p = page.open()
            expect(p.locator('input[name="key"]')).to_be_visible()
            api = [r for r in responses if "/api/v1/" in r.url]
            assert api and {r.status for r in api} == {401}
            expect(p.locator("#runs")).to_have_count(0)
            p.fill('input[name="key"]', "wrong-key")
            p.click("text=Open")
            expect(p.get_by_text("That key was refused.")).to_be_visible()
            p.fill('input[name="key"]', key)
            p.click("text=Open")
            expect(p.locator(f'#runs tr[data-run-id="{rl.run_id}"]')).to_be_visible()
            p.click(f"text={rl.name}")
            expect(p.locator(".chart")).to_have_count(len(METRIC_NAMES))
            p.click("text=ep-45")
            expect(p.locator(".msg")).to_have_count(len(ROLES))
            assert p.evaluate("sessionStorage.length") == 1 and p.evaluate("localStorage.length") == 0
            sent = [r for r in page.requests if "/api/v1/" in r.url]
            assert all(key not in r.url for r in page.requests)
            sent_with = {r.headers.get("authorization") for r in sent}
            assert f"Bearer {key}" in sent_with
            assert sent_with <= {"Bearer viewer", "Bearer wrong-key", f"Bearer {key}"}
            assert page.foreign_requests() == []
            # The browser logs each 401 it got before the key as a failed load; nothing else.
            assert all("401" in error for error in page.errors), page.errors
        finally:
            context.close()


def test_pages_follow_a_running_run(browser, tmp_path) -> None:
    with LocalTracesService(tmp_path / "traces.db") as svc:
        assert api(svc, "POST", "/runs", json={"id": "live", "name": "live", "kind": "train"}).status_code == 201
        rows = [{"step": s, "time": 1.7e9 + s, "metrics": {"loss": 1.0 / (s + 1)}} for s in range(10)]
        assert api(svc, "POST", "/runs/live/metrics", json={"rows": rows}).status_code == 200
        context = browser.new_context()
        # The pages refresh on timers: the test moves the page's clock on instead of waiting.
        context.clock.install()
        try:
            page = Page(context, svc.url)
            p = page.open()
            records = p.locator('#runs tr[data-run-id="live"] td').nth(5)
            expect(records).to_have_text("0")
            committed(upload(svc.url, [make_trace("live-1", run_id="live", step=0)]))
            # A refresh that fails is said on the page and tried again.
            fail_once(p, "**/api/v1/_viewer/runs?*")
            p.clock.fast_forward(RUNS_REFRESH_MS)
            stale = p.locator(".refresh-error")
            expect(stale).to_have_text("refresh failed (restarting); trying again")
            expect(records).to_have_text("0")
            p.clock.fast_forward(RUNS_REFRESH_MS)
            expect(records).to_have_text("1")  # no reload: the page refreshes itself
            expect(stale).to_be_hidden()
            p.click("text=live")
            chart = p.locator('.chart[data-metric="loss"]')
            expect(chart).to_have_attribute("data-points", "10")
            expect(p.locator("#run-episodes h2")).to_be_visible()
            more = [{"step": s, "time": 1.7e9 + s, "metrics": {"loss": 1.0 / (s + 1)}} for s in range(10, 25)]
            assert api(svc, "POST", "/runs/live/metrics", json={"rows": more}).status_code == 200
            p.clock.fast_forward(RUN_REFRESH_MS)
            expect(chart).to_have_attribute("data-points", "25")
            assert [e for e in page.errors if "503" not in e] == []
        finally:
            context.close()


@pytest.mark.parametrize(("ci", "outcome"), [("true", pytest.fail.Exception), ("", pytest.skip.Exception)])
def test_without_a_browser_ci_fails_and_a_local_run_skips(monkeypatch, tmp_path, ci, outcome) -> None:
    monkeypatch.setenv("CI", ci)
    monkeypatch.setenv(CHROMIUM_ENV, str(tmp_path / "no-such-chromium"))
    with pytest.raises(outcome, match="no-such-chromium"), launched_chromium():
        pass
