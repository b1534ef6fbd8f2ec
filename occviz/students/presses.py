"""A student's "+1": one read-modify-write on the job's contended object, as the API writes it.

It goes through `occviz.store.writes.update`, the compare-and-swap path of the admin and the
API, so the running job hears of it as an outside write and records it on the student's own
lane ("student: <nickname>"). With the job's strategy: `none` writes blindly (whatever was
stored since the read is overwritten, and counted as lost), any other strategy writes only
over the version read, and a 409 is shown to the student, who may press again.

A press is read (`read_for_press`), then a think, then the write (`Read.write`): the view
awaits the think on its event loop, so a class thinking at once holds no thread. Between
the read and the write the student "thinks" half as long as the job's writers do:
long enough that a class pressing at once races the job's writers, short enough that with
`occ` a press wins about as often as it meets a 409, and with `none` erases as often as not.

A press is refused before anything is read or written when the job is not running or the
student is over their rate (MAX_PRESSES_PER_S): a refused press writes nothing and counts
for nothing.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from django.db import OperationalError, connection, connections

from occviz.jobs.affinity import quick_handoffs
from occviz.jobs.models import Job
from occviz.store import rows, writes
from occviz.store.cas import ANY
from occviz.store.models import Change, Counter, Deployment, VersionConflict, VersionedObject
from occviz.students import roster
from occviz.students.models import Student, StudentLink
from occviz.students.tokens import LinkRefused, link_id, usable

MAX_PRESSES_PER_S: Final = 5
MAX_THINK_S: Final = 0.5
"""The longest the student thinks between read and write, whatever the job's think time."""
JOB_LOCK_TIMEOUT: Final = "2s"
OBJECT_LOCK_TIMEOUT: Final = "250ms"
PRESS_ANNOTATION: Final = "occviz.dev/student-presses"
"""The Deployment's annotation the students increment: a field no controller owns."""


@dataclass(frozen=True)
class Pressed:
    """What became of a press: an HTTP status, and a sentence for the student."""

    status: int
    message: str
    version: int | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200

    def as_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "status": self.status, "message": self.message, "version": self.version}


TOO_FAST: Final = Pressed(429, f"Too fast: at most {MAX_PRESSES_PER_S} presses a second. Nothing was written.")
NOT_SEATED: Final = Pressed(403, "Pick a nickname first: only students who joined this job may write.")


@dataclass(frozen=True)
class Read:
    """A press's read, awaiting its write: the object as read, the changes to write over it, the think before."""

    job: Job
    student: Student
    stored: VersionedObject
    changes: dict[str, Any]
    said: str
    """The change in words: "value 3 → 4"."""
    think_s: float

    def write(self) -> Pressed:
        return _write(self.job, self.student, self.stored, self.changes, self.said)


def read_for_press(job: Job, student: Student) -> Read | Pressed:
    """The read of one +1 by `student` on `job`'s object, or why there is none (nothing written then).

    `job` as it was just read (with the link that seated the student): its status says whether it takes writes.
    """
    if job.status != Job.Status.RUNNING or job.outside_writes_closed_at is not None:
        when = "has not started yet" if job.status == Job.Status.QUEUED else f"has finished ({job.status})"
        if job.status == Job.Status.RUNNING:
            when = "is finishing"
        return Pressed(409, f"The job {when}: writes are closed, nothing was written.")
    plus_one = _PRESSES.get(job.scenario)
    if plus_one is None:
        return Pressed(409, "This job's scenario takes no writes from students: watch only.")
    if not take_a_turn(student):
        return TOO_FAST
    return plus_one(job, student)


def read_for_seat(token: str, cookies: Mapping[str, str]) -> Read | Pressed:
    """The read of one +1 by the student whose seat is among `cookies`, on the link `token` names (the
    student's socket presses this way), or why there is none (nothing written then).

    As `open_link` and `roster.seated` would read them, but in one statement that makes models of
    the few fields a press uses: a class's presses come many a second, each one's Django work on the
    cores the job's writers use.
    """
    try:
        pk = link_id(token)
    except LinkRefused as refused:
        return Pressed(refused.status, refused.reason)
    with connection.cursor() as cursor:
        cursor.execute(_seat_sql(connection.alias), [json.dumps(roster.seats(cookies)), pk])
        row = cursor.fetchone()
    db = connection.alias
    link_end, job_end = len(_LINK_FIELDS), len(_LINK_FIELDS) + len(_JOB_FIELDS)
    try:
        usable(None if row is None else rows.from_row(StudentLink, db, _LINK_FIELDS, row[:link_end]))
    except LinkRefused as refused:
        return Pressed(refused.status, refused.reason)
    if row[job_end] is None:
        return NOT_SEATED
    job = rows.from_row(Job, db, _JOB_FIELDS, row[link_end:job_end])
    return read_for_press(job, rows.from_row(Student, db, _STUDENT_FIELDS, row[job_end:]))


