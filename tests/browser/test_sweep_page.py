"""A teacher launches a contention curve and watches it grow live, then follows a point to its job.

Against Daphne and a db_worker on the test database; the job page is saved under artifacts/ at
1400x900 and 1280x720 (the projector's sizes) to be looked at.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from occviz.jobs.models import Job
from tests.browser.test_web_browser import canvas_has_marks, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SIZES = ({"width": 1400, "height": 900}, {"width": 1280, "height": 720})


def chart(page: Page, key: str) -> str:
    return page.locator("[data-sweep-chart]").get_attribute(f"data-{key}") or ""


def test_the_curve_grows_live_and_each_point_links_its_job(
    page: Page, app_url: str, teacher: User, artifacts: Path
) -> None:
    page.set_viewport_size(SIZES[0])
    sign_in(page, app_url, teacher)
    page.click("text=Launch a contention curve")
    page.fill("input[name=strategies]", "occ atomic")
    page.fill("input[name=max_writers]", "8")
    page.fill("input[name=seconds]", "1")
    page.click("button:has-text('Launch')")
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    job_id = int(page.url.rstrip("/").rsplit("/", 1)[1])

    # Live: the first points are drawn while the next ones are measured.
    page.wait_for_function(
        "() => { const c = document.querySelector('[data-sweep-chart]'); return c && Number(c.dataset.points) >= 3; }",
        timeout=30_000,
    )
    assert chart(page, "series") == "occ,atomic,pgbench"
    assert chart(page, "levels") == "1,2,4,8"
    expect(page.locator("#live-state [data-sweep-running]")).to_contain_text("measuring")
    assert canvas_has_marks(page, "[data-sweep-chart]")
    page.screenshot(path=str(artifacts / "sweep-live-1400x900.png"))

    verdict = page.locator("#live-status .verdict")
    expect(verdict).to_contain_text("12 of 12 points measured", timeout=60_000)
    page.wait_for_function("() => document.querySelector('[data-sweep-chart]')?.dataset.points === '12'")
    for size in SIZES:
        page.set_viewport_size(size)
        page.wait_for_timeout(300)
        page.screenshot(path=str(artifacts / f"sweep-{size['width']}x{size['height']}.png"))
        page.screenshot(path=str(artifacts / f"sweep-{size['width']}x{size['height']}-full.png"), full_page=True)
    job = Job.objects.get(pk=job_id)
    assert job.status == "succeeded"
    points = (job.summary or {})["points"]
    assert page.locator("#live-state td[data-state=measured]").count() == len(points) == 12

    # Replay at the end draws the same curve from the stored snapshot.
    page.click("text=Replay")
    page.wait_for_function("() => document.querySelector('[data-page=replay]').dataset.ready === '1'")
    page.locator("[data-scrub]").fill(str(int(job.summary["duration_s"] * 1000) + 1000))  # type: ignore[index]
    page.wait_for_function("() => document.querySelector('[data-sweep-chart]')?.dataset.points === '12'")
    page.goto(f"{app_url}/jobs/{job_id}/")

    # A point of the chart is a link to its job: one that stands apart from the others, clicked on the chart itself.
    page.wait_for_function("() => document.querySelector('[data-sweep-chart]')?.dataset.points === '12'")
    where = page.evaluate(
        """() => {
            const c = document.querySelector('[data-sweep-chart]');
            const all = c.sweepPositions;
            const apart = (p) => Math.min(...all.filter((q) => q !== p).map((q) => Math.hypot(p.x - q.x, p.y - q.y)));
            const p = all.filter((found) => found.job).sort((a, b) => apart(b) - apart(a))[0];
            return { job: p.job, x: p.x, y: p.y, apart: apart(p), width: c.clientWidth };
        }"""
    )
    assert where["width"] > 600 and where["apart"] > 20
    page.locator("[data-sweep-chart]").click(position={"x": where["x"], "y": where["y"]})
    page.wait_for_url(f"{app_url}/jobs/{where['job']}/")
    expect(page.locator("[data-parent]")).to_have_text(f"job #{job_id}")
