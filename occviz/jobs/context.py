"""What a running program is given: `JobContext`, its job and parameters, recorder, stop signal and controls.

A program runs its actors through `run_actors` (threads released together by one
barrier, stopped at the time limit), takes the failure controls asked for while it
runs with `on_control`, and follows writes to its objects from outside the job (the
admin, the API) with `on_outside_write`, each outside writer on a lane of its own
(`outside_lane`). The runner (runner.py) makes the context; programs only use it.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import OperationalError, connection, connections, transaction
from django.utils import timezone

from occviz.jobs.figures import Totals
from occviz.jobs.models import Job, JobControl
from occviz.jobs.recorder import EventRecorder
from occviz.jobs.shards import Shard, ShardStopped
from occviz.jobs.snapshots import snapshot_or_empty
from occviz.store import rows

logger = logging.getLogger(__name__)

# An actor prepares (connects), then calls `ready()` and waits with all the others.
Actor = Callable[[Callable[[], object]], None]
# How long settling waits for one of the job's objects before it lets go of the job's row and tries again.
SETTLE_LOCK_TIMEOUT = "100ms"

# A control asked for while the job runs: (action, target actor or None, seconds or None).
ControlHandler = Callable[[str, int | None, float | None], None]
# A write to one of the job's objects from outside it (the admin, the API), as store.writes describes it.
OutsideWriteHandler = Callable[[dict[str, Any]], None]


_DELIVERED = rows.fields_named(JobControl, "id", "action", "actor", "seconds", "payload")
"""The fields of a control its delivery reads."""

_APPLIED_SQL = (
    "UPDATE jobs_jobcontrol SET outcome = applied.outcome, applied_at = applied.at"
    " FROM unnest(%s::bigint[], %s::text[], %s::timestamptz[]) AS applied(id, outcome, at)"
    " WHERE jobs_jobcontrol.id = applied.id"
)


@functools.cache
def _pending_sql(alias: str) -> str:
    """The job's controls not yet applied, in order, claimed (those another delivery holds are skipped)."""
    return (
        f"SELECT {rows.columns_of(_DELIVERED, connections[alias])} FROM jobs_jobcontrol"
        " WHERE job_id = %s AND applied_at IS NULL ORDER BY id FOR UPDATE SKIP LOCKED"
    )


