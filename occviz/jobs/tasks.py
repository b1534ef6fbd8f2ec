"""Jobs as django.tasks: `launch()` creates a job and enqueues it for a `db_worker`."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.tasks import task

from occviz.jobs.models import Job
from occviz.jobs.registry import program
from occviz.jobs.runner import run_job


@task
def run_job_task(job_id: int) -> str:
    return run_job(job_id).status


def create_job(scenario: str, data: dict[str, Any], user: Any = None) -> Job:
    """A queued job with validated parameters (ParamsError on bad input, and no job made)."""
    params = program(scenario).clean(data)
    return Job.objects.create(scenario=scenario, strategy=params.get("strategy", ""), params=params, created_by=user)


def launch(scenario: str, data: dict[str, Any], user: Any = None) -> Job:
    """Create the job and hand it to a worker once the job row is committed."""
    with transaction.atomic():
        job = create_job(scenario, data, user)

        def enqueue() -> None:
            result = run_job_task.enqueue(job.pk)
            Job.objects.filter(pk=job.pk).update(task_id=str(result.id))

        transaction.on_commit(enqueue)
    return job
