"""What a person does in the dashboard, in Chromium against Daphne and a db_worker on real PostgreSQL."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from occviz.jobs.models import Job
from occviz.jobs.runner import run_job
from occviz.jobs.tasks import create_job

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PASSWORD = "correct horse battery staple"


def sign_in(page: Page, app_url: str, user: User) -> None:
    page.goto(f"{app_url}/")
    assert "/accounts/login/" in page.url  # signed out: sent to sign in first
    page.fill("input[name=username]", user.get_username())
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{app_url}/")


def counter(page: Page, name: str) -> int:
    text = page.locator(f'#live-figures [data-counter="{name}"]').inner_text()
    return int(text.strip()) if text.strip().lstrip("-").isdigit() else -1


def job_status(page: Page) -> str:
    return page.locator("#live-status .status").inner_text().strip()


def canvas_has_marks(page: Page, selector: str) -> bool:
    """Whether anything other than white/transparent was drawn on the canvas."""
    return bool(
        page.evaluate(
            """(selector) => {
                const c = document.querySelector(selector);
                const data = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
                for (let i = 0; i < data.length; i += 4) {
                    if (data[i + 3] > 0 && (data[i] < 200 || data[i + 1] < 200)) return true;
                }
                return false;
            }""",
            selector,
        )
    )


def test_a_new_user_launches_an_occ_race_and_watches_it_live(
    page: Page, app_url: str, teacher: User, artifacts: Path
) -> None:
    sign_in(page, app_url, teacher)
    expect(page.locator(".card h2")).to_have_text(
        [
            "Anomalies table",
            "Controller race",
            "Counter race",
            "Leader election",
            "Quota race",
            "Step mode",
            "Contention curve",
        ]
    )
    page.click("text=Launch a counter race")
    page.click("[data-preset=k8s-default-backoff]")
    expect(page.locator("select[name=strategy]")).to_have_value("occ")
    expect(page.locator("select[name=retry]")).to_have_value("k8s-default-backoff")
    # A few seconds of contention: long enough to watch the counters move while it runs.
    page.fill("input[name=writers]", "6")
    page.fill("input[name=increments]", "")
    page.fill("input[name=seconds]", "4")
    page.fill("input[name=think_ms]", "3")
    # The page reads events.json only when the stream cannot give it a frame's events.
    reads_from_store: list[str] = []
    page.on("request", lambda request: reads_from_store.append(request.url) if "events.json" in request.url else None)
    page.click("button:has-text('Launch')")
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    job_id = int(page.url.rstrip("/").rsplit("/", 1)[1])

    seen_running: list[int] = []
    page.wait_for_function("document.querySelector('#live-status .status').textContent.trim() === 'running'")
    for _ in range(60):
        if job_status(page) != "running":
            break
        committed = counter(page, "committed")
        if committed > 0:
            seen_running.append(committed)
        if len(set(seen_running)) >= 3:
            break
        page.wait_for_timeout(200)
    assert job_status(page) == "running"
    assert len(set(seen_running)) >= 3, seen_running
    assert seen_running == sorted(seen_running)
    expect(page.locator("#live-log li").first).to_be_visible()
    assert canvas_has_marks(page, "[data-timeline]")
    # Drawn from the socket's frames (event arrays named by the hello's event_fields), not the store.
    shown = page.get_attribute("[data-page=job]", "data-last-seq") or ""
    assert shown.isdigit() and int(shown) > 0, shown
    assert reads_from_store == [], reads_from_store

    expect(page.locator("#live-status .verdict-ok")).to_contain_text("Invariant holds", timeout=30_000)
    expect(page.locator("#live-status .verdict-ok")).to_contain_text("no update lost")
    job = Job.objects.get(pk=job_id)
    assert job.status == "succeeded"
    assert job.created_by == teacher
    assert counter(page, "committed") == job.summary["committed"]  # type: ignore[index]
    assert counter(page, "conflicts") == job.summary["conflicts"] > 0  # type: ignore[index]
    expect(page.locator("[data-cancel]")).to_have_count(0)
    page.wait_for_timeout(500)  # let the last frame reach the canvas
    page.screenshot(path=str(artifacts / "job-page.png"), full_page=True)


def test_a_lost_update_demo_reports_the_lost_updates(page: Page, app_url: str, teacher: User, artifacts: Path) -> None:
    sign_in(page, app_url, teacher)
    page.goto(f"{app_url}/jobs/new/counter/")
    page.click("[data-preset=lost-update-demo]")
    expect(page.locator("select[name=strategy]")).to_have_value("none")
    expect(page.locator("input[name=writers]")).to_have_value("8")
    page.fill("input[name=seconds]", "1")  # the preset runs long enough to watch; a second loses updates too
    page.click("button:has-text('Launch')")
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    expect(page.locator("#live-status .verdict")).to_contain_text("updates lost", timeout=30_000)
    job = Job.objects.get(pk=int(page.url.rstrip("/").rsplit("/", 1)[1]))
    lost = job.summary["lost_updates"]  # type: ignore[index]
    assert lost > 0
    expect(page.locator('#live-figures [data-counter="lost_updates"]')).to_have_text(str(lost))
    page.screenshot(path=str(artifacts / "lost-updates.png"), full_page=True)
    # The home page lists it with its verdict and its losses.
    page.goto(f"{app_url}/")
    expect(page.locator(f'tr[data-job="{job.pk}"]')).to_contain_text(f"{lost} lost update")
    page.click("[data-large-type]")  # the classroom view
    page.screenshot(path=str(artifacts / "home-large-type.png"), full_page=True)


def test_bad_input_shows_the_error_inline_and_launches_nothing(page: Page, app_url: str, teacher: User) -> None:
    sign_in(page, app_url, teacher)
    page.goto(f"{app_url}/jobs/new/counter/")
    page.fill("input[name=writers]", "0")
    page.fill("input[name=seconds]", "2")  # and increments too: not both
    page.fill("input[name=increments]", "10")
    page.click("button:has-text('Launch')")
    expect(page.locator("#id_writers_error")).to_contain_text("greater than or equal to 1")
    expect(page.locator(".errorsummary")).to_contain_text("Nothing was launched")
    assert page.url == f"{app_url}/jobs/new/counter/"
    assert Job.objects.count() == 0
    # Corrected in place, the same form launches.
    page.fill("input[name=writers]", "2")
    page.fill("input[name=seconds]", "")
    page.click("button:has-text('Launch')")
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    assert Job.objects.count() == 1


def test_replay_scrubs_to_any_moment(page: Page, app_url: str, teacher: User, artifacts: Path) -> None:
    job = run_job(create_job("counter", {"strategy": "occ", "writers": 4, "increments": 40, "think_ms": 2}, teacher).pk)
    job.refresh_from_db()
    committed = job.summary["committed"]  # type: ignore[index]
    sign_in(page, app_url, teacher)
    page.goto(f"{app_url}/jobs/{job.pk}/replay/")
    page.wait_for_selector("[data-page=replay][data-ready='1']")
    # The live page's own figures, as the server rendered them at each moment (before the first event: none).
    value = page.locator('#live-figures [data-counter="committed"]')
    expect(value).to_have_text("\u2014")
    duration = float(page.locator("[data-scrub]").get_attribute("max") or 0)
    assert duration > 0

    page.locator("[data-scrub]").fill(str(duration / 2))
    expect(value).not_to_have_text("\u2014")  # swapped in when the server's fragments arrive
    halfway = int(value.inner_text())
    assert 0 < halfway < committed
    expect(page.locator("[data-clock]")).to_contain_text("of")

    page.locator("[data-scrub]").fill(str(duration))
    expect(value).to_have_text(str(committed))
    assert canvas_has_marks(page, "[data-timeline]")
    # At the last event, replay shows what the live page shows at the end: the same figures, rows and log.
    page.wait_for_selector(f"[data-page=replay][data-seq-shown='{job.last_seq}']")
    replayed = {part: page.locator(f"#live-{part}").inner_text() for part in ("figures", "state", "log")}
    live = page.context.new_page()
    live.goto(f"{app_url}/jobs/{job.pk}/")
    assert {part: live.locator(f"#live-{part}").inner_text() for part in ("figures", "state", "log")} == replayed
    live.close()
    page.screenshot(path=str(artifacts / "replay.png"), full_page=True)

    page.locator("[data-scrub]").fill("0")
    expect(value).to_have_text("\u2014")
    page.select_option("[data-speed]", "10")
    page.click("[data-play]")
    expect(value).to_have_text(str(committed), timeout=20_000)
    expect(page.locator("[data-play]")).to_have_text("Play")


def test_compare_two_finished_jobs(page: Page, app_url: str, teacher: User, artifacts: Path) -> None:
    jobs = [
        run_job(create_job("counter", {"strategy": s, "writers": 4, "increments": 20, "think_ms": 1}, teacher).pk)
        for s in ("occ", "pessimistic")
    ]
    sign_in(page, app_url, teacher)
    for job in jobs:
        page.check(f"#compare-{job.pk}")
    page.click("[data-compare-ids]")
    page.wait_for_url(re.compile(r"/jobs/compare/"))
    expect(page.locator("[data-compare-chart]")).to_have_count(2)
    assert canvas_has_marks(page, '[data-compare-chart="0"]')
    assert canvas_has_marks(page, '[data-compare-chart="1"]')
    for width, height in ((1400, 900), (1280, 720)):
        page.set_viewport_size({"width": width, "height": height})
        page.wait_for_timeout(300)  # the charts redrawn at their new width
        page.screenshot(path=str(artifacts / f"compare-{width}x{height}.png"), full_page=True)


def test_a_finished_job_page_draws_its_stored_events_and_hover_explains_a_mark(
    page: Page, app_url: str, teacher: User
) -> None:
    job = run_job(create_job("counter", {"strategy": "occ", "writers": 2, "increments": 30, "think_ms": 2}, teacher).pk)
    sign_in(page, app_url, teacher)
    page.goto(f"{app_url}/jobs/{job.pk}/")
    expect(page.locator("#live-status .verdict-ok")).to_be_visible()
    page.wait_for_function("document.querySelector('[data-page=job]').dataset.finished === '1'")
    page.wait_for_timeout(300)
    assert canvas_has_marks(page, "[data-timeline]")
    page.locator("[data-timeline]").scroll_into_view_if_needed()  # below the figures, the captions and the state
    box = page.locator("[data-timeline]").bounding_box()
    assert box is not None
    tooltip = page.locator("[data-tooltip]")
    lane_y = box["y"] + 8 + 14  # the middle of writer 1's lane
    x = box["x"] + 90
    while x < box["x"] + box["width"] and not tooltip.is_visible():
        page.mouse.move(x, lane_y)
        x += 4
    expect(tooltip).to_be_visible()
    expect(tooltip).to_contain_text("writer 1")
    expect(tooltip).to_contain_text("version read")
    # The exports stream through Daphne (an async iterator there), every event in order.
    job.refresh_from_db()
    for fmt, header in (("jsonl", 0), ("csv", 1)):
        response = page.request.get(f"{app_url}/jobs/{job.pk}/export.{fmt}")
        assert response.ok
        assert len(response.text().splitlines()) == job.last_seq + header
    assert page.request.get(f"{app_url}/jobs/{job.pk}/summary.json").json()["invariant_ok"] is True
