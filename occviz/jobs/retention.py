"""Retention: the events of jobs that finished long ago are deleted; the jobs themselves stay.

A busy job stores tens of megabytes of events a minute (README: Disk use). `prune_events`
deletes the EventBatch rows of jobs that finished more than OCCVIZ_KEEP_DAYS days ago, a
limited number of rows per transaction so that no delete holds locks or piles up WAL for
long. The Job row keeps its summary, verdict and `last_seq`; `events_pruned_at` says when
its events went, so its page says so and events.json and the exports answer 410 Gone.

Called by `manage.py prune` and once a day by `serve`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from occviz.jobs.models import EventBatch, Job

logger = logging.getLogger(__name__)

# EventBatch rows deleted per transaction. A row is one flush, a tenth of a second of a job's
# events: 500 are under a minute of a busy job, a short transaction with little WAL.
DELETE_ROWS = 500


@dataclass
class PruneResult:
    """What a prune did (or, a dry run, would do)."""

    days: int
    """Events of jobs finished more than this many days ago; 0: nothing is pruned."""
    cutoff: datetime | None
    dry_run: bool = False
    jobs: list[int] = field(default_factory=list)
    batches: int = 0
    events: int = 0

    def __str__(self) -> str:
        if self.cutoff is None:
            return "Nothing pruned: events are kept for ever (OCCVIZ_KEEP_DAYS=0)."
        verb = "Would prune" if self.dry_run else "Pruned"
        return (
            f"{verb} the events of {len(self.jobs)} job{'s' * (len(self.jobs) != 1)} finished before "
            f"{self.cutoff:%Y-%m-%d %H:%M} UTC ({self.days} days): {self.events} events in {self.batches} batches."
        )


def prunable_jobs(cutoff: datetime) -> list[int]:
    """Finished before `cutoff` and not yet pruned, or pruned by a run that was interrupted."""
    has_events = Exists(EventBatch.objects.filter(job_id=OuterRef("pk")))
    return list(
        Job.objects.filter(status__in=Job.FINISHED, finished_at__lt=cutoff)
        .filter(Q(events_pruned_at=None) | Q(has_events))
        .order_by("id")
        .values_list("id", flat=True)
    )


def prune_events(days: int | None = None, *, dry_run: bool = False) -> PruneResult:
    """Delete the events of jobs finished more than `days` (default OCCVIZ_KEEP_DAYS) days ago.

    Each job is marked `events_pruned_at` before its events go, so a reader never takes a
    half-deleted job for a whole one; a prune that is interrupted is finished by the next.
    """
    keep = settings.OCCVIZ_KEEP_DAYS if days is None else days
    if keep < 0:
        raise ValueError(f"days must be 0 (keep for ever) or more, not {keep}")
    if keep == 0:
        return PruneResult(0, None, dry_run)
    cutoff = timezone.now() - timedelta(days=keep)
    result = PruneResult(keep, cutoff, dry_run)
    for job_id in prunable_jobs(cutoff):
        if dry_run:
            batches, events = _count(job_id)
        else:
            Job.objects.filter(pk=job_id, events_pruned_at=None).update(events_pruned_at=timezone.now())
            batches, events = _delete_events(job_id)
        result.jobs.append(job_id)
        result.batches += batches
        result.events += events
    if result.jobs and not dry_run:
        logger.info("%s", result)
    return result


def _count(job_id: int) -> tuple[int, int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*), coalesce(sum(seq_to - seq_from + 1), 0) FROM jobs_eventbatch WHERE job_id = %s",
            [job_id],
        )
        batches, events = cursor.fetchone()
    return int(batches), int(events)


def _delete_events(job_id: int) -> tuple[int, int]:
    """Delete the job's EventBatch rows, DELETE_ROWS per transaction; (rows, events) deleted."""
    batches = events = 0
    while True:
        # (job, seq_to) is indexed (the batches' unique constraint): each round finds its rows at once.
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "DELETE FROM jobs_eventbatch WHERE id IN "
                "(SELECT id FROM jobs_eventbatch WHERE job_id = %s ORDER BY seq_to LIMIT %s) "
                "RETURNING seq_to - seq_from + 1",
                [job_id, DELETE_ROWS],
            )
            deleted = [row[0] for row in cursor.fetchall()]
        batches += len(deleted)
        events += sum(deleted)
        if len(deleted) < DELETE_ROWS:
            return batches, events
