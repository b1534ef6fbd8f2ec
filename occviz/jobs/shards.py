"""One job over several processes: its shards, their barrier in PostgreSQL, and their watch on each other.

A job whose `processes` parameter is N > 1 runs its actors in N shards, each a process with
actors N/N-th of the job's, in order: shard 0 is the job's own runner (the coordinator, which
runs the program), shards 1..N-1 run elsewhere: `run_shard_task`s any worker may claim, or
`runshard` child processes of `runjob`. Each rebuilds its actors from the job's row and
stored objects (its program's `shard_actors(context, plan)`) and keeps its own slice.

- The barrier: every shard connects its actors, then marks itself arrived (`JobShard.arrived_at`).
  Once all have, the coordinator writes the release time, a moment ahead on PostgreSQL's clock
  (`released_at`); every shard turns it into its own clock, waits for it, and starts its
  actors' clock there, so all the shards' event times count from one moment. A shard that has
  not arrived within OCCVIZ_SHARD_ARRIVAL_S fails the job with why.
- No shard waits for a worker that is not there: one that no worker claimed within
  OCCVIZ_SHARD_CLAIM_S (every worker busy), or whose worker died after claiming it and before
  arriving, the coordinator starts itself, as a `runshard` child (ChildShards), and the
  shard's row names that process. After the release, a shard whose process dies fails the job.
- One sequence: each shard has its own recorder, and each batch takes its numbers from the job
  row in the transaction that stores it, so the shards' batches interleave without a gap.
- The watch: each shard renews its row's heartbeat every WATCH_INTERVAL_S and reads the
  others'. A shard that failed or was stopped (an actor's error, a cancel, a signal), or whose
  heartbeat is older than OCCVIZ_SHARD_HEARTBEAT_TIMEOUT_S (its process died), stops every
  other shard within the interval, and the coordinator fails the job naming it. A job ended
  by anyone else (a reaper, after the coordinator died) stops them too.
- Settings: a change the job's first process takes while the job runs (a live control's) and that
  every shard's actors must see is `share`d in the job's shared state (occviz.jobs.shared); each
  shard that `follow`s it applies it on its watch's next look, within the interval.
- The end: the coordinator waits for every shard to finish (its last batch stored) before the
  program summarizes from the stored events.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Protocol

from django.conf import settings
from django.db import Error, connection
from django.db.models import QuerySet
from django.utils import timezone

from occviz.jobs import shared
from occviz.jobs.models import Job, JobShard


class Stoppable(Protocol):
    """What a shard reads and stops of the job's running context (occviz.jobs.context.JobContext is one)."""

    stop: threading.Event
    stop_reason: str
    errors: list[str]

    def request_stop(self, reason: str) -> None: ...


logger = logging.getLogger(__name__)

MAX_PROCESSES = 16
# How often a shard renews its heartbeat and looks at the others'.
WATCH_INTERVAL_S = 0.2
# How far ahead of "all arrived" the release is set: time enough for every shard to read it.
RELEASE_AHEAD_S = 0.05
# How often a shard at the barrier looks whether the others have arrived.
BARRIER_POLL_S = 0.005
_ENDED = (JobShard.Status.DONE, JobShard.Status.FAILED, JobShard.Status.STOPPED)
# The names of the shared entries that hold the settings shards follow.
_SETTING = "setting:"


def _setting(name: str, default: float) -> float:
    """A shard timing: the setting if the project defines it, else its environment variable, else `default`."""
    value = getattr(settings, name, None)
    if value is None:
        value = os.environ.get(name) or default
    return float(value)


def arrival_bound_s() -> float:
    """How long the coordinator waits for every shard to arrive at the barrier (OCCVIZ_SHARD_ARRIVAL_S, 30)."""
    return _setting("OCCVIZ_SHARD_ARRIVAL_S", 30.0)


def claim_bound_s() -> float:
    """How long a shard's task waits for a worker before the coordinator starts it itself (OCCVIZ_SHARD_CLAIM_S, 2)."""
    return _setting("OCCVIZ_SHARD_CLAIM_S", 2.0)


