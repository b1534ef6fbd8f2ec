"""API fixtures: occviz served by a real Daphne (and a db_worker for jobs) on the test database.

The servers are child processes started once per test module, as a deployment runs them;
each test makes its users and tokens in the test database (transactional_db, so the
servers see them), and the database is emptied between tests under the running servers.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import requests
from django.contrib.auth.models import User
from django.db import connection

from occviz.api.models import ApiToken
from tests.browser.conftest import _free_port, _stop, _wait_for_port

ROOT = Path(__file__).resolve().parent.parent.parent
PASSWORD = "correct horse battery staple"


def _database_url() -> str:
    params = connection.settings_dict
    host = params["HOST"] or "127.0.0.1"
    if host.startswith("/"):
        return f"postgresql://{params['USER']}@/{params['NAME']}?host={quote(host)}"
    return f"postgresql://{params['USER']}:{params['PASSWORD']}@{host}:{params['PORT'] or 5432}/{params['NAME']}"


@pytest.fixture(scope="module")
def api_server(
    django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The base URL of Daphne serving occviz on the test database, with one db_worker running jobs."""
    with django_db_blocker.unblock():
        database_url = _database_url()
    logs_dir = tmp_path_factory.mktemp("api-servers")
    port = _free_port()
    env = {**os.environ, "DATABASE_URL": database_url, "DEBUG": "false", "PYTHONUNBUFFERED": "1"}
    logs = {name: (logs_dir / f"{name}.log").open("wb") for name in ("daphne", "worker")}
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


@pytest.fixture
def api_url(api_server: str, transactional_db: None) -> str:
    """The live API's base URL, for a test whose rows the servers can see (committed, emptied after)."""
    return api_server


@pytest.fixture
def student(transactional_db: None) -> User:
    return User.objects.create_user("student", password=PASSWORD)


@pytest.fixture
def token(student: User) -> str:
    """A read-write bearer token of `student`, named "laptop"."""
    return ApiToken.issue(student, "laptop")[1]


@pytest.fixture
def api(api_url: str, token: str) -> requests.Session:
    """A requests session on the live API, authenticated with student's token; `api.url(path)` joins the base."""
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {token}"
    session.base = api_url  # type: ignore[attr-defined]
    return session


LEASES = "/apis/coordination.k8s.io/v1/namespaces/default/leases"
COUNTERS = "/apis/occviz.dev/v1/namespaces/default/counters"
PODS = "/api/v1/namespaces/default/pods"
QUOTAS = "/api/v1/namespaces/default/resourcequotas"
JOBS = "/apis/occviz.dev/v1/namespaces/default/jobs"


def lease_body(name: str = "demo", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15, **spec},
    }
