"""A running job's threads kept on one CPU.

A job's actors are threads of one process: they share one interpreter lock, so
together they never run more than one core's worth of Python. Left to the
scheduler they move between cores at every wake-up, each time onto a core whose
caches hold PostgreSQL's backends rather than the interpreter. Kept on one core for
the job, they find their code and data warm, and the other cores are left to
PostgreSQL: with 4 writers on one hot row on two cores, 10 to 20 % more commits
(`make bench`). OCCVIZ_PIN_ACTORS=off leaves placement to the scheduler.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from django.conf import settings


@contextmanager
def one_cpu() -> Iterator[int | None]:
    """Pin this thread, and every thread it starts meanwhile, to one CPU until the block ends.

    Yields the CPU, or None where there is nothing to choose (one CPU, pinning off, or
    no sched_setaffinity). Workers spread over the CPUs by process id.
    """
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_setaffinity") else set()
    if not settings.OCCVIZ_PIN_ACTORS or len(allowed) < 2:
        yield None
        return
    cpu = sorted(allowed)[os.getpid() % len(allowed)]
    os.sched_setaffinity(0, {cpu})
    try:
        yield cpu
    finally:
        os.sched_setaffinity(0, allowed)
