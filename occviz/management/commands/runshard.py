"""runshard: run one shard of a job over several processes, in this process.

    python manage.py runshard JOB INDEX

runjob starts these, and so does a worker running a job whose shard no other worker took in
time, or whose worker died before the release. The shard's row must be waiting for a process
(its job's coordinator made it); the shard then runs its slice of the job's actors, released
with the other shards', and ends with them. SIGINT or SIGTERM stops it within a second, and with it the whole job.
"""

from __future__ import annotations

import signal
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from occviz.jobs.models import Job
from occviz.jobs.runner import run_shard, runner_id, stop_all_jobs


class Command(BaseCommand):
    help = "Run one shard of a job over several processes (runjob --processes N starts them)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("job", type=int, help="the job's id")
        parser.add_argument("index", type=int, help="the shard's index, 1 to processes - 1")

    def handle(self, *args: Any, **options: Any) -> None:
        if not Job.objects.filter(pk=options["job"]).exists():
            raise CommandError(f"no job {options['job']}", returncode=2)

        def stop(signum: int, frame: object) -> None:
            stop_all_jobs("interrupted")

        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, stop)
        status = run_shard(options["job"], options["index"], runner=runner_id("runshard"))
        if status == "failed":
            raise CommandError(f"job {options['job']} shard {options['index']} failed")
