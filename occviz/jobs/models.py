"""Jobs and the events they record.

A job is one run of a scenario. Its lifecycle moves only by compare-and-swap on
`status` (queued -> running -> succeeded / failed / cancelled), so a cancel that
races the worker picking the job up has exactly one winner.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import connections, models, router
from django.utils import timezone

from occviz.store import rows


class Job(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"

    FINISHED = (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)

    scenario = models.CharField(max_length=32)
    params = models.JSONField(default=dict)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    cancel_requested = models.BooleanField(default=False)
    controls_requested = models.PositiveIntegerField(
        default=0, help_text="How many JobControls were asked for: the runner fetches them when this moves."
    )
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    released_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When the actors were released together: every event's t_ms counts from here (after started_at "
        "by the time the program took to set up and connect).",
    )
    finished_at = models.DateTimeField(null=True, blank=True)
    last_seq = models.BigIntegerField(default=0, help_text="Sequence number of the last stored event.")
    summary = models.JSONField(null=True, blank=True)
    invariant_ok = models.BooleanField(null=True)
    error = models.TextField(blank=True)
    runner = models.CharField(
        max_length=128, blank=True, help_text="The process running it (serve's worker, runjob), while it runs."
    )
    heartbeat_at = models.DateTimeField(
        null=True, blank=True, help_text="Renewed every second by the process running it: its heartbeat."
    )
    events_pruned_at = models.DateTimeField(null=True, blank=True, help_text="When its events were deleted.")
    outside_writes_closed_at = models.DateTimeField(
        null=True, blank=True, help_text="When it stopped following outside writes (it settled its accounts)."
    )
    parent = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="children",
        help_text="The job this one is a part of (a point of a sweep, a cell of the anomalies table).",
    )

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["status"], name="job_status")]

    def __str__(self) -> str:
        return f"job {self.pk} ({self.scenario}, {self.status})"

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

    def may_be_controlled_by(self, user: Any) -> bool:
        """Who launched a job, or staff, may cancel or control it; everyone signed in may watch it."""
        return bool(user.is_staff or self.created_by_id == user.pk)

    def request_control(
        self,
        action: str,
        actor: int | None = None,
        seconds: float | None = None,
        user: Any = None,
        payload: dict[str, Any] | None = None,
    ) -> JobControl:
        """Ask the running job to apply a control; JobNotRunning (and nothing stored) if it is not running.

        One statement bumps the job's count and stores the control, only while the job runs (a job
        that ended meanwhile gets no control).
        """
        control = _control(self.pk, action, actor=actor, seconds=seconds, user=user, payload=payload)
        db = connections[router.db_for_write(JobControl)]
        with db.cursor() as cursor:
            _store_control(cursor, control)
            row = cursor.fetchone()
        if row is None:
            self.refresh_from_db(fields=["status"])
            raise JobNotRunning(f"job {self.pk} is {self.status}: controls apply only while it runs")
        control.pk = row[0]
        control._state.adding = False
        control._state.db = db.alias
        return control


def hold_before_deleting(sender: type[Job], instance: Job, using: str, **kwargs: Any) -> None:
    """Lock a job's row as its deletion starts, before its events and controls are deleted (Job's pre_delete).

    A running job's recorder stores a batch with the job's row locked, and a control is stored
    the same way: one that committed after its rows were deleted, before the job's, would still
    refer to the job, and the deletion would fail on the foreign key. Held first, the row waits
    for such a write to commit, so the rows deleted after it include it; a later one finds no job.
    """
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT 1 FROM jobs_job WHERE id = %s FOR UPDATE", [instance.pk])


def _control(
    job_id: int,
    action: str,
    *,
    actor: int | None = None,
    seconds: float | None = None,
    user: Any = None,
    payload: dict[str, Any] | None = None,
) -> JobControl:
    """A control of job `job_id`, not yet stored; `user` kept only if it is one (not an anonymous one)."""
    requested_by = user if getattr(user, "pk", None) else None
    return JobControl(
        job_id=job_id, action=action, actor=actor, seconds=seconds, requested_by=requested_by, payload=payload
    )


def _store_control(cursor: Any, control: JobControl) -> None:
    """The one statement that moves the job's count and stores `control`, while the job runs (its id returned)."""
    fields = _control_values()
    values = rows.values_of(control, fields, cursor.db)
    cursor.execute(_store_control_sql(cursor.db.alias), [control.job_id, *values])


