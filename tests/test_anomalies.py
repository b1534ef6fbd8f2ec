"""Hermitage's table, measured on the real PostgreSQL: every cell computed from a step-mode job that really ran.

The whole table is run once (module scope): 42 scripts, each a step job on fresh rows.
Its PostgreSQL row must equal the one Hermitage published; each cell's verdict is checked
against the run it links to (the rows the read returned, the SQLSTATE the database gave).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client

from occviz.jobs.models import Job
from occviz.jobs.runner import run_job
from occviz.jobs.tasks import create_job
from occviz.steps.builtin import scripts
from occviz.steps.hermitage import ANOMALIES, LEVELS, PUBLISHED, TESTS, scripts_of_cell

# The table's tests only read the job the module ran once (outside their transactions); the others run jobs.
reads_the_table = pytest.mark.django_db
runs_jobs = pytest.mark.django_db(transaction=True)

HERMITAGE_POSTGRESQL = {
    "read committed": {a: a in ("G0", "G1a", "G1b", "G1c", "OTV") for a in ANOMALIES},
    "repeatable read": {a: a not in ("G2-item", "G2") for a in ANOMALIES},
    "serializable": dict.fromkeys(ANOMALIES, True),
}
"""Hermitage's published PostgreSQL row, as the issue states it: prevented (True) or not."""


def run_table(**params: Any) -> Job:
    job = run_job(create_job("anomalies", params).pk)
    assert job.status == Job.Status.SUCCEEDED, job.error
    assert job.summary is not None
    return job


@pytest.fixture(scope="module")
def table(django_db_setup: None, django_db_blocker: Any) -> Iterator[Job]:
    with django_db_blocker.unblock():
        job = run_table()
        yield job
        Job.objects.filter(parent=job).delete()
        job.delete()


def step_of(child: Job, line: int) -> dict[str, Any]:
    (found,) = [step for step in (child.summary or {})["steps"] if step["line"] == line]
    return dict(found)


# -- the scripts ---------------------------------------------------------------------------


def test_every_test_has_a_script_at_each_level_in_the_step_registry() -> None:
    registry = scripts()
    for level in LEVELS:
        for anomaly in ANOMALIES:
            found = scripts_of_cell(anomaly, level)
            assert found, f"{anomaly} at {level}"
            assert all(test.name in registry for test in found)
    assert "hermitage-g-single-repeatable-read" in registry
    assert {"hermitage-pmp-write-serializable", "hermitage-g-single-predicate-read-committed"} <= registry.keys()
    assert {"hermitage-g-single-write-serializable", "hermitage-g2-two-edges-serializable"} <= registry.keys()
    assert len(TESTS) == 14 * 3


def test_a_check_decides_from_the_steps_both_ways() -> None:
    """The P4 check: both commits after both updates is a lost update; a 40001 on T2's update prevents it."""
    test = TESTS["hermitage-p4-read-committed"]

    def steps(t2_update: dict[str, Any]) -> list[dict[str, Any]]:
        ok = {"outcome": "ok", "rows": None}
        return [
            {"actor": "T1", "line": 1, **ok},
            {"actor": "T2", "line": 2, **ok},
            {"actor": "T1", "line": 3, **ok, "rows": [{"id": 1, "value": 10, "version": 1}]},
            {"actor": "T2", "line": 4, **ok, "rows": [{"id": 1, "value": 10, "version": 1}]},
            {"actor": "T1", "line": 5, **ok},
            {"actor": "T2", "line": 6, "blocked_by": ["T1"], **t2_update},
            {"actor": "T1", "line": 7, **ok},
            {"actor": "T2", "line": 8, **ok},
        ]

    lost = test.judge(steps({"outcome": "blocked", "then": "ok", "rows": None}), {"1": 11, "2": 20})
    assert lost["prevented"] is False and "both committed" in lost["how"]
    refused = {"outcome": "blocked", "then": "error", "sqlstate": "40001", "message": "could not serialize access"}
    prevented = test.judge(steps(refused), {"1": 11, "2": 20})
    assert prevented["prevented"] is True
    assert prevented["how"].startswith("aborted with 40001: T2 on line 6")


