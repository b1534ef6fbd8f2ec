"""Small helpers for the engine tests: run a counter job in this process and read what it stored."""

from __future__ import annotations

from typing import Any

from occviz.jobs.models import Event, Job
from occviz.jobs.runner import run_job
from occviz.jobs.tasks import create_job
from occviz.store.models import Counter


def run_counter(user: Any = None, **params: Any) -> Job:
    """Create and run a counter race to its end, in this process (actors are threads here)."""
    job = create_job("counter", params, user)
    return run_job(job.pk)


def events(job: Job, *kinds: str) -> list[Event]:
    queryset = Event.objects.filter(job=job).order_by("seq")
    if kinds:
        queryset = queryset.filter(kind__in=kinds)
    return list(queryset)


def rows_of(job: Job) -> list[Counter]:
    return list(Counter.objects.filter(job=job).order_by("pk"))
