"""A teacher runs the anomalies table from its page, watches it fill in, and follows a mark to its run.

Against Daphne and a db_worker on the test database (and the machine's MariaDB when one answers,
as CI's does); the page is saved under artifacts/ at 1400x900 and 1280x720 to be looked at.
"""

from __future__ import annotations

import re
from pathlib import Path

import pymysql
import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from occviz.jobs.models import Job
from occviz.steps.hermitage import ANOMALIES, LEVELS, PUBLISHED
from tests.browser.test_web_browser import sign_in

# With tests/test_anomalies_mariadb.py on one xdist worker: they share the machine's MariaDB.
pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.usefixtures("mariadb_to_ourselves")]

SIZES = ({"width": 1400, "height": 900}, {"width": 1280, "height": 720})


def mariadb_answers() -> bool:
    try:
        pymysql.connect(host="127.0.0.1", port=3306, user="root", connect_timeout=2).close()
    except pymysql.MySQLError:
        return False
    return True


def test_the_table_fills_in_and_each_mark_links_its_run(
    page: Page, app_url: str, teacher: User, artifacts: Path
) -> None:
    both = mariadb_answers()
    page.set_viewport_size(SIZES[0])
    sign_in(page, app_url, teacher)
    page.click("nav >> a[href='/anomalies/']")
    expect(page.locator("[data-no-job]")).to_be_visible()
    if not both:
        page.select_option("#anomalies-database", "")
    page.click("text=Run the table")
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    job_id = int(page.url.rstrip("/").rsplit("/", 1)[1])

    # The anomalies page follows the job while it runs, then shows the measured table.
    page.goto(f"{app_url}/anomalies/")
    postgresql = page.locator("#anomalies-measured [data-database=postgresql]")
    expect(page.locator("#anomalies-measured h2")).to_contain_text(f"job {job_id}")
    expect(page.locator("#anomalies-measured [data-verdict]")).to_be_visible(timeout=240_000)
    job = Job.objects.get(pk=job_id)
    assert job.status == "succeeded", job.error

    # Every PostgreSQL mark as measured equals Hermitage's published row, and no cell is left pending.
    for level in LEVELS:
        row = postgresql.locator(f"tr[data-level={level.replace(' ', '-')}]")
        marks = [row.locator(f"td[data-anomaly='{anomaly}']").get_attribute("data-mark") for anomaly in ANOMALIES]
        assert marks == [PUBLISHED["postgresql"][level][anomaly] for anomaly in ANOMALIES], level
    assert page.locator("#anomalies-measured td.pending").count() == 0
    if both:
        expect(page.locator("#anomalies-measured [data-database=mariadb]")).to_be_visible()

    for size in SIZES:
        page.set_viewport_size(size)
        page.wait_for_timeout(300)
        name = f"anomalies-{size['width']}x{size['height']}"
        page.screenshot(path=str(artifacts / f"{name}.png"))
        page.screenshot(path=str(artifacts / f"{name}-full.png"), full_page=True)

    # A mark is a link to its run: a step-mode job that is a part of the table's job.
    cell = postgresql.locator("tr[data-level=repeatable-read] td[data-anomaly='G2-item'] a").first
    cell.click()
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    run = Job.objects.get(pk=int(page.url.rstrip("/").rsplit("/", 1)[1]))
    assert (run.scenario, run.parent_id) == ("step", job_id)
    assert run.params["script"].startswith("hermitage-g2-item") and run.params["isolation"] == "repeatable read"
    expect(page.locator("[data-parent]")).to_have_text(f"job #{job_id}")
    page.screenshot(path=str(artifacts / "anomalies-run-1400x900.png"))
