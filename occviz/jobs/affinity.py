"""How a running job's threads are scheduled: the interpreter lock passed on quickly, and
the threads kept on one CPU when OCCVIZ_PIN_ACTORS asks for it.

Passing the lock on (`quick_handoffs`). A thread running Python keeps the interpreter
lock until it blocks, or until another thread has waited for it the switch interval,
5 ms by default. The writers block within microseconds, but the event flusher spends
about 4 ms of CPU on a batch and the publisher about 2 on a progress message, ten times
a second each: a writer whose result came back meanwhile waited for them, and the hot
row sat idle. With a 0.2 ms interval while a job runs, 0.91 and 0.83 of pgbench against
0.82 and 0.77 (medians of seven alternating rounds, two comparisons).

Placement (`one_cpu`). A job's actors are threads of one process: they share one
interpreter lock, so together they never run more than one core's worth of Python.
Kept on one core, they find their code and data warm and leave the other cores to
PostgreSQL; left to the scheduler, a thread woken by its result can run its system
calls on an idle core while another holds the lock. Which wins depends on what holds
the job back (4 writers on one hot row, two cores, alternating rounds against pgbench
as `make bench` runs them):

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
import sys
import threading
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


# How long, while a job runs, a thread that holds the interpreter lock keeps it from one that waits.
JOB_SWITCH_INTERVAL_S = 0.0002


class _SwitchInterval:
    """The process's switch interval, shortened while at least one job runs in it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = 0
        self._saved = sys.getswitchinterval()

    @contextmanager
    def shortened(self) -> Iterator[None]:
        with self._lock:
            if self._running == 0:
                self._saved = sys.getswitchinterval()
                sys.setswitchinterval(JOB_SWITCH_INTERVAL_S)
            self._running += 1
        try:
            yield
        finally:
            with self._lock:
                self._running -= 1
                if self._running == 0:
                    sys.setswitchinterval(self._saved)


quick_handoffs = _SwitchInterval().shortened
"""While the block runs, the interpreter lock changes hands within JOB_SWITCH_INTERVAL_S."""