_LINK_FIELDS: Final = rows.fields_named(StudentLink, "id", "job", "expires", "revoked")
_JOB_FIELDS: Final = rows.fields_named(Job, "id", "status", "outside_writes_closed_at", "scenario", "params")
"""What a press reads of its job (the rest is deferred): whether it takes writes, and how."""
_STUDENT_FIELDS: Final = rows.fields_named(Student, "id", "job", "nickname")


@functools.cache
def _seat_sql(alias: str) -> str:
    """The link, its job, and the student of that job whose seat cookie (named by the job's id) came with the press."""
    db = connections[alias]
    return (
        f"SELECT {rows.columns_of(_LINK_FIELDS, db, 'l')}, {rows.columns_of(_JOB_FIELDS, db, 'j')},"
        f" {rows.columns_of(_STUDENT_FIELDS, db, 's')}"
        f" FROM {StudentLink._meta.db_table} l JOIN {Job._meta.db_table} j ON j.id = l.job_id"
        f" LEFT JOIN {Student._meta.db_table} s"
        " ON s.job_id = l.job_id AND s.id = (%s::jsonb ->> l.job_id::text)::bigint"
        " WHERE l.id = %s"
    )


def take_a_turn(student: Student) -> bool:
    """Count a press in the student's one-second window, if it has room: one compare-and-swap on their row."""
    with connection.cursor() as cursor:
        # Every expression sees the row as it was; under READ COMMITTED a press racing this one
        # re-checks the WHERE on the row this one wrote, so two presses never share the last turn.
        fresh = "(window_start IS NULL OR window_start <= statement_timestamp() - interval '1 second')"
        cursor.execute(
            f"""
            UPDATE students_student SET
              window_start = CASE WHEN {fresh} THEN statement_timestamp() ELSE window_start END,
              writes_in_window = CASE WHEN {fresh} THEN 1 ELSE writes_in_window + 1 END
            WHERE id = %s AND ({fresh} OR writes_in_window < %s)
            """,
            [student.pk, MAX_PRESSES_PER_S],
        )
        return cursor.rowcount == 1


class _TooLate(Exception):
    """The job had settled its accounts, or ended, before the press could write."""


def _hold_the_job(job: Job) -> bool:
    """Lock the job's row if it still follows outside writes (False if it has settled or ended).

    Taken before the object's lock, so that the object is never held while this waits for the
    job's row (the job's recorder holds it while it stores a batch): the job's own writers wait
    for a press's few statements only. Held until the press commits, it keeps the job from
    settling before the press's write is handed to it. Once it is held, the press waits for the
    object's lock OBJECT_LOCK_TIMEOUT at most.
    """
    with connection.cursor() as cursor:
        # The object stays locked until the commit: not waiting for its WAL flush keeps that short. A crash
        # may lose the last presses, and with them the job, which is then ended without a verdict.
        cursor.execute(
            "SELECT set_config('lock_timeout', %s, true), set_config('synchronous_commit', 'off', true)",
            [JOB_LOCK_TIMEOUT],
        )
        # The object's timeout is set by the outer SELECT, once the inner one holds the job's row.
        cursor.execute(
            "SELECT set_config('lock_timeout', %s, true) FROM ("
            "  SELECT 1 FROM jobs_job WHERE id = %s AND status = %s AND outside_writes_closed_at IS NULL"
            "  FOR NO KEY UPDATE"
            ") AS held",
            [OBJECT_LOCK_TIMEOUT, job.pk, Job.Status.RUNNING],
        )
        return cursor.fetchone() is not None


def _think_s(job: Job) -> float:
    return min(float(job.params.get("think_ms") or 0) / 2000, MAX_THINK_S)