@runs_jobs
def test_in_written_order_a_blocked_actor_holds_up_only_its_own_lines() -> None:
    """As Hermitage's scripts are run by hand: T2's commit waits for T2's blocked update, T1's commit does not."""
    text = "T1: begin\nT1: update test set value = 11 where id = 1\nT2: update test set value = 12 where id = 1\n"
    text += "T2: commit\nT1: commit\n"
    job = run_job(create_job("step", {"text": text, "pace": "written order", "lock_timeout": 5}).pk)
    summary = job.summary or {}
    taken = [(step["actor"], step["line"], step["outcome"], step.get("then")) for step in summary["steps"]]
    assert taken == [
        ("T1", 1, "ok", None),
        ("T1", 2, "ok", None),
        ("T2", 3, "blocked", "ok"),
        ("T1", 5, "ok", None),
        ("T2", 4, "ok", None),
    ]
    assert summary["final"] == {"1": 12, "2": 20}


# -- the whole table on PostgreSQL -------------------------------------------------------------


@pytest.mark.slow
@reads_the_table
def test_the_postgresql_table_equals_hermitages_published_row(table: Job) -> None:
    summary = table.summary or {}
    rows = summary["postgresql"]
    measured = {level: {anomaly: cell["prevented"] for anomaly, cell in row.items()} for level, row in rows.items()}
    assert measured == HERMITAGE_POSTGRESQL
    assert sum(len(row) for row in summary["postgresql"].values()) == 30
    assert summary["invariant_ok"], summary["invariant"]
    assert summary["differences"] == {"postgresql": []}
    # The published row the code holds is the too.
    assert {lvl: {a: m == "✓" for a, m in row.items()} for lvl, row in PUBLISHED["postgresql"].items()} == measured


@pytest.mark.slow
@reads_the_table
def test_each_cell_links_to_the_step_jobs_that_decided_it(table: Job) -> None:
    summary = table.summary or {}
    children = {job.pk: job for job in Job.objects.filter(parent=table)}
    linked = [pk for row in summary["postgresql"].values() for cell in row.values() for pk in cell["jobs"]]
    assert sorted(linked) == sorted(children), "every run is a step job of this table, each in one cell"
    assert len(linked) == len(TESTS)
    for level, row in summary["postgresql"].items():
        for anomaly, cell in row.items():
            for variant, pk in zip(cell["variants"], cell["jobs"], strict=True):
                child = children[pk]
                assert child.scenario == "step" and child.status == Job.Status.SUCCEEDED
                assert child.params["script"] == variant["script"] and child.params["isolation"] == level
                assert child.summary and child.summary["invariant_ok"], child.summary
                assert variant["script"] in {test.name for test in scripts_of_cell(anomaly, level)}


@pytest.mark.slow
@reads_the_table
def test_how_each_prevention_happened_is_what_postgresql_did(table: Job) -> None:
    cells = (table.summary or {})["postgresql"]
    children = {job.pk: job for job in Job.objects.filter(parent=table)}

    # G0 at read committed: T2's write waited for T1's lock, then went on.
    g0 = cells["read committed"]["G0"]
    assert g0["how"].startswith("blocked then resolved: T2 waited for T1 on line 4, then went on")
    assert step_of(children[g0["jobs"][0]], 4)["blocked_by"] == ["T1"]

    # P4 at repeatable read: T2's update blocked, then PostgreSQL refused it with 40001.
    p4 = cells["repeatable read"]["P4"]
    assert p4["how"].startswith("aborted with 40001: T2 on line 6")
    refused = step_of(children[p4["jobs"][0]], 6)
    assert (refused["outcome"], refused["then"], refused["sqlstate"]) == ("blocked", "error", "40001")
    assert children[p4["jobs"][0]].summary["final"] == {"1": 11, "2": 20}  # type: ignore[index]

    # G2-item at serializable: the second commit is refused (SSI), 40001.
    g2_item = cells["serializable"]["G2-item"]
    assert "aborted with 40001: T2" in g2_item["how"]

    # G1a at every level: nothing blocks, the reads show the committed value only.
    g1a = cells["serializable"]["G1a"]
    assert g1a["how"].startswith("the reads showed no anomaly: T2 read 1 => 10, 2 => 20 (line 4)")


@pytest.mark.slow
@reads_the_table
def test_an_anomaly_that_occurs_names_the_read_that_shows_it(table: Job) -> None:
    cells = (table.summary or {})["postgresql"]
    children = {job.pk: job for job in Job.objects.filter(parent=table)}

    basic, predicate, write = cells["read committed"]["G-single"]["variants"]
    assert basic["how"].startswith("T1 read 1 => 10 (line 3) before T2, then T1 read 2 => 18 (line 9)")
    assert step_of(children[basic["job"]], 9)["rows"] == [{"id": 2, "value": 18, "version": 1}]
    assert predicate["prevented"] is False and write["prevented"] is False

    pmp = cells["read committed"]["PMP"]["variants"][0]
    assert pmp["how"].startswith("T1 read 3 => 30 (line 6)")
    assert cells["repeatable read"]["G2"]["mark"] == "—"

    lost = cells["read committed"]["P4"]
    assert "both committed" in lost["how"]
    assert children[lost["jobs"][0]].summary["lost_updates"] == 1  # type: ignore[index]