def heartbeat_timeout_s() -> float:
    """A running shard whose heartbeat is older than this has stopped (OCCVIZ_SHARD_HEARTBEAT_TIMEOUT_S, 3)."""
    return _setting("OCCVIZ_SHARD_HEARTBEAT_TIMEOUT_S", 3.0)


def processes_of(params: dict[str, Any] | Any) -> int:
    """The processes a job's cleaned parameters ask for (1 for jobs from before there were shards)."""
    try:
        return max(1, int(params.get("processes") or 1))
    except (TypeError, ValueError, AttributeError):
        return 1


def parse_processes(raw: object, actors: int | None) -> int:
    """A `processes` parameter as an int: 1..MAX_PROCESSES, or "auto" (one per core, up to the actors).

    ValueError with the message a form shows.
    """
    text = "1" if raw in (None, "") else str(raw).strip().lower()
    if text == "auto":
        cores = os.cpu_count() or 1
        return max(1, min(cores, actors or 1, MAX_PROCESSES))
    if not (text.isascii() and text.isdigit()):
        raise ValueError(f'Give a whole number of processes from 1 to {MAX_PROCESSES}, or "auto".')
    processes = int(text)
    if not 1 <= processes <= MAX_PROCESSES:
        raise ValueError(f"A job runs in 1 to {MAX_PROCESSES} processes, not {processes}.")
    if actors is not None and processes > actors:
        raise ValueError(
            f"{processes} processes for {actors} actor{'s' * (actors != 1)}: each process runs at least one."
        )
    return processes


def slices(actors: int, processes: int) -> list[tuple[int, int]]:
    """Actors 1..`actors` in `processes` runs as even as can be, in order: [(first, last), ...]."""
    base, extra = divmod(actors, processes)
    ranges, first = [], 1
    for index in range(processes):
        size = base + (1 if index < extra else 0)
        ranges.append((first, first + size - 1))
        first += size
    return ranges


class ShardStopped(Exception):
    """This shard's actors are not to start: the job failed or was stopped at the barrier."""


