"""A teacher launches a counter race over two processes from the form and watches its shards on the job page.

Against Daphne and two db_workers on the test database (one runs the job, the other takes its
second shard): the form's Processes field, the running page's table of shards changing as the
rows do, the finished page's, and presenter mode without pids; then a replay's table of the same
shards. Screenshots at 1400x900 and 1280x720 go to artifacts/.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from occviz.jobs.models import Job, JobShard
from occviz.jobs.runner import run_job
from occviz.jobs.tasks import create_job
from tests.browser.test_presenter_browser import CUT, KEY_PARTS, OFF_SCREEN
from tests.browser.test_web_browser import sign_in
from tests.servers import ROOT, stop
from tests.test_shards import HOST

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SIZES = ((1400, 900), (1280, 720))


@pytest.fixture
def second_worker(app_url: str, database_url: str, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Another db_worker beside the app's own, as `serve` runs several."""
    env = {**os.environ, "DATABASE_URL": database_url, "DEBUG": "false", "PYTHONUNBUFFERED": "1"}
    with (tmp_path / "worker-2.log").open("wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "manage.py", "db_worker", "--interval", "0.1", "--no-startup-delay"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        yield worker
    finally:
        stop(worker)


def drawn(page: Page, job: Job) -> None:
    """Until the page has drawn every event of the finished job (before a screenshot)."""
    page.wait_for_function("(n) => document.querySelector('.job-page').dataset.lastSeq === String(n)", arg=job.last_seq)


def no_horizontal_scroll(page: Page) -> bool:
    return bool(page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth"))


def test_a_race_over_two_processes_launched_from_the_form_shows_its_shards(
    page: Page, app_url: str, second_worker: subprocess.Popen[bytes], teacher: User, artifacts: Path
) -> None:
    sign_in(page, app_url, teacher)
    page.set_viewport_size({"width": 1400, "height": 900})
    page.goto(f"{app_url}/jobs/new/counter/")
    field = page.locator(".field[data-field=processes]")
    expect(field.locator("input[name=processes]")).to_have_value("1")
    expect(field).to_contain_text('"auto"')
    field.scroll_into_view_if_needed()
    page.screenshot(path=str(artifacts / "shards-form.png"), full_page=True)

    # Bad input first: said beside the field, nothing launched.
    page.select_option("select[name=strategy]", "occ")
    page.fill("input[name=writers]", "4")
    page.fill("input[name=increments]", "")
    page.fill("input[name=seconds]", "4")
    page.fill("input[name=think_ms]", "5")
    page.fill("input[name=processes]", "5")
    page.click("button:has-text('Launch')")
    expect(field.locator(".errorlist")).to_contain_text("5 processes for 4 actors")
    assert not Job.objects.exists()

    page.fill("input[name=processes]", "2")
    page.click("button:has-text('Launch')")
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    job = Job.objects.get()
    assert job.params["processes"] == 2

    # Running: two rows, each with its runner and writers, the heartbeat renewed while they run.
    table = page.locator("#shards table.shard-rows")
    expect(table.locator("tbody tr")).to_have_count(2, timeout=30_000)
    running = page.locator('#shards tr[data-shard-status="running"]')
    expect(running).to_have_count(2, timeout=30_000)
    expect(page.locator('#shards tr[data-shard="0"]')).to_contain_text("writers 1\u20132")
    expect(page.locator('#shards tr[data-shard="1"]')).to_contain_text("writers 3\u20134")
    expect(page.locator('#shards tr[data-shard="1"] .shard-time')).to_contain_text(re.compile(r"\d\.\d s ago"))
    pids = {shard.index: shard.pid for shard in JobShard.objects.filter(job=job)}
    expect(page.locator('#shards tr[data-shard="1"] [data-pid]')).to_have_text(f":{pids[1]}")
    page.screenshot(path=str(artifacts / "shards-running-1400x900.png"))

    # Finished: the table as it ended, refreshed by the page itself (not reloaded).
    expect(page.locator("#live-status .verdict")).to_contain_text("Invariant holds", timeout=60_000)
    expect(page.locator('#shards tr[data-shard-status="done"]')).to_have_count(2, timeout=10_000)
    expect(page.locator("#shards[hx-trigger]")).to_have_count(0)  # no more asking
    expect(page.locator("#shards thead")).to_contain_text("Ended")
    job.refresh_from_db()
    assert job.status == "succeeded" and job.summary and job.summary["processes"] == 2
    drawn(page, job)
    for width, height in SIZES:
        page.set_viewport_size({"width": width, "height": height})
        page.locator("#shards").scroll_into_view_if_needed()
        assert no_horizontal_scroll(page), f"{width}x{height}: the page scrolls sideways"
        page.screenshot(path=str(artifacts / f"shards-finished-{width}x{height}.png"))

    # Presenter mode: the shards as a strip, without process ids; the page still one screen.
    for width, height in SIZES:
        page.set_viewport_size({"width": width, "height": height})
        page.goto(f"{app_url}/jobs/{job.pk}/?present=1")
        expect(page.locator("#shards tbody tr")).to_have_count(2)
        drawn(page, job)
        expect(page.locator("#shards [data-pid]").first).to_be_hidden()
        expect(page.locator('#shards tr[data-shard="1"]')).to_be_visible()
        box = page.locator("#shards").bounding_box()
        assert box is not None and box["y"] + box["height"] <= height, f"{width}x{height}: shards below the screen"
        page.screenshot(path=str(artifacts / f"shards-present-{width}x{height}.png"))


def test_the_replay_of_a_race_over_two_processes_shows_its_shards_but_not_when_presented(
    page: Page, app_url: str, teacher: User, artifacts: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", database_url)  # for the runshard child of this process's runner
    params = {"strategy": "occ", "writers": 4, "seconds": 2, "think_ms": 5, "processes": 2}
    job = run_job(create_job("counter", params, teacher).pk, shards="children")
    assert job.status == "succeeded", job.error
    pids = {shard.index: shard.pid for shard in JobShard.objects.filter(job=job)}
    sign_in(page, app_url, teacher)
    for width, height in SIZES:
        page.set_viewport_size({"width": width, "height": height})
        page.goto(f"{app_url}/jobs/{job.pk}/replay/")
        page.wait_for_selector("[data-page=replay][data-ready='1']")
        # The job page's table, as the shards ended: who ran which writers, where, how each ended.
        expect(page.locator('#shards tr[data-shard-status="done"]')).to_have_count(2)
        expect(page.locator('#shards tr[data-shard="0"]')).to_contain_text("writers 1\u20132")
        expect(page.locator('#shards tr[data-shard="1"]')).to_contain_text("writers 3\u20134")
        expect(page.locator('#shards tr[data-shard="1"] .shard-runner')).to_contain_text(f"runshard on {HOST}")
        expect(page.locator('#shards tr[data-shard="1"] [data-pid]')).to_have_text(f":{pids[1]}")
        expect(page.locator("#shards thead")).to_contain_text("Ended")
        expect(page.locator("#shards[hx-trigger]")).to_have_count(0)
        page.locator("#shards").scroll_into_view_if_needed()
        assert no_horizontal_scroll(page), f"{width}x{height}: the replay scrolls sideways"
        page.screenshot(path=str(artifacts / f"shards-replay-{width}x{height}.png"), full_page=True)

        # Presented: the replay's one screen, the timeline in view, without the table.
        page.goto(f"{app_url}/jobs/{job.pk}/replay/?present=1")
        page.wait_for_selector("[data-page=replay][data-ready='1']")
        page.locator("[data-scrub]").fill(page.locator("[data-scrub]").get_attribute("max") or "0")
        page.wait_for_selector(f"[data-page=replay][data-seq-shown='{job.last_seq}']")
        expect(page.locator("#shards")).to_be_hidden()
        timeline = page.locator("[data-timeline]").bounding_box()
        assert timeline is not None and timeline["y"] + timeline["height"] <= height, f"{width}x{height}: {timeline}"
        page.wait_for_timeout(300)  # a frame for the charts to take their size
        page.screenshot(path=str(artifacts / f"shards-replay-present-{width}x{height}.png"))
        assert page.evaluate(OFF_SCREEN) == [] and page.evaluate(CUT, KEY_PARTS) == []
