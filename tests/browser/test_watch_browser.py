"""The watch page in Chromium against Daphne: an API write and a stale one (409) appear live, by writer."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from occviz.api.models import ApiToken
from occviz.store import writes
from occviz.store.models import Counter
from tests.browser.test_web_browser import sign_in

pytestmark = [pytest.mark.browser, pytest.mark.slow]

COUNTER = "/apis/occviz.dev/v1/namespaces/default/counters/demo"
WRITER = "API: teacher (token laptop)"


def test_an_api_write_and_a_stale_one_appear_live_with_the_writers_name(
    page: Page, app_url: str, teacher: User, artifacts: Path
) -> None:
    writes.create(Counter, {"namespace": "default", "name": "demo", "value": 0}, writes.Writer("admin", "teacher"))
    api = requests.Session()
    api.headers["Authorization"] = f"Bearer {ApiToken.issue(teacher, 'laptop')[1]}"
    sign_in(page, app_url, teacher)
    page.goto(f"{app_url}/watch/counters/default/demo/")
    entries = page.locator("[data-entries] tr")
    expect(entries).to_have_count(1)
    expect(page.locator("[data-version]")).to_have_text("v1")
    page.evaluate("window.notReloaded = true")  # gone if the page reloads

    seen = api.get(app_url + COUNTER).json()
    seen["spec"]["value"] = 5
    assert api.put(app_url + COUNTER, json=seen).status_code == 200
    written = page.locator('[data-entries] tr[data-type="MODIFIED"]')
    expect(written).to_have_count(1)
    expect(written.locator("td").nth(0)).to_have_text("v2")
    expect(written.locator("td").nth(2)).to_have_text(WRITER)
    expect(written.locator("td").nth(3)).to_have_text("value 5")
    expect(page.locator("[data-version]")).to_have_text("v2")
    expect(page.locator("[data-fields]")).to_contain_text("value=5")

    seen["spec"]["value"] = 9  # still resourceVersion 1
    stale = api.put(app_url + COUNTER, json=seen)
    assert stale.status_code == 409 and stale.json()["reason"] == "Conflict"
    refused = page.locator('[data-entries] tr[data-type="CONFLICT"]')
    expect(refused).to_have_count(1)
    expect(refused.locator("td").nth(2)).to_have_text(WRITER)
    expect(refused.locator("td").nth(3)).to_have_text("409 Conflict: had v1, stored v2")
    # Newest on top: the refusal, the write, the creation.
    expect(entries.locator("td:nth-child(2)")).to_have_text(["CONFLICT", "MODIFIED", "ADDED"])
    counts = page.locator(f'[data-counts] tr[data-writer="{WRITER}"] td')
    expect(counts).to_have_text(["1", "1"])
    expect(page.locator('[data-counts] tr[data-writer="admin: teacher"] td')).to_have_text(["1", "0"])
    expect(page.locator("[data-version]")).to_have_text("v2")  # the refusal wrote nothing
    assert page.evaluate("window.notReloaded") is True
    page.screenshot(path=str(artifacts / "watch-api-conflict.png"), full_page=True)
