"""A job made of jobs: a sweep's points, the anomalies table's cells, each a whole job of its own.

A program calls `run_child` from its `run()`: the child is created (validated by its
scenario's form, linked by `Job.parent`) and run to its end in the calling thread, with
its own events, summary and page. The parent's admission already counted what its largest
child needs, so a child is not admitted again; a stop of the parent (cancel, time limit,
signal) stops the child running now, and the parent's program then stops making more.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from occviz.jobs.runner import run_job, running_context
from occviz.jobs.tasks import create_job

if TYPE_CHECKING:
    from occviz.jobs.context import JobContext
    from occviz.jobs.models import Job


def run_child(parent: JobContext, scenario: str, data: dict[str, Any]) -> Job:
    """Run a job of `scenario` with `data` as a part of `parent`'s job; returns it ended.

    ParamsError if `data` is not valid for `scenario` (no job made).
    """
    child = create_job(scenario, data, parent.job.created_by, parent=parent.job)
    if parent.stop.is_set():
        child.request_cancel()  # still queued: cancelled at once, never started
        return child
    finished = threading.Event()

    def pass_the_stop_on() -> None:
        while not finished.wait(0.05):
            if parent.stop.is_set() and (running := running_context(child.pk)) is not None:
                running.request_stop(parent.stop_reason or "cancelled")
                return

    watcher = threading.Thread(target=pass_the_stop_on, name=f"job-{parent.job.pk}-child-{child.pk}", daemon=True)
    watcher.start()
    try:
        return run_job(child.pk, runner=parent.job.runner or None)
    finally:
        finished.set()
        watcher.join()
