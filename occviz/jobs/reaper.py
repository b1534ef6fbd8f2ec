"""The reaper: ends the running jobs whose runner stopped renewing their heartbeat,
and hands back to the queue the jobs whose worker died between claiming and starting them.

A running job's process renews `Job.heartbeat_at` every second (`occviz.jobs.runner.Heartbeat`).
A job whose heartbeat is older than OCCVIZ_HEARTBEAT_TIMEOUT_S lost its runner (killed,
paused, cut off from PostgreSQL): it would say "running" forever. Whichever occviz process
notices first (a worker every few seconds, `serve`, `runjob` at its start, the job's page)
ends it as `failed` with the reason in words, or as `cancelled` if a cancel was waiting for
it. Its recorded events stay; its page shows the reason and its stream sends `end`.

Ending is a compare-and-swap on the status and the heartbeat seen: of several processes
that notice at once exactly one wins, and a heartbeat that arrives meanwhile saves the job.
Every time is PostgreSQL's clock, never this host's.

A worker claims a job's task (django-tasks-db marks it RUNNING, with the worker's id and the
claim's time in `started_at`) and then, milliseconds later, moves the job to running. One
killed in between leaves the job `queued` for ever: its task is RUNNING, so no worker takes it
again, and it keeps one of its owner's slots. django-tasks-db has no worker heartbeat, so the
claim's age stands for one: a job still queued a heartbeat timeout after its claim lost its
worker (or the worker is stuck: starting again elsewhere is safe, as only one start can win
the job's compare-and-swap). Such a job is handed back to the queue, its task READY again:
nothing of it ran, and who launched it expects it to run, as a pod whose node died is
started on another. Only a job claimed MAX_CLAIMS times, whose every worker died before
starting it (most likely something in the job kills them), is failed, with why in words.
The claim's time is the worker's clock (django-tasks-db writes it), compared with
PostgreSQL's: they share the host, or NTP, far closer than the timeout.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import Error, connection, transaction
from django.db.backends.utils import CursorWrapper
from django.utils import timezone
from django_tasks_db.models import DBTaskResult

from occviz.jobs.models import Job
from occviz.jobs.tasks import run_job_task

logger = logging.getLogger(__name__)

# Running jobs whose heartbeat is too old (none ever: counted from their start).
_STALE = """
    SELECT id, runner, heartbeat_at, started_at, cancel_requested, now()
    FROM jobs_job
    WHERE status = 'running' AND coalesce(heartbeat_at, started_at, created_at) < now() - make_interval(secs => %s)
"""
# One of them, ended only if it is still running on the heartbeat seen, and still stale.
_END = """
    UPDATE jobs_job SET status = %s, error = %s, finished_at = now()
    WHERE id = %s AND status = 'running' AND heartbeat_at IS NOT DISTINCT FROM %s
      AND coalesce(heartbeat_at, started_at, created_at) < now() - make_interval(secs => %s)
    RETURNING id
"""

# A job claimed this many times by workers that all stopped before starting it is failed, not handed back.
MAX_CLAIMS = 3
_TASKS = DBTaskResult._meta.db_table
# Queued jobs whose task a worker claimed longer than the timeout ago (the task's only argument is the job's id).
_UNSTARTED = f"""
    SELECT task.id, job.id, ARRAY(SELECT jsonb_array_elements_text(task.worker_ids)), task.started_at, now()
    FROM {_TASKS} task JOIN jobs_job job ON task.args_kwargs #>> '{{args,0}}' = job.id::text
    WHERE task.task_path = %s AND task.status = 'RUNNING' AND job.status = 'queued'
      AND task.started_at < now() - make_interval(secs => %s)
"""
# The job, locked so no worker starts it meanwhile, if it is still queued.
_LOCK_QUEUED = "SELECT id FROM jobs_job WHERE id = %s AND status = 'queued' FOR UPDATE"
# Its task, still on the claim seen: back to the queue, or failed.
_HAND_BACK = f"""
    UPDATE {_TASKS} SET status = 'READY', started_at = NULL
    WHERE id = %s AND status = 'RUNNING' AND started_at = %s RETURNING id
"""
_FAIL_TASK = f"""
    UPDATE {_TASKS} SET status = 'FAILED', finished_at = now(), exception_class_path = '', traceback = %s
    WHERE id = %s AND status = 'RUNNING' AND started_at = %s RETURNING id
"""
_FAIL_QUEUED = "UPDATE jobs_job SET status = 'failed', error = %s, finished_at = now() WHERE id = %s"


def _at(moment: datetime, now: datetime) -> str:
    """A moment in the site's time zone and how long ago it was: "11:42:03 UTC (12 s)"."""
    local = timezone.localtime(moment)
    return f"{local:%H:%M:%S} {local.tzname()} ({(now - moment).total_seconds():.0f} s)"


def stale_reason(
    runner: str, heartbeat_at: datetime | None, started_at: datetime | None, now: datetime, cancelled: bool
) -> str:
    """Why a job was ended without its runner: "its worker stopped: no heartbeat from w1 since 11:42:03 UTC (12 s)"."""
    who = f" from {runner}" if runner else ""
    last = heartbeat_at or started_at
    if last is None:
        since = ""
    else:
        what = "since" if heartbeat_at else "since it started at"
        since = f" {what} {_at(last, now)}"
    if cancelled:
        return f"cancelled; its worker had stopped: no heartbeat{who}{since}"
    return f"its worker stopped: no heartbeat{who}{since}"


