"""The counter race's actors: the five ways a writer can increment a versioned counter, each recording what it did.

    none          read, modify, blind write: updates are lost, and counted
    occ           read, modify, compare-and-swap; a zero-row match is a conflict, retried by policy
    pessimistic   SELECT ... FOR UPDATE (or FOR SHARE) inside a transaction; lock waits measured
    serializable  a SERIALIZABLE (or REPEATABLE READ) transaction; SQLSTATE 40001 is retried
    atomic        UPDATE ... SET value = value + 1: no read-modify-write at all

Each strategy is a function `(writer, row, op) -> bool` (True when the increment
committed). The retrying ones share `with_retries` (occviz.concurrency.retry), so `occ`,
`pessimistic` and `serializable` count attempts, waits and give-ups the same way.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from occviz.concurrency.retry import RETRY, Retryable, with_retries
from occviz.concurrency.writer import ActorContext
from occviz.store.cas import Add, swap_for
from occviz.store.models import Counter

# A row-lock acquisition this slow was a wait behind another holder, not just the round trip.
LOCK_WAIT_THRESHOLD_MS = 1.0

# The writes of the counter race, built once: value = %s checked against the version read,
# the same unchecked (a blind write), and value = value + 1 computed in place. The read and the
# checked write are the occ writer's two statements (the engine benchmark's floor runs them bare).
CHECKED = swap_for(Counter, (("value", False),), True)
_BLIND = swap_for(Counter, (("value", False),), False)
_IN_PLACE = swap_for(Counter, (("value", True),), False, ("resource_version", "value"))
READ = "SELECT value, resource_version FROM store_counter WHERE id = %s"


@dataclass
class CounterWriter(ActorContext):
    """A writer of the counter race: with the lock a pessimistic one takes and the isolation a serializable one asks."""

    lock_mode: str = "update"
    isolation: str = "serializable"
    names: Mapping[int, dict[str, Any]] = field(default_factory=dict)
    """Each row's name, as a conflict's detail: the object a 409 would name (one dict per row, shared)."""

    def named(self, row: int) -> dict[str, Any] | None:
        return self.names.get(row)


def _read(writer: CounterWriter, row: int, op: int, attempt: int, lock: str = "") -> tuple[int, int, float]:
    started = time.perf_counter()
    found = writer.cursor.one(READ + lock if lock else READ, [row])
    if found is None:
        raise Counter.DoesNotExist(f"counter {row} was deleted while the job ran")
    value, version = found
    took_ms = (time.perf_counter() - started) * 1000.0
    writer.record(op, attempt, "read", row, version_read=version, value_read=value, duration_ms=took_ms)
    return value, version, took_ms


def _committed(writer: CounterWriter, row: int, op: int, attempt: int, started: float, **fields: Any) -> bool:
    writer.record(op, attempt, "committed", row, latency_ms=(time.perf_counter() - started) * 1000.0, **fields)
    return True


def _think_then_swap(writer: CounterWriter, row: int, value: int, version: int) -> tuple[int, float] | None:
    """In the caller's transaction: think, then compare-and-swap value + 1 at the version read.

    (the version written, when the swap began), or None when the job stopped during the think
    time; zero rows is a conflict, raised to be retried.
    """
    if not writer.pause(writer.think_ms):
        return None
    t = time.perf_counter()
    result = CHECKED.run(row, version, (value + 1,), cursor=writer.cursor)
    if result is None:
        raise Retryable("conflict", version_read=version, value_read=value, detail=writer.named(row))
    return result[0], t


def _incremented(
    writer: CounterWriter,
    row: int,
    op: int,
    attempt: int,
    started: float,
    value: int,
    version: int,
    written: int,
    t: float,
) -> bool:
    """A read-modify-write increment committed: its duration runs from the swap to now (the commit included)."""
    return _committed(
        writer,
        row,
        op,
        attempt,
        started,
        version_read=version,
        version_written=written,
        value_read=value,
        value_written=value + 1,
        duration_ms=(time.perf_counter() - t) * 1000.0,
    )


def none(writer: CounterWriter, row: int, op: int) -> bool:
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


def occ(writer: CounterWriter, row: int, op: int) -> bool:
    def attempt_once(attempt: int, started: float) -> bool | object:
        value, version, _ = _read(writer, row, op, attempt)
        if not writer.pause(writer.think_ms):
            return False
        t = time.perf_counter()
        result = CHECKED.run(row, version, (value + 1,), cursor=writer.cursor)
        took_ms = (time.perf_counter() - t) * 1000.0
        if result is None:
            # Only the row's name: the rest of the API server's 409 is the same words every time.
            writer.record(
                op,
                attempt,
                "conflict",
                row,
                version_read=version,
                value_read=value,
                duration_ms=took_ms,
                detail=writer.named(row),
            )
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


def pessimistic(writer: CounterWriter, row: int, op: int) -> bool:
    clause = " FOR SHARE" if writer.lock_mode == "share" else " FOR UPDATE"

    def attempt_once(attempt: int, started: float) -> bool:
        with writer.cursor.transaction():
            # SET LOCAL: the timeout ends with this transaction, never leaks to the next one.
            writer.cursor.execute(f"SET LOCAL lock_timeout = {writer.lock_timeout()}")
            value, version, waited_ms = _read(writer, row, op, attempt, clause)
            if waited_ms >= LOCK_WAIT_THRESHOLD_MS:
                writer.record(op, attempt, "lock_wait", row, duration_ms=waited_ms, detail={"lock": clause.strip()})
            # Zero rows cannot happen under FOR UPDATE; FOR SHARE deadlocks before it gets here.
            swapped = _think_then_swap(writer, row, value, version)
            if swapped is None:
                return False
        return _incremented(writer, row, op, attempt, started, value, version, *swapped)

    return with_retries(writer, row, op, attempt_once)


def serializable(writer: CounterWriter, row: int, op: int) -> bool:
    level = "REPEATABLE READ" if writer.isolation == "repeatable-read" else "SERIALIZABLE"

    def attempt_once(attempt: int, started: float) -> bool:
        with writer.cursor.transaction(level):
            value, version, _ = _read(writer, row, op, attempt)
            swapped = _think_then_swap(writer, row, value, version)
            if swapped is None:
                return False
        # The commit itself can fail with 40001: only after it is this increment committed.
        return _incremented(writer, row, op, attempt, started, value, version, *swapped)

    return with_retries(writer, row, op, attempt_once)


def atomic(writer: CounterWriter, row: int, op: int) -> bool:
    started = time.perf_counter()
    # Think time paces the writer, before its statement: with nothing read first, nothing goes stale meanwhile.
    if not writer.pause(writer.think_ms):
        return False
    t = time.perf_counter()
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
        duration_ms=(time.perf_counter() - t) * 1000.0,
    )


Strategy = Callable[[CounterWriter, int, int], bool]

STRATEGIES: dict[str, Strategy] = {
    "none": none,
    "occ": occ,
    "pessimistic": pessimistic,
    "serializable": serializable,
    "atomic": atomic,
}
PROTECTED = frozenset({"occ", "pessimistic", "serializable", "atomic"})


def increment_until_done(
    writer: CounterWriter,
    rows: Sequence[int],
    increment: Strategy,
    increments: int | None,
    time_up: Callable[[str], object],
) -> None:
    """One writer's run: increment one of `rows` (at random among several) until done, stopped or out of time.

    `increments` None: until the writer's deadline, which whoever sees it first reports (`time_up`):
    the job's own timer may be a moment later.
    """
    op = 0
    while not writer.stop.is_set():
        if increments is not None and op >= increments:
            break
        if writer.ms_left() <= 0:
            time_up("time limit")
            break
        op += 1
        row = rows[0] if len(rows) == 1 else writer.rng.choice(rows)
        increment(writer, row, op)
