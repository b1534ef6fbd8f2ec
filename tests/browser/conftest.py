"""Browser fixtures: the app served by a real Daphne with a real db_worker, driven by Debian's Chromium.

Both servers are child processes pointed at the test database, as a deployment would
be: Daphne for HTTP and the websockets, `manage.py db_worker` for the jobs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Browser, Page, sync_playwright

from tests.servers import served_app

ROOT = Path(__file__).resolve().parent.parent.parent
ARTIFACTS = ROOT / "artifacts"
CHROMIUM = "/usr/bin/chromium"
PASSWORD = "correct horse battery staple"  # the teacher fixture's


@pytest.fixture
def app_url(database_url: str, tmp_path: Path) -> Iterator[str]:
    """The base URL of Daphne serving occviz on the test database, with one db_worker running jobs."""
    with served_app(database_url, tmp_path) as url:
        yield url


# Module scope, not session: Playwright's sync API keeps an event loop running in this
# thread until it stops, and the asyncio tests that run after the browser ones need it gone.
@pytest.fixture(scope="module")
def chromium() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        # CI installs the package (.ci/run) and must run these; a developer without it is told how.
        message = f"{CHROMIUM} is missing: apt-get install -y chromium (Playwright cannot download a browser here)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"]
        )
        yield browser
        browser.close()


@pytest.fixture
def page(chromium: Browser) -> Iterator[Page]:
    context = chromium.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(20_000)
    page = context.new_page()
    yield page
    context.close()


@pytest.fixture
def teacher(database_url: str) -> User:
    """A new user, made in the test database the servers read."""
    return User.objects.create_user("teacher", password=PASSWORD)


@pytest.fixture
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS
