"""The job runner: one job, in this process, its actors as threads released together.

Whoever runs a job (a `db_worker` through `run_job_task`, or `runjob` in its own
process) calls `run_job`. It moves the job to running by compare-and-swap (so a
job cancelled while queued is never started, and two workers never run the same
job), starts the event recorder, lets the scenario run its actors, and records the
outcome. Actors stop early on cancel, on the time limit, or when one of them fails.

While it runs, the job has a heartbeat: `runner` names this process and a
`Heartbeat` thread renews `heartbeat_at` every second. A job whose heartbeat stops (its
process was killed, or lost PostgreSQL for too long) is ended by whichever occviz process
notices first (`occviz.jobs.reaper`). `stop_all_jobs` is what a signal handler calls.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import Error, connection
from django.tasks import task
from django.utils import timezone

from occviz.jobs.affinity import one_cpu, quick_handoffs
from occviz.jobs.context import JobContext
from occviz.jobs.models import Job, JobShard
from occviz.jobs.recorder import EventRecorder
from occviz.jobs.registry import JobObserver, JobProgram, observers_for, program
from occviz.jobs.shards import ChildShards, Shard, processes_of
from occviz.jobs.snapshots import Snapshotter

logger = logging.getLogger(__name__)


# How often a running job renews its heartbeat (the reapers' timeout is OCCVIZ_HEARTBEAT_TIMEOUT_S).
HEARTBEAT_INTERVAL_S = 1.0
# How long the runner keeps trying to record a job's end while PostgreSQL is unreachable (restarting).
FINAL_WRITE_PATIENCE_S = 15.0


def runner_id(kind: str) -> str:
    """Who runs a job, as `Job.runner` records it: OCCVIZ_RUNNER_ID if set, else `kind:host:pid`."""
    return os.environ.get("OCCVIZ_RUNNER_ID") or f"{kind}:{socket.gethostname()}:{os.getpid()}"


class Heartbeat:
    """A running job's heartbeat: `heartbeat_at` renewed every second, from a thread and connection of its own.

    Each renewal is a compare-and-swap on the job's status and runner. Zero rows means the
    job was ended by someone else (a reaper that saw no heartbeat for longer than the
    timeout, after this process was paused or cut off), and `on_lost` stops the actors at
    once. A renewal that fails (PostgreSQL restarting) is tried again a second later on a
    new connection: the job is reaped only if that lasts longer than the timeout.
    """

    def __init__(
        self, job_id: int, runner: str, on_lost: Callable[[], None], *, interval: float = HEARTBEAT_INTERVAL_S
    ) -> None:
        self.job_id = job_id
        self.runner = runner
        self.on_lost = on_lost
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"job-{job_id}-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def beat(self) -> bool:
        """Renew the heartbeat now; False if the job is no longer running here."""
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE jobs_job SET heartbeat_at = now() WHERE id = %s AND status = 'running' AND runner = %s",
                [self.job_id, self.runner],
            )
            return cursor.rowcount == 1

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    renewed = self.beat()
                except Error as error:  # DatabaseError, or InterfaceError (a connection already closed)
                    logger.warning("job %s: renewing its heartbeat failed, retrying: %s", self.job_id, error)
                    connection.close()
                else:
                    if not renewed:
                        if not self._stop.is_set():
                            logger.warning("job %s was ended by another process: stopping its actors", self.job_id)
                            self.on_lost()
                        return
                self._stop.wait(self.interval)
        finally:
            connection.close()


# The jobs this process runs now, so a signal can stop them (`stop_all_jobs`). Reentrant:
# the signal handler runs in the main thread, possibly while that thread holds the lock.
_running_lock = threading.RLock()
_running: dict[int, JobContext] = {}
_stopping_reason: str | None = None


def stop_all_jobs(reason: str = "cancelled") -> list[int]:
    """Stop every job this process runs (their actors within a second), and refuse any it would start after.

    For a process that was asked to stop (SIGINT, SIGTERM): each job records `reason`
    ("cancelled" ends it as cancelled, with its summary). Safe to call from a signal handler.
    Returns the ids of the jobs it stopped.
    """
    global _stopping_reason
    with _running_lock:
        _stopping_reason = reason
        contexts = list(_running.values())
    for context in contexts:
        context.request_stop(reason)
    return [context.job.pk for context in contexts]


def running_context(job_id: int) -> JobContext | None:
    """The context of job `job_id` if this process runs it now."""
    with _running_lock:
        return _running.get(job_id)


def _failure(error: BaseException) -> str:
    """A job's `error` for an exception: the one-line reason first (pages and `manage.py jobs` show it), then where."""
    return f"{type(error).__name__}: {error}\n\n{traceback.format_exc()}"


