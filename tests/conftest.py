"""Fixtures shared by the whole suite. Every database test runs on real PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tests.servers import child_database_url, machine_wide

ROOT = Path(__file__).resolve().parent.parent
MARIADB_LOCK = Path(tempfile.gettempdir()) / "occviz-tests-mariadb.lock"

# Playwright's sync API runs an event loop in the test thread; Django's ORM must still be usable there.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


@pytest.fixture
def alice(db: None) -> User:
    return User.objects.create_user("alice", password="correct horse battery")


@pytest.fixture
def signed_in(client: Client, alice: User) -> Client:
    """Django's test client, signed in as alice."""
    client.force_login(alice)
    return client


@pytest.fixture(autouse=True)
def in_memory_channel_layer(settings: Any) -> None:
    """Jobs run in the test process publish here, not to the development database's layer.

    Tests about the layer itself, and child processes (given DATABASE_URL), use the real one.
    """
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


@pytest.fixture(scope="module")
def mariadb_to_ourselves() -> Iterator[None]:
    """The machine's MariaDB to this module's tests alone, whatever else runs (xdist workers, another checkout).

    A run's databases there are named by job id, which every worker's test database counts from 1,
    and one test drops the stale ones.
    """
    with machine_wide(MARIADB_LOCK):
        yield


@pytest.fixture
def database_url(transactional_db: None) -> str:
    """A DATABASE_URL for the test database, for subprocesses (runjob, db_worker, daphne)."""
    return child_database_url()


def manage(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run `python manage.py ...` as a user would, in a child process."""
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def run_manage(database_url: str) -> Iterator[object]:
    """`run_manage("runjob", ...)`: manage.py in a child process, on the test database."""

    def run(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return manage(*args, env={"DATABASE_URL": database_url, **(env or {})}, timeout=timeout)

    yield run
