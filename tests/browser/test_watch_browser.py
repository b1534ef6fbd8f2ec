"""The watch page in Chromium against Daphne: API writes and a stale one (409) appear live, by writer."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from occviz.api.models import ApiToken
from tests.browser.test_web_browser import sign_in

pytestmark = [pytest.mark.browser, pytest.mark.slow]

COUNTERS = "/apis/occviz.dev/v1/namespaces/default/counters"
WRITER = "API: teacher (token laptop)"


def test_api_writes_and_a_stale_one_appear_live_with_the_writers_name(
    page: Page, app_url: str, teacher: User, artifacts: Path
) -> None:
    api = requests.Session()
    api.headers["Authorization"] = f"Bearer {ApiToken.issue(teacher, 'laptop')[1]}"
    sign_in(page, app_url, teacher)
    # Opened before the counter exists, as `kubectl get -w` may be.
    page.goto(f"{app_url}/watch/counters/default/demo/")
    entries = page.locator("[data-entries] tr[data-key]")
    stored, missing = page.locator("[data-now-stored]"), page.locator("[data-now-missing]")
    expect(missing).to_be_visible()
    expect(stored).to_be_hidden()
    page.evaluate("window.notReloaded = true")  # gone if the page reloads

    made = api.post(app_url + COUNTERS, json={"metadata": {"name": "demo"}, "spec": {"value": 0}})
    assert made.status_code == 201, made.text
    expect(entries).to_have_count(1)
    expect(stored).to_contain_text("Stored now: v1")
    expect(page.locator("[data-fields]")).to_contain_text("value: 0")
    expect(missing).to_be_hidden()

    seen = made.json()
    seen["spec"]["value"] = 5
    assert api.put(f"{app_url}{COUNTERS}/demo", json=seen).status_code == 200
    written = page.locator('[data-entries] tr[data-type="MODIFIED"] td')
    expect(written).to_have_count(5)
    expect(written.nth(0)).to_have_text("v2")
    expect(written.nth(2)).to_have_text(WRITER)
    expect(written.nth(3)).to_have_text("value 5")
    expect(page.locator("[data-version]")).to_have_text("v2")
    expect(page.locator("[data-fields]")).to_contain_text("value: 5")

    seen["spec"]["value"] = 9  # still resourceVersion 1
    stale = api.put(f"{app_url}{COUNTERS}/demo", json=seen)
    assert stale.status_code == 409 and stale.json()["reason"] == "Conflict"
    refused = page.locator('[data-entries] tr[data-type="CONFLICT"] td')
    expect(refused).to_have_count(5)
    expect(refused.nth(2)).to_have_text(WRITER)
    expect(refused.nth(3)).to_have_text("409 Conflict: had v1, stored v2")
    # Newest on top: the refusal, the write, the creation.
    expect(entries.locator("td:nth-child(2)")).to_have_text(["CONFLICT", "MODIFIED", "ADDED"])
    expect(page.locator(f'[data-counts] tr[data-writer="{WRITER}"] td')).to_have_text(["2", "1"])
    expect(page.locator("[data-version]")).to_have_text("v2")  # the refusal wrote nothing
    page.screenshot(path=str(artifacts / "watch-api-conflict.png"), full_page=True)

    assert api.delete(f"{app_url}{COUNTERS}/demo").status_code == 200
    expect(entries.first.locator("td").nth(1)).to_have_text("DELETED")
    expect(missing).to_be_visible()
    expect(stored).to_be_hidden()
    assert page.evaluate("window.notReloaded") is True
