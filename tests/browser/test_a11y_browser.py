"""Accessibility and slides out, in Chromium: axe-core on every kind of page, charts as PNG and SVG, the printed report.

One site is made for the module (a finished and a running job of every scenario, the shipped
lessons, a stored counter, Daphne and a db_worker) and every check reads it; what a check
changes, it changes through the browser, as a person would. `PAGES` is the list of pages
axe-core checks, each a builder that brings the browser to the page: a new page is one line there.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from axe_playwright_python.sync_playwright import Axe
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import override_settings
from playwright.sync_api import Browser, Page, expect

from occviz.jobs.models import Job
from occviz.lessons.models import Lesson
from occviz.scenarios import SCENARIOS
from occviz.store.models import Counter
from occviz.students.models import StudentLink
from occviz.students.tokens import token_for
from tests.browser.conftest import ARTIFACTS, PASSWORD
from tests.servers import child_database_url, served_app
from tests.test_every_page import JobSet
from tests.test_lessons import ship

# django_db: the test database is set up for these tests too (the site's rows are made outside their transactions).
pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db]

AXE = Axe()
SCREENS = ((1400, 900), (1280, 720))
REPORTED = ("serious", "critical")


@dataclass
class Site:
    """What the pages are made of: the served app, its jobs, a signed-in staff user's browser page."""

    url: str
    jobs: JobSet
    page: Page
    lesson: str
    """A shipped lesson's slug."""
    counter: int
    """A stored counter's primary key (for the admin's change form)."""
    student_link: str
    """A student link to the running counter race, as the teacher makes it."""

    def job(self, scenario: str, state: str) -> Job:
        return self.jobs.subject(scenario, state).job

    def goto(self, path: str) -> None:
        response = self.page.goto(self.url + path)
        assert response is not None and response.status < 500, f"{path}: {response and response.status}"


@pytest.fixture(scope="module")
def site(
    django_db_setup: None, django_db_blocker: Any, chromium: Browser, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Site]:
    # Outside the tests' transactions (the jobs' threads and the servers write for real), flushed at the end.
    in_memory = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    with django_db_blocker.unblock(), override_settings(CHANNEL_LAYERS=in_memory):
        jobs = JobSet()
        context = None
        try:
            user = User.objects.create_superuser("a11y-teacher", password=PASSWORD)
            ship()
            lesson = Lesson.objects.order_by("pk").values_list("slug", flat=True)[0]
            counter = Counter.objects.create(name="a11y-shared", value=1).pk
            jobs = JobSet.start()
            student = f"/s/{token_for(StudentLink.make(jobs.subject('counter', 'running').job, user))}/"
            with served_app(child_database_url(), tmp_path_factory.mktemp("a11y")) as url:
                context = chromium.new_context(viewport={"width": 1400, "height": 900})
                context.set_default_timeout(20_000)
                page = context.new_page()
                page.goto(f"{url}/accounts/login/")
                page.fill("input[name=username]", user.get_username())
                page.fill("input[name=password]", PASSWORD)
                page.click("button[type=submit]")
                page.wait_for_url(f"{url}/")
                yield Site(url, jobs, page, lesson, counter, student)
        finally:
            if context is not None:
                context.close()
            jobs.stop()
            call_command("flush", interactive=False, verbosity=0)


# -- the pages ---------------------------------------------------------------------------------------


def drawn(page: Page) -> None:
    """The job page's charts have drawn the events read so far (and their text alternatives exist)."""
    page.wait_for_function("() => Number(document.querySelector('[data-page=job]').dataset.lastSeq) > 0")
    page.wait_for_selector("[data-chart-text] table", state="attached")


def job_page(scenario: str, state: str) -> Callable[[Site], None]:
    def build(site: Site) -> None:
        site.goto(f"/jobs/{site.job(scenario, state).pk}/")
        drawn(site.page)

    return build


def replay_of(scenario: str) -> Callable[[Site], None]:
    def build(site: Site) -> None:
        site.goto(f"/jobs/{site.job(scenario, 'finished').pk}/replay/")
        site.page.wait_for_function("() => document.querySelector('[data-page=replay]').dataset.ready === '1'")

    return build


replay = replay_of("leader-election")


def compare(site: Site) -> None:
    ids = [site.job(scenario, "finished").pk for scenario in ("counter", "quota")]
    site.goto(f"/jobs/compare/?id={ids[0]}&id={ids[1]}")
    expect(site.page.locator("[data-chart-out]")).to_have_count(2)


def path(url: str) -> Callable[[Site], None]:
    return lambda site: site.goto(url)


def lesson_step(site: Site) -> None:
    site.goto(f"/lessons/{site.lesson}/1/")


def admin_change_form(site: Site) -> None:
    site.goto(f"/admin/store/counter/{site.counter}/change/")


def save(page: Page) -> int:
    with page.expect_response(lambda r: r.request.method == "POST") as response:
        page.click("input[name=_save]")
    page.wait_for_load_state()
    return response.value.status