@pytest.mark.slow
@reads_the_table
def test_the_page_shows_the_table_with_its_links(table: Job, client: Client) -> None:
    client.force_login(User.objects.get_or_create(username="anomalies-viewer")[0])
    page = client.get("/anomalies/")
    assert page.status_code == 200
    html = page.content.decode()
    for pk in [pk for row in table.summary["postgresql"].values() for cell in row.values() for pk in cell["jobs"]]:  # type: ignore[index]
        assert f'href="/jobs/{pk}/"' in html
    assert "Hermitage's published rows" in html and "MySQL/InnoDB" in html
    assert 'data-database="postgresql"' in html and f'href="/jobs/{table.pk}/"' in html
    assert 'action="/jobs/new/anomalies/"' in html, "a button launches a new table"
    assert 'href="/anomalies/"' in html, "the site's navigation links the page"
    job_page = client.get(f"/jobs/{table.pk}/")
    assert job_page.status_code == 200 and 'data-anomaly="G-single"' in job_page.content.decode()
    assert "30 of 30 cells measured" in job_page.content.decode(), "the last snapshot holds the last cell"


# -- headless and bad input -------------------------------------------------------------------


@pytest.mark.slow
@runs_jobs
def test_runjob_anomalies_json_prints_the_cells_asked_for(run_manage) -> None:  # type: ignore[no-untyped-def]
    result = run_manage("runjob", "anomalies", "--anomalies", "P4", "g1a", "--levels", "read-committed", "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert list(summary["postgresql"]) == ["read committed"]
    cells = summary["postgresql"]["read committed"]
    assert list(cells) == ["G1a", "P4"]
    assert cells["P4"]["prevented"] is False and cells["G1a"]["prevented"] is True
    assert cells["P4"].keys() >= {"prevented", "how", "jobs"}
    assert summary["invariant_ok"] and "mariadb" not in summary and "mysql" not in summary


@runs_jobs
def test_a_mysql_server_that_does_not_answer_is_reported_and_postgresql_still_measured(settings: Any) -> None:
    settings.OCCVIZ_MYSQL_URLS = ["mysql://root@127.0.0.1:1/"]  # nothing listens on port 1
    job = run_table(anomalies="P4", levels="read-committed", database="mysql://root@127.0.0.1:1/")
    summary = job.summary or {}
    assert summary["mysql"]["error"].startswith("mysql://root@127.0.0.1:1/ did not answer")
    assert summary["postgresql"]["read committed"]["P4"]["prevented"] is False
    assert summary["invariant_ok"] and "did not answer" in summary["invariant"]
    assert Job.objects.filter(parent=job).count() == 1, "only PostgreSQL's run"


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["step", "--database", "mysql://root@db.example.org:3306/"], "OCCVIZ_MYSQL_URLS"),
        (["step", "--database", "postgresql://127.0.0.1/"], "is not a mysql:// URL"),
        (["anomalies", "--database", "mysql://root@127.0.0.1:3307/"], "OCCVIZ_MYSQL_URLS"),
        (["anomalies", "--database", "mysql://root@127.0.0.1:3306/occviz"], "give the server only"),
        (["anomalies", "--anomalies", "G3"], "'G3' is not one of Hermitage's anomalies"),
        (["anomalies", "--levels", "snapshot"], "'snapshot' is not a level"),
    ],
)
@runs_jobs
def test_a_bad_database_or_cell_is_refused_and_nothing_runs(flags: list[str], said: str) -> None:
    before = Job.objects.count()
    with pytest.raises(CommandError, match="invalid job") as refused:
        call_command("runjob", *flags, "--json")
    assert said in str(refused.value)
    assert Job.objects.count() == before


@runs_jobs
def test_the_allowed_servers_come_from_the_setting(settings: Any) -> None:
    settings.OCCVIZ_MYSQL_URLS = ["mysql://root@127.0.0.1:3307/"]
    with pytest.raises(CommandError, match=r"OCCVIZ_MYSQL_URLS may be given \(now: mysql://root@127.0.0.1:3307/\)"):
        call_command("runjob", "step", "--database", "mysql://root@127.0.0.1:3306/", "--json")
