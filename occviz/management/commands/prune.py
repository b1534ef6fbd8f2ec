"""prune: delete the events of jobs that finished more than OCCVIZ_KEEP_DAYS days ago.

    python manage.py prune [--days N] [--dry-run]

The jobs stay, with their summaries and verdicts; their pages say the events were
pruned. `serve` runs the same once a day (occviz/jobs/retention.py).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from occviz.jobs.retention import prune_events


def _days(raw: str) -> int:
    """A whole number of days in ASCII digits, 0 or more (int() would take '٣')."""
    if not (raw.isascii() and raw.isdigit()):
        raise ValueError(raw)
    return int(raw)


_days.__name__ = "whole number of days"  # argparse: "invalid whole number of days value: 'x'"


class Command(BaseCommand):
    help = "Delete the events of jobs that finished long ago (the jobs and their summaries stay)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--days",
            type=_days,
            default=None,
            help=f"prune jobs finished more than this many days ago (default OCCVIZ_KEEP_DAYS, now "
            f"{settings.OCCVIZ_KEEP_DAYS}; 0 prunes nothing)",
        )
        parser.add_argument("--dry-run", action="store_true", help="say what would be pruned, delete nothing")

    def handle(self, *args: Any, **options: Any) -> None:
        result = prune_events(options["days"], dry_run=options["dry_run"])
        self.stdout.write(str(result))
        if result.jobs:
            self.stdout.write("Jobs: " + ", ".join(map(str, result.jobs)))
