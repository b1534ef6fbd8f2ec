"""The reaper: ends the running jobs whose runner stopped renewing their heartbeat.

A running job's process renews `Job.heartbeat_at` every second (`occviz.jobs.runner.Heartbeat`).
A job whose heartbeat is older than OCCVIZ_HEARTBEAT_TIMEOUT_S lost its runner (killed,
paused, cut off from PostgreSQL): it would say "running" forever. Whichever occviz process
notices first (a worker every few seconds, `serve`, `runjob` at its start, the job's page)
ends it as `failed` with the reason in words, or as `cancelled` if a cancel was waiting for
it. Its recorded events stay; its page shows the reason and its stream sends `end`.

Ending is a compare-and-swap on the status and the heartbeat seen: of several processes
that notice at once exactly one wins, and a heartbeat that arrives meanwhile saves the job.
Every time is PostgreSQL's clock, never this host's.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime

from django.conf import settings
from django.db import Error, connection
from django.utils import timezone

from occviz.jobs.models import Job

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


def stale_reason(
    runner: str, heartbeat_at: datetime | None, started_at: datetime | None, now: datetime, cancelled: bool
) -> str:
    """Why a job was ended without its runner: "its worker stopped: no heartbeat from w1 since 11:42:03 UTC (12 s)"."""
    who = f" from {runner}" if runner else ""
    last = heartbeat_at or started_at
    if last is None:
        since = ""
    else:
        local = timezone.localtime(last)
        quiet_s = (now - last).total_seconds()
        what = "since" if heartbeat_at else "since it started at"
        since = f" {what} {local:%H:%M:%S} {local.tzname()} ({quiet_s:.0f} s)"
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


class Reaper:
    """A daemon thread that calls `end_stale_jobs` at once, then every `interval_s` seconds until `stop()`."""

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
                    end_stale_jobs()
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
