"""A teacher steps transactions by hand on the job page: clicks, keys, a lock wait, and the replay of it all.

The job runs on the real database through a real db_worker; every step is the job's `step`
control, posted from the page as a person would (a click on a transaction's column, or
`1`-`4` then space). What the page shows after each step is then read again from the replay's
fragments, rendered from the stored events alone, and must be the same.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from occviz.jobs.models import Job
from tests.browser.test_web_browser import sign_in

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SCREENS = ((1400, 900), (1280, 720))

# What the page shows of the rows: as committed, and as each transaction sees them.
SHOWN_ROWS = """(root) => {
  const text = (el) => (el ? el.textContent.replace(/\\s+/g, " ").trim() : "");
  const state = root.querySelector("[data-step-state]");
  if (!state) return null;
  return {
    committed: text(state.querySelector("[data-committed] tbody")),
    seen: [...state.querySelectorAll("[data-seen]")].map(text),
  };
}"""


def launch(page: Page, app_url: str, script: str) -> int:
    """The launch form, a built-in script chosen from its list by hand, stepped by hand: the job's id."""
    page.goto(f"{app_url}/jobs/new/step/")
    item = page.locator(f"[data-step-builtin='{script}']")
    item.locator("summary").click()
    expect(item.locator("[data-step-text]")).to_be_visible()
    item.locator("[data-step-use]").click()
    expect(page.locator("select[name=script]")).to_have_value(script)
    expect(page.locator("select[name=pace]")).to_have_value("by hand")
    page.click("button:has-text('Launch')")
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    expect(page.locator("#live-state th[data-step-lane]")).to_have_count(2, timeout=30_000)
    expect(page.locator("#live-state td[data-next]")).to_have_count(2, timeout=20_000)
    return int(page.url.rstrip("/").rsplit("/", 1)[1])


def cell(page: Page, position: int) -> Any:
    return page.locator(f"#live-state td[data-position='{position}']")


def by_click(page: Page, actor: int) -> None:
    page.locator(f"#live-state td[data-step-lane='{actor}'][data-next]").click()


def by_keys(page: Page, actor: int) -> None:
    page.keyboard.press(str(actor))
    page.keyboard.press(" ")


def shown(page: Page) -> dict[str, Any]:
    return page.locator("#live-state").evaluate(SHOWN_ROWS)


def take(page: Page, how: Any, actor: int, position: int, outcome: str = "ok") -> dict[str, Any]:
    """Step `actor` (its next step is line `position` of the script) and wait for its outcome: the rows shown."""
    expect(cell(page, position)).to_have_attribute("data-next", "")
    how(page, actor)
    expect(cell(page, position)).to_have_attribute("data-outcome", outcome)
    return shown(page)


def screenshots(page: Page, artifacts: Path, name: str) -> None:
    for width, height in SCREENS:
        page.set_viewport_size({"width": width, "height": height})
        page.locator("#live-state").scroll_into_view_if_needed()
        page.screenshot(path=str(artifacts / f"step-{name}-{width}x{height}.png"))
    page.set_viewport_size({"width": 1400, "height": 1000})


def replayed(page: Page, app_url: str, job_id: int, last_seq: int) -> list[dict[str, Any]]:
    """The rows shown after each stored event, as the replay's fragments render them (from the events alone)."""
    found = []
    for seq in range(1, last_seq + 1):
        html = page.request.get(f"{app_url}/jobs/{job_id}/fragments/?seq={seq}").text()
        found.append(
            page.evaluate(
                f"""(html) => {{
                  const box = document.createElement("div");
                  box.innerHTML = html;
                  return ({SHOWN_ROWS})(box);
                }}""",
                html,
            )
        )
    return found


