"""API fixtures: occviz served by a real Daphne (and a db_worker for jobs) on the test database.

The servers are child processes started once per test module, as a deployment runs them;
each test makes its users and tokens in the test database (transactional_db, so the
servers see them), and the database is emptied between tests under the running servers.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from django.contrib.auth.models import User

from occviz.api.models import ApiToken
from tests.servers import child_database_url, served_app

ROOT = Path(__file__).resolve().parent.parent.parent
PASSWORD = "correct horse battery staple"


@pytest.fixture(scope="module")
def api_server(
    django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The base URL of Daphne serving occviz on the test database, with one db_worker running jobs."""
    with django_db_blocker.unblock():
        database_url = child_database_url()
    with served_app(database_url, tmp_path_factory.mktemp("api-servers")) as url:
        yield url


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
