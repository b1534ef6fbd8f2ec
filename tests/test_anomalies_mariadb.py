"""The step engine and Hermitage's table on the machine's MariaDB (127.0.0.1:3306, root without a password).

Skipped, saying why, when no MariaDB answers there; with OCCVIZ_REQUIRE_MARIADB=1 (CI) that
is a failure instead. Each run makes a database of its own on the server and drops it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from html import unescape
from typing import Any

import pymysql
import pytest
from django.contrib.auth.models import User
from django.test import Client

from occviz.jobs.models import Job
from occviz.jobs.runner import run_job
from occviz.jobs.tasks import create_job
from occviz.steps.hermitage import ANOMALIES, LEVELS, TESTS
from occviz.steps.mysql import DATABASE_PREFIX, Server, drop_stale_databases

URL = "mysql://root@127.0.0.1:3306/"
pytestmark = pytest.mark.usefixtures("mariadb_to_ourselves")
reads_the_table = pytest.mark.django_db
runs_jobs = pytest.mark.django_db(transaction=True)


def _mariadb_or_skip() -> Server:
    server = Server.from_url(URL)
    try:
        with server.connect() as conn, conn.cursor() as cursor:
            cursor.execute("SELECT VERSION()")
    except pymysql.MySQLError as error:
        message = f"no MariaDB answers at {server.label} ({error})"
        if os.environ.get("OCCVIZ_REQUIRE_MARIADB") == "1":
            pytest.fail(f"{message}, and OCCVIZ_REQUIRE_MARIADB=1 requires one")
        pytest.skip(message)
    return server


@pytest.fixture(scope="module")
def mariadb() -> Server:
    return _mariadb_or_skip()


def leftover_databases(server: Server, suffix: str) -> list[str]:
    with server.connect() as conn, conn.cursor() as cursor:
        cursor.execute("SELECT SCHEMA_NAME FROM information_schema.SCHEMATA WHERE SCHEMA_NAME LIKE %s", [suffix])
        return [name for (name,) in cursor.fetchall()]


def run_step(**params: Any) -> Job:
    job = run_job(create_job("step", {"pace": "written order", "database": URL, **params}).pk)
    assert job.status == Job.Status.SUCCEEDED, job.error
    assert job.summary is not None and job.summary["invariant_ok"], job.summary
    return job


@runs_jobs
def test_a_deadlock_on_mariadb_is_a_40001_and_its_victim_named(mariadb: Server) -> None:
    job = run_step(script="deadlock")
    summary = job.summary or {}
    assert summary["database"].startswith("mariadb ") and mariadb.label in summary["database"]
    (victim,) = [step for step in summary["steps"] if step["outcome"] == "error" or step.get("then") == "error"]
    assert victim["sqlstate"] == "40001" and victim["message"].startswith("1213: Deadlock found")
    (waited,) = [step for step in summary["steps"] if step["outcome"] == "blocked"]
    assert waited["actor"] != victim["actor"] and waited["then"] == "ok"
    assert summary["deadlocks"] == 1, "recorded as a deadlock's victim, not as a serialization failure"
    assert summary["connections_released"] and summary["rows_dropped"]
    assert leftover_databases(mariadb, f"{DATABASE_PREFIX}{job.pk}\\_%") == []


@runs_jobs
def test_a_lock_wait_on_mariadb_names_its_blocker_and_times_out(mariadb: Server) -> None:
    text = """\
