"""A job's shards, on its page and its replay: which process runs which actors, where, and how each is doing.

Only a job over several processes (`processes` > 1) has one. The table is read from the
shards' rows (occviz.jobs.shards keeps them); while the job runs, either page asks the job
page for it again every second, so a shard's status and heartbeat change on it as they do in the rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import DurationField, ExpressionWrapper, F
from django.db.models.functions import Now
from django.urls import reverse

from occviz.jobs.models import Job, JobShard
from occviz.jobs.shards import heartbeat_timeout_s, processes_of
from occviz.scenarios.base import Scenario


@dataclass(frozen=True)
class ShardRow:
    index: int
    kind: str
    """What runs it: "worker" (a `manage.py worker`), "runjob", "runshard" (a child of runjob or of a worker)."""
    host: str
    pid: int | None
    actors: str
    """"writers 1-2" (an en dash), "writer 3"."""
    status: str
    why: str
    """Why it failed or was stopped, when that is more than the word of its status ("" otherwise)."""
    heartbeat_s: float | None
    """How long ago its heartbeat was renewed, on PostgreSQL's clock (None: not yet claimed)."""
    late: bool
    """Running, with a heartbeat older than a shard may go without (its process died or stopped; it fails soon)."""
    ended_s: float | None
    """When it ended, in seconds from the job's start (None: not ended, or the job has no start)."""


def _actors(spec: Scenario | None, first: int, last: int) -> str:
    noun = spec.actor_noun if spec else "actor"
    return f"{noun} {first}" if first == last else f"{noun}s {first}\u2013{last}"


# What a shard stopped because another did, or the job was cancelled, says: its status says as much.
_PLAIN_REASONS = ("", "cancelled", "stopped", "ended elsewhere", "failed")


def _why(shard: JobShard) -> str:
    if shard.status == JobShard.Status.FAILED or (
        shard.status == JobShard.Status.STOPPED and shard.error not in _PLAIN_REASONS
    ):
        return shard.error or "no reason given"
    return ""


def shard_table(job: Job, spec: Scenario | None) -> dict[str, Any] | None:
    """The table's context ("rows", "processes", "live", "actors_title", "url"), or None for a job in one process.

    "url" is the job page's, which renders the table alone for an htmx request that targets it.
    """
    processes = processes_of(job.params)
    if processes <= 1:
        return None
    age = ExpressionWrapper(Now() - F("heartbeat_at"), output_field=DurationField())
    rows = []
    timeout = heartbeat_timeout_s()
    for shard in JobShard.objects.filter(job=job).annotate(age=age).order_by("index"):
        # On the replay's clock: from the release of the actors (every event's t_ms counts from there).
        start = job.released_at or job.started_at
        ended = (shard.finished_at - start).total_seconds() if shard.finished_at and start else None
        rows.append(
            ShardRow(
                index=shard.index,
                kind=shard.runner.split(":", 1)[0] if shard.runner else "",
                host=shard.host,
                pid=shard.pid,
                actors=_actors(spec, shard.first_actor, shard.last_actor),
                status=shard.status,
                why=_why(shard),
                heartbeat_s=shard.age.total_seconds() if shard.age is not None else None,
                late=shard.status == JobShard.Status.RUNNING
                and shard.age is not None
                and shard.age.total_seconds() > timeout,
                ended_s=max(0.0, ended) if ended is not None else None,
            )
        )
    noun = spec.actor_noun if spec else "actor"
    return {
        "rows": rows,
        "processes": processes,
        "live": not job.is_finished,
        "actors_title": f"{noun}s".capitalize(),
        "url": reverse("job_detail", args=[job.pk]),
    }