@functools.cache
def _control_values() -> tuple[models.Field[Any, Any], ...]:
    """The fields of a control stored with values of its own: all but its job (the job moved)."""
    return tuple(field for field in rows.fields_to_insert(JobControl, False) if field.name != "job")


@functools.cache
def _store_control_sql(alias: str) -> str:
    """`_store_control`'s statement, made once per database."""
    connection = connections[alias]
    values = {field.name: f"%s::{field.db_type(connection)}" for field in _control_values()}
    (moved, bump), (_, store) = control_statements(connection, "%s", values)
    return f'WITH "{moved}" AS ({bump}) {store} RETURNING id'


def control_statements(
    connection: Any, job: str, values: Mapping[str, str], source: str | None = None, moved: str = "moved"
) -> list[tuple[str, str]]:
    """The two statements that store a control: (name, statement) pairs, as CTEs of one statement run them.

    The first, `moved`, bumps the count of controls of job `job` (SQL), if it runs; the second
    stores a control of that job with `values` (SQL, by field name; every field but the job).
    `source` names a row source both read from (`job` and `values` may name its columns).
    """
    fields = rows.fields_to_insert(JobControl, False)
    selected = ", ".join(f'"{moved}"."id"' if field.name == "job" else values[field.name] for field in fields)
    joined = f' FROM "{source}"' if source else ""
    return [
        (
            moved,
            f"UPDATE jobs_job SET controls_requested = controls_requested + 1{joined}"
            f" WHERE jobs_job.id = {job} AND jobs_job.status = '{Job.Status.RUNNING}' RETURNING jobs_job.id",
        ),
        (
            f"{moved}_stored",
            f"INSERT INTO jobs_jobcontrol ({rows.columns_of(fields, connection)})"
            f' SELECT {selected} FROM "{moved}"{f', "{source}"' if source else ""}',
        ),
    ]


class JobNotRunning(Exception):
    """A control was asked of a job that is not running."""


class JobControl(models.Model):
    """A failure control asked for while a job runs (kill a leader, pause it...), delivered once to its program.

    The view stores it and bumps `Job.controls_requested` in one transaction; the job's
    recorder reads that count with the cancel flag every tick, and the runner hands each
    new control to the program under a lock on its row, so it runs once, and marks it applied
    with its outcome in the same write.
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="controls")
    action = models.CharField(max_length=32)
    actor = models.IntegerField(null=True, blank=True, help_text="The actor it targets, if any.")
    seconds = models.FloatField(null=True, blank=True)
    payload = models.JSONField(
        null=True, blank=True, help_text="What an outside write (admin, API) did to one of the job's objects."
    )
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    requested_at = models.DateTimeField(default=timezone.now)
    applied_at = models.DateTimeField(null=True, blank=True)
    outcome = models.TextField(blank=True, help_text="Why it could not be applied, if it could not.")

    class Meta:
        ordering = ["job", "id"]

    def __str__(self) -> str:
        target = f" actor {self.actor}" if self.actor is not None else ""
        return f"job {self.job_id}: {self.action}{target}"


class EventBatch(models.Model):
    """One flush of a job's event recorder: events seq_from..seq_to, stored column by column.

    A job records thousands of events a second. Stored as one row each, PostgreSQL spent
    more on inserting them (a heap tuple, an index entry and WAL each) than on the job's
    own writes; stored as one row a flush, with one array per column, it costs a few
    inserts a second. Element i of every array is event seq_from + i; times are whole
    microseconds. Read events through `Event`, the view that unnests these rows.
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="event_batches", db_index=False)
    seq_from = models.BigIntegerField()
    seq_to = models.BigIntegerField()
    t_us = ArrayField(models.BigIntegerField(), help_text="Microseconds since the job's actors were released.")
    actor = ArrayField(models.IntegerField())
    op = ArrayField(models.IntegerField())
    attempt = ArrayField(models.IntegerField())
    kind = ArrayField(models.CharField(max_length=24))
    row = ArrayField(models.BigIntegerField(null=True))
    version_read = ArrayField(models.BigIntegerField(null=True))
    version_written = ArrayField(models.BigIntegerField(null=True))
    value_read = ArrayField(models.BigIntegerField(null=True))
    value_written = ArrayField(models.BigIntegerField(null=True))
    duration_us = ArrayField(models.BigIntegerField(null=True))
    latency_us = ArrayField(models.BigIntegerField(null=True))
    detail = models.JSONField(default=dict, help_text="The few events with a detail, by position in the batch.")
    snapshot = models.JSONField(
        null=True, blank=True, help_text="What the job showed as of seq_to (its figures and state), made by its runner."
    )

    class Meta:
        ordering = ["job", "seq_from"]
        # (job, seq_to) finds the batches holding the events after a given seq without unnesting the others.
        constraints = [models.UniqueConstraint(fields=["job", "seq_to"], name="eventbatch_unique_seq_to")]

    def __str__(self) -> str:
        return f"job {self.job_id} events {self.seq_from}..{self.seq_to}"