class JobContext:
    """What a running program is given: its job and parameters, the recorder, the stop signal."""

    def __init__(self, job: Job, recorder: EventRecorder) -> None:
        self.job = job
        self.params: dict[str, Any] = dict(job.params)
        self.recorder = recorder
        self.stop = threading.Event()
        self.stop_reason = ""
        self.errors: list[str] = []
        self.elapsed_s = 0.0
        self._control_handler: ControlHandler | None = None
        self._outside_handler: OutsideWriteHandler | None = None
        self._next_actor: Callable[[], int] = lambda: 0
        self.shard: Shard | None = None
        """This process's part of a job over several processes (its runner sets it), or None."""
        self.outside_lanes: dict[str, int] = {}
        """Outside writers' lanes: name -> actor number, in the order they first wrote."""
        self._lanes_lock = threading.Lock()
        # The recorder's thread delivers; a program settling its accounts delivers too (settle_outside_writes).
        self._delivering = threading.Lock()
        recorder.on_cancel = lambda: self.request_stop("cancelled")
        recorder.controls_seen = job.controls_requested
        recorder.on_controls = self.deliver_controls

    def on_control(self, handler: ControlHandler) -> None:
        """Controls asked for while the job runs go to `handler(action, actor, seconds)`; a ValueError refuses one."""
        self._control_handler = handler

    def on_outside_write(
        self, handler: OutsideWriteHandler | None, *, next_actor: Callable[[], int] | None = None
    ) -> None:
        """Writes to the job's objects by the admin or the API (and their refusals) go to `handler(payload)`.

        The payload is `occviz.store.writes`'s: change (the Change's id), type (MODIFIED, CONFLICT,
        ADDED, DELETED), resource, object_id, name, via, writer, expected_version, resource_version,
        before and after. `next_actor()` numbers a new outside writer's lane (after the program's
        own actors). A handler of None stops following: later writes are marked as not followed.
        """
        self._outside_handler = handler
        if next_actor is not None:
            self._next_actor = next_actor

    def outside_lane(self, name: str) -> int:
        """The actor number of outside writer `name`'s lane, numbered the first time it writes."""
        with self._lanes_lock:
            number = self.outside_lanes.get(name)
            if number is None:
                number = self.outside_lanes[name] = self._next_actor()
            return number

    @contextmanager
    def settling(self, lock_objects: Callable[[], object]) -> Iterator[None]:
        """The transaction to settle the outside writes in: the job's row locked, then its objects (`lock_objects`).

        In the order a student's press locks them (occviz.students.presses), so a press waiting for
        an object never waits on settling in a circle (it did, the other way round: settling held
        the hot row and waited for the job's row, the press held the job's row and waited for the
        hot row, and PostgreSQL ended the job's transaction as the deadlock's victim). An API or
        admin write locks the object first, then the job's row: if one holds an object, settling
        gives up on it after SETTLE_LOCK_TIMEOUT, lets go of the job's row and tries again, with
        nothing handed over yet.
        """
        with transaction.atomic():
            while True:
                try:
                    with transaction.atomic():  # a savepoint: the locks go with it if it rolls back
                        list(Job.objects.filter(pk=self.job.pk).select_for_update(no_key=True).values_list("pk"))
                        _local_lock_timeout(SETTLE_LOCK_TIMEOUT)
                        lock_objects()
                        _local_lock_timeout("0")
                    break
                except OperationalError as error:
                    if getattr(error.__cause__, "sqlstate", None) != "55P03":  # lock_not_available
                        raise
                    time.sleep(0.01)
            yield

    def settle_outside_writes(self) -> None:
        """Hand every outside write committed so far to the program now, and stop following them.

        Called by a program that is about to check its objects against its events: call it in
        `settling` (a transaction that has locked the job's row and those objects), so that no
        outside write lands between what it reads and what its events say. It waits for a
        delivery under way on the recorder's thread, so none is half recorded.
        """
        self.deliver_controls()
        self._outside_handler = None
        # In the settling transaction: a writer that commits after it can tell its write came too late.
        Job.objects.filter(pk=self.job.pk).update(outside_writes_closed_at=timezone.now())

    def deliver_controls(self) -> None:
        """Hand each control not yet applied to the program, once (from the recorder's thread, or settling)."""
        with self._delivering:
            self._deliver_controls()

    def _deliver_controls(self) -> None:
        # Claimed under their rows' locks and marked applied with their outcomes in one write: a control
        # is handled once, and nobody sees it applied before they can see whether it was refused. All that
        # are waiting at once, in four statements made once: a class pressing sends dozens a second, and
        # each one's Python is time the job's own writers wait for the interpreter lock.
        failed: Exception | None = None
        applied: list[tuple[int, str, datetime]] = []
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(_pending_sql(connection.alias), [self.job.pk])
            for row in cursor.fetchall():
                control = rows.from_row(JobControl, connection.alias, _DELIVERED, row)
                try:
                    outcome = self._apply(control)
                except Exception as error:  # raised once those before it are stored as applied; it and the rest wait
                    failed = error
                    break
                applied.append((control.pk, outcome, timezone.now()))
            if applied:
                ids, outcomes, times = (list(column) for column in zip(*applied, strict=True))
                cursor.execute(_APPLIED_SQL, [ids, outcomes, times])
        if failed is not None:
            raise failed

    def _apply(self, control: JobControl) -> str:
        """Hand `control` to the program: '' once applied, else why it was not."""
        if control.action == "outside":
            # Followed after the stop too: the writers wind down, and the objects still take writes.
            if self._outside_handler is None:
                return "the job does not follow outside writes now"
            self._outside_handler(control.payload or {})
            return ""
        if self._control_handler is None or self.stop.is_set():
            return "the job takes no controls now"
        try:
            self._control_handler(control.action, control.actor, control.seconds)
        except ValueError as refused:
            return str(refused)
        return ""

    def final_figures(self) -> Totals:
        """The job's figures as it ends: everything recorded so far stored, and its snapshot's figures.

        A program's summary starts from them (and adds its invariant), so the summary says what
        the live page, replay and compare show.
        """
        self.recorder.flush()
        return snapshot_or_empty(self.job.pk, self.recorder.last_seq)["figures"]

    def request_stop(self, reason: str) -> None:
        if not self.stop.is_set():
            self.stop_reason = reason
            self.stop.set()

    def run_actors(
        self, actors: Sequence[Actor], *, time_limit_s: float | None = None, plan: dict[str, Any] | None = None
    ) -> None:
        """Run `actors` as threads released by one barrier; return when all have finished.

        In a job over several processes (`shard` set), only this shard's slice of them runs
        here, and the barrier spans every shard (occviz.jobs.shards). The coordinator makes
        the shards (they are given `plan`: what the program shares with them, as JSON), and
        returns once every shard has finished, with all their events stored.
        """
        limit_s = time_limit_s if time_limit_s is not None else settings.OCCVIZ_MAX_SECONDS
        timer = threading.Timer(limit_s, self.request_stop, ["time limit"])
        timer.daemon = True
        numbered = list(enumerate(actors, start=1))
        shard = self.shard
        if shard is not None:
            if shard.coordinator:
                shard.make_rows(len(actors), plan or {}, limit_s)
                shard.start_watch(self)  # the other shards' from their claim (run_shard)
            numbered = numbered[shard.first - 1 : shard.last]

        def release() -> None:
            self.recorder.start_clock()
            timer.start()

        ready: Callable[[], object]
        if shard is None:
            barrier = threading.Barrier(len(numbered), action=release)
            ready, abort = barrier.wait, barrier.abort
        else:
            # Two steps: this shard's actors connect, then this thread (its connection is the
            # runner's own) meets the other shards at the barrier in PostgreSQL, then releases them.
            connected = threading.Barrier(len(numbered) + 1)
            go, released = threading.Event(), threading.Event()

            def ready_here() -> None:
                connected.wait()
                go.wait()
                if not released.is_set():
                    raise threading.BrokenBarrierError

            ready = ready_here
            abort = connected.abort
        threads = [
            threading.Thread(
                target=self._actor_main, args=(number, actor, ready, abort), name=f"job-{self.job.pk}-actor-{number}"
            )
            for number, actor in numbered
        ]
        try:
            for thread in threads:
                thread.start()
            if shard is not None:
                try:
                    connected.wait()
                    self.recorder.start_clock(shard.arrive_and_wait(self))
                    released.set()
                    timer.start()
                except (threading.BrokenBarrierError, ShardStopped) as stopped:
                    logger.warning("job %s shard %s: its actors do not start: %s", self.job.pk, shard.index, stopped)
                except Exception as error:  # PostgreSQL gone at the barrier, say: this shard fails, and so the job
                    logger.exception("job %s shard %s: at the barrier", self.job.pk, shard.index)
                    self.errors.append(f"at the barrier: {type(error).__name__}: {error}")
                    self.request_stop("failed")
                finally:
                    go.set()
            for thread in threads:
                thread.join()
        finally:
            timer.cancel()
            self.elapsed_s = self.recorder.now_ms() / 1000.0
            self.recorder.flush()  # the scenario summarizes from the stored events
            if shard is not None:
                shard.finish(self)
                if shard.coordinator:
                    self.elapsed_s = self.recorder.now_ms() / 1000.0  # until the last shard ended
                # Every shard's batches are stored now: the program reads up to the job's last event.
                stored = Job.objects.filter(pk=self.job.pk).values_list("last_seq", flat=True).first()
                self.recorder.last_seq = max(self.recorder.last_seq, stored or 0)

    def _actor_main(self, number: int, actor: Actor, ready: Callable[[], object], abort: Callable[[], None]) -> None:
        try:
            actor(ready)
        except threading.BrokenBarrierError:
            pass  # another actor failed before the start; its error is the one reported
        except Exception as error:
            message = f"actor {number}: {type(error).__name__}: {error}"
            logger.exception("job %s: %s", self.job.pk, message)
            self.errors.append(message)
            self.recorder.record(number, 0, 0, "error", detail={"message": message})
            abort()
            self.request_stop("failed")
        finally:
            connections.close_all()


def _local_lock_timeout(value: str) -> None:
    """How long a row lock may be waited for, until the current transaction ends ("0": for ever)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('lock_timeout', %s, true)", [value])


__all__ = ["Actor", "ControlHandler", "JobContext", "OutsideWriteHandler"]