class Shard:
    """This process's part of a job over several processes: its slice, the barrier and the watch.

    `launch(index)` (the coordinator's only) starts shard `index` elsewhere, as `launch_kind`
    says ("tasks" or "children"); `take_over(index)` starts it in a process of the coordinator's
    own, for a shard that no worker claimed in time or whose worker died before it arrived.
    """

    def __init__(
        self,
        job: Job,
        index: int,
        processes: int,
        *,
        launch: Callable[[int], None] | None = None,
        launch_kind: str = "tasks",
        take_over: Callable[[int], None] | None = None,
        runner: str = "",
    ) -> None:
        self.job_id = job.pk
        self.index = index
        self.processes = processes
        self.launch = launch
        self.launch_kind = launch_kind
        self.take_over = take_over
        self.runner = runner
        self.first = self.last = 0
        self.plan: dict[str, Any] = {}
        """What the program shares with its shards (the counter's seed)."""
        self.time_limit_s: float | None = None
        self._context: Stoppable | None = None
        self._stop_watch = threading.Event()
        self._watch: threading.Thread | None = None
        self._reported: set[int] = set()
        self._lock = threading.Lock()
        self._made_at = 0.0
        """When the coordinator made the rows (its monotonic clock): a task's claim is awaited from then."""
        self._taken_over: set[int] = set()
        self._followers: dict[str, Callable[[Any], None]] = {}
        self._applied: dict[str, Any] = {}

    @property
    def coordinator(self) -> bool:
        return self.index == 0

    # -- the coordinator's rows ----------------------------------------------------------

    def make_rows(self, actors: int, plan: dict[str, Any], time_limit_s: float) -> None:
        """The coordinator: one row per shard (its own running), then the other shards started."""
        if actors < self.processes:
            raise ValueError(f"{self.processes} processes for {actors} actors: each process runs at least one")
        now = timezone.now()
        rows = [
            JobShard(
                job_id=self.job_id,
                index=index,
                first_actor=first,
                last_actor=last,
                plan={"program": plan, "time_limit_s": time_limit_s},
                **(
                    {
                        "runner": self.runner,
                        "pid": os.getpid(),
                        "host": socket.gethostname(),
                        "status": JobShard.Status.RUNNING,
                        "heartbeat_at": now,
                    }
                    if index == 0
                    else {}
                ),
            )
            for index, (first, last) in enumerate(slices(actors, self.processes))
        ]
        JobShard.objects.bulk_create(rows)
        self._made_at = time.monotonic()
        self.first, self.last, self.plan = rows[0].first_actor, rows[0].last_actor, plan
        self.time_limit_s = time_limit_s
        assert self.launch is not None
        for index in range(1, self.processes):
            self.launch(index)

    def claim(self) -> JobShard | None:
        """A shard process: take its row (waiting -> running, by compare-and-swap); None if not to run."""
        moved = JobShard.objects.filter(job_id=self.job_id, index=self.index, status=JobShard.Status.WAITING).update(
            status=JobShard.Status.RUNNING,
            runner=self.runner,
            pid=os.getpid(),
            host=socket.gethostname(),
            heartbeat_at=timezone.now(),
        )
        if not moved:
            return None
        row = self._mine().get()
        self.first, self.last = row.first_actor, row.last_actor
        self.plan, self.time_limit_s = dict(row.plan.get("program") or {}), row.plan.get("time_limit_s")
        return row

    def _mine(self) -> QuerySet[JobShard]:
        """This shard's row while this process holds it: one handed back to another process is not mine any more."""
        return JobShard.objects.filter(job_id=self.job_id, index=self.index, pid=os.getpid(), host=socket.gethostname())

    # -- settings ----------------------------------------------------------------------------

    def share(self, name: str, value: Any) -> None:
        """Setting `name` is `value` (JSON) from now on, in every shard that follows it."""
        shared.put(self.job_id, f"{_SETTING}{name}", data=value)

    def follow(self, name: str, apply: Callable[[Any], None]) -> None:
        """`apply(value)` here each time setting `name` changes (on the watch's thread; a ValueError is logged).

        Call it before the actors run: a setting shared before this shard started is applied at its first look.
        """
        self._followers[name] = apply

    def _apply_settings(self) -> None:
        for name, apply in self._followers.items():
            value = shared.data(self.job_id, f"{_SETTING}{name}")
            if value is None or self._applied.get(name) == value:
                continue
            self._applied[name] = value
            try:
                apply(value)
            except ValueError as refused:  # its actors' proxies are gone: the shard is ending
                logger.warning(
                    "job %s shard %s: setting %s = %r not applied: %s", self.job_id, self.index, name, value, refused
                )

    # -- the watch -------------------------------------------------------------------------

    def start_watch(self, context: Stoppable) -> None:
        self._context = context
        name = f"job-{self.job_id}-shard-{self.index}"
        self._watch = threading.Thread(target=self._run_watch, name=name, daemon=True)
        self._watch.start()

    def stop_watch(self) -> None:
        self._stop_watch.set()
        if self._watch is not None and self._watch.is_alive():
            self._watch.join()

    def _run_watch(self) -> None:
        try:
            while not self._stop_watch.is_set():
                try:
                    self.look()
                except Error as error:
                    logger.warning("job %s shard %s: its watch failed, retrying: %s", self.job_id, self.index, error)
                    connection.close()
                self._stop_watch.wait(WATCH_INTERVAL_S)
        finally:
            connection.close()

    def look(self) -> None:
        """Renew this shard's heartbeat, say if it stopped, apply the settings it follows that changed, and stop it
        if another shard did (or the job ended)."""
        context = self._context
        assert context is not None
        mine = self._stopping_status(context)
        with connection.cursor() as cursor:
            if mine:
                cursor.execute(
                    "UPDATE jobs_jobshard SET status = %s, error = %s, heartbeat_at = now() "
                    "WHERE job_id = %s AND index = %s AND status = 'running' AND pid = %s AND host = %s",
                    [mine, self._why(context), self.job_id, self.index, os.getpid(), socket.gethostname()],
                )
            else:
                cursor.execute(
                    "UPDATE jobs_jobshard SET heartbeat_at = now() "
                    "WHERE job_id = %s AND index = %s AND status = 'running' AND pid = %s AND host = %s",
                    [self.job_id, self.index, os.getpid(), socket.gethostname()],
                )
            renewed = cursor.rowcount == 1
            cursor.execute(
                "SELECT s.index, s.runner, s.status, s.error, extract(epoch FROM now() - s.heartbeat_at), "
                "s.arrived_at IS NOT NULL, j.status "
                "FROM jobs_jobshard s JOIN jobs_job j ON j.id = s.job_id WHERE s.job_id = %s ORDER BY s.index",
                [self.job_id],
            )
            shards = cursor.fetchall()
        if not shards:
            return
        self._apply_settings()
        if shards[0][6] != Job.Status.RUNNING:
            context.request_stop("ended elsewhere")
            return
        if not renewed and not mine:
            # The coordinator marked this shard failed or stopped, or handed it to another process.
            context.request_stop("ended elsewhere")
        timeout = heartbeat_timeout_s()
        for index, runner, status, error, age, arrived, _ in shards:
            if index == self.index:
                continue
            if status == JobShard.Status.FAILED:
                self._fail(context, index, f"{self._name(index, runner)} failed: {error or 'no reason given'}")
            elif status == JobShard.Status.STOPPED:
                if error in ("", "cancelled", "stopped", "ended elsewhere", "failed"):
                    context.request_stop("cancelled" if error == "cancelled" else "stopped")
                else:  # its process was asked to stop (a signal to its worker): the job cannot be whole
                    self._fail(context, index, f"{self._name(index, runner)} was stopped: {error}")
            elif status == JobShard.Status.RUNNING and float(age or 0) > timeout and (arrived or index == 0):
                # One that died before arriving the coordinator starts again instead (_start_missing).
                self._stale(context, index, runner, float(age))

    @staticmethod
    def _stopping_status(context: Stoppable) -> str:
        """What this shard's row should say now that it stops early, or "" (still running, or just done)."""
        if context.errors:
            return JobShard.Status.FAILED
        if context.stop.is_set() and context.stop_reason in ("cancelled", "interrupted"):
            return JobShard.Status.STOPPED
        return ""

    def _name(self, index: int, runner: str) -> str:
        """How the job's error names a shard: "shard 1 of 3 (worker:host:4242)"."""
        return f"shard {index} of {self.processes} ({runner or 'not claimed'})"

    @staticmethod
    def _why(context: Stoppable) -> str:
        return "\n".join(context.errors) if context.errors else context.stop_reason

    def _fail(self, context: Stoppable, index: int, reason: str) -> None:
        with self._lock:
            if index in self._reported:
                return
            self._reported.add(index)
        if self.coordinator:
            context.errors.append(reason)
        context.request_stop("failed")

    def _stale(self, context: Stoppable, index: int, runner: str, age: float) -> None:
        reason = (
            f"{self._name(index, runner)} stopped renewing its heartbeat: "
            f"none for {age:.1f} s (its process died, or lost PostgreSQL)"
        )
        if self.coordinator:
            # Marked failed by compare-and-swap: the shard, if it comes back, stops on seeing it.
            JobShard.objects.filter(job_id=self.job_id, index=index, status=JobShard.Status.RUNNING).update(
                status=JobShard.Status.FAILED, error=reason, finished_at=timezone.now()
            )
        logger.warning("job %s: %s", self.job_id, reason)
        self._fail(context, index, reason)

    # -- the barrier -------------------------------------------------------------------------

    def arrive_and_wait(self, context: Stoppable) -> float:
        """Mark this shard arrived, wait for the release, and return it on this process's perf_counter clock.

        ShardStopped if the actors are not to start (the reason is in the job's errors, on the coordinator).
        """
        if not self._mine().update(arrived_at=timezone.now(), heartbeat_at=timezone.now()):
            context.request_stop("ended elsewhere")
            raise ShardStopped("its row was handed to another process")
        bound = arrival_bound_s()
        deadline = time.monotonic() + bound + (0 if self.coordinator else bound)
        while True:
            if context.stop.is_set():
                raise ShardStopped(context.stop_reason)
            before = time.perf_counter()
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT s.index, s.status, s.arrived_at IS NOT NULL, s.released_at, s.runner, "
                    "clock_timestamp(), j.status, extract(epoch FROM clock_timestamp() - s.heartbeat_at) "
                    "FROM jobs_jobshard s JOIN jobs_job j ON j.id = s.job_id WHERE s.job_id = %s ORDER BY s.index",
                    [self.job_id],
                )
                shards = cursor.fetchall()
                if shards[0][6] != Job.Status.RUNNING or any(row[1] in _ENDED for row in shards):
                    context.request_stop("stopped")
                    raise ShardStopped("another shard stopped before the release")
                released_at: datetime | None = shards[0][3]
                if released_at is None and self.coordinator and all(row[2] for row in shards):
                    cursor.execute(
                        "UPDATE jobs_jobshard SET released_at = clock_timestamp() + make_interval(secs => %s) "
                        "WHERE job_id = %s AND index = 0 RETURNING released_at, clock_timestamp()",
                        [RELEASE_AHEAD_S, self.job_id],
                    )
                    released_at, now = cursor.fetchone()
                else:
                    now = shards[0][5]
            after = time.perf_counter()
            if released_at is not None:
                release = (before + after) / 2 + (released_at - now).total_seconds()
                wait = release - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                return release
            if self.coordinator:
                self._start_missing(shards)
            if time.monotonic() > deadline:
                missing = [row for row in shards if not row[2]]
                self._never_arrived(context, missing, bound)
            time.sleep(BARRIER_POLL_S)

    def _start_missing(self, shards: Sequence[tuple[Any, ...]]) -> None:
        """The coordinator before the release: start here each shard that would otherwise never arrive.

        A shard's task no worker claimed within claim_bound_s() (every worker busy, or none
        running), and a shard whose process claimed it, then stopped renewing its heartbeat
        before arriving (it died): that one is handed back first, by compare-and-swap, so a
        shard arriving meanwhile keeps its row. Either is then claimed by a `runshard` process of
        this one, or by a worker that got there first; a worker claiming it later does nothing.
        """
        if self.take_over is None:
            return
        timeout = heartbeat_timeout_s()
        for index, status, arrived, _, runner, _, _, age in shards[1:]:
            if arrived:
                continue
            if status == JobShard.Status.WAITING:
                if self.launch_kind != "tasks" or index in self._taken_over:
                    continue
                if time.monotonic() - self._made_at < claim_bound_s():
                    continue
                why = f"no worker claimed it within {claim_bound_s():g} s"
            elif status == JobShard.Status.RUNNING and age is not None and float(age) > timeout:
                if not self._hand_back(index, timeout):
                    continue
                why = f"{self._name(index, runner)} stopped renewing its heartbeat before it arrived (its process died)"
            else:
                continue
            logger.warning("job %s shard %s: %s: starting it in a process of this one", self.job_id, index, why)
            self._taken_over.add(index)
            self.take_over(index)

    def _hand_back(self, index: int, timeout: float) -> bool:
        """Shard `index` claimed, not arrived, silent longer than `timeout`: waiting again; False if not so now."""
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE jobs_jobshard SET status = 'waiting', runner = '', pid = NULL, host = '', heartbeat_at = NULL "
                "WHERE job_id = %s AND index = %s AND status = 'running' AND arrived_at IS NULL "
                "AND heartbeat_at < now() - make_interval(secs => %s)",
                [self.job_id, index, timeout],
            )
            return cursor.rowcount == 1

    def _never_arrived(self, context: Stoppable, missing: Sequence[tuple[Any, ...]], bound: float) -> None:
        if not self.coordinator:
            context.request_stop("stopped")
            raise ShardStopped("the release never came")
        index, status, runner = missing[0][0], missing[0][1], missing[0][4]
        why = "no process took it" if status == JobShard.Status.WAITING else f"{runner} took it and did not connect"
        reason = f"shard {index} of {self.processes} never arrived within {bound:g} s: {why}"
        with self._lock:  # said here: the watch, finding their rows stopped with this reason, is not to say it again
            self._reported.update(row[0] for row in missing)
        # The shards not arrived are stopped: one claimed later finds its row taken and does nothing.
        JobShard.objects.filter(
            job_id=self.job_id, index__in=[row[0] for row in missing], status__in=["waiting", "running"]
        ).update(status=JobShard.Status.STOPPED, error=reason, finished_at=timezone.now())
        context.errors.append(reason)
        context.request_stop("failed")
        raise ShardStopped(reason)

    # -- the end -------------------------------------------------------------------------------

    def finish(self, context: Stoppable) -> None:
        """Record how this shard ended; the coordinator then waits for every other shard to end."""
        status = self._stopping_status(context) or (
            JobShard.Status.STOPPED if context.stop_reason in ("stopped", "failed", "ended elsewhere") else "done"
        )
        mine = self._mine()
        mine.filter(status=JobShard.Status.RUNNING).update(
            status=status, error="" if status == "done" else self._why(context)
        )
        # Its status may have been said earlier (by its watch, or by the coordinator): it ends now.
        mine.filter(finished_at=None).update(finished_at=timezone.now())
        if self.coordinator:
            while JobShard.objects.filter(job_id=self.job_id, status=JobShard.Status.RUNNING).exists():
                time.sleep(0.02)  # the watch ends a shard that stopped renewing its heartbeat
        self.stop_watch()
        if self.coordinator:
            self.look_once_more(context)

    def look_once_more(self, context: Stoppable) -> None:
        """The shards' ends as they were recorded: a failure the watch had not seen yet fails the job too."""
        for index, runner, error in JobShard.objects.filter(
            job_id=self.job_id, status=JobShard.Status.FAILED
        ).values_list("index", "runner", "error"):
            if index != self.index and error and not any(error in known for known in context.errors):
                self._fail(context, index, f"{self._name(index, runner)} failed: {error}")

    def summary(self) -> list[dict[str, Any]]:
        return [
            {"index": index, "runner": runner, "pid": pid, "actors": [first, last]}
            for index, runner, pid, first, last in JobShard.objects.filter(job_id=self.job_id)
            .order_by("index")
            .values_list("index", "runner", "pid", "first_actor", "last_actor")
        ]


class ChildShards:
    """runjob's way: each shard a `manage.py runshard JOB INDEX` child process of its own."""

    def __init__(self, job_id: int) -> None:
        self.job_id = job_id
        self.children: list[subprocess.Popen[bytes]] = []

    def launch(self, index: int) -> None:
        manage = os.path.join(settings.BASE_DIR, "manage.py")
        self.children.append(
            subprocess.Popen(
                [sys.executable, manage, "runshard", str(self.job_id), str(index)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C reaches runjob, which stops them through the watch
            )
        )

    def reap(self, timeout_s: float = 10.0) -> None:
        """Wait for the children (they end with their shard), and kill any still there after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        for child in self.children:
            try:
                child.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.warning("job %s: shard process %s did not end: killing it", self.job_id, child.pid)
                child.kill()
                child.wait()


__all__ = [
    "MAX_PROCESSES",
    "ChildShards",
    "Shard",
    "ShardStopped",
    "arrival_bound_s",
    "claim_bound_s",
    "heartbeat_timeout_s",
    "parse_processes",
    "processes_of",
    "slices",
]
