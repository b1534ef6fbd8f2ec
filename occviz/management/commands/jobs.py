"""jobs: the recent jobs at a glance, for people without a browser (like `kubectl get jobs`).

    python manage.py jobs                 # a table, newest first
    python manage.py jobs --json          # one JSON array
    python manage.py jobs --limit 50
    python manage.py jobs cancel 7        # a queued job at once; a running one is asked to stop

Before listing, running jobs whose runner died are ended, and queued jobs whose worker died
between claiming and starting them are handed back (as every occviz process does), so the
table never shows as running a job no one runs, nor as queued one no worker will take.
Ages are measured by PostgreSQL's clock.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection

from occviz.jobs.models import Job
from occviz.jobs.reaper import end_if_stale, reap

COLUMNS = ("ID", "SCENARIO", "STATUS", "RUNNER", "HEARTBEAT AGE", "AGE", "REASON", "VERDICT")
REASON_WIDTH = 90


def _ascii_int(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number in ASCII digits (int() would take '٣' as 3), within [low, high]."""

    def whole_number(raw: str) -> int:
        if not (raw.isascii() and raw.isdigit()) or not low <= int(raw) <= high:
            raise argparse.ArgumentTypeError(f"give a whole number from {low} to {high} in ASCII digits, not {raw!r}")
        return int(raw)

    return whole_number


def reason(job: Job) -> str:
    """The first line of the job's error: why it ended without its runner, or how it failed."""
    return job.error.strip().partition("\n")[0]


def verdict(job: Job) -> str:
    if job.invariant_ok is None:
        return "-"
    return "holds" if job.invariant_ok else "BROKEN"


def age(seconds: float | None) -> str:
    """kubectl's short ages: 42s, 5m12s, 3h4m, 2d5h."""
    if seconds is None:
        return "-"
    whole = max(0, int(seconds))
    if whole < 120:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m{secs}s" if minutes < 10 and secs else f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes}m" if hours < 8 and minutes else f"{hours}h"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours}h" if days < 8 and hours else f"{days}d"


def _seconds_since(moment: datetime | None, now: datetime) -> float | None:
    return None if moment is None else (now - moment).total_seconds()


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


class Command(BaseCommand):
    help = "List recent jobs (status, runner, heartbeat age, reason), or cancel one: jobs cancel ID."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print one JSON array")
        parser.add_argument(
            "--limit", type=_ascii_int(1, 1000), default=20, help="how many jobs, newest first (1-1000, default 20)"
        )
        actions = parser.add_subparsers(dest="action", metavar="ACTION")
        cancel = actions.add_parser(
            "cancel",
            help="cancel a job: a queued one at once, a running one within a second",
            called_from_command_line=parser.called_from_command_line,
        )
        cancel.add_argument("job_id", type=_ascii_int(1, 2**63 - 1), metavar="ID")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["action"] == "cancel":
            self.cancel(options["job_id"])
            return
        reap()
        jobs = list(Job.objects.order_by("-id")[: options["limit"]])
        with connection.cursor() as cursor:
            cursor.execute("SELECT now()")
            now = cursor.fetchone()[0]
        rows = [self.row(job, now) for job in jobs]
        if options["json"]:
            self.stdout.write(json.dumps(rows))
        elif not rows:
            self.stdout.write("No jobs yet.")
        else:
            self.stdout.write(self.table(rows))

    def row(self, job: Job, now: datetime) -> dict[str, Any]:
        running = job.status == Job.Status.RUNNING
        return {
            "id": job.pk,
            "scenario": job.scenario,
            "strategy": job.params.get("strategy"),
            "status": job.status,
            "cancel_requested": job.cancel_requested,
            "runner": job.runner or None,
            "heartbeat_at": _iso(job.heartbeat_at),
            "heartbeat_age_s": _seconds_since(job.heartbeat_at, now) if running else None,
            "created_at": _iso(job.created_at),
            "started_at": _iso(job.started_at),
            "finished_at": _iso(job.finished_at),
            "age_s": _seconds_since(job.created_at, now),
            "last_seq": job.last_seq,
            "reason": reason(job) or None,
            "invariant_ok": job.invariant_ok,
            "verdict": verdict(job),
        }

    def table(self, rows: list[dict[str, Any]]) -> str:
        cells = [COLUMNS]
        for row in rows:
            status = "cancelling" if row["status"] == Job.Status.RUNNING and row["cancel_requested"] else row["status"]
            text = row["reason"] or "-"
            if len(text) > REASON_WIDTH:
                text = text[: REASON_WIDTH - 3] + "..."
            cells.append(
                (
                    str(row["id"]),
                    row["scenario"],
                    status,
                    row["runner"] or "-",
                    age(row["heartbeat_age_s"]),
                    age(row["age_s"]),
                    text,
                    row["verdict"],
                )
            )
        widths = [max(len(line[column]) for line in cells) for column in range(len(COLUMNS))]
        return "\n".join(
            "   ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip() for line in cells
        )

    def cancel(self, job_id: int) -> None:
        job = Job.objects.filter(pk=job_id).first()
        if job is None:
            raise CommandError(f"job {job_id} does not exist.", returncode=2)
        if job.is_finished:
            raise CommandError(f"job {job_id} is {job.status} already: there is nothing to cancel.", returncode=2)
        job.request_cancel()
        if job.status == Job.Status.CANCELLED:
            self.stdout.write(f"job {job_id} cancelled (it was queued).")
        elif job.status == Job.Status.RUNNING:
            # A cancel nobody will read: the runner is gone, so the job is ended here and now.
            if end_if_stale(job):
                self.stdout.write(f"job {job_id} is {job.status}: {reason(job)}")
            else:
                self.stdout.write(f"job {job_id}: cancel requested; {job.runner} stops it within a second.")
        else:
            raise CommandError(f"job {job_id} is {job.status} already: there is nothing to cancel.", returncode=2)
