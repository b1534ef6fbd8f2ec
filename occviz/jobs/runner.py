"""The job runner: one job, in this process, its actors as threads released together.

Whoever runs a job (a `db_worker` through `run_job_task`, or `runjob` in its own
process) calls `run_job`. It moves the job to running by compare-and-swap (so a
job cancelled while queued is never started, and two workers never run the same
job), starts the event recorder, lets the scenario run its actors, and records the
outcome. Actors stop early on cancel, on the time limit, or when one of them fails.
"""

from __future__ import annotations

import logging
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from django.conf import settings
from django.db import connections
from django.utils import timezone

from occviz.jobs.affinity import one_cpu, quick_handoffs
from occviz.jobs.models import Job, JobControl
from occviz.jobs.recorder import EventRecorder
from occviz.jobs.registry import observers_for, program

logger = logging.getLogger(__name__)

# An actor prepares (connects), then calls `ready()` and waits with all the others.
Actor = Callable[[Callable[[], object]], None]
# A control asked for while the job runs: (action, target actor or None, seconds or None).
ControlHandler = Callable[[str, int | None, float | None], None]


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
        recorder.on_cancel = lambda: self.request_stop("cancelled")
        recorder.controls_seen = job.controls_requested
        recorder.on_controls = self.deliver_controls

    def on_control(self, handler: ControlHandler) -> None:
        """Controls asked for while the job runs go to `handler(action, actor, seconds)`; a ValueError refuses one."""
        self._control_handler = handler

    def deliver_controls(self) -> None:
        """Hand each control not yet applied to the program, once (called from the recorder's thread)."""
        for control in JobControl.objects.filter(job_id=self.job.pk, applied_at=None).order_by("id"):
            # Applied by compare-and-swap: two deliveries never apply the same control twice.
            if not JobControl.objects.filter(pk=control.pk, applied_at=None).update(applied_at=timezone.now()):
                continue
            outcome = ""
            if self._control_handler is None or self.stop.is_set():
                outcome = "the job takes no controls now"
            else:
                try:
                    self._control_handler(control.action, control.actor, control.seconds)
                except ValueError as refused:
                    outcome = str(refused)
            if outcome:
                JobControl.objects.filter(pk=control.pk).update(outcome=outcome)

    def request_stop(self, reason: str) -> None:
        if not self.stop.is_set():
            self.stop_reason = reason
            self.stop.set()

    def run_actors(self, actors: Sequence[Actor], *, time_limit_s: float | None = None) -> None:
        """Run `actors` as threads released by one barrier; return when all have finished."""
        limit_s = time_limit_s if time_limit_s is not None else settings.OCCVIZ_MAX_SECONDS
        timer = threading.Timer(limit_s, self.request_stop, ["time limit"])
        timer.daemon = True

        def release() -> None:
            self.recorder.start_clock()
            timer.start()

        barrier = threading.Barrier(len(actors), action=release)
        threads = [
            threading.Thread(
                target=self._actor_main, args=(number, actor, barrier), name=f"job-{self.job.pk}-actor-{number}"
            )
            for number, actor in enumerate(actors, start=1)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        timer.cancel()
        self.elapsed_s = self.recorder.now_ms() / 1000.0
        self.recorder.flush()  # the scenario summarizes from the stored events

    def _actor_main(self, number: int, actor: Actor, barrier: threading.Barrier) -> None:
        try:
            actor(barrier.wait)
        except threading.BrokenBarrierError:
            pass  # another actor failed before the start; its error is the one reported
        except Exception as error:
            message = f"actor {number}: {type(error).__name__}: {error}"
            logger.exception("job %s: %s", self.job.pk, message)
            self.errors.append(message)
            self.recorder.record(number, 0, 0, "error", detail={"message": message})
            barrier.abort()
            self.request_stop("failed")
        finally:
            connections.close_all()


def run_job(job_id: int) -> Job:
    """Run a queued job to its end; returns it in its final state."""
    job = Job.objects.get(pk=job_id)
    if not job.move(Job.Status.QUEUED, Job.Status.RUNNING, started_at=timezone.now()):
        logger.info("job %s is %s, not queued: not running it", job.pk, job.status)
        return job
    runnable = program(job.scenario)
    recorder = EventRecorder(job.pk, last_seq=job.last_seq)
    observers = observers_for(job)
    recorder.listeners.extend(observer.stored for observer in observers)
    context = JobContext(job, recorder)
    summary: dict[str, Any] | None = None
    error = ""
    # The flusher and the actors start inside: pinned, they inherit the one CPU.
    with one_cpu(), quick_handoffs():
        recorder.start()
        try:
            summary = runnable.run(context)
        except Exception:
            error = traceback.format_exc()
            logger.exception("job %s failed", job.pk)
        finally:
            recorder.stop()
    if context.errors:
        error = "\n".join(context.errors)
    if error:
        status = Job.Status.FAILED
    elif context.stop_reason == "cancelled":
        status = Job.Status.CANCELLED
    else:
        status = Job.Status.SUCCEEDED
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
    job.move(
        Job.Status.RUNNING,
        status,
        finished_at=timezone.now(),
        last_seq=recorder.last_seq,
        summary=summary,
        invariant_ok=None if summary is None else summary["invariant_ok"],
        error=error,
    )
    for observer in observers:
        observer.ended(job)
    return job
