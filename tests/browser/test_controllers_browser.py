"""A teacher launches two blind controllers from the dashboard and watches one erase the other's field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from occviz.jobs.models import Job
from tests.browser.test_web_browser import counter, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_launch_two_blind_controllers_and_watch_fields_erased(
    page: Page, app_url: str, teacher: User, artifacts: Path
) -> None:
    sign_in(page, app_url, teacher)
    page.click("text=Two controllers, none (lost fields)")
    expect(page.locator("[data-preset=two-none]")).to_have_class(re.compile(r"\bactive\b"))
    expect(page.locator("select[name=strategy]")).to_have_value("none")
    expect(page.locator("input[name=controllers]")).to_have_value("2")
    page.click("button:has-text('Launch')")
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    job_id = int(page.url.rstrip("/").rsplit("/", 1)[1])

    # The figures move while the job runs: writes climb, and erased fields show in red.
    page.wait_for_function("() => Number(document.querySelector('[data-counter=writes]').textContent) > 0")
    first = counter(page, "writes")
    page.wait_for_function(
        "(n) => Number(document.querySelector('[data-counter=writes]').textContent) > n + 20", arg=first
    )
    expect(page.locator('#live-figures [data-counter="lost_fields"].bad')).to_be_visible(timeout=15_000)
    expect(page.locator("#live-status .status")).to_have_text("running")

    # The Deployment as it is, a row per controller, and the log naming who erased whom.
    expect(page.locator("#live-state [data-deployment]")).to_contain_text("kind: Deployment")
    expect(page.locator("#live-state tr[data-controller]")).to_have_count(2)
    expect(page.locator("#live-state tr[data-controller='1']")).to_contain_text("status.observedGeneration")
    expect(page.locator("#live-state tr[data-controller='2']")).to_contain_text("spec.replicas")
    erased = page.locator("#live-log li.event-erased").first
    expect(erased).to_contain_text(re.compile(r"controller [AB]'s write v\d+ erased controller [AB]'s "))
    page.screenshot(path=str(artifacts / "controllers-erased.png"), full_page=True)

    # The verdict, once the ten seconds are up: the lost fields, counted exactly.
    verdict = page.locator("#live-status .verdict")
    expect(verdict).to_be_visible(timeout=30_000)
    expect(verdict).to_contain_text("acknowledged fields erased by another controller, counted exactly")
    job = Job.objects.get(pk=job_id)
    assert job.status == Job.Status.SUCCEEDED and job.summary is not None
    assert job.summary["lost_fields"] > 0 and job.invariant_ok is True
    expect(page.locator('#live-figures [data-counter="lost_fields"]')).to_have_text(str(job.summary["lost_fields"]))