class Event(models.Model):
    """One step of one actor: a read, a compare-and-swap's outcome, a wait.

    Numbered by `seq` within the job. Read-only: a view (`jobs_event`) over the
    EventBatch rows the job's EventRecorder writes, one row per event.
    """

    # (job id << 32) + seq: one number per event, as the admin needs (it refuses composite keys).
    id = models.BigIntegerField(primary_key=True)
    job = models.ForeignKey(
        Job, on_delete=models.DO_NOTHING, related_name="events", db_constraint=False, db_index=False
    )
    seq = models.BigIntegerField()
    t_ms = models.FloatField(help_text="Milliseconds since the job's actors were released.")
    actor = models.IntegerField()
    op = models.IntegerField(help_text="The actor's operation number (its n-th increment).")
    attempt = models.IntegerField()
    kind = models.CharField(max_length=24, help_text="One of its scenario's event kinds.")
    row = models.BigIntegerField(null=True, blank=True, help_text="Primary key of the contended object.")
    version_read = models.BigIntegerField(null=True, blank=True)
    version_written = models.BigIntegerField(null=True, blank=True)
    value_read = models.BigIntegerField(null=True, blank=True)
    value_written = models.BigIntegerField(null=True, blank=True)
    duration_ms = models.FloatField(null=True, blank=True, help_text="How long this step (or wait) took.")
    latency_ms = models.FloatField(null=True, blank=True, help_text="Committed: from the first read to the commit.")
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        managed = False
        db_table = "jobs_event"
        ordering = ["job", "seq"]

    def __str__(self) -> str:
        return f"#{self.seq} actor {self.actor} {self.kind}"


class JobShard(models.Model):
    """One process of a job split over several (`processes` > 1): which actors it runs, where, and how it is.

    Shard 0 is the job's own runner, the coordinator: it runs the program, makes these rows,
    starts the other shards, releases every shard's actors together once all have arrived
    (connected), and records the job's end once all have finished. Each shard renews its own
    heartbeat; a shard that stops renewing it, or fails, stops the others and fails the job.
    """

    class Status(models.TextChoices):
        WAITING = "waiting"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"
        STOPPED = "stopped"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="shards", db_index=False)
    index = models.PositiveSmallIntegerField(help_text="0: the coordinator, the process that runs the program.")
    runner = models.CharField(max_length=128, blank=True)
    pid = models.IntegerField(null=True, blank=True)
    host = models.CharField(max_length=255, blank=True)
    first_actor = models.PositiveIntegerField()
    last_actor = models.PositiveIntegerField()
    plan = models.JSONField(default=dict, blank=True, help_text="What the program shares with every shard (a seed).")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.WAITING)
    error = models.TextField(blank=True)
    arrived_at = models.DateTimeField(null=True, blank=True, help_text="When its actors had all connected.")
    released_at = models.DateTimeField(
        null=True, blank=True, help_text="Shard 0 only: when every shard's actors start, on PostgreSQL's clock."
    )
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["job", "index"]
        constraints = [models.UniqueConstraint(fields=["job", "index"], name="jobshard_unique_index")]

    def __str__(self) -> str:
        return f"job {self.job_id} shard {self.index} (actors {self.first_actor}..{self.last_actor}, {self.status})"


class JobShared(models.Model):
    """A value the actors of one job share, whichever process each runs in: a count, or an entry of a set or a log.

    A job's actors in several processes (its shards) cannot share memory: what they contend
    on besides their objects (the next pod to create, the charges under way, the writes to
    replay) lives here, one row per `name`, changed by single statements (occviz.jobs.shared).
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="shared", db_index=False)
    name = models.CharField(max_length=64)
    number = models.BigIntegerField(default=0)
    data = models.JSONField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "name"], name="jobshared_unique_name")]

    def __str__(self) -> str:
        return f"job {self.job_id} {self.name} = {self.number}"
