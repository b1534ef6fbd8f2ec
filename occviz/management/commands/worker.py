"""worker: django-tasks-db's `db_worker`, plus what keeps jobs honest.

    python manage.py worker --interval 0.2 --worker-id w1

Every flag of `db_worker` works as there; the worker runs one job at a time. Besides:

- it is a reaper: every REAP_INTERVAL_S it ends the running jobs whose runner stopped
  renewing their heartbeat, whichever process ran them (`occviz.jobs.reaper`);
- on SIGINT or SIGTERM it stops the job it runs (its actors within a second, recorded as
  cancelled with its summary) and exits, where `db_worker` would let the job run to its
  end. A second signal exits at once; the job is then ended by the reapers.

Each job it runs records it as its runner: OCCVIZ_RUNNER_ID if set, else `worker:<host>:<pid>`.
"""

from __future__ import annotations

import os
from types import FrameType
from typing import Any

from django.core.management.base import CommandError
from django.utils.autoreload import DJANGO_AUTORELOAD_ENV, run_with_reloader
from django_tasks_db.management.commands import db_worker

from occviz.jobs.reaper import start_reaper
from occviz.jobs.runner import stop_all_jobs

# How often a worker looks for jobs whose runner died (their timeout is OCCVIZ_HEARTBEAT_TIMEOUT_S).
REAP_INTERVAL_S = 2.0


class JobWorker(db_worker.Worker):
    """db_worker's loop; a stop signal also stops the job being run, rather than waiting for its end."""

    def shutdown(self, signum: int, frame: FrameType | None) -> None:
        if self.running:
            stop_all_jobs("cancelled")
        super().shutdown(signum, frame)

    def run(self) -> None:
        reaper = start_reaper(REAP_INTERVAL_S)
        try:
            super().run()
        finally:
            reaper.stop()


class Command(db_worker.Command):
    help = "Run queued jobs (as db_worker does), and end the running jobs whose runner died."

    def handle(self, *args: Any, **options: Any) -> None:
        # db_worker's own handle, with JobWorker for its Worker.
        self.configure_logging(options["verbosity"])
        reload, batch = options["reload"], options["batch"]
        if reload and batch:
            db_worker.logger.warning("--reload and --batch cannot be specified together. Disabling autoreload.")
            reload = False
        queue_names = options["queue_name"].split(",")
        excluded_queue_names = options["exclude_queues"].split(",") if options["exclude_queues"] else []
        if excluded_queue_names and "*" not in queue_names:
            raise CommandError("--exclude-queues can only be used with --queue-name=*")
        worker = JobWorker(
            queue_names=queue_names,
            interval=options["interval"],
            batch=batch,
            backend_name=options["backend_name"],
            startup_delay=options["startup_delay"],
            max_tasks=options["max_tasks"],
            worker_id=options["worker_id"],
            excluded_queue_names=excluded_queue_names,
        )
        if reload:
            if os.environ.get(DJANGO_AUTORELOAD_ENV) == "true":
                worker.configure_signals()  # only the reloaded child runs tasks
            run_with_reloader(worker.run)
        else:
            worker.configure_signals()
            worker.run()
