"""Browser fixtures: the app served by a real Daphne with a real db_worker, driven by Debian's Chromium.

Both servers are child processes pointed at the test database, as a deployment would
be: Daphne for HTTP and the websockets, `manage.py db_worker` for the jobs.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Browser, Page, sync_playwright

ROOT = Path(__file__).resolve().parent.parent.parent
ARTIFACTS = ROOT / "artifacts"
CHROMIUM = "/usr/bin/chromium"
PASSWORD = "correct horse battery staple"  # the teacher fixture's


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for_port(port: int, process: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"daphne exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout} s")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def app_url(database_url: str, tmp_path: Path) -> Iterator[str]:
    """The base URL of Daphne serving occviz on the test database, with one db_worker running jobs."""
    port = _free_port()
    env = {**os.environ, "DATABASE_URL": database_url, "DEBUG": "false", "PYTHONUNBUFFERED": "1"}
    logs = {name: (tmp_path / f"{name}.log").open("wb") for name in ("daphne", "worker")}
    daphne = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "occviz.asgi:application"],
        cwd=ROOT,
        env=env,
        stdout=logs["daphne"],
        stderr=subprocess.STDOUT,
    )
    worker = subprocess.Popen(
        [sys.executable, "manage.py", "db_worker", "--interval", "0.1", "--no-startup-delay"],
        cwd=ROOT,
        env=env,
        stdout=logs["worker"],
        stderr=subprocess.STDOUT,
    )
    try:
        _wait_for_port(port, daphne)
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop(worker)
        _stop(daphne)
        for log in logs.values():
            log.close()


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
