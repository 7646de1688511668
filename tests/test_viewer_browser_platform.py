"""Runs made through the platform's run routes (contract §10), in the viewer: headless Chromium.

An evaluation's ``viewer_url`` opens its page; a training run's
``/rft/metrics`` rows are its charts; what the routes were told shows as
the run's Platform block.
"""

from __future__ import annotations

import pytest
from _browser import Page
from _platform_helpers import answer, call, create_eval, create_train, resolve_env
from _upload_helpers import committed, make_episode, make_trace, upload

from prime_traces.server import LocalTracesService

try:
    from playwright.sync_api import expect
except ImportError:  # the browser fixture then skips, or fails under CI=true, saying why
    expect = None

pytestmark = [pytest.mark.browser, pytest.mark.timeout(60)]
STEPS = 12


def test_platform_runs_have_their_pages(browser, tmp_path) -> None:
    with LocalTracesService(tmp_path / "traces.db") as svc:
        train = create_train(svc, name="grpo-platform", run_config={"lr": 1e-6})
        for step in range(STEPS):
            metrics = {"loss": 1.0 / (step + 1), "step": step, "_timestamp": 1.7e9 + step}
            answer(call(svc, "POST", "/rft/metrics", {"run_id": train["id"], "metrics": metrics}))
        evaluation = create_eval(svc, "gsm8k-eval", [resolve_env(svc, "gsm8k")], model_name="qwen/qwen3-8b")
        episodes = [
            make_episode(f"ep-{i}", [make_trace(f"t-{i}", run_id=evaluation["evaluation_id"])]) for i in range(3)
        ]
        committed(upload(svc.url, episodes, episode=True))
        answer(call(svc, "POST", f"/evaluations/{evaluation['evaluation_id']}/finalize", {"metrics": {"n": 3}}))
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        try:
            page = Page(context, svc.url)
            p = page.open()
            eval_row = p.locator(f'#runs tr[data-run-id="{evaluation["evaluation_id"]}"]')
            expect(eval_row).to_contain_text("gsm8k-eval")
            expect(eval_row).to_contain_text("completed")
            expect(p.locator(f'#runs tr[data-run-id="{train["id"]}"]')).to_contain_text("running")

            p.goto(evaluation["viewer_url"])
            expect(p.locator("h1").first).to_contain_text("gsm8k-eval")
            expect(p.locator("#episodes tbody tr")).to_have_count(3)
            platform = p.locator("details", has_text="Platform")
            expect(platform).to_contain_text("qwen/qwen3-8b")

            p.goto(f"{svc.url}/#/run/{train['id']}")
            expect(p.locator('.chart[data-metric="loss"]')).to_have_attribute("data-points", str(STEPS))
            expect(p.locator("details", has_text="Platform")).to_contain_text('"base_model"')
            assert page.foreign_requests() == []
            assert page.errors == []
        finally:
            context.close()
