"""A teacher runs the leader election in the browser and kills the leader from its row."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from occviz.jobs.models import Job, JobControl
from tests.browser.test_web_browser import sign_in

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def leader_row(page: Page) -> int:
    """The replica the live state says believes it leads."""
    row = page.locator("#live-state tr.leading").first
    expect(row).to_be_visible(timeout=15_000)
    return int(row.get_attribute("data-replica") or "0")


def test_kill_the_leader_and_watch_the_failover(page: Page, app_url: str, teacher: User, artifacts: Path) -> None:
    sign_in(page, app_url, teacher)
    page.click("text=Launch a leader election")
    page.click("[data-preset=classroom]")
    expect(page.locator("input[name=lease_duration]")).to_have_value("3")
    expect(page.locator("input[name=retry_period]")).to_have_value("0.5")
    page.click("button:has-text('Launch')")
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    job_id = int(page.url.rstrip("/").rsplit("/", 1)[1])

    # A leader emerges: the Lease names it, its row says so, and its lane carries the band.
    leader = leader_row(page)
    expect(page.locator("#live-state [data-holder]")).to_have_text(f"replica-{leader}")
    page.wait_for_function("(n) => document.querySelector('[data-timeline]').dataset.leaders === String(n)", arg=leader)

    # Opened again while the job runs, the page shows every replica's belief, token and timer from its
    # first render (the server's HTML, before any frame), as the runner's snapshot has them; so do
    # snapshot.json and replay at the latest moment.
    again = page.context.new_page()
    response = again.goto(f"{app_url}/jobs/{job_id}/")
    assert response is not None
    first = response.text()
    assert re.search(r"<strong>yes</strong> \(token \d+\)", first), "no leader in the first render"
    assert re.search(r"lease: [\d.]+ s left", first), "no follower's lease timer in the first render"
    assert first.count("<tr data-replica=") >= 2
    state = again.request.get(f"{app_url}/jobs/{job_id}/snapshot.json").json()["state"]
    assert any(replica["leading"] and replica["token"] >= 1 for replica in state["replicas"])
    again.goto(f"{app_url}/jobs/{job_id}/replay/")
    again.wait_for_selector("[data-page=replay][data-ready='1']")
    again.locator("[data-scrub]").fill(again.locator("[data-scrub]").get_attribute("max") or "0")
    expect(again.locator("#live-state tr.leading")).to_contain_text("token", timeout=10_000)
    again.close()

    page.click(f'#actor-controls tr[data-actor-row="{leader}"] button[data-control="kill"]')
    expect(page.locator("[data-control-note]")).to_have_text(f"Sent: kill replica-{leader}.")

    # Another replica takes over once the lease has run out, and the log says how long it took
    # (and which process it was: each replica runs in a process of its own, killed with SIGKILL).
    failover = page.locator("#live-log li", has_text=re.compile(rf"after replica-{leader} \(process \d+\) was killed"))
    expect(failover).to_have_count(1, timeout=15_000)
    text = failover.inner_text()
    found = re.match(r"replica-(\d+) acquired the lease \(transition (\d+)\), ([\d.]+) s after", text)
    assert found, text
    new_leader, transition, after_s = int(found[1]), int(found[2]), float(found[3])
    assert new_leader != leader and transition >= 2
    assert after_s <= 3 + 2 * 2.2 * 0.5 + 0.5, "within LeaseDuration + 2 x 2.2 x RetryPeriod + margin"
    page.wait_for_function(
        "(n) => document.querySelector('[data-timeline]').dataset.leaders === String(n)", arg=new_leader
    )
    expect(page.locator(f'#live-state tr[data-replica="{leader}"]')).to_contain_text("killed")
    page.wait_for_timeout(300)
    page.screenshot(path=str(artifacts / "leader-failover.png"), full_page=True)

    # The control was stored once and applied; ending the job early keeps its verdict honest.
    control = JobControl.objects.get(job_id=job_id)
    assert (control.action, control.actor, control.outcome) == ("kill", leader, "")
    page.click("[data-cancel]")
    expect(page.locator("#live-status .verdict")).to_be_visible(timeout=20_000)
    job = Job.objects.get(pk=job_id)
    assert job.status == "cancelled"
    assert job.summary["max_leaders_at_once"] == 1  # type: ignore[index]
    assert job.summary["transitions"] >= 2  # type: ignore[index]