def admin_conflict(site: Site) -> None:
    """The change form saved on a version another tab saved meanwhile: the 409 conflict page."""
    admin_change_form(site)
    other = site.page.context.new_page()
    try:
        other.goto(site.page.url)
        other.fill("input[name=value]", str(int(other.input_value("input[name=value]")) + 1))
        assert save(other) == 302
    finally:
        other.close()
    site.page.fill("input[name=value]", "99")
    assert save(site.page) == 409


def student_join(site: Site) -> None:
    site.goto(site.student_link)
    expect(site.page.locator("#nickname")).to_be_visible()


def student_page(site: Site) -> None:
    """A student's page once joined: the job followed live, the +1 button."""
    student_join(site)
    site.page.fill("#nickname", "axe")
    site.page.click("button[type=submit]")
    expect(site.page.locator("[data-plus-one]")).to_be_visible()
    drawn(site.page)


PAGES: dict[str, Callable[[Site], None]] = {
    "home": path("/"),
    **{f"launch form {name}": path(f"/jobs/new/{name}/") for name in SCENARIOS},
    **{f"{state} job {name}": job_page(name, state) for name in SCENARIOS for state in ("finished", "running")},
    "replay": replay,
    "replay step": replay_of("step"),
    "compare": compare,
    "anomalies table": path("/anomalies/"),
    "lessons": path("/lessons/"),
    "lesson step": lesson_step,
    "admin change form": admin_change_form,
    "admin conflict page": admin_conflict,
    "student join page": student_join,
    "student page": student_page,
}


def serious(results: dict[str, Any]) -> list[str]:
    """axe-core's serious and critical violations, one line each: rule, what it says, where."""
    return [
        f"{v['id']} ({v['impact']}): {v['help']} at {[(n['target'], n['html'][:160]) for n in v['nodes']][:4]}"
        for v in results["violations"]
        if v["impact"] in REPORTED
    ]


@pytest.mark.parametrize("name", PAGES)
def test_axe_finds_no_serious_or_critical_violation(site: Site, name: str) -> None:
    PAGES[name](site)
    assert serious(AXE.run(site.page).response) == []


# -- slides out --------------------------------------------------------------------------------------


def test_every_chart_downloads_as_png_and_as_vector_svg_from_the_keyboard(site: Site) -> None:
    job = site.job("quota", "finished")
    job_page("quota", "finished")(site)
    page = site.page
    charts = page.locator("[data-chart-out]")
    expect(charts).to_have_count(3)  # the quota chart, the timeline, the rates
    names = set()
    for i in range(charts.count()):
        name = charts.nth(i).get_attribute("data-chart-out")
        names.add(name)
        for fmt in ("png", "svg"):
            button = charts.nth(i).locator(f"[data-download={fmt}]")
            button.focus()
            with page.expect_download() as download:
                page.keyboard.press("Enter")
            assert download.value.suggested_filename == f"occviz-job-{job.pk}-{name}.{fmt}"
            saved = Path(download.value.path())
            data = saved.read_bytes()
            if fmt == "png":
                assert data.startswith(b"\x89PNG\r\n\x1a\n")
                continue
            svg = ET.fromstring(data)
            tags = [element.tag.split("}")[1] for element in svg.iter()]
            assert "image" not in tags  # drawn in vectors, not pixels wrapped in SVG
            assert tags.count("path") + tags.count("rect") > 5
            texts = [element.text for element in svg.iter() if element.tag.endswith("text")]
            ARTIFACTS.mkdir(exist_ok=True)
            (ARTIFACTS / f"chart-{name}.svg").write_bytes(data)
            if name == "timeline":  # the lanes are named in the drawing as in the table that describes it
                assert set(page.locator("[data-chart-text] tbody th").all_inner_texts()) <= set(texts)
            if name == "quota":
                assert "used (charged)" in texts
    assert names == {"quota", "timeline", "rates"}
    for width, height in SCREENS:
        page.set_viewport_size({"width": width, "height": height})
        page.wait_for_timeout(200)  # the charts redraw at the new width
        page.evaluate("() => window.scrollTo(0, 0)")
        page.screenshot(path=str(ARTIFACTS / f"job-top-{width}x{height}.png"))
        charts.nth(1).scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / f"job-charts-out-{width}x{height}.png"))
        assert page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth")
    page.set_viewport_size({"width": 1400, "height": 900})


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_printed_report_of_a_finished_job_is_one_a4_page(site: Site, scenario: str) -> None:
    job_page(scenario, "finished")(site)
    page = site.page
    expect(page.locator("[data-print-report]")).to_be_visible()
    pdf = page.pdf(format="A4", print_background=True)
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / f"report-{scenario}.pdf").write_bytes(pdf)
    assert page.locator(".print-copy").count() == 0  # drawn for printing, removed after
    assert b"/Subtype /Image" not in pdf  # the charts printed in vectors at the sheet's width, not as pixels
    page.evaluate("() => window.dispatchEvent(new Event('beforeprint'))")  # as page.pdf does
    page.emulate_media(media="print")
    try:
        # The sheet's printable width (A4 less print.css's margins), as the PDF lays it out.
        page.set_viewport_size({"width": 703, "height": 1046})
        page.screenshot(path=str(ARTIFACTS / f"report-{scenario}.png"), full_page=True)
        assert len(re.findall(rb"/Type\s*/Page\b", pdf)) == 1
        assert page.locator("#live-status .verdict").is_visible()
        assert page.locator("canvas[data-timeline] + .print-copy").is_visible()
        assert page.locator(".params").is_visible()
        # The key sentences: the key moments (the verdict at least, on a finished job), not the whole log.
        assert page.locator("#key-moments li").first.is_visible()
        assert not page.locator("#live-log").is_visible()
        assert not page.locator(".topbar").is_visible()
    finally:
        page.emulate_media(media="null")  # back to none: page.pdf prints with print media only then
        page.evaluate("() => window.dispatchEvent(new Event('afterprint'))")
        page.set_viewport_size({"width": 1400, "height": 900})


