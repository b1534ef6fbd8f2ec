"""A class joins a job from a student link, in Chromium: a second browser context with no session.

Against Daphne and a db_worker on the test database. The teacher makes the link on the job page,
a student opens it at a phone's size, picks a nickname, follows the race live with no control in
sight and presses +1 in a `none` race; the teacher's page then names the student for the updates
their blind writes erased. The link revoked, altered or expired is refused. Screenshots go to
artifacts/students/ to be looked at.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from playwright.sync_api import Browser, Page, expect

from occviz.jobs.models import Job
from occviz.jobs.tasks import launch
from occviz.students.models import StudentLink
from tests.browser.conftest import ARTIFACTS
from tests.browser.test_web_browser import sign_in

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SHOTS = ARTIFACTS / "students"
SIZES = ((1400, 900), (1280, 720))
PHONE = {"width": 390, "height": 844}
# Blind writers with think time: a student's press (half that think) lands among their commits.
RACE = {"strategy": "none", "writers": 2, "increments": None, "seconds": 9, "think_ms": 40}


def shot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    size = page.viewport_size or {"width": 0, "height": 0}
    page.screenshot(path=str(SHOTS / f"{size['width']}x{size['height']}-{name}.png"))


def fits_the_width(page: Page) -> bool:
    return bool(page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"))


def test_a_student_follows_a_none_race_from_a_link_presses_and_is_named_for_what_they_erased(
    page: Page, chromium: Browser, app_url: str, teacher: User
) -> None:
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    sign_in(page, app_url, teacher)
    job = launch("counter", RACE, teacher)

    # The teacher makes the link on the job page: its URL and QR code in the panel presenter mode enlarges.
    page.goto(f"{app_url}/jobs/{job.pk}/")
    page.click("#student-link [data-make-link]")
    page.wait_for_url(re.compile(rf"/jobs/{job.pk}/#student-link$"))
    url = page.locator("#student-link [data-student-url]").inner_text().strip()
    assert url.startswith(f"{app_url}/s/")
    expect(page.locator("#student-link svg.student-link-qr")).to_be_visible()
    for width, height in SIZES:
        page.set_viewport_size({"width": width, "height": height})
        page.locator("#student-link").scroll_into_view_if_needed()
        assert fits_the_width(page)
        shot(page, "teacher-link-panel")

    # The student: another browser, no session, a phone.
    student_context = chromium.new_context(viewport=PHONE)
    student_context.set_default_timeout(20_000)
    student = student_context.new_page()
    student.on("pageerror", lambda error: errors.append(str(error)))
    student.goto(url)
    shot(student, "student-join")
    student.fill("#nickname", "<b>Ada</b>")
    student.click("button[type=submit]")
    expect(student.locator("[data-join-error]")).to_contain_text("markup")
    student.fill("#nickname", "Ada")
    student.click("button[type=submit]")
    expect(student.locator("[data-nickname]")).to_have_text("Ada")
    assert not [c for c in student_context.cookies() if c["name"] == "sessionid"]

    # It follows the job live, read-only: no control, no navigation, nothing of the site.
    expect(student.locator("#live-status .status")).to_have_text("running", timeout=30_000)
    student.wait_for_function("Number(document.querySelector('[data-page]').dataset.lastSeq || 0) > 20")
    for absent in ("[data-cancel]", "[data-control]", "#actor-controls", "#controls", "nav", "a[href*='/admin/']"):
        assert student.locator(absent).count() == 0, absent
    assert student.locator("a[href^='/jobs/'], a[href^='/lessons/']").count() == 0
    assert fits_the_width(student)
    shot(student, "student-live")

    # Everyone press +1 now: a press every quarter second, within the rate, over the page's open socket.
    posts: list[str] = []
    student.on("request", lambda request: posts.append(request.url) if request.method == "POST" else None)
    said: list[str] = []
    for _ in range(16):
        if Job.objects.get(pk=job.pk).is_finished:
            break
        student.click("[data-plus-one]")
        student.wait_for_timeout(250)
        said.append(student.locator("[data-press-result]").inner_text())
    assert any("+1 written blindly" in sentence for sentence in said), said
    assert posts == [], "a press went as a POST while the page's socket was open"
    for width, height in SIZES:
        student.set_viewport_size({"width": width, "height": height})
        assert fits_the_width(student)
        shot(student, "student-live")
    student.set_viewport_size(PHONE)

    # The race ends: the student's page says so, its button goes quiet; the teacher's names the student.
    expect(student.locator("#live-status .verdict")).to_be_visible(timeout=30_000)
    expect(student.locator("[data-plus-one]")).to_be_disabled()
    shot(student, "student-finished")
    page.goto(f"{app_url}/jobs/{job.pk}/")
    verdict = page.locator("#live-status .verdict")
    expect(verdict).to_be_visible()
    finished = Job.objects.get(pk=job.pk)
    assert finished.summary["lost_to_outside_blind_writes"] > 0, finished.summary["invariant"]
    expect(verdict).to_contain_text("by student: Ada")
    assert finished.summary["invariant_ok"], finished.summary["invariant"]

    # The teacher revokes the link on the page: the student's next look is refused, and so is an altered token.
    page.locator("#student-link").scroll_into_view_if_needed()
    page.click("#student-link [data-revoke-link]")
    expect(page.locator("#student-link [data-student-url]")).to_have_count(0)
    refused = student.goto(url)
    assert refused is not None and refused.status == 410
    expect(student.locator("h1")).to_have_text("Link revoked")
    shot(student, "student-refused")
    tampered = student.goto(url.rstrip("/")[:-3] + "xyz/")
    assert tampered is not None and tampered.status == 403
    expect(student.locator("h1")).to_have_text("Not a student link")
    student_context.close()
    assert errors == []


def test_an_expired_link_is_refused_in_a_browser_with_no_session(
    chromium: Browser, app_url: str, teacher: User
) -> None:
    job = launch("counter", {**RACE, "seconds": 1}, teacher)
    link = StudentLink.make(job, teacher, 5)
    StudentLink.objects.filter(pk=link.pk).update(expires=timezone.now() - timedelta(minutes=1))
    from occviz.students.tokens import token_for

    context = chromium.new_context(viewport=PHONE)
    page = context.new_page()
    response = page.goto(f"{app_url}/s/{token_for(link)}/")
    assert response is not None and response.status == 410
    expect(page.locator("h1")).to_have_text("Link expired")
    assert page.locator("[data-page], #nickname").count() == 0
    context.close()
