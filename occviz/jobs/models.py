"""Jobs and the events they record.

A job is one run of a scenario. Its lifecycle moves only by compare-and-swap on
`status` (queued -> running -> succeeded / failed / cancelled), so a cancel that
races the worker picking the job up has exactly one winner.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone


class Job(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"

    FINISHED = (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)

    scenario = models.CharField(max_length=32)
    strategy = models.CharField(max_length=32, blank=True)
    params = models.JSONField(default=dict)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    cancel_requested = models.BooleanField(default=False)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    last_seq = models.BigIntegerField(default=0, help_text="Sequence number of the last stored event.")
    summary = models.JSONField(null=True, blank=True)
    invariant_ok = models.BooleanField(null=True)
    error = models.TextField(blank=True)
    task_id = models.CharField(max_length=64, blank=True)

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["status"], name="job_status")]

    def __str__(self) -> str:
        return f"job {self.pk} ({self.scenario}, {self.strategy or '-'}, {self.status})"

    @property
    def is_finished(self) -> bool:
        return self.status in self.FINISHED

    def move(self, from_status: str, to_status: str, **fields: Any) -> bool:
        """Move the lifecycle on if it is still at `from_status`; False if someone else moved it first."""
        moved = Job.objects.filter(pk=self.pk, status=from_status).update(status=to_status, **fields)
        if moved:
            self.status = to_status
            for name, value in fields.items():
                setattr(self, name, value)
        return moved == 1

    def request_cancel(self) -> None:
        """Cancel a queued job at once; ask a running one to stop (its runner sees the flag within 0.1 s)."""
        if self.move(self.Status.QUEUED, self.Status.CANCELLED, cancel_requested=True, finished_at=timezone.now()):
            return
        Job.objects.filter(pk=self.pk, status=self.Status.RUNNING).update(cancel_requested=True)
        self.refresh_from_db(fields=["status", "cancel_requested"])


class Event(models.Model):
    """One step of one actor: a read, a compare-and-swap's outcome, a wait.

    Written in batches by the job's EventRecorder (COPY), numbered by `seq` within the job.
    """

    class Kind(models.TextChoices):
        READ = "read"
        COMMITTED = "committed"
        CONFLICT = "conflict"
        RETRY = "retry"
        GAVE_UP = "gave_up"
        LOCK_WAIT = "lock_wait"
        LOCK_TIMEOUT = "lock_timeout"
        DEADLOCK = "deadlock"
        SERIALIZATION_FAILURE = "serialization_failure"
        ERROR = "error"

    # No index of its own: the unique (job, seq) index serves every lookup by job, and
    # each index costs the event store work on every one of thousands of inserts a second.
    # No foreign-key constraint either: PostgreSQL would check it row by row (about 8 us an
    # event, more than the insert itself). The recorder moves the job's last_seq in the same
    # transaction as each batch and rolls the batch back if the job is gone; deleting a job
    # deletes its events through Django's cascade.
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events", db_index=False, db_constraint=False)
    seq = models.BigIntegerField()
    t_ms = models.FloatField(help_text="Milliseconds since the job's actors were released.")
    actor = models.PositiveIntegerField()
    op = models.PositiveIntegerField(help_text="The actor's operation number (its n-th increment).")
    attempt = models.PositiveIntegerField()
    kind = models.CharField(max_length=24, choices=Kind.choices)
    row = models.BigIntegerField(null=True, blank=True, help_text="Primary key of the contended object.")
    version_read = models.BigIntegerField(null=True, blank=True)
    version_written = models.BigIntegerField(null=True, blank=True)
    value_read = models.BigIntegerField(null=True, blank=True)
    value_written = models.BigIntegerField(null=True, blank=True)
    duration_ms = models.FloatField(null=True, blank=True, help_text="How long this step (or wait) took.")
    latency_ms = models.FloatField(null=True, blank=True, help_text="Committed: from the first read to the commit.")
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["job", "seq"]
        constraints = [models.UniqueConstraint(fields=["job", "seq"], name="event_unique_seq")]

    def __str__(self) -> str:
        return f"#{self.seq} actor {self.actor} {self.kind}"
