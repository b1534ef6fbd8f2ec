"""`manage.py studentlink <job-id> [--minutes M] [--base-url URL]`: a student link to a job, printed for scripts.

`--revoke TOKEN_OR_ID` revokes a link instead. Bad input is a CommandError saying what to give.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.urls import reverse

from occviz.jobs.models import Job
from occviz.students.models import DEFAULT_MINUTES, MAX_MINUTES, StudentLink
from occviz.students.tokens import lookup, token_for
from occviz.students.views import parse_minutes

DEFAULT_BASE_URL = "http://127.0.0.1:8000"


class Command(BaseCommand):
    help = "Print a student link to a job (its full URL), or revoke one with --revoke."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("job_id", nargs="?", help="The job's id (not needed with --revoke).")
        parser.add_argument(
            "--minutes", default=str(DEFAULT_MINUTES), help=f"How long it is valid: 1 to {MAX_MINUTES} (24 hours)."
        )
        parser.add_argument("--base-url", default=DEFAULT_BASE_URL, help="Where the students reach the site.")
        parser.add_argument("--revoke", metavar="TOKEN_OR_ID", help="Revoke this link (its token, URL or id).")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["revoke"] is not None:
            self._revoke(options["revoke"])
            return
        raw_job = options["job_id"]
        if raw_job is None:
            raise CommandError("give a job id: manage.py studentlink <job-id> [--minutes M]")
        if not (raw_job.isascii() and raw_job.isdigit() and len(raw_job) <= 18):
            raise CommandError(f"job id must be a whole number, not {raw_job!r}")
        job = Job.objects.filter(pk=int(raw_job)).first()
        if job is None:
            raise CommandError(f"job {raw_job} does not exist")
        try:
            minutes = parse_minutes(options["minutes"])
        except ValueError as why:
            raise CommandError(f"--minutes: {why}") from None
        base = _base_url(options["base_url"])
        link = StudentLink.make(job, None, minutes)
        self.stdout.write(base + reverse("students:page", args=[token_for(link)]))

    def _revoke(self, given: str) -> None:
        # A whole URL is taken too: its token is the segment after /s/.
        token = given.rstrip("/").rsplit("/s/", 1)[-1] if "/s/" in given else given
        link = lookup(token)
        if link is None:
            raise CommandError(f"no student link is named {given!r}: give its id, its token or its URL")
        if link.revoke():
            self.stdout.write(f"revoked student link {link.pk} to job {link.job_id}")
        else:
            self.stdout.write(f"student link {link.pk} to job {link.job_id} was already revoked at {link.revoked_at}")


def _base_url(raw: str) -> str:
    parts = urlsplit(raw.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        raise CommandError(f"--base-url must be an http(s) URL such as {DEFAULT_BASE_URL}, not {raw!r}")
    return raw.strip().rstrip("/")
