"""The five ways a writer can increment a versioned counter, each recording what it did.

    none          read, modify, blind write: updates are lost, and counted
    occ           read, modify, compare-and-swap; a zero-row match is a conflict, retried by policy
    pessimistic   SELECT ... FOR UPDATE (or FOR SHARE) inside a transaction; lock waits measured
    serializable  a SERIALIZABLE (or REPEATABLE READ) transaction; SQLSTATE 40001 is retried
    atomic        UPDATE ... SET value = value + 1: no read-modify-write at all

Each strategy is a function `(writer, row, op) -> bool` (True when the increment
committed). The retrying ones share `with_retries`, so `occ`, `pessimistic` and
`serializable` count attempts, waits and give-ups the same way.

A writer's deadline bounds everything it waits for: think time and retry waits end
at it, and a row lock is waited for no longer than the time left (`lock_timeout`),
since a statement blocked in PostgreSQL does not see the job's stop signal.
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
from typing import Any, Final

import psycopg

from occviz.concurrency.retry import RetryPolicy
from occviz.jobs.recorder import EventRecorder
from occviz.store.cas import Add, swap_for
from occviz.store.models import Counter
from occviz.store.session import PreparedSession

# A row-lock acquisition this slow was a wait behind another holder, not just the round trip.
LOCK_WAIT_THRESHOLD_MS = 1.0

# The writes of the counter race, built once: value = %s checked against the version read,
# the same unchecked (a blind write), and value = value + 1 computed in place.
_CHECKED = swap_for(Counter, (("value", False),), True)
_BLIND = swap_for(Counter, (("value", False),), False)
_IN_PLACE = swap_for(Counter, (("value", True),), False, ("resource_version", "value"))
_READ = "SELECT value, resource_version FROM store_counter WHERE id = %s"

_RETRYABLE_SQLSTATES = {
    "40001": "serialization_failure",
    "40P01": "deadlock",
    "55P03": "lock_timeout",
}


@dataclass
class ActorContext:
    """One actor of a job (a counter's writer, a controller): its number, connection, policy and clocks."""

    number: int
    recorder: EventRecorder
    policy: RetryPolicy
    think_ms: float
    stop: threading.Event
    rng: random.Random
    lock_mode: str = "update"
    isolation: str = "serializable"
    lock_timeout_ms: int = 10_000
    deadline: float | None = None
    """time.perf_counter() at which the writer must have stopped waiting, or None."""
    cursor: PreparedSession = field(init=False, repr=False)
    record: Callable[..., None] = field(init=False, repr=False)
    """record(op, attempt, kind, row, **fields): this writer's events (the recorder's, with its number)."""

    def __post_init__(self) -> None:
        # A C-level partial, not a method that re-packs keyword arguments: it runs for every step.
        self.record = functools.partial(self.recorder.record, self.number)

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


class Retryable(Exception):
    """An attempt that failed in a way the policy retries: a conflict, a serialization failure, ..."""

    def __init__(self, kind: str, **fields: Any) -> None:
        super().__init__(kind)
        self.kind = kind
        self.fields = fields


def _read(writer: ActorContext, row: int, op: int, attempt: int, lock: str = "") -> tuple[int, int, float]:
    started = time.perf_counter()
    found = writer.cursor.one(_READ + lock if lock else _READ, [row])
    if found is None:
        raise Counter.DoesNotExist(f"counter {row} was deleted while the job ran")
    value, version = found
    took_ms = (time.perf_counter() - started) * 1000.0
    writer.record(op, attempt, "read", row, version_read=version, value_read=value, duration_ms=took_ms)
    return value, version, took_ms


def _committed(writer: ActorContext, row: int, op: int, attempt: int, started: float, **fields: Any) -> bool:
    writer.record(op, attempt, "committed", row, latency_ms=(time.perf_counter() - started) * 1000.0, **fields)
    return True


# What an attempt returns when it failed in a way the policy retries, having recorded why.
# (Inside a transaction an attempt raises Retryable instead, so that the transaction rolls back.)
RETRY: Final = object()


def with_retries(writer: ActorContext, row: int, op: int, attempt_once: Callable[[int, float], bool | object]) -> bool:
    """Run `attempt_once` until it commits (True), the job stops (False) or the attempts run out."""
    started = time.perf_counter()
    policy = writer.policy
    for attempt in range(1, policy.max_attempts + 1):
        try:
            outcome = attempt_once(attempt, started)
        except Retryable as failure:
            writer.record(op, attempt, failure.kind, row, **failure.fields)
            outcome = RETRY
        except psycopg.Error as error:
            kind = _RETRYABLE_SQLSTATES.get(error.sqlstate or "")
            if kind is None:
                raise
            writer.record(op, attempt, kind, row, detail={"message": str(error).strip()})
            outcome = RETRY
        if outcome is not RETRY:
            return bool(outcome)
        if attempt == policy.max_attempts:
            writer.record(op, attempt, "gave_up", row)
            return False
        wait_ms = policy.wait_ms(attempt, writer.rng)
        writer.record(op, attempt, "retry", row, duration_ms=wait_ms)
        if not writer.pause(wait_ms):
            return False
    return False


def none(writer: ActorContext, row: int, op: int) -> bool:
    started = time.perf_counter()
    value, version, _ = _read(writer, row, op, 1)
    if not writer.pause(writer.think_ms):
        return False
    t = time.perf_counter()
    (written,) = _BLIND.run(row, None, (value + 1,), cursor=writer.cursor)  # type: ignore[misc]
    # Versions that landed between our read and our write were overwritten by it.
    overwrote = written - version - 1
    return _committed(
        writer,
        row,
        op,
        1,
        started,
        version_read=version,
        version_written=written,
        value_read=value,
        value_written=value + 1,
        duration_ms=(time.perf_counter() - t) * 1000.0,
        detail={"overwrote": overwrote} if overwrote else None,
    )


def occ(writer: ActorContext, row: int, op: int) -> bool:
    def attempt_once(attempt: int, started: float) -> bool | object:
        value, version, _ = _read(writer, row, op, attempt)
        if not writer.pause(writer.think_ms):
            return False
        t = time.perf_counter()
        result = _CHECKED.run(row, version, (value + 1,), cursor=writer.cursor)
        took_ms = (time.perf_counter() - t) * 1000.0
        if result is None:
            # No detail: a conflict's message is always Kubernetes' one (VersionConflict), and
            # storing it thousands of times a second would cost the job more than it tells.
            writer.record(op, attempt, "conflict", row, version_read=version, value_read=value, duration_ms=took_ms)
            return RETRY
        return _committed(
            writer,
            row,
            op,
            attempt,
            started,
            version_read=version,
            version_written=result[0],
            value_read=value,
            value_written=value + 1,
            duration_ms=took_ms,
        )

    return with_retries(writer, row, op, attempt_once)


def pessimistic(writer: ActorContext, row: int, op: int) -> bool:
    clause = " FOR SHARE" if writer.lock_mode == "share" else " FOR UPDATE"

    def attempt_once(attempt: int, started: float) -> bool:
        with writer.cursor.transaction():
            # SET LOCAL: the timeout ends with this transaction, never leaks to the next one.
            writer.cursor.execute(f"SET LOCAL lock_timeout = {writer.lock_timeout()}")
            value, version, waited_ms = _read(writer, row, op, attempt, clause)
            if waited_ms >= LOCK_WAIT_THRESHOLD_MS:
                writer.record(op, attempt, "lock_wait", row, duration_ms=waited_ms, detail={"lock": clause.strip()})
            if not writer.pause(writer.think_ms):
                return False
            t = time.perf_counter()
            result = _CHECKED.run(row, version, (value + 1,), cursor=writer.cursor)
            if result is None:  # cannot happen under FOR UPDATE; FOR SHARE deadlocks before it gets here
                raise Retryable("conflict", version_read=version, value_read=value)
        return _committed(
            writer,
            row,
            op,
            attempt,
            started,
            version_read=version,
            version_written=result[0],
            value_read=value,
            value_written=value + 1,
            duration_ms=(time.perf_counter() - t) * 1000.0,
        )

    return with_retries(writer, row, op, attempt_once)


def serializable(writer: ActorContext, row: int, op: int) -> bool:
    level = "REPEATABLE READ" if writer.isolation == "repeatable-read" else "SERIALIZABLE"

    def attempt_once(attempt: int, started: float) -> bool:
        with writer.cursor.transaction(level):
            value, version, _ = _read(writer, row, op, attempt)
            if not writer.pause(writer.think_ms):
                return False
            t = time.perf_counter()
            result = _CHECKED.run(row, version, (value + 1,), cursor=writer.cursor)
            if result is None:
                raise Retryable("conflict", version_read=version, value_read=value)
        # The commit itself can fail with 40001: only after it is this increment committed.
        return _committed(
            writer,
            row,
            op,
            attempt,
            started,
            version_read=version,
            version_written=result[0],
            value_read=value,
            value_written=value + 1,
            duration_ms=(time.perf_counter() - t) * 1000.0,
        )

    return with_retries(writer, row, op, attempt_once)


def atomic(writer: ActorContext, row: int, op: int) -> bool:
    started = time.perf_counter()
    written, value = _IN_PLACE.run(row, None, (Add(1),), cursor=writer.cursor)  # type: ignore[misc]
    return _committed(
        writer,
        row,
        op,
        1,
        started,
        version_read=written - 1,
        version_written=written,
        value_written=value,
        duration_ms=(time.perf_counter() - started) * 1000.0,
    )


STRATEGIES: dict[str, Callable[[ActorContext, int, int], bool]] = {
    "none": none,
    "occ": occ,
    "pessimistic": pessimistic,
    "serializable": serializable,
    "atomic": atomic,
}
PROTECTED = frozenset({"occ", "pessimistic", "serializable", "atomic"})


@contextmanager
def connected(writer: ActorContext) -> Iterator[ActorContext]:
    """The writer with its own session, opened before the barrier so connecting is not part of the race."""
    writer.cursor = PreparedSession()
    try:
        yield writer
    finally:
        writer.cursor.close()
