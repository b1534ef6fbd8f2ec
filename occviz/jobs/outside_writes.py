"""Outside writes (the admin's, the API's, a student's press) to a running job's objects, handed to that job.

The store runs its listeners' statements inside every write's own (`occviz.store.statements`);
the jobs app listens from start-up (apps.py). A write to an object a running job made becomes
a JobControl "outside", its payload the write as the store describes it, that the job's
program records on the writer's lane. It is stored by the write's own statement, the row
locked, so the job hears of the writes to one object in the order they committed, and a
writer holds the row for no statement of the job's.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db.backends.base.base import BaseDatabaseWrapper

from occviz.jobs.models import control_statements


def hand_to_job(connection: BaseDatabaseWrapper) -> Sequence[tuple[str, str]]:
    """Hand the write to the job that made the object, if it is running (a finished job's objects are just objects)."""
    values = {
        "action": "'outside'",
        "actor": "NULL",
        "seconds": "NULL",
        "payload": '"notice"."payload"',
        "requested_by": '"notice"."user_id"',
        "requested_at": '"notice"."at"',
        "applied_at": "NULL",
        "outcome": "''",
    }
    return control_statements(connection, '"notice"."owner_job"', values, source="notice", moved="handed_to_job")