def _write(job: Job, student: Student, stored: VersionedObject, changes: dict[str, Any], said: str) -> Pressed:
    """Write `changes` over `stored` as the job's strategy writes: blind for `none`, else over the version read."""
    blind = job.params.get("strategy") == "none"
    writer = writes.Writer(Change.Via.STUDENT, student.nickname)
    read = stored.resource_version
    try:
        # The web process's event loop sends frames to every page meanwhile: with the job's row held, its answer
        # must not wait a switch interval for the interpreter lock. The object is held for one statement and
        # the commit: the write, which logs itself and hands itself to the job, goes with the COMMIT.
        with quick_handoffs(), writes.pipelined_transaction():
            # Short of the object's lock, give way (a job settling its accounts holds it, and waits for
            # the job's row that this press holds): the press is refused, and the job goes on.
            if not _hold_the_job(job):
                raise _TooLate
            try:
                written = writes.update(stored, changes, writer, expected_version=ANY if blind else read, last=True)
            except VersionConflict as conflict:  # the refusal's record is committed with it
                now = conflict.stored.resource_version if conflict.stored is not None else "?"
                return Pressed(
                    409,
                    f"Conflict (409): you read v{read}, but someone wrote first (it is v{now} now). "
                    "Press again to retry.",
                )
    except OperationalError as error:
        if getattr(error.__cause__, "sqlstate", None) != "55P03":  # lock_not_available
            raise
        return Pressed(503, "The job is busy (settling its accounts, or another write holds the object): press again.")
    except type(stored).DoesNotExist:
        return Pressed(409, "The object was deleted: nothing to write.")
    except _TooLate:
        return Pressed(409, "The job has finished: writes are closed, nothing was written.")
    overwritten = written.resource_version - 1 - read
    if blind and overwritten:
        return Pressed(
            200,
            f"+1 written blindly: v{written.resource_version} ({said}). You overwrote {overwritten} newer "
            f"version{'s' * (overwritten != 1)}: their updates are lost.",
            written.resource_version,
        )
    how = "blindly" if blind else f"over v{read}"
    return Pressed(200, f"+1 written {how}: v{written.resource_version} ({said}).", written.resource_version)


@functools.cache
def _first_of_sql(model: type[VersionedObject]) -> str:
    meta = model._meta
    columns = rows.columns_of(meta.concrete_fields, connection)
    return f'SELECT {columns} FROM "{meta.db_table}" WHERE "job_id" = %s ORDER BY "{meta.pk.column}" LIMIT 1'


def _first_of[V: VersionedObject](model: type[V], job: Job) -> V | None:
    """The job's first object of `model` (as `model.objects.filter(job=job).order_by("pk").first()`)."""
    with connection.cursor() as cursor:
        cursor.execute(_first_of_sql(model), [job.pk])
        row = cursor.fetchone()
    return None if row is None else rows.from_row(model, connection.alias, model._meta.concrete_fields, row)


def _plus_one_counter(job: Job, student: Student) -> Read | Pressed:
    """The counter race: read row-1, to write its value + 1."""
    row = _first_of(Counter, job)
    if row is None:
        return Pressed(409, "The job has not made its counter yet: press again in a moment.")
    return Read(job, student, row, {"value": row.value + 1}, f"value {row.value} → {row.value + 1}", _think_s(job))


def _plus_one_deployment(job: Job, student: Student) -> Read | Pressed:
    """The controllers' race: read the Deployment, to send it whole back with the students' annotation + 1.

    As `kubectl edit` does: every field goes back as it was read, so a blind write erases what a
    controller wrote in between, which the job counts on the student's lane.
    """
    deployment = _first_of(Deployment, job)
    if deployment is None:
        return Pressed(409, "The job has not made its Deployment yet: press again in a moment.")
    try:
        count = int(deployment.annotations.get(PRESS_ANNOTATION, 0))
    except (TypeError, ValueError):
        count = 0
    changes = {
        "replicas": deployment.replicas,
        "labels": deployment.labels,
        "annotations": {**deployment.annotations, PRESS_ANNOTATION: str(count + 1)},
        "status": deployment.status,
    }
    return Read(job, student, deployment, changes, f"{PRESS_ANNOTATION} {count} → {count + 1}", _think_s(job))


_PRESSES: dict[str, Callable[[Job, Student], Read | Pressed]] = {
    "counter": _plus_one_counter,
    "controllers": _plus_one_deployment,
}


def takes_presses(scenario: str) -> bool:
    return scenario in _PRESSES
