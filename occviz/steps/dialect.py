"""What the step engine needs of a database: fresh rows, one connection per actor, an observer.

A `Dialect` makes a job's `test` table somewhere of its own (a schema on PostgreSQL, a
database on MySQL), connects each actor to it, and gives an `Observer`: a connection of
its own, in autocommit, that reads the rows as committed and tells who waits for whom.
The engine (engine.py) drives any dialect the same way; postgres.py is PostgreSQL's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from occviz.steps.script import Statement

Row = dict[str, int]
"""One row of `test`: {"id": 1, "value": 10, "version": 1}."""

IN_TRANSACTION, IDLE, FAILED = "in transaction", "idle", "failed"
"""A connection's transaction status after a step (failed: the transaction hit an error and must be aborted)."""


@dataclass(frozen=True)
class Result:
    """What a data statement did: the rows a read returned, or the rows a write wrote or deleted."""

    rows: list[Row] | None
    """None when the database cannot say which rows a write touched (no RETURNING)."""
    count: int


class StepFailed(Exception):
    """The database refused a step: its SQLSTATE and message, as the database worded it."""

    def __init__(
        self, sqlstate: str | None, message: str, *, deadlock: bool | None = None, lock_timeout: bool | None = None
    ) -> None:
        self.sqlstate = sqlstate
        self.message = message
        self.deadlock = sqlstate == "40P01" if deadlock is None else deadlock
        """The database chose this step's transaction as a deadlock's victim (MySQL says so with 40001 too)."""
        self.lock_timeout = sqlstate == "55P03" if lock_timeout is None else lock_timeout
        """The step waited for a lock longer than its session allows (MySQL's 1205 has no SQLSTATE of its own)."""
        super().__init__(f"{sqlstate}: {message}" if sqlstate else message)


class ActorConnection(Protocol):
    """One actor's own session. Every method but `cancel` is called from the actor's thread only."""

    backend: int
    """The server's id of this session (PostgreSQL's backend pid), as the observer's `waits` names it."""

    def begin(self, isolation: str) -> None: ...

    def commit(self) -> None: ...

    def abort(self) -> None: ...

    def execute(self, statement: Statement) -> Result:
        """Run a select, update, insert or delete (StepFailed if the database refuses it)."""
        ...

    def status(self) -> str:
        """IDLE, IN_TRANSACTION or FAILED."""
        ...

    def cancel(self) -> None:
        """Interrupt the statement running now, from any thread (a blocked step at the end of a session)."""
        ...

    def close(self) -> None: ...


class Observer(Protocol):
    """A session of the engine's own, in autocommit: never inside an actor's transaction."""

    def committed(self) -> list[Row]:
        """The rows as committed now, by id."""
        ...

    def waits(self, backends: Sequence[int]) -> Mapping[int, Sequence[int]]:
        """For each of `backends` that waits for a lock, the backends it waits for."""
        ...

    def close(self) -> None: ...


class Dialect(Protocol):
    name: str

    def create_rows(self, rows: Sequence[tuple[int, int]]) -> None:
        """A fresh `test (id, value, version)` table holding `rows` (id, value) at version 1."""
        ...

    def drop_rows(self) -> None:
        """Drop what `create_rows` made (safe to call when it made nothing)."""
        ...

    def connect(self, actor: str, lock_timeout_s: float) -> ActorConnection:
        """An actor's session on the fresh rows, waiting at most `lock_timeout_s` for a lock in any statement."""
        ...

    def observe(self) -> Observer: ...
