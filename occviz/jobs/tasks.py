"""Jobs as django.tasks: `launch()` creates a job and enqueues it for a `db_worker`.

A job is created only if it fits: within the database's connection budget (every
queued and running job's connections, plus its own, within the connections the database
lets occviz's role open, less a reserve for the web server and workers) and within its
user's number of queued and running jobs. The reserve is honest because everything
outside the jobs is bounded within it (occviz/connections.py), so a job admitted is a
job that gets its connections. Both are checked under one PostgreSQL advisory lock held until the new
job's row commits, so two launches racing for the last room cannot both pass.
"""

from __future__ import annotations

import contextlib
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.tasks import task

from occviz.jobs.models import Job
from occviz.jobs.registry import ParamsError, program
from occviz.jobs.runner import run_job
from occviz.jobs.shards import processes_of

# Beyond its actors' sessions, a running job holds the runner's own connection, the event
# recorder's flusher's and the heartbeat's.
RUNNER_CONNECTIONS = 3
# A job over several processes holds, in each of its shards, the shard's own, its flusher's, and its
# watch's (the coordinator's heartbeat besides).
SHARD_CONNECTIONS = 3
# pg_advisory_xact_lock's key for admitting jobs (any constant no other code uses).
_ADMISSION_LOCK = 0x6F6363_6A6F62  # "occjob"
_ACTIVE = (Job.Status.QUEUED, Job.Status.RUNNING)

_max_connections: int | None = None


class LaunchRefused(ParamsError):
    """Valid parameters, but the job may not be queued now: `message` says why. Nothing was created."""

    def __init__(self, message: str) -> None:
        super().__init__({"__all__": [message]})
        self.message = message


@task
def run_job_task(job_id: int) -> str:
    return run_job(job_id).status


def connections_needed(scenario: str, params: dict[str, Any]) -> int:
    """The database connections a job of `scenario` with these cleaned parameters holds while it runs."""
    processes = processes_of(params)
    shards = 0 if processes == 1 else SHARD_CONNECTIONS * processes - 2  # the coordinator's runner already counted
    return program(scenario).connections(params) + RUNNER_CONNECTIONS + shards


def connection_budget() -> int:
    """How many connections jobs may hold at once: the database's max_connections less the reserve."""
    return database_max_connections() - settings.OCCVIZ_RESERVED_CONNECTIONS


# What this role may open: max_connections less the slots kept for superusers (and, from PostgreSQL 16,
# for roles granted pg_use_reserved_connections) unless it is one, and no more than its role's or
# its database's CONNECTION LIMIT. least() passes over the NULLs of the limits that do not apply.
_ROOM_SQL = """
SELECT least(
    current_setting('max_connections')::int - CASE WHEN r.rolsuper THEN 0 ELSE
        current_setting('superuser_reserved_connections')::int
        + coalesce(current_setting('reserved_connections', true)::int, 0) END,
    CASE WHEN r.rolsuper OR r.rolconnlimit < 0 THEN NULL ELSE r.rolconnlimit END,
    CASE WHEN r.rolsuper OR d.datconnlimit < 0 THEN NULL ELSE d.datconnlimit END)
FROM pg_roles r, pg_database d WHERE r.rolname = current_user AND d.datname = current_database()
"""


def database_max_connections() -> int:
    """OCCVIZ_DB_CONNECTIONS if set, else the connections the database lets this role open (asked once)."""
    global _max_connections
    if settings.OCCVIZ_DB_CONNECTIONS:
        return int(settings.OCCVIZ_DB_CONNECTIONS)
    if _max_connections is None:
        with connection.cursor() as cursor:
            cursor.execute(_ROOM_SQL)
            _max_connections = int(cursor.fetchone()[0])
    return _max_connections


def connections_in_use() -> int:
    """The connections queued and running jobs hold, or will once a worker takes them.

    A job's parts (children) are inside their parent's count.
    """
    used = 0
    for scenario, params in Job.objects.filter(status__in=_ACTIVE, parent=None).values_list("scenario", "params"):
        # A scenario no longer installed, or parameters it cannot read: such a job cannot run, so holds nothing.
        with contextlib.suppress(LookupError):
            used += connections_needed(scenario, params)
    return used


def _admit(scenario: str, params: dict[str, Any], user: Any) -> None:
    """Refuse (LaunchRefused) a job that would exceed its user's job limit or the connection budget.

    Call inside the transaction that creates the job, which then holds the admission lock.
    """
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_ADMISSION_LOCK])
    per_user = settings.OCCVIZ_MAX_JOBS_PER_USER
    if user is not None and user.is_authenticated:
        active = Job.objects.filter(created_by=user, status__in=_ACTIVE, parent=None).count()
        if active >= per_user:
            raise LaunchRefused(
                f"You have {active} jobs queued or running, the most one person may have at once "
                f"(the OCCVIZ_MAX_JOBS_PER_USER limit): wait for one to finish, or cancel one."
            )
    needed = connections_needed(scenario, params)
    budget = connection_budget()
    used = connections_in_use()
    if used + needed > budget:
        room = max(0, budget - used)
        raise LaunchRefused(
            f"This job needs {needed} database connections, but the database has room for {room} more connections; "
            f"running and queued jobs use {used} of the {budget} jobs may hold (max_connections "
            f"{database_max_connections()}, less {settings.OCCVIZ_RESERVED_CONNECTIONS} kept for the web "
            f"server and workers). Try fewer actors, or launch it when a job has finished."
        )


def create_job(scenario: str, data: dict[str, Any], user: Any = None, *, parent: Job | None = None) -> Job:
    """A queued job with validated parameters; ParamsError (LaunchRefused when it does not fit now), and no job made.

    A part of a running job (`parent`) is not admitted again: the parent's own admission
    counted the connections its largest part needs (its scenario's `connections`).
    """
    params = program(scenario).clean(data)
    if "processes" not in params and data.get("processes") not in (None, "", 1, "1"):
        # Its form has no such field: it cannot spread its actors over processes yet.
        raise ParamsError(
            {"processes": [f"A {scenario} job runs in one process for now: its actors share what is in its memory."]}
        )
    with transaction.atomic():
        if parent is None:
            _admit(scenario, params, user)
        return Job.objects.create(scenario=scenario, params=params, created_by=user, parent=parent)


def launch(scenario: str, data: dict[str, Any], user: Any = None) -> Job:
    """Create the job and hand it to a worker once the job row is committed."""
    with transaction.atomic():
        job = create_job(scenario, data, user)

        transaction.on_commit(lambda: run_job_task.enqueue(job.pk))
    return job
