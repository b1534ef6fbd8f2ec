"""Limits that hold: bounded numbers in ASCII digits, a duration is a deadline, a connection budget, jobs per user."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django import forms
from django.contrib.auth.models import User
from django.db import connection, connections, transaction
from django.test import Client
from django_tasks_db.models import DBTaskResult

from occviz.concurrency.retry import LONGEST_WAIT_MS, RetryPolicy, make_policy
from occviz.jobs.models import Event, Job
from occviz.jobs.runner import run_job
from occviz.jobs.tasks import LaunchRefused, create_job
from occviz.scenarios import SCENARIOS
from occviz.scenarios.base import DecimalNumberField, WholeNumberField
from occviz.store.models import Counter
from tests.helpers import events, run_counter

# Digits int() and float() read as numbers ("\u0663" is 3), which occviz refuses.
ARABIC_0, ARABIC_1, ARABIC_3 = "\u0660", "\u0661", "\u0663"  # ARABIC-INDIC DIGIT ZERO, ONE, THREE
FULLWIDTH_0, FULLWIDTH_3 = "\uff10", "\uff13"
EXPONENTIAL = {"strategy": "occ", "writers": "4", "increments": "10", "retry": "exponential"}


# -- bounded parameters ---------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("field", "value"),
    [("base_ms", "1e300"), ("factor", "1e10"), ("cap_ms", "1e300"), ("base_ms", "60001"), ("factor", "10.5")],
)
def test_the_form_refuses_retry_settings_that_overflowed(signed_in: Client, field: str, value: str) -> None:
    response = signed_in.post("/jobs/new/counter/", {**EXPONENTIAL, field: value})
    assert response.status_code == 400
    html = response.content.decode()
    error_at = html.index(f'id="id_{field}_error"')
    assert "Ensure this value is less than or equal to" in html[error_at : error_at + 300]
    assert not Job.objects.exists()
    assert not DBTaskResult.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_runjob_refuses_retry_settings_that_overflowed(run_manage: Any) -> None:
    result = run_manage(
        "runjob",
        "counter",
        "--strategy",
        "occ",
        "--retry",
        "exponential",
        "--base-ms",
        "1e300",
        "--factor",
        "1e10",
        "--cap-ms",
        "1e300",
        "--json",
    )
    assert result.returncode == 2, result.stderr
    assert f"--base-ms: Ensure this value is less than or equal to {LONGEST_WAIT_MS}." in result.stderr
    assert "--factor: Ensure this value is less than or equal to 10." in result.stderr
    assert f"--cap-ms: Ensure this value is less than or equal to {LONGEST_WAIT_MS}." in result.stderr
    assert not Job.objects.exists()


def test_a_retry_wait_never_overflows_whatever_the_attempt() -> None:
    # The largest base and factor, no cap, the millionth attempt: the ceiling, not an OverflowError.
    policy = make_policy("exponential", 1_000_000, base_ms=LONGEST_WAIT_MS, factor=10, cap_ms=0)
    assert policy.bounds_ms(999_999) == (0.0, LONGEST_WAIT_MS)
    assert make_policy("exponential", 2_000, base_ms=0.001, factor=1.5, cap_ms=250).bounds_ms(1_999) == (0.0, 250)
    assert make_policy("exponential", base_ms=10, factor=2, cap_ms=0).bounds_ms(3) == (0.0, 40)


@pytest.mark.parametrize(
    "options",
    [{"base_ms": 1e300}, {"factor": 1e10}, {"cap_ms": float("inf")}, {"factor": float("nan")}, {"base_ms": -1.0}],
)
def test_a_retry_policy_refuses_what_it_cannot_wait(options: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be from"):
        RetryPolicy("exponential", 10, **options)


def _numeric_fields() -> list[tuple[str, str]]:
    return [
        (spec.name, name)
        for spec in SCENARIOS.values()
        for name, field in spec.form_class.base_fields.items()
        if isinstance(field, forms.IntegerField)  # Django's FloatField is one too
    ]


@pytest.mark.parametrize(("scenario", "name"), _numeric_fields())
def test_every_number_of_every_scenario_is_bounded_and_ascii(scenario: str, name: str) -> None:
    field = SCENARIOS[scenario].form_class.base_fields[name]
    assert isinstance(field, WholeNumberField | DecimalNumberField)
    bounded_by_setting = {"writers", "workers", "increments", "seconds", "rows", "think_ms", "max_attempts"}
    assert getattr(field, "max_value", None) is not None or name in bounded_by_setting, f"{scenario} {name}"
    assert getattr(field, "min_value", None) is not None, f"{scenario} {name}"


# -- ASCII digits ---------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("scenario", "data", "field"),
    [
        ("counter", {**EXPONENTIAL, "writers": ARABIC_3}, "writers"),
        ("counter", {**EXPONENTIAL, "writers": FULLWIDTH_3}, "writers"),
        ("counter", {**EXPONENTIAL, "think_ms": ARABIC_1 + ".5"}, "think_ms"),
        ("counter", {**EXPONENTIAL, "base_ms": "2" + FULLWIDTH_0}, "base_ms"),
        ("leader-election", {"replicas": ARABIC_3}, "replicas"),
        ("leader-election", {"replicas": "3", "seconds": ARABIC_3 + ARABIC_0}, "seconds"),
    ],
)
def test_numbers_in_other_digits_are_refused(
    signed_in: Client, scenario: str, data: dict[str, str], field: str
) -> None:
    response = signed_in.post(f"/jobs/new/{scenario}/", data)
    assert response.status_code == 400
    html = response.content.decode()
    error_at = html.index(f'id="id_{field}_error"')
    assert "Write the number with the digits 0-9" in html[error_at : error_at + 300]
    assert not Job.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("query", [f"after={ARABIC_3}", f"limit={FULLWIDTH_3}", f"after=1&limit={ARABIC_1}{ARABIC_0}"])
def test_events_json_refuses_other_digits(signed_in: Client, alice: User, query: str) -> None:
    job = Job.objects.create(scenario="counter", params={"strategy": "occ", "writers": 1}, created_by=alice)
    response = signed_in.get(f"/jobs/{job.pk}/events.json?{query}")
    assert response.status_code == 400
    assert "in the digits 0-9" in response.json()["error"]


@pytest.mark.django_db
def test_compare_refuses_other_digits(signed_in: Client) -> None:
    assert signed_in.get(f"/jobs/compare/?ids={ARABIC_1},{ARABIC_3}").status_code == 400


# -- the duration is a deadline -------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_3_s_job_with_1_s_retry_waits_ends_by_4_s() -> None:
    job = run_counter(
        strategy="occ",
        writers=12,
        seconds=3,
        think_ms=20,
        retry="exponential",
        base_ms=1000,
        factor=2,
        cap_ms=LONGEST_WAIT_MS,
        max_attempts=1000,
        seed=3,
    )
    summary = job.summary
    assert job.status == Job.Status.SUCCEEDED, job.error
    assert summary["duration_s"] <= 4.0
    assert summary["stopped_by"] == "time limit"
    assert summary["invariant_ok"] is True
    assert summary["conflicts"] > 0 and summary["retries"] > 0
    # The time ran out on writers waiting to retry, longer than the job had left: the wait was cut.
    last: dict[int, Any] = {}
    for event in events(job):
        last[event.actor] = event
    cut = [event for event in last.values() if event.kind == "retry" and event.t_ms + event.duration_ms > 3_000]
    assert cut, "some writer must have been waiting past the end when the time ran out"
    assert max(event.t_ms for event in events(job)) <= 3_100


@pytest.mark.django_db(transaction=True)
def test_a_3_s_pessimistic_job_ends_by_4_s_however_long_the_lock_queue() -> None:
    # A session outside the job takes the row's lock as soon as the row exists, and keeps it until a writer
    # has given up waiting (8 s at most): every writer queues behind it. (A holder inside the job would let
    # go at the deadline itself, racing its waiters' timeouts.) The job's settling waits for the lock too.
    job = create_job("counter", {"strategy": "pessimistic", "writers": 6, "seconds": 3, "max_attempts": 1000})
    held = threading.Event()

    def hold() -> None:
        try:
            deadline = time.monotonic() + 10
            while not Counter.objects.filter(job_id=job.pk).exists() and time.monotonic() < deadline:
                time.sleep(0.002)
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT id FROM store_counter WHERE job_id = %s FOR UPDATE", [job.pk])
                held.set()
                given_up = Event.objects.filter(job_id=job.pk, kind="lock_timeout")
                give_up = time.monotonic() + 8
                while time.monotonic() < give_up and not given_up.exists():
                    time.sleep(0.02)
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        job = run_job(job.pk)
    finally:
        holder.join()
    assert held.is_set(), "the outside session never took the row's lock"
    assert job.status == Job.Status.SUCCEEDED, job.error
    assert job.summary["duration_s"] <= 4.0
    assert job.summary["invariant_ok"] is True
    assert job.summary["lock_timeouts"] > 0, "the writers queued on the lock stop waiting at the deadline"


@pytest.mark.django_db(transaction=True)
def test_a_job_of_increments_ends_by_the_longest_a_job_may_run(settings: Any) -> None:
    settings.OCCVIZ_MAX_SECONDS = 2
    job = run_counter(
        strategy="occ",
        writers=8,
        increments=10,
        think_ms=100,
        retry="exponential",
        base_ms=1000,
        factor=2,
        cap_ms=LONGEST_WAIT_MS,
        max_attempts=1000,
    )
    assert job.summary["duration_s"] <= 3.0
    assert job.summary["stopped_by"] == "time limit"
    assert job.summary["invariant_ok"] is True


# -- the connection budget ------------------------------------------------------------------------

TEN_WRITERS = {"strategy": "occ", "writers": "10", "increments": "10", "retry": "k8s-default-backoff"}


@pytest.fixture
def budget_of_20(settings: Any) -> None:
    """A database of 40 connections, 20 kept back: jobs may hold 20 (a 10-writer job holds 13)."""
    settings.OCCVIZ_DB_CONNECTIONS = 40
    settings.OCCVIZ_RESERVED_CONNECTIONS = 20


@pytest.mark.django_db
def test_a_launch_beyond_the_connection_budget_is_refused_with_why(
    signed_in: Client, budget_of_20: None, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        assert signed_in.post("/jobs/new/counter/", TEN_WRITERS).status_code == 302
        response = signed_in.post("/jobs/new/counter/", TEN_WRITERS)
    assert response.status_code == 400
    html = response.content.decode()
    assert (
        "This job needs 13 database connections, but the database has room for 7 more connections; "
        "running and queued jobs use 13 of the 20 jobs may hold (max_connections 40, less 20 kept"
    ) in html
    assert "too many clients" not in html
    assert "Nothing was launched." in html and "correct the fields" not in html
    assert Job.objects.count() == 1
    assert DBTaskResult.objects.count() == 1
    # A smaller job fits in what is left.
    assert signed_in.post("/jobs/new/counter/", {**TEN_WRITERS, "writers": "4"}).status_code == 302


@pytest.mark.django_db
def test_a_finished_job_gives_its_connections_back(budget_of_20: None) -> None:
    first = create_job("counter", TEN_WRITERS)
    with pytest.raises(LaunchRefused):
        create_job("counter", TEN_WRITERS)
    Job.objects.filter(pk=first.pk).update(status=Job.Status.SUCCEEDED)
    create_job("counter", TEN_WRITERS)


@pytest.mark.django_db
def test_a_leader_election_counts_its_replicas_and_room_for_added_ones(budget_of_20: None) -> None:
    create_job("leader-election", {"replicas": 10})  # 10 + 4 added + 3 of the runner's = 17
    with pytest.raises(LaunchRefused, match="needs 6 database connections, but the database has room for 3 more"):
        create_job("counter", {**TEN_WRITERS, "writers": 3})


@pytest.mark.django_db(transaction=True)
def test_runjob_beyond_the_budget_is_refused_and_creates_nothing(run_manage: Any) -> None:
    result = run_manage(
        "runjob",
        "counter",
        "--strategy",
        "occ",
        "--writers",
        "30",
        "--json",
        env={"OCCVIZ_DB_CONNECTIONS": "40", "OCCVIZ_RESERVED_CONNECTIONS": "20"},
    )
    assert result.returncode == 2, result.stderr
    assert "This job needs 33 database connections, but the database has room for 20 more connections" in (
        result.stderr
    )
    assert not Job.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_launches_racing_for_the_last_room_never_both_pass(budget_of_20: None) -> None:
    racers = 8
    barrier = threading.Barrier(racers)
    outcomes: list[str] = []

    def launch() -> None:
        try:
            barrier.wait()
            create_job("counter", TEN_WRITERS)
            outcomes.append("created")
        except LaunchRefused:
            outcomes.append("refused")
        finally:
            connections.close_all()

    threads = [threading.Thread(target=launch) for _ in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(outcomes) == ["created"] + ["refused"] * (racers - 1)
    assert Job.objects.count() == 1


def test_the_default_budget_is_the_database_max_connections_less_the_reserve(db: None, settings: Any) -> None:
    from django.db import connection

    from occviz.jobs.tasks import connection_budget

    with connection.cursor() as cursor:
        cursor.execute("SHOW max_connections")
        max_connections = int(cursor.fetchone()[0])
    settings.OCCVIZ_DB_CONNECTIONS = 0
    assert connection_budget() == max_connections - settings.OCCVIZ_RESERVED_CONNECTIONS


# -- jobs per user --------------------------------------------------------------------------------


@pytest.fixture
def two_jobs_each(settings: Any) -> None:
    settings.OCCVIZ_MAX_JOBS_PER_USER = 2


@pytest.mark.django_db
def test_a_user_beyond_their_queued_and_running_jobs_is_refused(
    signed_in: Client, alice: User, two_jobs_each: None
) -> None:
    first = create_job("counter", TEN_WRITERS, alice)
    Job.objects.filter(pk=first.pk).update(status=Job.Status.RUNNING)
    create_job("counter", TEN_WRITERS, alice)
    response = signed_in.post("/jobs/new/counter/", TEN_WRITERS, headers={"HX-Request": "true"})
    assert response.status_code == 200  # htmx swaps only 2xx: the form comes back with the reason
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="launch">')
    assert (
        "You have 2 jobs queued or running, the most one person may have at once "
        "(the OCCVIZ_MAX_JOBS_PER_USER limit): wait for one to finish, or cancel one."
    ) in html
    assert Job.objects.count() == 2
    # Another person is not held back by alice's jobs; a finished job frees alice's place.
    bob = User.objects.create_user("bob", password="correct horse battery")
    create_job("counter", TEN_WRITERS, bob)
    Job.objects.filter(pk=first.pk).update(status=Job.Status.CANCELLED)
    assert signed_in.post("/jobs/new/counter/", TEN_WRITERS).status_code == 302


@pytest.mark.django_db
def test_staff_have_the_same_limit(client: Client, two_jobs_each: None) -> None:
    boss = User.objects.create_user("boss", password="correct horse battery", is_staff=True, is_superuser=True)
    client.force_login(boss)
    for _ in range(2):
        create_job("counter", TEN_WRITERS, boss)
    response = client.post("/jobs/new/counter/", TEN_WRITERS)
    assert response.status_code == 400
    assert "OCCVIZ_MAX_JOBS_PER_USER" in response.content.decode()


@pytest.mark.django_db
def test_jobs_without_a_user_have_no_per_user_limit(two_jobs_each: None) -> None:
    for _ in range(3):
        create_job("counter", {**TEN_WRITERS, "writers": 1})
    assert Job.objects.count() == 3
