"""soak: many randomized counter races, each checked against its invariant (`make soak`).

    python manage.py soak --jobs 1000 [--seed 42]

Every job draws its strategy, writers, rows, think time and retry policy from a seeded
generator (the seed is printed first, so a failure can be replayed with `--seed`), runs in
this process like `runjob`, and is judged by its own invariant. The command exits 1 if
any job broke its invariant or failed, and prints each such job with its parameters.
"""

from __future__ import annotations

import json
import random
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from occviz.concurrency.retry import PRESETS
from occviz.jobs.models import Job
from occviz.jobs.runner import run_job
from occviz.jobs.tasks import create_job
from occviz.scenarios.counter.actors import STRATEGIES


def draw(rng: random.Random) -> dict[str, Any]:
    """One job's parameters: small enough that a thousand run in minutes, racy enough to matter."""
    strategy = rng.choice(list(STRATEGIES))
    params: dict[str, Any] = {
        "strategy": strategy,
        "writers": rng.choice([1, 2, 4, 8, 16]),
        "rows": rng.choice([1, 1, 1, 2, 4]),
        "think_ms": rng.choice([0, 0, 0.5, 1, 2]),
        "retry": rng.choice(list(PRESETS)),
        "max_attempts": rng.choice([None, 3, 10, 50]),
        "seed": rng.randrange(2**31),
    }
    if rng.random() < 0.2:
        params["seconds"] = rng.choice([0.2, 0.5])
    else:
        params["increments"] = rng.choice([5, 10, 25])
    if params["retry"] == "exponential":
        params.update(base_ms=rng.choice([1, 5, 10]), factor=rng.choice([1.5, 2.0]), cap_ms=rng.choice([20, 100]))
    if strategy == "pessimistic":
        params["lock"] = rng.choice(["update", "update", "share"])
        if params["lock"] == "share":
            # FOR SHARE deadlocks by design, and PostgreSQL breaks one deadlock a second
            # (deadlock_timeout): many writers would spend minutes on a handful of increments.
            params["writers"] = min(params["writers"], 2)
            params.pop("seconds", None)
            params["increments"] = 5
    if strategy == "serializable":
        params["isolation"] = rng.choice(["serializable", "repeatable-read"])
    return {key: value for key, value in params.items() if value is not None}


class Command(BaseCommand):
    help = "Run many randomized counter races and check every invariant."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--jobs", type=int, default=1000)
        parser.add_argument("--seed", type=int, help="replay a soak: the seed it printed")

    def handle(self, *args: Any, **options: Any) -> None:
        if not 1 <= options["jobs"] <= 100_000:
            raise CommandError("--jobs: from 1 to 100000", returncode=2)
        seed = options["seed"] if options["seed"] is not None else random.randrange(2**32)
        self.stdout.write(f"soak: {options['jobs']} jobs, seed {seed}")
        rng = random.Random(seed)
        started = time.monotonic()
        violations: list[str] = []
        by_strategy: dict[str, int] = {}
        for number in range(1, options["jobs"] + 1):
            params = draw(rng)
            job = run_job(create_job("counter", params).pk)
            by_strategy[params["strategy"]] = by_strategy.get(params["strategy"], 0) + 1
            if job.status != Job.Status.SUCCEEDED or not (job.summary or {}).get("invariant_ok"):
                verdict = (job.summary or {}).get("invariant") or job.error.splitlines()[-1:]
                violations.append(f"job {job.pk} ({job.status}): {verdict} with {json.dumps(params)}")
                self.stderr.write(violations[-1])
            if number % 100 == 0:
                self.stdout.write(f"  {number} jobs, {len(violations)} violations, {time.monotonic() - started:.0f} s")
        self.stdout.write(
            f"soak: {options['jobs']} jobs in {time.monotonic() - started:.0f} s, seed {seed}, "
            f"{len(violations)} violations; by strategy: {json.dumps(by_strategy, sort_keys=True)}"
        )
        if violations:
            raise CommandError(f"{len(violations)} jobs broke their invariant or failed (seed {seed})")
