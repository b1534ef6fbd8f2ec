"""A teacher moves the writers of a running counter race further from the database, and draws a curve over latency.

Against Daphne and a db_worker on the test database: the job page's latency control, typed
and applied as a person would, reaches the running job (its event, its writers' round
trips); a sweep over latency draws its chart with the latencies as its x-axis.
"""

from __future__ import annotations

import re
import statistics
import time

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from occviz.jobs.models import Event, Job
from occviz.jobs.tasks import launch
from tests.browser.test_web_browser import canvas_has_marks, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_the_latency_control_slows_a_running_race(page: Page, app_url: str, teacher: User) -> None:
    job = launch("counter", {"strategy": "atomic", "writers": 2, "seconds": 6, "latency_ms": "1"}, teacher)
    sign_in(page, app_url, teacher)
    page.goto(f"{app_url}/jobs/{job.pk}/")
    value = page.locator("#actor-controls input[name=ms]")
    expect(value).to_be_visible(timeout=30_000)
    expect(page.locator("#actor-controls table.control-rows")).to_have_count(0)  # no per-writer buttons
    deadline = time.monotonic() + 30
    while not Event.objects.filter(job=job, kind="committed").exists():  # running, not queued any more
        assert time.monotonic() < deadline, "the job did not start"
        time.sleep(0.05)
    value.fill("30")
    page.click("#actor-controls button[data-control=latency]")
    expect(page.locator("[data-control-note]")).to_have_text("Sent: latency 30 ms.")
    expect(page.locator("#live-status .verdict")).to_be_visible(timeout=30_000)
    changed = Event.objects.get(job=job, kind="latency_changed")
    commits = Event.objects.filter(job=job, kind="committed")
    before = [e.duration_ms for e in commits.filter(seq__lt=changed.seq)]
    after = [e.duration_ms for e in commits.filter(seq__gt=changed.seq)]
    # Two round trips a commit, each 30 ms longer now. A busy machine lengthens every commit, before and after
    # alike, so no upper bound: the commits after are slower than those before by the two round trips.
    assert before and after and statistics.median(after) > 55, after
    assert statistics.median(after) - statistics.median(before) > 50, (before, after)
    assert (Job.objects.get(pk=job.pk).summary or {})["network"]["latency_ms"] == 30.0


def test_a_curve_over_latency_has_the_latencies_as_its_x_axis(page: Page, app_url: str, teacher: User) -> None:
    sign_in(page, app_url, teacher)
    page.click("text=Launch a contention curve")
    page.fill("input[name=strategies]", "occ")
    page.select_option("select[name=axis]", "latency")
    page.fill("input[name=max_writers]", "2")
    page.fill("input[name=max_latency_ms]", "8")
    page.fill("input[name=seconds]", "1")
    page.select_option("select[name=pgbench]", "off")
    page.click("button:has-text('Launch')")
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    expect(page.locator("#live-status .verdict")).to_contain_text("5 of 5 points measured", timeout=60_000)
    page.wait_for_function("() => document.querySelector('[data-sweep-chart]')?.dataset.points === '5'")
    assert page.locator("[data-sweep-chart]").get_attribute("data-levels") == "0,1,2,4,8"
    assert canvas_has_marks(page, "[data-sweep-chart]")
    expect(page.locator(".sweep-points thead th").first).to_have_text("latency (ms)")