# -- the keyboard ------------------------------------------------------------------------------------

FOCUSABLE = "a[href], button:not([disabled]), input:not([type=hidden]):not([disabled]), select, [tabindex='0']"
# The focused element, and whether it shows a focus ring (an outline at least 2 px wide).
FOCUSED = """() => {
  const e = document.activeElement, style = getComputedStyle(e);
  return [e.dataset.tabbed, style.outlineStyle !== "none" && parseFloat(style.outlineWidth) >= 2];
}"""


@pytest.mark.parametrize("build", [job_page("quota", "finished"), replay, compare], ids=["job", "replay", "compare"])
def test_tab_reaches_every_control_with_a_visible_focus_ring(site: Site, build: Callable[[Site], None]) -> None:
    build(site)
    page = site.page
    page.wait_for_load_state("networkidle")  # a finished job's controls are asked for again once its events are read
    count = page.evaluate(
        f"() => [...document.querySelectorAll({FOCUSABLE!r})].filter(e => e.checkVisibility())"
        ".map((e, i) => e.dataset.tabbed = String(i)).length"
    )
    page.evaluate("() => document.activeElement.blur()")
    reached: dict[str, bool] = {}
    for _ in range(count + 5):
        page.keyboard.press("Tab")
        tabbed, ringed = page.evaluate(FOCUSED)
        if tabbed is not None:
            reached[tabbed] = ringed
    missed = page.evaluate(
        "(reached) => [...document.querySelectorAll('[data-tabbed]')].filter(e => !reached.includes(e.dataset.tabbed))"
        ".map(e => e.outerHTML.slice(0, 120))",
        list(reached),
    )
    assert missed == []
    assert [tabbed for tabbed, ringed in reached.items() if not ringed] == []
    for width, height in SCREENS:
        page.set_viewport_size({"width": width, "height": height})
        page.wait_for_timeout(200)
        page.screenshot(path=str(ARTIFACTS / f"tabbed-{page.url.split('/')[-2] or 'page'}-{width}x{height}.png"))
    page.set_viewport_size({"width": 1400, "height": 900})


# -- text alternatives and announcements -------------------------------------------------------------


def test_the_timeline_has_a_table_of_counts_per_actor_that_follows_the_job(site: Site) -> None:
    job = site.job("counter", "running")
    job_page("counter", "running")(site)
    page = site.page
    timeline = page.locator("canvas[data-timeline]")
    described = timeline.get_attribute("aria-describedby")
    table = page.locator(f"#{described} table")
    expect(table.locator("tbody tr")).to_have_count(job.params["writers"])

    def total() -> int:
        return sum(int(cell) for cell in table.locator("tbody td").all_inner_texts())

    first = total()
    counted = "([id, before]) => [...document.querySelectorAll(`#${id} tbody td`)]"
    page.wait_for_function(
        counted + ".reduce((n, td) => n + Number(td.textContent), 0) > before", arg=[described, first]
    )
    rates = page.locator(f"#{page.locator('canvas[data-rates]').get_attribute('aria-describedby')}")
    expect(rates).to_contain_text("per second")


def test_the_verdict_is_announced_when_a_job_ends(site: Site) -> None:
    page = site.page
    site.goto("/jobs/new/counter/")
    for name, value in {"strategy": "occ", "writers": "2", "seconds": "2", "think_ms": "20"}.items():
        field = page.locator(f"[name={name}]")
        if field.evaluate("e => e.tagName") == "SELECT":
            field.select_option(value)
        else:
            field.fill(value)
    page.locator("#launch-form [type=submit]").click()
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    announce = page.locator("[data-announce]")
    expect(announce).to_have_attribute("aria-live", "polite")
    expect(announce).to_contain_text("Invariant holds", timeout=20_000)


def test_a_failover_is_announced_as_it_happens(site: Site) -> None:
    """Last: it kills the running leader election's leader (the job runs on, another replica leads)."""
    job_page("leader-election", "running")(site)
    page = site.page
    leader = page.locator("#live-state tr.leading").first.get_attribute("data-replica")
    page.click(f'#actor-controls tr[data-actor-row="{leader}"] button[data-control="kill"]')
    expect(page.locator("[data-announce]")).to_contain_text("acquired the lease", timeout=20_000)
    expect(page.locator("[data-announce]")).not_to_contain_text(f"replica-{leader} acquired")
