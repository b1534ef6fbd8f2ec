"""Presenter mode in Chromium: one screen at 1280x720 for each scenario, and the keys a teacher presses.

Each job here is short (a second or two of its scenario, not a preset's watchable run): what is
checked is the layout and the keys, not the race.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Browser, Page, expect

from occviz.jobs.models import Job
from occviz.jobs.runner import run_job
from occviz.jobs.tasks import create_job, launch
from occviz.lessons.models import Lesson, LessonRun
from tests.browser.conftest import ARTIFACTS
from tests.browser.test_web_browser import sign_in
from tests.test_lessons import STORY, ship

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SHOTS = ARTIFACTS / "presenter"

SHORT_JOBS: dict[str, dict[str, Any]] = {
    "counter": {"strategy": "occ", "writers": 4, "seconds": 1, "think_ms": 2},
    "leader-election": {"replicas": 3, "lease_duration": 1, "renew_deadline": 0.7, "retry_period": 0.2, "seconds": 2},
    "quota": {"pods": 12, "hard": 5, "workers": 3, "think_ms": 5, "create_failure_rate": 0.3, "resync_seconds": 1},
    "controllers": {"strategy": "none", "controllers": 2, "rate_per_s": 30, "think_ms": 5, "seconds": 1},
}

# Every element that shows (not hidden, not clipped away by a box it sits in) lies inside the window,
# and the document has nothing to scroll to.
OFF_SCREEN = """() => {
  const w = window.innerWidth, h = window.innerHeight, out = [];
  for (const el of document.body.querySelectorAll("*")) {
    const style = getComputedStyle(el);
    if (style.visibility === "hidden" || style.display === "none") continue;
    let r = el.getBoundingClientRect();
    if (r.width === 0 || r.height === 0) continue;
    let box = { left: r.left, top: r.top, right: r.right, bottom: r.bottom };
    for (let a = el.parentElement; a && a !== document.body; a = a.parentElement) {
      const s = getComputedStyle(a);
      if (s.overflow === "visible" && s.overflowX === "visible" && s.overflowY === "visible") continue;
      const c = a.getBoundingClientRect();
      box = { left: Math.max(box.left, c.left), top: Math.max(box.top, c.top),
              right: Math.min(box.right, c.right), bottom: Math.min(box.bottom, c.bottom) };
    }
    if (box.right - box.left < 1 || box.bottom - box.top < 1) continue;  // clipped away entirely
    if (box.right > w + 1 || box.bottom > h + 1 || box.left < -1 || box.top < -1) {
      const name = `${el.tagName.toLowerCase()}${el.id ? "#" + el.id : ""}.${el.className}`;
      out.push(`${name}: ${Math.round(box.right)}x${Math.round(box.bottom)}`);
    }
  }
  const doc = document.scrollingElement;
  if (doc.scrollHeight > h + 1 || doc.scrollWidth > w + 1) out.push(`document ${doc.scrollWidth}x${doc.scrollHeight}`);
  return out;
}"""


# What a class must see whole, neither off the screen nor cut by the box it sits in: with the caption, and the
# key moments' heading under it, or none of the key moments (at 1280x720 the Lease's state once left the caption
# a line short, and the quota's left the heading half shown).
KEY_PARTS = (
    "#live-status, #live-figures, #live-state pre, #live-state tr, #live-state p, .viz canvas,"
    " #captions .caption-now, #key-moments-title"
)

CUT = """(selector) => {
  const out = [];
  for (const el of document.querySelectorAll(selector)) {
    // not shown (nothing of it, or hidden on purpose)
    if (!el.getClientRects().length || !el.checkVisibility({ visibilityProperty: true })) continue;
    const r = el.getBoundingClientRect();
    let box = { left: 0, top: 0, right: window.innerWidth, bottom: window.innerHeight };
    for (let a = el.parentElement; a && a !== document.body; a = a.parentElement) {
      if (getComputedStyle(a).overflow === "visible") continue;
      const c = a.getBoundingClientRect();
      box = { left: Math.max(box.left, c.left), top: Math.max(box.top, c.top),
              right: Math.min(box.right, c.right), bottom: Math.min(box.bottom, c.bottom) };
    }
    if (r.left < box.left - 1 || r.top < box.top - 1 || r.right > box.right + 1 || r.bottom > box.bottom + 1) {
      out.push(`${el.tagName.toLowerCase()}${el.id ? "#" + el.id : ""} ${(el.textContent || "").slice(0, 40)}`);
    }
  }
  return out;
}"""


def shot(page: Page, name: str, *, full_page: bool = False) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    size = page.viewport_size or {"width": 0, "height": 0}
    page.screenshot(path=str(SHOTS / f"{size['width']}x{size['height']}-{name}.png"), full_page=full_page)


def assert_fits(page: Page, name: str) -> None:
    page.wait_for_timeout(300)  # a frame for the charts to take their size
    shot(page, name)
    assert page.evaluate(OFF_SCREEN) == []
    assert page.evaluate(CUT, KEY_PARTS) == []


@pytest.fixture
def presenter(chromium: Browser, app_url: str, teacher: User) -> Any:
    context = chromium.new_context(viewport={"width": 1280, "height": 720})
    context.set_default_timeout(20_000)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    sign_in(page, app_url, teacher)
    yield page
    context.close()
    assert errors == []


@pytest.mark.parametrize("scenario", list(SHORT_JOBS))
def test_presenter_mode_shows_a_job_and_its_replay_on_one_screen(
    presenter: Page, app_url: str, teacher: User, scenario: str
) -> None:
    page = presenter
    job = run_job(create_job(scenario, SHORT_JOBS[scenario], teacher).pk)
    assert job.status == "succeeded", job.error
    slug = scenario.replace("-", "_")

    # The normal page with A+ at 1280x720: the canvases' text grows with the page's.
    page.goto(f"{app_url}/jobs/{job.pk}/")
    page.wait_for_function("document.querySelector('[data-page=job]').dataset.lastSeq > 0")
    page.click("[data-large-type]")
    assert (
        page.evaluate(
            "getComputedStyle(document.querySelector('[data-timeline]')).getPropertyValue('--canvas-text')"
        ).strip()
        == "16"
    )
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    shot(page, f"{slug}-normal-large", full_page=True)
    page.click("[data-large-type]")

    # A student link made from the job page's panel: presenter mode shows its address and QR code whole.
    page.click("[data-make-link]")
    page.wait_for_selector("[data-student-url]")

    # The Present button: presenter mode (full screen where the browser allows it), one screen.
    page.click("[data-present]")
    expect(page.locator("body")).to_have_class(re.compile(r"\bpresenting\b"))
    assert "present=1" in page.url
    expect(page.locator(".topbar")).to_be_hidden()
    expect(page.locator("#live-figures")).to_be_visible()
    expect(page.locator("#live-state")).to_be_visible()
    expect(page.locator("[data-timeline]")).to_be_visible()
    expect(page.locator(".params-section")).to_be_hidden()
    expect(page.locator("#student-link")).to_be_hidden()
    assert_fits(page, f"{slug}-presenting")
    # The finished job's key moments have room under its caption, even on a projector's 720 lines.
    expect(page.locator("#captions .key-moments")).not_to_have_class(re.compile(r"\bunfit\b"))
    expect(page.locator("#key-moments li").first).to_be_visible()
    page.set_viewport_size({"width": 1400, "height": 900})
    assert_fits(page, f"{slug}-presenting")
    page.set_viewport_size({"width": 1280, "height": 720})
    # `s` shows the student link over the page, whole, for the class to scan; `s` again hides it.
    page.keyboard.press("s")
    expect(page.locator("#student-link [data-student-url]")).to_be_visible()
    expect(page.locator("#student-link svg")).to_be_visible()
    expect(page.locator("#student-link [data-make-link]")).to_be_hidden()
    assert page.evaluate(CUT, "#student-link svg, #student-link [data-student-url]") == []
    assert page.evaluate(OFF_SCREEN) == []
    shot(page, f"{slug}-student-link")
    page.keyboard.press("s")
    expect(page.locator("#student-link")).to_be_hidden()
    page.set_viewport_size({"width": 1280, "height": 720})

    # `?` lists the keys; Esc closes the list, and Esc again leaves presenter mode.
    page.keyboard.press("?")
    expect(page.locator("#presenter-keys")).to_be_visible()
    expect(page.locator("#presenter-keys")).to_contain_text("cut it off")
    page.keyboard.press("Escape")
    expect(page.locator("#presenter-keys")).to_be_hidden()
    page.keyboard.press("Escape")
    expect(page.locator("body")).not_to_have_class(re.compile(r"\bpresenting\b"))
    expect(page.locator(".topbar")).to_be_visible()
    assert page.evaluate("document.fullscreenElement") is None
    assert "present=1" not in page.url

    # Replay in presenter mode: one screen; the arrows step one event, space plays and pauses.
    page.goto(f"{app_url}/jobs/{job.pk}/replay/?present=1")
    page.wait_for_selector("[data-page=replay][data-ready='1']")
    assert_fits(page, f"{slug}-replay-presenting")
    moment = lambda: float(page.input_value("[data-scrub]"))  # noqa: E731
    page.keyboard.press("ArrowRight")
    first = moment()
    page.keyboard.press("ArrowRight")
    assert moment() > first > 0
    expect(page.locator("[data-page=replay]")).not_to_have_attribute("data-seq-shown", "0")
    page.keyboard.press("ArrowLeft")
    assert moment() == first
    page.keyboard.press(" ")
    expect(page.locator("[data-play]")).to_have_text("Pause")
    page.keyboard.press(" ")
    expect(page.locator("[data-play]")).to_have_text("Play")
    # With the Play button focused (clicked), space still toggles once, not the key and the button both
    # (slowly played, so that the end of the run does not stop it meanwhile).
    page.select_option("[data-speed]", "0.01")
    page.click("[data-play]")
    expect(page.locator("[data-play]")).to_have_text("Pause")
    page.keyboard.press(" ")
    page.wait_for_timeout(300)
    assert page.text_content("[data-play]") == "Play"

    # In a form field the keys are the field's: `?` shows nothing, space does not play.
    page.focus("[data-speed]")
    page.keyboard.press("?")
    expect(page.locator("#presenter-keys")).to_be_hidden()
    page.keyboard.press("Escape")
    expect(page.locator("body")).to_have_class(re.compile(r"\bpresenting\b"))


def test_keys_pause_select_kill_and_run_again_a_live_leader_election(
    presenter: Page, app_url: str, teacher: User
) -> None:
    page = presenter
    params = {"replicas": 3, "lease_duration": 1, "renew_deadline": 0.7, "retry_period": 0.2, "seconds": 10}
    job = launch("leader-election", params, teacher)  # queued for the db_worker: a live job
    # The normal page: the failure controls say who leads, right under the state that says it.
    page.goto(f"{app_url}/jobs/{job.pk}/")
    leading = page.locator("#live-state tr.leading")
    expect(leading).to_be_visible(timeout=15_000)
    leader = leading.get_attribute("data-replica")
    expect(page.locator("#actor-controls tr.leads")).to_have_attribute("data-actor-row", leader or "")
    expect(page.locator("#actor-controls tr.leads")).to_contain_text("★ leads")
    shot(page, "leader_election-live-normal", full_page=True)

    page.goto(f"{app_url}/jobs/{job.pk}/?present=1")
    expect(page.locator("#live-state tr.leading")).to_be_visible(timeout=15_000)
    assert_fits(page, "leader_election-live-presenting")

    # Space freezes the drawing while the events keep coming; space again catches up.
    page.keyboard.press(" ")
    expect(page.locator("body")).to_have_class(re.compile(r"\bfrozen\b"))
    frozen_at = int(page.get_attribute("[data-page=job]", "data-last-seq") or "0")
    page.wait_for_timeout(1200)
    assert int(page.get_attribute("[data-page=job]", "data-last-seq") or "0") == frozen_at
    assert Job.objects.get(pk=job.pk).last_seq > frozen_at, "the job ran on"
    page.keyboard.press(" ")
    expect(page.locator("body")).not_to_have_class(re.compile(r"\bfrozen\b"))
    page.wait_for_function(
        "(n) => Number(document.querySelector('[data-page=job]').dataset.lastSeq) > n", arg=frozen_at
    )

    # 1 selects replica-1, k kills it through the control endpoint; the page shows it dead, its buttons off.
    page.keyboard.press("1")
    expect(page.locator("[data-selected]")).to_have_text("selected: replica-1")
    expect(page.locator('#live-state tr[data-replica="1"]')).to_have_class(re.compile(r"\bselected\b"))
    page.keyboard.press("k")
    expect(page.locator("[data-presenter-note]")).to_have_text("Sent: kill replica-1.")
    expect(page.locator('#live-state tr[data-replica="1"]')).to_contain_text("killed", timeout=10_000)
    expect(page.locator('#actor-controls tr[data-actor-row="1"] button[data-control="kill"]')).to_be_disabled()
    assert job.controls.filter(action="kill", actor=1).exists()
    page.keyboard.press("k")
    expect(page.locator("[data-presenter-note]")).to_have_text("replica-1 is down.")

    # A key typed into a field is the field's; a control key does nothing there.
    page.evaluate("() => { const i = document.createElement('input'); i.id = 'typing'; document.body.prepend(i); }")
    page.focus("#typing")
    page.keyboard.press("2")
    page.keyboard.press("k")
    expect(page.locator("[data-selected]")).to_have_text("selected: replica-1")
    assert not job.controls.filter(actor=2).exists()
    page.evaluate("document.getElementById('typing').remove()")

    # r: the same parameters again, a new job, shown in presenter mode.
    page.keyboard.press("r")
    page.wait_for_url(lambda url: re.search(r"/jobs/\d+/\?present=1$", url) and f"/jobs/{job.pk}/" not in url)
    again = Job.objects.exclude(pk=job.pk).get()
    assert (again.scenario, again.params, again.created_by) == (job.scenario, job.params, teacher)
    expect(page.locator("body")).to_have_class(re.compile(r"\bpresenting\b"))
    again.request_cancel()


def test_a_lesson_step_presented_runs_its_job_in_presenter_mode(presenter: Page, app_url: str) -> None:
    page = presenter
    ship()
    step = Lesson.objects.get(slug=STORY).ordered_steps()[0]
    step.params = {"seconds": 1}  # the preset's watchable run is not what is checked here
    step.save(update_fields=["params"])
    page.goto(f"{app_url}/lessons/{STORY}/1/")
    page.click("[data-present]")  # the button, not the URL: what follows must stay in presenter mode
    expect(page.locator("body")).to_have_class(re.compile(r"\bpresenting\b"))
    expect(page.locator(".topbar")).to_be_hidden()
    expect(page.locator("[data-run-step]")).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    shot(page, "lesson-step-presenting")
    page.click("[data-run-step]")
    page.wait_for_url(re.compile(r"/jobs/\d+/\?present=1$"))
    expect(page.locator("body")).to_have_class(re.compile(r"\bpresenting\b"))
    expect(page.locator("[data-lesson-of-job]")).to_contain_text("step 1 of")
    expect(page.locator("#live-status .status")).to_have_text("succeeded", timeout=30_000)
    assert_fits(page, "lesson-job-presenting")
    first = int(page.url.split("/jobs/")[1].split("/")[0])

    # r runs the step again in the same lesson run, so that its runs can be compared.
    page.keyboard.press("r")
    page.wait_for_url(lambda url: re.search(r"/jobs/\d+/\?present=1$", url) and f"/jobs/{first}/" not in url)
    run = LessonRun.objects.get()
    assert sorted(found.job_id for found in run.jobs.all()) == sorted(Job.objects.values_list("pk", flat=True))
    assert {found.step_id for found in run.jobs.all()} == {step.pk}
    expect(page.locator("[data-lesson-of-job]")).to_contain_text(f"All of run #{run.pk}")
