"""runjob: run a job headless, in this process, and print its summary.

    python manage.py runjob counter --writers 8 --increments 100 --strategy occ --json

The job is recorded like any other (events, summary, admin), but no worker is
needed: the actors run as threads of this command.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from occviz.concurrency.retry import PRESETS
from occviz.concurrency.strategies import STRATEGIES
from occviz.jobs.models import Job
from occviz.jobs.runner import run_job
from occviz.jobs.tasks import create_job
from occviz.scenarios.base import ParamsError

# Flags that are not job parameters.
_OWN = {
    "scenario",
    "json",
    "verbosity",
    "settings",
    "pythonpath",
    "traceback",
    "no_color",
    "force_color",
    "skip_checks",
}


class Command(BaseCommand):
    help = "Run a contention job headless and print its summary."

    def add_arguments(self, parser: CommandParser) -> None:
        scenarios = parser.add_subparsers(dest="scenario", required=True, metavar="SCENARIO")
        counter = scenarios.add_parser(
            "counter",
            help="N writers x M increments over K rows",
            called_from_command_line=parser.called_from_command_line,
        )
        counter.add_argument("--strategy", required=True, choices=list(STRATEGIES))
        counter.add_argument("--writers", type=int, default=4)
        amount = counter.add_mutually_exclusive_group()
        amount.add_argument("--increments", type=int, help="increments per writer (default 100)")
        amount.add_argument("--seconds", type=float, help="run for this long instead")
        counter.add_argument("--rows", type=int, default=1)
        counter.add_argument("--think-ms", type=float, default=0.0, help="pause between read and write")
        counter.add_argument("--retry", choices=list(PRESETS), default="k8s-default-backoff")
        counter.add_argument("--max-attempts", type=int)
        counter.add_argument("--base-ms", type=float, default=10.0, help="exponential: first wait")
        counter.add_argument("--factor", type=float, default=2.0, help="exponential: growth per retry")
        counter.add_argument("--cap-ms", type=float, default=1000.0, help="exponential: longest wait")
        counter.add_argument("--lock", choices=["update", "share"], default="update", help="pessimistic lock mode")
        counter.add_argument("--isolation", choices=["serializable", "repeatable-read"], default="serializable")
        counter.add_argument("--initial-value", type=int, default=0)
        counter.add_argument("--seed", type=int)
        for sub in (counter,):
            sub.add_argument("--json", action="store_true", help="print only the summary, as one JSON object")

    def handle(self, *args: Any, **options: Any) -> None:
        scenario = options["scenario"]
        data = {key: value for key, value in options.items() if key not in _OWN and value is not None}
        try:
            job = create_job(scenario, data)
        except ParamsError as error:
            flags = "; ".join(
                f"--{field.replace('_', '-')}: {' '.join(messages)}" if field != "__all__" else " ".join(messages)
                for field, messages in error.errors.items()
            )
            raise CommandError(f"invalid job: {flags}", returncode=2) from None
        job = run_job(job.pk)
        if job.summary is None:
            raise CommandError(f"job {job.pk} failed:\n{job.error}")
        if options["json"]:
            self.stdout.write(json.dumps(job.summary))
        else:
            self.stdout.write(_readable(job))
        if job.status == Job.Status.FAILED:
            raise CommandError(f"job {job.pk} failed:\n{job.error}")
        if not job.summary["invariant_ok"]:
            raise CommandError(f"job {job.pk}: invariant broken: {job.summary['invariant']}")


def _readable(job: Job) -> str:
    s = job.summary or {}
    latency = s.get("latency_ms") or {}
    lines = [
        f"job {job.pk}: {s['scenario']} race, strategy {s['strategy']}, "
        f"{s['writers']} writers on {s['rows']} row(s): {job.status}",
        f"  attempts {s['attempts']}  committed {s['committed']}  conflicts {s['conflicts']}  retries {s['retries']}"
        f"  gave up {s['gave_up']}",
        f"  serialization failures {s['serialization_failures']}  deadlocks {s['deadlocks']}"
        f"  lock waits {s['lock_waits']} ({s['lock_wait_ms']} ms)",
        f"  {s['commits_per_s']} commits/s over {s['duration_s']} s;"
        f" latency p50 {latency.get('p50')} ms, p95 {latency.get('p95')} ms, p99 {latency.get('p99')} ms",
        f"  value {s['initial_value']} -> {s['final_value']}, lost updates {s['lost_updates']}",
        f"  invariant {'holds' if s['invariant_ok'] else 'BROKEN'}: {s['invariant']}",
    ]
    return "\n".join(lines)