def distinct(views: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each view once, in order: a change of what is shown, not an event that changed nothing."""
    kept: list[dict[str, Any]] = []
    for view in views:
        if view is not None and view["committed"] != "no rows yet" and (not kept or kept[-1] != view):
            kept.append(view)
    return kept


def test_a_lost_update_stepped_by_clicks_and_keys_loses_it_and_replays_the_same(
    page: Page, app_url: str, teacher: User, artifacts: Path
) -> None:
    sign_in(page, app_url, teacher)
    job_id = launch(page, app_url, "lost-update")
    expect(page.locator("[data-question]")).to_contain_text("is row 1 at 12?")
    expect(page.locator("[data-step-note]")).to_contain_text("to choose a transaction and space")
    views = [shown(page)]

    # T1 and T2 begin and read row 1 at 10, by clicks on their columns.
    views.append(take(page, by_click, 1, 0))
    views.append(take(page, by_click, 2, 1))
    views.append(take(page, by_click, 1, 2))
    views.append(take(page, by_click, 2, 3))
    expect(page.locator("#live-state [data-seen='1']")).to_contain_text("10")
    screenshots(page, artifacts, "lost-update-read")

    # Then by keys: each writes 11 and commits.
    views.append(take(page, by_keys, 1, 4))
    views.append(take(page, by_keys, 1, 5))
    expect(page.locator("#live-state [data-committed] tr[data-row='1']")).to_contain_text("11")
    views.append(take(page, by_keys, 2, 6))
    views.append(take(page, by_keys, 2, 7))

    # The final rows show the lost update: two increments from 10, row 1 at 11; the job ends by itself.
    committed = page.locator("#live-state [data-committed] tr[data-row='1']")
    expect(committed).to_contain_text("11")
    expect(page.locator('#live-figures [data-counter="lost_updates"]')).to_have_text("1")
    expect(page.locator("#live-status .verdict")).to_be_visible(timeout=20_000)
    expect(page.locator("#live-state td[data-next]")).to_have_count(0)
    screenshots(page, artifacts, "lost-update-end")
    job = Job.objects.get(pk=job_id)
    assert job.summary is not None and job.summary["final"]["1"] == 11
    assert [(step["actor"], step["outcome"]) for step in job.summary["steps"]] == [
        ("T1", "ok"),
        ("T2", "ok"),
        ("T1", "ok"),
        ("T2", "ok"),
        ("T1", "ok"),
        ("T1", "ok"),
        ("T2", "ok"),
        ("T2", "ok"),
    ]

    # The replay, from the stored events alone, shows the same rows after every step, in the same order.
    again = distinct(replayed(page, app_url, job_id, job.last_seq))
    assert again == distinct(views)
    page.goto(f"{app_url}/jobs/{job_id}/replay/")
    page.wait_for_function("() => document.querySelector('[data-page=replay]').dataset.ready === '1'")
    expect(page.locator("#live-state [data-step-actor]").first).to_be_hidden()


def test_a_for_update_wait_shows_whom_it_waits_for_and_goes_on_when_the_lock_is_released(
    page: Page, app_url: str, teacher: User, artifacts: Path
) -> None:
    sign_in(page, app_url, teacher)
    launch(page, app_url, "for-update-wait")
    take(page, by_click, 1, 0)
    take(page, by_click, 2, 1)
    take(page, by_click, 1, 2)

    # T2 asks for the lock T1 holds: it waits, and says for whom.
    take(page, by_keys, 2, 3, outcome="blocked")
    t2 = page.locator("#live-state th[data-step-lane='2']")
    expect(t2).to_have_attribute("data-status", "blocked")
    expect(t2).to_contain_text("waits for T1")
    expect(cell(page, 3)).to_contain_text("blocked: waits for T1")
    expect(t2.locator("[data-step-actor]")).to_be_disabled()
    # Stepped again while blocked: nothing is sent, the page says why.
    by_keys(page, 2)
    expect(page.locator("[data-step-note]")).to_contain_text("T2 is blocked, waiting for T1")
    screenshots(page, artifacts, "for-update-blocked")

    # Presenter mode, the class's view: the same keys step T1 on, its commit releases T2.
    page.goto(page.url + "?present=1")
    expect(page.locator("#live-state th[data-step-lane='2']")).to_have_attribute("data-status", "blocked")
    page.keyboard.press("?")
    expect(page.locator("#presenter-keys")).to_contain_text("run the chosen transaction's next step")
    page.keyboard.press("?")
    expect(page.locator("#presenter-keys")).to_be_hidden()
    take(page, by_keys, 1, 4)
    screenshots(page, artifacts, "for-update-presenting")
    take(page, by_keys, 1, 5)
    expect(cell(page, 3)).to_contain_text("waited for T1, then ✓ went on")
    expect(t2).not_to_have_attribute("data-status", "blocked")
    expect(page.locator("#live-state [data-seen='2']")).to_contain_text("11")
    take(page, by_keys, 2, 6)
    take(page, by_keys, 2, 7)
    expect(page.locator("#live-state [data-committed] tr[data-row='1']")).to_contain_text("12")
    expect(page.locator("#live-status .verdict")).to_be_visible(timeout=20_000)


def test_a_script_with_a_bad_line_is_refused_with_its_line_marked_and_nothing_runs(
    page: Page, app_url: str, teacher: User, artifacts: Path
) -> None:
    sign_in(page, app_url, teacher)
    page.goto(f"{app_url}/jobs/new/step/")
    item = page.locator("[data-step-builtin='deadlock']")
    expect(item).to_contain_text("who waits for whom")
    item.locator("summary").click()
    page.screenshot(path=str(artifacts / "step-launch-form-1400x1000.png"))
    item.locator("[data-step-copy]").click()
    text = page.locator("textarea[name=text]")
    expect(text).to_have_value(re.compile(r"^# Two transactions take the same two row locks"))
    expect(page.locator("select[name=script]")).to_have_value("")
    # Line 5 made into SQL the grammar does not take.
    lines = text.input_value().split("\n")
    lines[4] = "T2: update test set value = 21 where id = 2; drop table test"
    text.fill("\n".join(lines))
    jobs = Job.objects.count()
    page.click("button:has-text('Launch')")
    error = page.locator("[data-field=text] .errorlist")
    expect(error).to_contain_text("line 5")
    expect(page.locator("[data-step-gutter] .step-gutter-wrong")).to_have_text("5")
    expect(text).to_be_focused()
    assert (
        page.evaluate(
            "() => { const t = document.querySelector('textarea[name=text]');"
            " return t.value.slice(t.selectionStart, t.selectionEnd); }"
        )
        == lines[4]
    )
    assert Job.objects.count() == jobs
    assert "/jobs/new/step/" in page.url
    for width, height in SCREENS:
        page.set_viewport_size({"width": width, "height": height})
        error.scroll_into_view_if_needed()
        page.screenshot(path=str(artifacts / f"step-bad-line-{width}x{height}.png"))


def test_a_deadlock_shows_the_victim_postgresql_chose_with_its_sqlstate(
    page: Page, app_url: str, teacher: User, artifacts: Path
) -> None:
    sign_in(page, app_url, teacher)
    job_id = launch(page, app_url, "deadlock")
    for actor, position in ((1, 0), (2, 1), (1, 2), (2, 3)):
        take(page, by_click, actor, position)
    take(page, by_keys, 1, 4, outcome="blocked")  # T1 waits for T2's row 2
    expect(page.locator("#live-state th[data-step-lane='1']")).to_contain_text("waits for T2")
    by_keys(page, 2)  # T2 asks for T1's row 1: each waits for the other
    victim = page.locator("#live-state td.step-cell [data-error]")
    expect(victim).to_contain_text("SQLSTATE 40P01", timeout=15_000)
    expect(victim).to_contain_text("deadlock detected")
    expect(victim).to_contain_text("deadlock victim")
    screenshots(page, artifacts, "deadlock")
    job = Job.objects.get(pk=job_id)
    # The victim shown is the one whose statement PostgreSQL aborted, as its events say.
    deadlocks = list(job.events.filter(kind="deadlock").values_list("actor", flat=True))
    assert len(deadlocks) == 1
    shown_victim = victim.locator("xpath=ancestor::td").get_attribute("data-step-lane")
    assert shown_victim == str(deadlocks[0])
    survivor = 3 - deadlocks[0]
    expect(page.locator(f"#live-state th[data-step-lane='{survivor}']")).not_to_have_attribute("data-status", "blocked")
    expect(page.locator(f"#live-state th[data-step-lane='{deadlocks[0]}']")).to_have_attribute("data-status", "failed")


def test_a_script_launched_in_written_order_runs_by_itself_and_takes_no_step_from_the_page(
    page: Page, app_url: str, teacher: User
) -> None:
    sign_in(page, app_url, teacher)
    page.goto(f"{app_url}/jobs/new/step/?preset=lost-update")
    page.select_option("select[name=pace]", "written order")
    page.fill("input[name=step_ms]", "600")
    page.click("button:has-text('Launch')")
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    expect(page.locator("[data-step-note]")).to_have_text("This script runs by itself, in its written order.")
    expect(page.locator("#live-state td[data-outcome]").first).to_be_visible(timeout=30_000)
    expect(page.locator("#live-state [data-step-actor]").first).to_be_disabled()
    by_keys(page, 1)
    expect(page.locator("[data-step-note]")).to_contain_text("nothing to step")
    expect(page.locator("#live-status .verdict")).to_be_visible(timeout=30_000)
    expect(page.locator("#live-state [data-committed] tr[data-row='1']")).to_contain_text("11")
    expect(page.locator("#live-state td[data-outcome]")).to_have_count(8)