T1: begin
T1: update test set value = 11 where id = 1
T2: begin
T2: update test set value = 12 where id = 1
"""
    job = run_step(text=text, lock_timeout=1)
    steps = (job.summary or {})["steps"]
    waited = steps[-1]
    assert (waited["actor"], waited["outcome"], waited["blocked_by"]) == ("T2", "blocked", ["T1"])
    assert waited["then"] == "error" and waited["message"].startswith("1205: Lock wait timeout exceeded")
    # Counted as a lock timeout, as PostgreSQL's 55P03 is, not as an error of any other kind.
    summary = job.summary or {}
    assert summary["lock_timeouts"] == 1 and summary["errors"] == 0, summary
    assert "T2 timed out waiting for a lock (1205)" in summary["findings"]
    assert (job.summary or {})["final"] == {"1": 10, "2": 20}, "T1's open transaction was rolled back at the end"


@pytest.fixture(scope="module")
def table(mariadb: Server, django_db_setup: None, django_db_blocker: Any) -> Iterator[Job]:
    with django_db_blocker.unblock():
        job = run_job(create_job("anomalies", {"database": URL}).pk)
        yield job
        Job.objects.filter(parent=job).delete()
        job.delete()


@pytest.mark.slow
@reads_the_table
def test_the_table_runs_on_mariadb_and_reports_every_cell(table: Job, mariadb: Server) -> None:
    assert table.status == Job.Status.SUCCEEDED, table.error
    summary = table.summary or {}
    assert summary["invariant_ok"], summary["invariant"]
    assert "mariadb" in summary["servers"]
    cells = summary["mariadb"]
    assert list(cells) == list(LEVELS)
    for level in LEVELS:
        assert list(cells[level]) == list(ANOMALIES)
        for anomaly, cell in cells[level].items():
            assert isinstance(cell["prevented"], bool), f"{anomaly} at {level}: {cell['how']}"
            assert cell["how"] and cell["jobs"]
    children = Job.objects.filter(parent=table)
    assert children.count() == 2 * len(TESTS)
    assert all(child.summary and child.summary["invariant_ok"] for child in children)
    on_mariadb = [child for child in children if child.params.get("database") == URL]
    assert len(on_mariadb) == len(TESTS)
    assert all((child.summary or {})["database"].startswith("mariadb") for child in on_mariadb)
    # InnoDB's serializable takes shared locks on every read: each anomaly prevented, by a lock wait or a deadlock.
    assert all(cell["prevented"] for cell in cells["serializable"].values())
    # Its read committed lets the lost update through, as Hermitage found on MySQL.
    assert cells["read committed"]["P4"]["prevented"] is False
    left = leftover_databases(mariadb, f"{DATABASE_PREFIX}%")
    assert not [name for name in left for child in on_mariadb if name.startswith(f"{DATABASE_PREFIX}{child.pk}_")]


@pytest.mark.slow
@reads_the_table
def test_the_page_shows_both_databases_and_where_mariadb_differs_from_hermitage(table: Job, client: Client) -> None:
    client.force_login(User.objects.get_or_create(username="anomalies-viewer")[0])
    html = unescape(client.get("/anomalies/").content.decode())
    assert 'data-database="postgresql"' in html and 'data-database="mariadb"' in html
    differences = (table.summary or {})["differences"]["mariadb"]
    if differences:
        assert "MariaDB differs from Hermitage's MySQL/InnoDB row" in html
    else:
        assert "as Hermitage's MySQL/InnoDB row" in html
    for pk in [pk for row in (table.summary or {})["mariadb"].values() for cell in row.values() for pk in cell["jobs"]]:
        assert f'href="/jobs/{pk}/"' in html


def test_a_database_left_by_a_run_that_died_is_dropped_and_no_other(mariadb: Server) -> None:
    left, fresh, other = "occviz_step_999999_0badcafe", "occviz_step_999998_0badcafe", "occviz_step_notarun"
    with mariadb.connect() as conn, conn.cursor() as cursor:
        for name in (left, other):
            cursor.execute(f"CREATE DATABASE IF NOT EXISTS `{name}`")
            cursor.execute(f"CREATE TABLE IF NOT EXISTS `{name}`.test (id int PRIMARY KEY)")
    time.sleep(2.1)  # CREATE_TIME and NOW() are whole seconds: two of them make one older for sure
    with mariadb.connect() as conn, conn.cursor() as cursor:
        cursor.execute(f"CREATE DATABASE IF NOT EXISTS `{fresh}`")
        cursor.execute(f"CREATE TABLE IF NOT EXISTS `{fresh}`.test (id int PRIMARY KEY)")
    try:
        assert drop_stale_databases(mariadb, older_than_s=1) == [left]
        remaining = leftover_databases(mariadb, "occviz\\_step\\_%")
        assert left not in remaining and fresh in remaining and other in remaining
    finally:
        with mariadb.connect() as conn, conn.cursor() as cursor:
            for name in (left, fresh, other):
                cursor.execute(f"DROP DATABASE IF EXISTS `{name}`")
