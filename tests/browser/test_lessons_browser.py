"""A teacher walks a lesson in Chromium: step by step, running each step's job and coming back to the lesson.

Against Daphne and a db_worker on the test database, at a projector's sizes; the screenshots of each
page are saved under artifacts/lessons/ to be looked at.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Browser, Page, expect

from occviz.jobs.models import Job
from occviz.lessons.models import Lesson, LessonRun, Step
from tests.browser.conftest import ARTIFACTS, PASSWORD
from tests.browser.test_web_browser import sign_in
from tests.test_lessons import STORY, ship

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SHOTS = ARTIFACTS / "lessons"
STEPS_WALKED = 3


@pytest.fixture(params=[(1400, 900), (1280, 720)], ids=lambda size: f"{size[0]}x{size[1]}")
def sized_page(request: pytest.FixtureRequest, chromium: Browser) -> Iterator[Page]:
    width, height = request.param
    context = chromium.new_context(viewport={"width": width, "height": height})
    context.set_default_timeout(20_000)
    page = context.new_page()
    yield page
    context.close()


def shot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    size = page.viewport_size or {"width": 0, "height": 0}
    page.screenshot(path=str(SHOTS / f"{size['width']}x{size['height']}-{name}.png"))


def fits_the_width(page: Page) -> bool:
    return bool(page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"))


def test_a_teacher_walks_the_story_from_step_one_to_three_running_each_job(
    sized_page: Page, app_url: str, teacher: User
) -> None:
    page = sized_page
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    ship()  # the shipped lessons, in the database the servers read
    story = Lesson.objects.get(slug=STORY)
    steps = story.ordered_steps()
    # Each step's preset runs for seconds, long enough to watch; the walk only needs each job to run.
    for step in steps[:STEPS_WALKED]:
        step.params = {"seconds": 1}
        step.save(update_fields=["params"])
    sign_in(page, app_url, teacher)
    shot(page, "home")
    expect(page.locator("[data-lessons] [data-lesson] h2").first).to_have_text(story.title)

    page.click("nav >> text=Lessons")
    page.wait_for_url(f"{app_url}/lessons/")
    assert fits_the_width(page)
    shot(page, "lessons")
    page.click(f"[data-lesson={STORY}] h2 a")
    expect(page.locator(".lesson-steps li")).to_have_count(len(steps))
    shot(page, "lesson")
    page.click("text=Start at step 1")
    jobs: list[int] = []
    for number in range(1, STEPS_WALKED + 1):
        step = steps[number - 1]
        page.wait_for_url(re.compile(rf"/lessons/{STORY}/{number}/(\?run=\d+)?$"))
        expect(page.locator("h1")).to_have_text(f"{number}. {step.title}")
        expect(page.locator(".ask p")).to_have_text(step.ask)
        assert fits_the_width(page)
        # What the teacher reads aloud and the button to run it are on the first screen.
        for selector in (".say", ".ask", ".point-at", "[data-run-step]"):
            box = page.locator(selector).bounding_box()
            assert box is not None and box["y"] + box["height"] <= (page.viewport_size or {})["height"], selector
        shot(page, f"step-{number}")

        page.click("[data-run-step]")
        page.wait_for_url(re.compile(r"/jobs/\d+/$"))
        job_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
        jobs.append(job_id)
        expect(page.locator("[data-lesson-of-job]")).to_contain_text(f"step {number} of {len(steps)}")
        expect(page.locator("#live-status .status")).to_have_text("succeeded", timeout=60_000)
        shot(page, f"step-{number}-job")
        job = Job.objects.get(pk=job_id)
        assert (job.scenario, job.created_by) == (step.scenario, teacher)
        page.click("[data-next-step]")

    run = LessonRun.objects.get(started_by=teacher)
    assert [found.job_id for found in run.jobs.all()] == jobs
    page.wait_for_url(re.compile(rf"/lessons/{STORY}/{STEPS_WALKED + 1}/\?run={run.pk}$"))
    expect(page.locator("[data-run-step]")).to_be_visible()
    page.click(f"text=run #{run.pk}")
    for job_id in jobs:
        expect(page.locator(f"[data-page=lesson-run] a[href='/jobs/{job_id}/']")).to_be_visible()
    assert fits_the_width(page)
    shot(page, "run")

    # Step 1 run again in the same run: the two runs of it are compared side by side.
    page.goto(f"{app_url}/lessons/{STORY}/1/?run={run.pk}")
    page.click("[data-run-step]")
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    expect(page.locator("#live-status .status")).to_have_text("succeeded", timeout=60_000)
    page.click("[data-lesson-of-job] >> text=Back to the step")
    page.click("[data-compare-step]")
    page.wait_for_url(re.compile(r"/jobs/compare/\?ids=\d+,\d+$"))
    shot(page, "compare-step-1")
    assert errors == []


def test_staff_reorder_steps_in_the_admin_and_are_told_why_a_step_is_refused(
    chromium: Browser, app_url: str, database_url: str
) -> None:
    ship()
    User.objects.create_superuser("editor", password=PASSWORD)
    lesson = Lesson.objects.get(slug="quota-race")
    first, second, third = lesson.ordered_steps()
    context = chromium.new_context(viewport={"width": 1400, "height": 900})
    context.set_default_timeout(20_000)
    page = context.new_page()
    page.goto(f"{app_url}/accounts/login/?next=/admin/")
    page.fill("input[name=username]", "editor")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{app_url}/admin/")

    change = f"{app_url}/admin/lessons/lesson/{lesson.pk}/change/"
    page.goto(change)
    page.fill("#id_steps-0-order", "99")
    page.click("input[name=_save]")
    page.wait_for_url(f"{app_url}/admin/lessons/lesson/")
    assert [step.pk for step in lesson.ordered_steps()] == [second.pk, third.pk, first.pk]

    page.goto(change)
    page.fill("#id_steps-0-params", '{"hard": 10000000}')  # now the second step: the first by order
    page.click("input[name=_save]")
    error = page.locator(".errorlist").filter(has_text="hard:")
    expect(error).to_contain_text("hard: Ensure this value is less than or equal to")
    error.scroll_into_view_if_needed()
    shot(page, "admin-refused")
    assert Step.objects.get(pk=second.pk).params == {}
    context.close()