def end_stale_jobs(timeout_s: float | None = None) -> list[int]:
    """End every running job with no heartbeat for `timeout_s` (default OCCVIZ_HEARTBEAT_TIMEOUT_S); their ids."""
    return _end_stale(timeout_s, job_id=None)


def end_if_stale(job: Job, timeout_s: float | None = None) -> bool:
    """End `job` if its runner stopped renewing it; True if this call ended it (`job` is then refreshed)."""
    if job.status != Job.Status.RUNNING:
        return False
    ended = bool(_end_stale(timeout_s, job_id=job.pk))
    if ended:
        job.refresh_from_db(fields=["status", "error", "finished_at"])
    return ended


def _end_stale(timeout: float | None, job_id: int | None) -> list[int]:
    seconds = float(settings.OCCVIZ_HEARTBEAT_TIMEOUT_S if timeout is None else timeout)
    query = _STALE + ("" if job_id is None else " AND id = %s")
    ended = []
    with connection.cursor() as cursor:
        cursor.execute(query, [seconds] if job_id is None else [seconds, job_id])
        for pk, runner, heartbeat_at, started_at, cancel_requested, now in cursor.fetchall():
            status = Job.Status.CANCELLED if cancel_requested else Job.Status.FAILED
            reason = stale_reason(runner, heartbeat_at, started_at, now, cancel_requested)
            cursor.execute(_END, [status, reason, pk, heartbeat_at, seconds])
            if cursor.fetchone() is None:
                continue  # another process ended it first, or its runner renewed it meanwhile
            logger.warning("job %s ended as %s: %s", pk, status, reason)
            ended.append(pk)
    return ended


def unstarted_reason(worker_ids: list[str], claimed_at: datetime, now: datetime) -> str:
    """Why a job claimed but never started was failed: "its workers stopped before starting it, 3 times: ..."."""
    return (
        f"its workers stopped before starting it, {len(worker_ids)} times: claimed by {', '.join(worker_ids)}, "
        f"the last at {_at(claimed_at, now)}, and never started"
    )


def hand_back_unstarted_jobs(timeout_s: float | None = None) -> tuple[list[int], list[int]]:
    """Hand back to the queue every job claimed `timeout_s` ago (default OCCVIZ_HEARTBEAT_TIMEOUT_S) and not started.

    Returns the ids of the jobs handed back, and of those failed instead (claimed MAX_CLAIMS times).
    """
    seconds = float(settings.OCCVIZ_HEARTBEAT_TIMEOUT_S if timeout_s is None else timeout_s)
    handed_back: list[int] = []
    failed: list[int] = []
    with connection.cursor() as cursor:
        cursor.execute(_UNSTARTED, [run_job_task.module_path, seconds])
        for task_id, job_id, worker_ids, claimed_at, now in cursor.fetchall():
            if len(worker_ids) < MAX_CLAIMS:
                if _settle_unstarted(cursor, _HAND_BACK, [task_id, claimed_at], job_id):
                    logger.warning(
                        "job %s handed back to the queue: %s claimed it at %s and stopped before starting it",
                        job_id,
                        worker_ids[-1] if worker_ids else "a worker",
                        _at(claimed_at, now),
                    )
                    handed_back.append(job_id)
                continue
            reason = unstarted_reason(worker_ids, claimed_at, now)
            if _settle_unstarted(cursor, _FAIL_TASK, [reason, task_id, claimed_at], job_id, error=reason):
                logger.warning("job %s ended as failed: %s", job_id, reason)
                failed.append(job_id)
    return handed_back, failed


def _settle_unstarted(
    cursor: CursorWrapper, task_update: str, params: list[Any], job_id: int, *, error: str = ""
) -> bool:
    """Move the task on its claim seen, with its job locked while queued; fail the job too with an `error`.

    A compare-and-swap: of several reapers one wins (True), and a worker that started the
    job meanwhile keeps it (False; nothing changed).
    """
    with transaction.atomic():
        cursor.execute(_LOCK_QUEUED, [job_id])
        if cursor.fetchone() is None:
            return False  # started or cancelled meanwhile
        cursor.execute(task_update, params)
        if cursor.fetchone() is None:
            return False  # another reaper acted first
        if error:
            cursor.execute(_FAIL_QUEUED, [error, job_id])
    return True


def reap(timeout_s: float | None = None) -> None:
    """What a reaper does: end the running jobs whose runner stopped, hand back those claimed but never started."""
    end_stale_jobs(timeout_s)
    hand_back_unstarted_jobs(timeout_s)


class Reaper:
    """A daemon thread that calls `reap` at once, then every `interval_s` seconds until `stop()`."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="job-reaper", daemon=True)
        self._failing = False

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop it, waiting at most `timeout_s` for a look in progress (PostgreSQL may not be answering)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    reap()
                except Error as error:  # DatabaseError, or InterfaceError (a connection already closed)
                    # PostgreSQL restarting, say: said once, then quiet until it answers again.
                    if not self._failing:
                        logger.warning("reaper: looking for stale jobs failed, retrying: %s", error)
                    self._failing = True
                    connection.close()
                else:
                    self._failing = False
                self._stop.wait(self.interval_s)
        finally:
            connection.close()


def start_reaper(interval_s: float = 2.0) -> Reaper:
    """Start a Reaper for a long-running process (a worker, serve); call its `stop()` on the way out."""
    reaper = Reaper(interval_s)
    reaper.start()
    return reaper