def _recording(job: Job, runnable: JobProgram) -> tuple[JobContext, list[JobObserver]]:
    """A context for running `job` here: its recorder, taking snapshots, told to its observers."""
    params = dict(job.params)
    snapshots = Snapshotter(
        job.pk, runnable.figures, lambda: runnable.read_state(job.pk, params), last_seq=job.last_seq
    )
    recorder = EventRecorder(job.pk, last_seq=job.last_seq, snapshot=snapshots.take)
    observers = observers_for(job)
    recorder.listeners.extend(observer.stored for observer in observers)
    return JobContext(job, recorder), observers


def run_job(job_id: int, *, runner: str | None = None, shards: str = "tasks") -> Job:
    """Run a queued job to its end, renewing its heartbeat while it runs; returns it in its final state.

    `runner` names this process on the job row (default: `runner_id("worker")`). A job over
    several processes starts its other shards as `shards` says: "tasks" for any worker to
    claim, or "children", processes of this one (runjob's way). A shard no worker takes in
    time, or whose process dies before the release, is started again as a child (Shard).
    """
    job = Job.objects.get(pk=job_id)
    if not _start(job, runner or runner_id("worker")):
        return job
    runnable = program(job.scenario)
    context, observers = _recording(job, runnable)
    recorder = context.recorder
    processes = processes_of(job.params)
    children: ChildShards | None = None
    if processes > 1:
        children = ChildShards(job.pk)
        launch = children.launch if shards == "children" else _enqueue_shard(job.pk)
        context.shard = Shard(
            job, 0, processes, launch=launch, launch_kind=shards, take_over=children.launch, runner=job.runner
        )
        recorder.interleaved = True
    heartbeat = Heartbeat(job.pk, job.runner, on_lost=lambda: context.request_stop("ended elsewhere"))
    with _running_lock:
        _running[job.pk] = context
        if _stopping_reason is not None:
            context.request_stop(_stopping_reason)
    try:
        heartbeat.start()
        outcome = _run_program(runnable, context)
    finally:
        # Stopped before the final write: once the job is no longer running here, nothing renews it.
        heartbeat.stop()
        with _running_lock:
            _running.pop(job.pk, None)
        if children is not None:
            children.reap()
    status = outcome.status(context)
    summary = outcome.summary
    if summary is not None:
        # The parameters are echoed first; what the program reports of the same name wins.
        summary = {
            "id": job.pk,
            "scenario": job.scenario,
            **job.params,
            **summary,
            "status": status,
            "stopped_by": context.stop_reason or None,
            "events": recorder.last_seq,
        }
        if context.shard is not None:
            summary.update(processes=processes, shards=context.shard.summary())
    # Not last_seq: the recorder moves it with each stored batch, in the same transaction, so the
    # row has it right even when PostgreSQL lost the last batches in a crash.
    _record_end(
        job,
        status,
        finished_at=timezone.now(),
        summary=summary,
        invariant_ok=None if summary is None else summary["invariant_ok"],
        error=outcome.error,
    )
    for observer in observers:
        try:
            observer.ended(job)
        except Exception:
            logger.exception("job %s: telling an observer of its end failed", job.pk)
    if outcome.interrupted is not None:
        raise outcome.interrupted
    return job


@task
def run_shard_task(job_id: int, index: int) -> str:
    """Shard `index` of a job over several processes, for any worker to claim (occviz.jobs.shards).

    Defined here, not with the other tasks in tasks.py, because the coordinator enqueues it.
    """
    return run_shard(job_id, index)


def _enqueue_shard(job_id: int) -> Callable[[int], None]:
    def enqueue(index: int) -> None:
        run_shard_task.enqueue(job_id, index)

    return enqueue


def run_shard(job_id: int, index: int, *, runner: str | None = None) -> str:
    """Run shard `index` of a job over several processes: its slice of the actors, to the job's end.

    Returns how the shard ended (its JobShard status), or "not run" if its row was not
    waiting for it (the job failed at the barrier, or another process took it).
    """
    job = Job.objects.get(pk=job_id)
    shard = Shard(job, index, processes_of(job.params), runner=runner or runner_id("worker"))
    if job.status != Job.Status.RUNNING or shard.claim() is None:
        logger.info("job %s shard %s: not waiting for a process, not running it", job_id, index)
        return "not run"
    runnable = program(job.scenario)
    context, _ = _recording(job, runnable)
    context.shard = shard
    context.recorder.interleaved = True
    context.recorder.on_controls = lambda: None  # the coordinator delivers the job's controls
    with _running_lock:
        _running[job.pk] = context
        if _stopping_reason is not None:
            context.request_stop(_stopping_reason)
    # Its heartbeat from the claim on: a shard rebuilding its actors is not taken for dead.
    shard.start_watch(context)
    try:
        outcome = _run_program(runnable, context, slot=job.pk + index, shard=True)
    finally:
        shard.stop_watch()
        with _running_lock:
            _running.pop(job.pk, None)
    if outcome.error and not context.errors:
        # Failed before its actors ran (rebuilding them): the other shards stop on seeing it.
        context.errors.append(outcome.error.split("\n", 1)[0])
        shard.finish(context)
    if outcome.interrupted is not None:
        raise outcome.interrupted
    return JobShard.objects.filter(job_id=job_id, index=index).values_list("status", flat=True).first() or ""


