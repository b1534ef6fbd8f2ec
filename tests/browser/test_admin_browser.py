"""Two editors in the admin, in Chromium against Daphne and a db_worker, while a counter race job runs."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Browser, Page, expect

from occviz.jobs.models import Job
from occviz.jobs.tasks import launch
from occviz.store.models import Change, Counter, Lease

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PASSWORD = "correct horse battery staple"


@pytest.fixture
def editors(chromium: Browser, app_url: str, database_url: str) -> Iterator[tuple[Page, Page]]:
    """Two staff users, each signed in in a browser context of their own (two sessions)."""
    contexts = []
    pages = []
    for name in ("alice", "bob"):
        User.objects.create_superuser(name, password=PASSWORD)
        context = chromium.new_context(viewport={"width": 1400, "height": 1000})
        context.set_default_timeout(20_000)
        page = context.new_page()
        page.goto(f"{app_url}/accounts/login/?next=/admin/")
        page.fill("input[name=username]", name)
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url(f"{app_url}/admin/")
        contexts.append(context)
        pages.append(page)
    yield pages[0], pages[1]
    for context in contexts:
        context.close()


def save(page: Page, button: str = "input[name=_save]") -> int:
    """Click a submit button; the HTTP status of the POST it sends."""
    with page.expect_response(lambda response: response.request.method == "POST") as response:
        page.click(button)
    page.wait_for_load_state()
    return response.value.status


def test_two_editors_and_a_running_job_lose_no_update(
    editors: tuple[Page, Page], app_url: str, artifacts: Path
) -> None:
    alice, bob = editors
    counter = Counter.objects.create(name="shared", value=10)
    lease = Lease.objects.create(name="demo", holder_identity="replica-1")
    # A counter race runs all along, on a db_worker, on its own row.
    job = launch("counter", {"strategy": "occ", "writers": 4, "seconds": 10, "think_ms": 2})
    seen = []  # the job's status at each step of the editors'

    def job_status() -> None:
        seen.append(Job.objects.get(pk=job.pk).status)

    # Both open the same counter; alice saves first, then bob, on the version he loaded.
    change_url = f"{app_url}/admin/store/counter/{counter.pk}/change/"
    alice.goto(change_url)
    bob.goto(change_url)
    alice.fill("input[name=value]", "11")
    assert save(alice) == 302
    expect(alice.locator(".messagelist")).to_contain_text("changed successfully")
    bob.fill("input[name=value]", "20")
    assert save(bob) == 409
    expect(bob.locator("#conflict .errornote")).to_contain_text("Operation cannot be fulfilled on counters.occviz.dev")
    expect(bob.locator("#conflict-writers")).to_contain_text("admin alice")
    row = bob.locator('#conflict-fields tr[data-field="value"]')
    expect(row.locator("td.saw")).to_have_text("10")
    expect(row.locator("td.entered")).to_have_text("20")
    expect(row.locator("td.stored")).to_have_text("11")
    expect(bob.locator(".messagelist")).to_have_count(0)  # no success claimed
    bob.screenshot(path=str(artifacts / "admin-conflict.png"), full_page=True)
    counter.refresh_from_db()
    assert (counter.value, counter.resource_version) == (11, 2)  # alice's write stands

    job_status()
    # Bob keeps his value for the field both changed, and re-applies onto version 2.
    expect(row.locator('input[value="mine"]')).to_be_checked()
    assert save(bob, "input[name=_reapply_submit]") == 302
    expect(bob.locator(".messagelist")).to_contain_text("were applied")
    counter.refresh_from_db()
    assert (counter.value, counter.resource_version) == (20, 3)

    job_status()
    # list_editable: both load the lease list; alice saves a holder; bob's row is now stale.
    list_url = f"{app_url}/admin/store/lease/?q=demo"
    alice.goto(list_url)
    bob.goto(list_url)
    alice.fill("input[name=form-0-holder_identity]", "alice-was-here")
    assert save(alice) == 302
    bob.fill("input[name=form-0-holder_identity]", "bob-was-here")
    assert save(bob) == 409
    expect(bob.locator(".errorlist")).to_contain_text("changed since this page was loaded")
    lease.refresh_from_db()
    assert (lease.holder_identity, lease.resource_version) == ("alice-was-here", 2)

    job_status()
    # An action on a stale row: bob resets the counter from a list alice changed since he loaded it.
    counters_url = f"{app_url}/admin/store/counter/?q=shared"
    bob.goto(counters_url)
    alice.goto(counters_url)
    alice.fill("input[name=form-0-value]", "21")
    assert save(alice) == 302
    bob.check(f"input.action-select[value='{counter.pk}']")
    bob.select_option("select[name=action]", "reset")
    save(bob, "button[name=index]")
    expect(bob.locator(".messagelist .error")).to_contain_text("Refused 1, changed since this page was loaded")
    expect(bob.locator(".messagelist .success")).to_have_count(0)
    counter.refresh_from_db()
    assert (counter.value, counter.resource_version) == (21, 4)
    # Loaded again, the same action goes through.
    bob.check(f"input.action-select[value='{counter.pk}']")
    bob.select_option("select[name=action]", "reset")
    save(bob, "button[name=index]")
    expect(bob.locator(".messagelist .success")).to_have_text("Reset 1 counter.")
    counter.refresh_from_db()
    assert (counter.value, counter.resource_version) == (0, 5)

    job_status()
    # Every write and refusal is in the history, by its writer.
    assert list(Change.objects.filter(object_id=counter.pk, resource="counters").values_list("type", "writer")) == [
        ("MODIFIED", "alice"),
        ("CONFLICT", "bob"),
        ("MODIFIED", "bob"),
        ("MODIFIED", "alice"),
        ("CONFLICT", "bob"),
        ("MODIFIED", "bob"),
    ]
    assert Job.Status.RUNNING in seen, f"the job should run while the editors edit: {seen}"

    # The job ran meanwhile and kept its invariant.
    deadline = time.monotonic() + 30
    while Job.objects.get(pk=job.pk).status in (Job.Status.QUEUED, Job.Status.RUNNING):
        assert time.monotonic() < deadline, "the job did not finish"
        time.sleep(0.2)
    job.refresh_from_db()
    assert job.status == Job.Status.SUCCEEDED
    assert job.invariant_ok is True
    assert job.summary["committed"] > 0  # type: ignore[index]
