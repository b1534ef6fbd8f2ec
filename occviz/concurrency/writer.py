"""A writer: one actor's own database session, retry policy and clocks, and how it records its steps.

The counter race's writers and the controller race's controllers are both writers. A
writer's deadline bounds everything it waits for: think time and retry waits end at it,
and a row lock is waited for no longer than the time left (`lock_timeout`), since a
statement blocked in PostgreSQL does not see the job's stop signal.
"""

from __future__ import annotations

import functools
import math
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from occviz.concurrency.retry import RetryPolicy
from occviz.store.session import PreparedSession


class Record(Protocol):
    """How an actor's step is recorded: the job recorder's `record(actor, op, attempt, kind, row, **fields)`."""

    def __call__(
        self,
        actor: int,
        op: int,
        attempt: int,
        kind: str,
        row: int | None = None,
        *,
        version_read: int | None = None,
        version_written: int | None = None,
        value_read: int | None = None,
        value_written: int | None = None,
        duration_ms: float | None = None,
        latency_ms: float | None = None,
        detail: dict[str, Any] | None = None,
    ) -> None: ...


@dataclass
class ActorContext:
    """One actor's view of the job: its number, connection, policy and clocks."""

    number: int
    record_step: Record
    """The job's recorder (every actor's steps); `record` is this writer's own."""
    policy: RetryPolicy
    think_ms: float
    stop: threading.Event
    rng: random.Random
    lock_timeout_ms: int = 10_000
    deadline: float | None = None
    """time.perf_counter() at which the writer must have stopped waiting, or None."""
    cursor: PreparedSession = field(init=False, repr=False)
    record: Callable[..., None] = field(init=False, repr=False)
    """record(op, attempt, kind, row, **fields): this writer's events (the recorder's, with its number)."""

    def __post_init__(self) -> None:
        # A C-level partial, not a method that re-packs keyword arguments: it runs for every step.
        self.record = functools.partial(self.record_step, self.number)

    def ms_left(self) -> float:
        """Milliseconds until the deadline (infinite without one; 0 once it has passed)."""
        if self.deadline is None:
            return math.inf
        return max(0.0, (self.deadline - time.perf_counter()) * 1000.0)

    def pause(self, ms: float) -> bool:
        """Sleep `ms` unless the job is stopped meanwhile; False if it was, or if the deadline comes first."""
        if ms >= self.ms_left():
            self.stop.wait(self.ms_left() / 1000.0)
            return False
        if ms <= 0:
            return not self.stop.is_set()
        return not self.stop.wait(ms / 1000.0)

    def lock_timeout(self) -> int:
        """The longest row-lock wait now, in whole ms: the usual timeout, or less when the deadline is nearer.

        Never 0: to PostgreSQL a lock_timeout of 0 means wait forever.
        """
        return max(1, int(min(self.lock_timeout_ms, self.ms_left())))


@contextmanager
def connected[W: ActorContext](writer: W, **overrides: Any) -> Iterator[W]:
    """The writer with its own session, opened before the barrier so connecting is not part of the race.

    `overrides` change its connection parameters (a proxy's socket folder: occviz.concurrency.latency).
    """
    writer.cursor = PreparedSession(**overrides)
    try:
        yield writer
    finally:
        writer.cursor.close()
