"""A teacher launches the quota race's "leak and repair" preset and watches the leak open and the resync close it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from occviz.jobs.models import Job
from tests.browser.test_web_browser import counter, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def chart(page: Page, key: str) -> int:
    value = page.locator("[data-quota-chart]").get_attribute(f"data-{key}")
    return int(value or "0")


def test_leak_and_repair_live(page: Page, app_url: str, teacher: User, artifacts: Path) -> None:
    sign_in(page, app_url, teacher)
    page.click("text=Launch a quota race")
    page.click("[data-preset=leak-and-repair]")
    expect(page.locator("input[name=create_failure_rate]")).to_have_value("0.2")
    expect(page.locator("input[name=resync_seconds]")).to_have_value("2")
    # The first resync later than the preset's, so that a page slow to open (a busy machine) still sees the leak.
    page.fill("input[name=resync_seconds]", "5")
    page.fill("input[name=seconds]", "8")
    page.click("button:has-text('Launch')")
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    job_id = int(page.url.rstrip("/").rsplit("/", 1)[1])

    # The admissions run: figures move, and the chart shows charged usage above what exists (the leak).
    page.wait_for_function(
        "() => { const c = document.querySelector('[data-quota-chart]');"
        " return c && Number(c.dataset.used) > Number(c.dataset.actual) && c.dataset.resyncs === '0'; }",
        timeout=15_000,
    )
    expect(page.locator('#live-figures [data-counter="admitted"]')).not_to_have_text("—")
    assert counter(page, "admitted") > 0
    expect(page.locator("#live-state [data-gap]")).to_contain_text("charged for pods that do not exist")
    page.screenshot(path=str(artifacts / "quota-leak.png"), full_page=True)

    # The quota controller's resync closes the gap, marked on the chart, and the log says what it released.
    page.wait_for_function(
        "() => { const c = document.querySelector('[data-quota-chart]');"
        " return Number(c.dataset.resyncs) >= 1 && c.dataset.used === c.dataset.actual; }",
        timeout=15_000,
    )
    expect(page.locator("#live-log li", has_text="leaked released").first).to_be_visible(timeout=10_000)

    # The verdict: the pods admitted never held more than hard.
    verdict = page.locator("#live-status .verdict")
    expect(verdict).to_contain_text("Invariant holds", timeout=20_000)
    expect(verdict).to_contain_text("the pods admitted never held more than hard 40")
    expect(page.locator("#live-state [data-gap]")).to_contain_text("Charged usage matches")
    page.wait_for_timeout(300)
    page.screenshot(path=str(artifacts / "quota-repaired.png"), full_page=True)
    job = Job.objects.get(pk=job_id)
    summary = job.summary or {}
    assert job.status == "succeeded" and summary["over_admitted"] == 0
    assert summary["create_failures"] > 0 and summary["leaked"] > 0
    assert summary["used_final"] == summary["actual_final"]

    # Replay rebuilds the chart and the quota from the stored events.
    page.click("text=Replay")
    page.wait_for_function("() => document.querySelector('[data-page=replay]').dataset.ready === '1'")
    page.locator("[data-scrub]").fill(str(int(summary["duration_s"] * 1000)))
    page.wait_for_function(
        "(used) => { const c = document.querySelector('[data-quota-chart]');"
        " return c && c.dataset.used === String(used) && Number(c.dataset.resyncs) >= 1; }",
        arg=summary["used_final"],
    )
    expect(page.locator("#live-state")).to_contain_text("kind: ResourceQuota")
