"""A running job's threads kept on one CPU, when OCCVIZ_PIN_ACTORS asks for it.

A job's actors are threads of one process: they share one interpreter lock, so
together they never run more than one core's worth of Python. Kept on one core,
they find their code and data warm and leave the other cores to PostgreSQL; left to
the scheduler, a thread woken by its result can run its system calls on an idle core
while another holds the lock. Which wins depends on what holds the job back (4 writers
on one hot row, two cores, alternating rounds against pgbench as `make bench` runs them):

- commits that wait on the disk (the embedded PostgreSQL, fsync on): unpinned ahead,
  0.87 against 0.81 of pgbench (medians of alternating rounds; 0.06 to 0.08 in four
  comparisons). When a commit lands, all four writers wake at once, and on one core
  the next winner's statement queues behind the others' system calls.
- commits that do not (a PostgreSQL with its data in memory), where the writers'
  CPU is the limit: pinned ahead, 0.49 against 0.41; on a machine whose disk committed
  nearly twice as fast, pinned was ahead by 0.02 to 0.12.

The default leaves placement to the scheduler, which wins on the disks these machines
have; OCCVIZ_PIN_ACTORS=on pins.
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
