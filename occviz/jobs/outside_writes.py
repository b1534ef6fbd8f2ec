"""Outside writes (the admin's, the API's) to a running job's objects, handed to that job.

The store announces every write and refusal (`occviz.store.writes.WriteNotice`); the
jobs app listens from start-up (apps.py). A write to an object a running job made becomes
a JobControl "outside" that the job's program records on the writer's lane. It is asked
for in the write's own transaction, the row still locked, so the job hears of the writes
to one object in the order they committed; without waiting for the answer, so a writer in a
pipeline holds the row no longer for it.
"""

from __future__ import annotations

from occviz.jobs.models import Job
from occviz.store.writes import WriteNotice


def hand_to_job(notice: WriteNotice) -> None:
    """Hand the write to the job that made the object, if it is running (a finished job's objects are just objects)."""
    if notice.owner_job is not None:
        Job.hand_over(notice.owner_job, "outside", payload=notice.payload(), user=notice.user)