def _start(job: Job, runner: str) -> bool:
    """Move the job from queued to running here; False (and `job` as it is now) if it is not to run."""
    if _stopping_reason is not None:
        # A signal arrived between the job's creation (or claim) and its start: it never begins.
        if not job.move(Job.Status.QUEUED, Job.Status.CANCELLED, cancel_requested=True, finished_at=timezone.now()):
            job.refresh_from_db()
        return False
    started = timezone.now()
    if not job.move(Job.Status.QUEUED, Job.Status.RUNNING, started_at=started, runner=runner, heartbeat_at=started):
        logger.info("job %s is %s, not queued: not running it", job.pk, job.status)
        return False
    return True


@dataclass
class Outcome:
    """How a program's run ended: its summary, or why it failed, or the interruption to pass on."""

    summary: dict[str, Any] | None = None
    error: str = ""
    interrupted: BaseException | None = None

    def status(self, context: JobContext) -> str:
        if context.errors:
            self.error = "\n".join(context.errors)
        if self.error:
            return Job.Status.FAILED
        if context.stop_reason == "cancelled":
            return Job.Status.CANCELLED
        return Job.Status.SUCCEEDED


def _run_program(runnable: JobProgram, context: JobContext, *, slot: int | None = None, shard: bool = False) -> Outcome:
    """Run the program with its recorder flushing, to whatever end; everything recorded is stored after.

    `shard`: run only this shard's actors, rebuilt by the program's `shard_actors` (it summarizes nothing).
    """
    outcome = Outcome()
    if slot is None and context.shard is not None:
        slot = context.job.pk  # each shard of a job on a CPU of its own
    # The flusher and the actors start inside: pinned, they inherit the one CPU.
    with one_cpu(slot), quick_handoffs():
        context.recorder.start()
        try:
            if shard:
                assert context.shard is not None
                actors = runnable.shard_actors(context, context.shard.plan)  # type: ignore[attr-defined]
                context.run_actors(actors, time_limit_s=context.shard.time_limit_s)
            else:
                outcome.summary = runnable.run(context)
        except Exception as failure:
            outcome.error = _failure(failure)
            logger.exception("job %s failed", context.job.pk)
        except BaseException as stopped:  # KeyboardInterrupt, SystemExit: record the end, then go on stopping
            outcome.interrupted = stopped
            context.request_stop("interrupted")
            outcome.error = f"its process was stopped ({type(stopped).__name__}) before the job ended"
        finally:
            context.recorder.stop()
    return outcome


def _record_end(job: Job, status: str, **fields: Any) -> None:
    """Move the job from running to `status`, retrying for a while if PostgreSQL is restarting.

    If the job was ended meanwhile by someone else (a reaper, a deletion), `job` is
    refreshed to what they recorded. If PostgreSQL stays away longer than
    FINAL_WRITE_PATIENCE_S, the job is left to the reapers: its heartbeat has stopped.
    """
    deadline = time.monotonic() + FINAL_WRITE_PATIENCE_S
    pause = 0.2
    while True:
        try:
            moved = job.move(Job.Status.RUNNING, status, **fields)
            break
        except Error as error:  # DatabaseError, or InterfaceError (a connection already closed)
            if connection.in_atomic_block or time.monotonic() >= deadline:
                logger.exception("job %s: its end could not be recorded (%s): left to the reapers", job.pk, status)
                return
            logger.warning("job %s: recording its end failed, retrying: %s", job.pk, error)
            connection.close()  # the next attempt connects afresh
            time.sleep(pause)
            pause = min(pause * 2, 2.0)
    if not moved:
        logger.warning("job %s was ended by another process before its runner could record it", job.pk)
    # If this read fails, what this process knows of the job stands.
    with contextlib.suppress(Error, Job.DoesNotExist):
        job.refresh_from_db(fields=["last_seq"] if moved else None)
