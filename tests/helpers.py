"""Small helpers for the engine tests: run a counter job in this process and read what it stored."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from occviz.jobs.models import Event, Job
from occviz.jobs.runner import run_job
from occviz.jobs.tasks import create_job
from occviz.store.models import Counter


def run_counter(user: Any = None, **params: Any) -> Job:
    """Create and run a counter race to its end, in this process (actors are threads here)."""
    job = create_job("counter", params, user)
    return run_job(job.pk)


def events(job: Job, *kinds: str) -> list[Event]:
    queryset = Event.objects.filter(job=job).order_by("seq")
    if kinds:
        queryset = queryset.filter(kind__in=kinds)
    return list(queryset)


def rows_of(job: Job) -> list[Counter]:
    return list(Counter.objects.filter(job=job).order_by("pk"))


def wait_for[T](predicate: Callable[[], T], timeout: float = 30.0, what: str = "it") -> T:
    """`predicate()`'s first true value, asked every 50 ms; AssertionError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@contextmanager
def manage_children(
    database_url: str, folder: Path, child_env: Mapping[str, str]
) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """`start("runjob", ...)`: manage.py as a child process on the test database, left running;
    every child still running is killed on the way out. Its output goes to files in `folder`
    (a child that logs a lot must never block on a full pipe): read them with `output(child)`."""
    root = Path(__file__).resolve().parent.parent
    children: list[subprocess.Popen[str]] = []

    def start(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        out, err = folder / f"out-{len(children)}", folder / f"err-{len(children)}"
        with out.open("w") as stdout, err.open("w") as stderr:
            child = subprocess.Popen(
                [sys.executable, str(root / "manage.py"), *args],
                cwd=root,
                env={**os.environ, **child_env, "DATABASE_URL": database_url, **(env or {})},
                stdout=stdout,
                stderr=stderr,
                text=True,
            )
        child.out_path = out  # type: ignore[attr-defined]
        child.err_path = err  # type: ignore[attr-defined]
        children.append(child)
        return child

    try:
        yield start
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
            child.wait()


def output(child: subprocess.Popen[str]) -> tuple[str, str]:
    """What a child of `manage_children` printed so far: (stdout, stderr)."""
    return child.out_path.read_text(), child.err_path.read_text()  # type: ignore[attr-defined]


class JobThread(threading.Thread):
    """`run_job(job_id)` in a thread of this test process, on its own connections; `ran` holds the job it returns."""

    def __init__(self, job_id: int) -> None:
        super().__init__(name=f"job-{job_id}-runner")
        self.job_id = job_id
        self.ran: list[Job] = []

    def run(self) -> None:
        from django.db import connections

        try:
            self.ran.append(run_job(self.job_id))
        finally:
            connections.close_all()
