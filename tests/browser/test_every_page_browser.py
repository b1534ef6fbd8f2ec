"""Every page a person looks at, of a finished and a running job of every scenario, as Chromium renders it.

The pages are those of tests/test_every_page.py (`PAGES`, the watch page of each object
a job uses, and the lesson pages); each is read once its scripts have drawn, and fails on `[object Object]` in the
text a person sees or on an uncaught script error.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from occviz.jobs.models import Event, Job
from occviz.jobs.tasks import create_job, run_job_task
from occviz.scenarios import SCENARIOS
from tests.browser.test_web_browser import job_status, sign_in
from tests.test_every_page import PAGES, STATES, JobSet, lesson_urls, watch_urls
from tests.test_lessons import ship

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _job_drawn(page: Page) -> None:
    page.wait_for_function("() => Number(document.querySelector('[data-page=job]').dataset.lastSeq) > 0")


def _replayed_to_the_end(page: Page) -> None:
    # The end of the run: the scenario's script has drawn its state as of the last event.
    page.wait_for_function("() => document.querySelector('[data-page=replay]').dataset.ready === '1'")
    scrub = page.locator("[data-scrub]")
    scrub.fill(scrub.get_attribute("max") or "0")
    page.wait_for_timeout(200)


def _polled(page: Page) -> None:
    page.wait_for_function("() => Number(document.querySelector('[data-page=watch]').dataset.polled) >= 1")


# How to tell a page's scripts have drawn it, by PAGES name; a page not named here is read once loaded
# (its deferred scripts have run by then).
SETTLED: dict[str, Callable[[Page], None]] = {"detail": _job_drawn, "replay": _replayed_to_the_end}


@pytest.fixture
def job_set(app_url: str) -> Iterator[JobSet]:
    made = JobSet()
    try:
        made = JobSet.start()
        yield made
    finally:
        made.stop()


def read(page: Page, url: str, settle: Callable[[Page], None] | None, errors: list[str]) -> list[str]:
    """What is wrong with the page once drawn: `[object Object]` in its text, script errors."""
    errors.clear()
    response = page.goto(url)
    found = [] if response is not None and response.ok else [f"{url}: {response.status if response else 'no answer'}"]
    if settle is not None:
        settle(page)
    if "[object Object]" in page.inner_text("body"):
        found.append(f"{url}: [object Object] in the page")
    found += [f"{url}: script error {error}" for error in errors]
    return found


def test_no_page_of_any_job_shows_object_object_or_a_script_error(
    page: Page, app_url: str, teacher: User, job_set: JobSet
) -> None:
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    sign_in(page, app_url, teacher)
    found: list[str] = []
    for scenario in SCENARIOS:
        for state in STATES:
            subject = job_set.subject(scenario, state)
            for shown in (p for p in PAGES if p.html):
                found += read(page, app_url + shown.url(subject), SETTLED.get(shown.name), errors)
            for url in watch_urls(subject.job):
                found += read(page, app_url + url, _polled, errors)
            if state == "finished":
                found += _rate_lines_missing(page, app_url, subject.job)
    assert found == []


def _rate_lines_missing(page: Page, app_url: str, job: Job) -> list[str]:
    """The finished job page's rate chart draws a line for every kind it charts that the job has events of.

    A kind whose events all fall in one bin (a quota race admits its pods in its first 100 ms) is a line
    across that bin: a lone point draws nothing.
    """
    charted = set(SCENARIOS[job.scenario].rates)
    if not charted:
        return []
    had = set(Event.objects.filter(job=job, kind__in=charted).values_list("kind", flat=True))
    page.goto(f"{app_url}/jobs/{job.pk}/")
    _job_drawn(page)
    page.wait_for_function("() => document.querySelector('canvas[data-rates]').dataset.lines !== undefined")
    lines = int(page.locator("canvas[data-rates]").get_attribute("data-lines") or 0)
    return [] if lines == len(had) else [f"job {job.pk} ({job.scenario}): {lines} rate lines for {sorted(had)}"]


def test_no_lesson_page_shows_object_object_or_a_script_error(page: Page, app_url: str, teacher: User) -> None:
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    ship()
    sign_in(page, app_url, teacher)
    assert [problem for url in lesson_urls() for problem in read(page, app_url + url, None, errors)] == []


def test_a_page_opened_while_its_job_is_queued_follows_it_running_and_links_its_objects(
    page: Page, app_url: str, teacher: User
) -> None:
    sign_in(page, app_url, teacher)
    job = create_job("counter", {"strategy": "occ", "writers": 2, "seconds": 3, "think_ms": 20}, teacher)
    page.goto(f"{app_url}/jobs/{job.pk}/")
    assert job_status(page) == "queued"
    objects = page.locator("#watched-objects")
    expect(objects).to_be_hidden()

    run_job_task.enqueue(job.pk)  # the served worker runs it
    expect(page.locator("#live-status .status")).to_have_text("running", timeout=15_000)
    assert Job.objects.get(pk=job.pk).status == "running"  # said while it runs, not only at its end
    expect(objects.locator("a[data-watch]")).to_have_text(f"counters job-{job.pk}/row-1")
    expect(page.locator("#live-status .status")).to_have_text("succeeded", timeout=15_000)
    expect(objects).to_be_visible()
