"""How a running job's threads are scheduled: the interpreter lock passed on quickly, and
the threads kept on one CPU when OCCVIZ_PIN_ACTORS asks for it.

`quick_handoffs`: a thread running Python keeps the interpreter lock until it blocks, or
until another thread has waited for it the switch interval (5 ms by default). The writers
block within microseconds, but the event flusher and the publisher run for milliseconds at
a time, and a writer whose result came back meanwhile would wait for them while the hot
row sits idle. So while a job runs the interval is JOB_SWITCH_INTERVAL_S.

`one_cpu`: a job's actors are threads of one process and share one interpreter lock, so
together they never run more than one core's worth of Python. Kept on one core, they find
their code and data warm and leave the other cores to PostgreSQL: that wins where the
writers' CPU is the limit (commits that do not wait on a disk). Where commits wait on the
disk, each commit wakes all the writers at once, and on one core the next winner's
statement queues behind the others' system calls; left to the scheduler, a thread woken by
its result can make its system calls on an idle core while another holds the lock. The
default leaves placement to the scheduler; OCCVIZ_PIN_ACTORS=on pins.

Measurements: docs/performance.md.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from django.conf import settings


@contextmanager
def one_cpu(slot: int | None = None) -> Iterator[int | None]:
    """Pin this thread, and every thread it starts meanwhile, to one CPU until the block ends.

    Yields the CPU, or None where there is nothing to choose (one CPU, pinning off, or
    no sched_setaffinity). Workers spread over the CPUs by process id; the shards of one
    job by `slot` (the job's id plus the shard's index), each on a CPU of its own.
    """
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_setaffinity") else set()
    if not settings.OCCVIZ_PIN_ACTORS or len(allowed) < 2:
        yield None
        return
    cpu = sorted(allowed)[(os.getpid() if slot is None else slot) % len(allowed)]
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
