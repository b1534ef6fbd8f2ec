"""The step engine: a script's actors, each a thread holding its own connection and transaction, stepped one at a time.

    session = Session(parse(text), PostgresDialect(conninfo, "job_12"), on_outcome=record)
    with session:                       # makes the rows and connects the actors
        session.advance("T1")           # T1's next step: its outcome, or `blocked` within ~0.3 s
        session.run_in_order()          # or the whole script in its written order

A step that blocks is reported `blocked` with the actors it waits for (the observer's
view of the database's lock waits); it completes by itself when they commit or abort, and
that completion is reported too (`resumed`, or its error: a deadlock's victim gets 40P01,
chosen by the database). Meanwhile the other actors can be stepped. Every outcome carries
the rows as committed after it (read by the observer, never inside an actor's transaction,
where a read would move a repeatable-read snapshot) and the rows as each actor sees them:
its reads overlaid with its own writes (known from RETURNING).

Outcomes are reported through `on_outcome`, one at a time and in causal order: a blocked
step's completion is reported after the step of the actor it waited for that released it.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from occviz.steps.dialect import FAILED, IDLE, ActorConnection, Dialect, Observer, Row, StepFailed
from occviz.steps.script import Script, Select, Step, StepKind, evaluate

logger = logging.getLogger(__name__)

BLOCKED_AFTER_S = 0.3
"""How long `advance` waits for a step before reporting it blocked (sooner, once the database says it waits)."""
_POLL_S = 0.02
_FIRST_LOOK_S = 0.04
_CAUSAL_WAIT_S = 1.0
_CLOSE_JOIN_S = 10.0


OK, BLOCKED, ERROR = "ok", "blocked", "error"
ACTOR_STATUSES = ("idle", "in transaction", "blocked", "done", "failed")


@dataclass(frozen=True)
class ActorView:
    """An actor as the class sees it after a step."""

    status: str
    """idle, in transaction, blocked, done (no steps left) or failed (its transaction hit an error)."""
    isolation: str | None
    """Its transaction's isolation level, while it has one."""
    waits_for: tuple[str, ...] = ()
    next_step: int | None = None
    """The position (in the script) of its next step, if any."""


@dataclass(frozen=True)
class Outcome:
    """One step's outcome, or a step reported blocked, with the rows after it."""

    actor: str
    position: int
    """The step's position in the script (0 for its first line)."""
    step: Step
    status: str
    """ok, blocked or error."""
    rows: list[Row] | None = None
    """A read's rows; a write's rows as written (or deleted)."""
    count: int | None = None
    sqlstate: str | None = None
    message: str | None = None
    waits_for: tuple[str, ...] = ()
    """Blocked: the actors it waits for (empty if the database names none of them)."""
    resumed: bool = False
    """A step reported blocked earlier that has now completed."""
    began: str | None = None
    """The isolation level of a transaction this step began (explicitly, or as an actor's first statement)."""
    rolled_back: bool = False
    """A commit of a transaction that had failed: the database rolled it back instead."""
    deadlock: bool = False
    """An error that made this step's transaction a deadlock's victim."""
    lock_timeout: bool = False
    """An error for a lock waited for longer than the session's lock timeout."""
    duration_ms: float = 0.0
    committed: list[Row] = field(default_factory=list)
    seen: dict[str, list[Row]] = field(default_factory=dict)
    actors: dict[str, ActorView] = field(default_factory=dict)

    @property
    def conflict(self) -> bool:
        """A compare-and-swap that matched no row: someone else changed the version first."""
        return self.status == OK and self.step.kind == StepKind.CAS_WRITE and self.count == 0


OutcomeListener = Callable[[Outcome], None]


@dataclass
class _Done:
    result: Any = None
    failure: StepFailed | None = None
    began: str | None = None
    rolled_back: bool = False
    status: str = IDLE
    finished: float = 0.0


class _Actor:
    def __init__(self, name: str, steps: tuple[tuple[int, Step], ...]) -> None:
        self.name = name
        self.steps = steps
        self.position = 0
        self.conn: ActorConnection | None = None
        self.thread: threading.Thread | None = None
        self.inbox: queue.Queue[tuple[int, Step] | None] = queue.Queue()
        self.running: tuple[int, Step] | None = None
        self.started = 0.0
        self.declared_blocked = False
        self.waits_for: tuple[str, ...] = ()
        self.done: _Done | None = None
        self.finished = threading.Event()
        self.finished.set()
        self.status = IDLE
        self.isolation: str | None = None
        self.read_rows: dict[int, Row] = {}
        self.own_writes: dict[int, Row | None] = {}
        """Rows written in its open transaction (None: deleted), overlaid on its reads."""

    @property
    def has_steps(self) -> bool:
        return self.position < len(self.steps)

    def seen(self) -> list[Row]:
        rows = dict(self.read_rows)
        for row_id, row in self.own_writes.items():
            if row is None:
                rows.pop(row_id, None)
            else:
                rows[row_id] = row
        return [rows[row_id] for row_id in sorted(rows)]

    def view(self) -> ActorView:
        if self.running is not None and self.declared_blocked:
            status = "blocked"
        elif self.running is None and not self.has_steps:
            status = "done"
        else:
            status = self.status
        next_step = self.steps[self.position][0] if self.has_steps else None
        waits = self.waits_for if status == "blocked" else ()
        return ActorView(status, self.isolation if self.status != IDLE else None, waits, next_step)


class StepRefused(ValueError):
    """A step that cannot be taken now (its actor is blocked, or has no step left): the reason, worded."""


class Session:
    """A script's actors on fresh rows of `dialect`; use as a context manager (rows made, everything released)."""

    def __init__(
        self,
        script: Script,
        dialect: Dialect,
        *,
        isolation: str = "read committed",
        lock_timeout_s: float = 30.0,
        on_outcome: OutcomeListener | None = None,
    ) -> None:
        self.script = script
        self.dialect = dialect
        self.isolation = isolation
        self.lock_timeout_s = lock_timeout_s
        self.on_outcome = on_outcome or (lambda outcome: None)
        positions = list(enumerate(script.steps))
        self.actors = {
            name: _Actor(name, tuple((i, step) for i, step in positions if step.actor == name))
            for name in script.actors
        }
        self.outcomes: list[Outcome] = []
        self.committed: list[Row] = []
        self._lock = threading.RLock()
        self._emitted = threading.Condition(self._lock)
        self._observer: Observer | None = None
        self._opened = False
        self._closed = False

    # -- life --------------------------------------------------------------------------

    def __enter__(self) -> Session:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        """Make the rows, connect the observer and every actor (each with its thread)."""
        self._opened = True
        try:
            self.dialect.create_rows(self.script.rows)
            self._observer = self.dialect.observe()
            for actor in self.actors.values():
                actor.conn = self.dialect.connect(actor.name, self.lock_timeout_s)
                actor.thread = threading.Thread(target=self._actor_main, args=(actor,), name=f"step-{actor.name}")
                actor.thread.start()
            self.committed = self._observer.committed()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """End every actor (a blocked statement is cancelled, an open transaction rolled back), drop the rows.

        Safe to call more than once; whatever fails on the way, the rest is still released.
        """
        with self._lock:
            if self._closed or not self._opened:
                self._closed = True
                return
            self._closed = True
            running = [actor for actor in self.actors.values() if actor.running is not None]
        for actor in running:
            if actor.conn is not None:
                actor.conn.cancel()
        for actor in self.actors.values():
            actor.inbox.put(None)
        for actor in self.actors.values():
            if actor.thread is not None:
                actor.thread.join(_CLOSE_JOIN_S)
        for actor in self.actors.values():
            if actor.conn is not None:
                with contextlib.suppress(Exception):
                    actor.conn.close()
        if self._observer is not None:
            with contextlib.suppress(Exception):
                self.committed = self._observer.committed()
            with contextlib.suppress(Exception):
                self._observer.close()
        self.dialect.drop_rows()

    @property
    def closed(self) -> bool:
        return self._closed

    # -- stepping ----------------------------------------------------------------------

    def refusal(self, name: str) -> str | None:
        """Why `name` cannot take a step now, or None if it can."""
        actor = self.actors.get(name)
        if actor is None:
            return f"{name} is not an actor of this script ({', '.join(self.actors)})"
        if self._closed:
            return "the session has ended"
        if actor.running is not None:
            _, step = actor.running
            waits = " and ".join(actor.waits_for) or "a lock"
            return (
                f"{name} is blocked: its step on line {step.line} ({step.text}) waits for {waits}, "
                "and goes on by itself when that transaction commits or aborts"
            )
        if not actor.has_steps:
            return f"{name} has no steps left"
        return None

    def advance(self, name: str) -> Outcome:
        """Run `name`'s next step: its outcome, or within BLOCKED_AFTER_S one that says `blocked`.

        StepRefused (a ValueError) if `name` may not step now: blocked, or without steps left.
        """
        with self._lock:
            refused = self.refusal(name)
            if refused is not None:
                raise StepRefused(refused)
            actor = self.actors[name]
            position, step = actor.steps[actor.position]
            actor.position += 1
            actor.running = (position, step)
            actor.declared_blocked = False
            actor.waits_for = ()
            actor.done = None
            actor.finished.clear()
            actor.started = time.perf_counter()
            actor.inbox.put((position, step))
        looked = False
        while True:
            if actor.finished.wait(_POLL_S):
                break
            waited = time.perf_counter() - actor.started
            if waited < _FIRST_LOOK_S and not looked:
                continue
            looked = True
            with self._lock:
                if actor.done is not None:
                    break
                waits = self._waits_for(actor)
                if waits or waited >= BLOCKED_AFTER_S:
                    actor.declared_blocked = True
                    actor.waits_for = waits
                    return self._emit(actor, position, step, None)
        with self._lock:
            return self._emit(actor, position, step, actor.done)

    def next_in_order(self) -> str | None:
        """The actor of the script's first line not yet taken, or None once every line has been."""
        with self._lock:
            waiting = [(actor.steps[actor.position][0], name) for name, actor in self.actors.items() if actor.has_steps]
        return min(waiting)[1] if waiting else None

    def advance_in_order(self) -> Outcome:
        """Take the script's next line in its written order (StepRefused if its actor is blocked, or none is left)."""
        name = self.next_in_order()
        if name is None:
            raise StepRefused("every line of the script has been taken")
        refused = self.refusal(name)
        if refused is not None:
            _, step = self.actors[name].steps[self.actors[name].position]
            raise StepRefused(f"the next line, line {step.line}, is {name}'s, and {refused}")
        return self.advance(name)

    def wait_idle(self, name: str, timeout_s: float | None = None) -> bool:
        """Wait until `name` has no step in progress; False if it still has one after `timeout_s`."""
        actor = self.actors[name]
        if not actor.finished.wait(timeout_s):
            return False
        # Its completion is reported by its own thread just after: wait for that too.
        with self._emitted:
            return self._emitted.wait_for(lambda: actor.running is None, timeout=timeout_s)

    def run_in_order(
        self, *, step_ms: float = 0.0, stop: threading.Event | None = None, settle_s: float | None = None
    ) -> None:
        """Run the whole script in its written order, then wait for blocked steps (at most the lock timeout).

        A blocked step does not hold up another actor's next line; an actor's own next line
        waits for its blocked step. `stop` ends it early.
        """
        stop = stop or threading.Event()
        patience = self.lock_timeout_s + 5.0
        pending = list(self.script.steps)
        deadline = time.monotonic() + patience
        while pending:
            if stop.is_set() or self._closed:
                return
            # The first line whose actor is free: a blocked actor's lines wait, the others' go on
            # (as a person running the script by hand skips the session that hangs).
            with self._lock:
                busy = {name for name, actor in self.actors.items() if actor.running is not None}
            ready = next((step for step in pending if step.actor not in busy), None)
            if ready is None:
                if time.monotonic() > deadline or stop.wait(_POLL_S):
                    return
                continue
            pending = [step for step in pending if step is not ready]
            self.advance(ready.actor)
            deadline = time.monotonic() + patience
            if step_ms > 0 and stop.wait(step_ms / 1000.0):
                return
        deadline = time.monotonic() + (settle_s if settle_s is not None else patience)
        for name in self.actors:
            while not self.wait_idle(name, 0.1):
                if stop.is_set() or time.monotonic() > deadline:
                    return

    def views(self) -> dict[str, ActorView]:
        """Each actor as it is now."""
        with self._lock:
            return {name: actor.view() for name, actor in self.actors.items()}

    def backends(self) -> dict[str, int | None]:
        """Each actor's session as the database names it (PostgreSQL's backend pid)."""
        return {name: None if actor.conn is None else actor.conn.backend for name, actor in self.actors.items()}

    @property
    def finished(self) -> bool:
        """Every actor has run all its steps and none is blocked."""
        with self._lock:
            return all(not actor.has_steps and actor.running is None for actor in self.actors.values())

    # -- inside --------------------------------------------------------------------------

    def _waits_for(self, actor: _Actor) -> tuple[str, ...]:
        if self._observer is None or actor.conn is None:
            return ()
        by_backend = {other.conn.backend: other.name for other in self.actors.values() if other.conn is not None}
        try:
            blockers = self._observer.waits([actor.conn.backend]).get(actor.conn.backend, ())
        except Exception:
            logger.exception("step session: reading lock waits failed")
            return ()
        names = {by_backend[pid] for pid in blockers if pid in by_backend}
        return tuple(sorted(names))

    def _actor_main(self, actor: _Actor) -> None:
        while True:
            work = actor.inbox.get()
            if work is None:
                return
            position, step = work
            done = self._take(actor, step)
            with self._lock:
                actor.done = done
                actor.finished.set()
                blocked = actor.declared_blocked
            if blocked:
                self._resume(actor, position, step, done)

    def _take(self, actor: _Actor, step: Step) -> _Done:
        conn = actor.conn
        assert conn is not None
        done = _Done()
        try:
            match step.kind:
                case StepKind.BEGIN:
                    level = getattr(step.statement, "isolation", None) or self.isolation
                    idle = conn.status() == IDLE
                    conn.begin(level)
                    # A begin inside a transaction is only a warning: that transaction goes on.
                    done.began = level if idle else None
                case StepKind.COMMIT:
                    # A failed transaction cannot commit: COMMIT ends it with a rollback, and says so.
                    done.rolled_back = conn.status() == FAILED
                    conn.commit()
                case StepKind.ABORT:
                    conn.abort()
                case _:
                    if conn.status() == IDLE:
                        # An actor's statement outside a transaction begins one, at the script's level.
                        conn.begin(self.isolation)
                        done.began = self.isolation
                    done.result = conn.execute(step.statement)
        except StepFailed as failed:
            done.failure = failed
        except Exception as error:  # the connection lost, say: reported as the step's error
            logger.exception("step session: actor %s failed", actor.name)
            done.failure = StepFailed(None, f"{type(error).__name__}: {error}")
        try:
            done.status = conn.status()
        except Exception:
            done.status = FAILED
        done.finished = time.perf_counter()
        return done

    def _resume(self, actor: _Actor, position: int, step: Step, done: _Done) -> None:
        """Report a blocked step's completion once the step of whoever released it has been reported."""

        succeeded = done.failure is None

        def released() -> bool:
            for name in actor.waits_for:
                other = self.actors[name]
                # A step it waited for, under way when this one went on, and not yet reported. Gone on, it
                # was released by that step's end: a commit or an abort, or (when that step is itself
                # blocked) its error, a deadlock's victim or a lock timeout, reported first.
                unreported = other.running is not None and other.started < done.finished
                if unreported and (succeeded or not other.declared_blocked or other.done is not None):
                    return False
            return True

        with self._emitted:
            # A deadlock's victim is released by nobody's step: the database broke the cycle.
            if done.failure is None or not done.failure.deadlock:
                self._emitted.wait_for(released, timeout=_CAUSAL_WAIT_S)
            self._emit(actor, position, step, done)

    def _emit(self, actor: _Actor, position: int, step: Step, done: _Done | None) -> Outcome:
        """Apply a step's outcome to its actor (None: blocked), make its Outcome and report it. Under the lock."""
        if done is None:
            outcome = self._outcome(actor, position, step, BLOCKED, waits_for=actor.waits_for)
        else:
            resumed = actor.declared_blocked
            actor.running = None
            actor.declared_blocked = False
            self._apply(actor, step, done)
            fields: dict[str, Any] = {
                "began": done.began,
                "rolled_back": done.rolled_back,
                "resumed": resumed,
                "duration_ms": round((done.finished - actor.started) * 1000.0, 3),
            }
            if done.failure is not None:
                failure = done.failure
                outcome = self._outcome(
                    actor,
                    position,
                    step,
                    ERROR,
                    sqlstate=failure.sqlstate,
                    message=failure.message,
                    deadlock=failure.deadlock,
                    lock_timeout=failure.lock_timeout,
                    **fields,
                )
            else:
                result = done.result
                outcome = self._outcome(
                    actor,
                    position,
                    step,
                    OK,
                    rows=None if result is None else result.rows,
                    count=None if result is None else result.count,
                    **fields,
                )
        self.outcomes.append(outcome)
        try:
            self.on_outcome(outcome)
        except Exception:
            logger.exception("step session: reporting an outcome failed")
        self._emitted.notify_all()
        return outcome

    def _apply(self, actor: _Actor, step: Step, done: _Done) -> None:
        actor.status = done.status
        if done.began is not None:
            actor.isolation = done.began
            actor.own_writes = {}
        if done.status == FAILED:
            # Its transaction can only roll back now: what it wrote in it is gone, for it as for everyone.
            actor.own_writes = {}
        if done.status == IDLE:
            if step.kind == StepKind.COMMIT and done.failure is None and not done.rolled_back:
                for row_id, row in actor.own_writes.items():
                    if row is None:
                        actor.read_rows.pop(row_id, None)
                    else:
                        actor.read_rows[row_id] = row
            actor.own_writes = {}
            actor.isolation = None
        if done.failure is not None or done.result is None:
            return
        rows = done.result.rows
        if step.kind.reads and rows is not None:
            where = step.statement.where if isinstance(step.statement, Select) else None
            if where is None:
                actor.read_rows = {}
            else:
                for row_id, row in list(actor.read_rows.items()):
                    if evaluate(where, row):
                        del actor.read_rows[row_id]
            for row in rows:
                # A row it wrote itself stays its own write: gone again if its transaction aborts.
                if row["id"] in actor.own_writes:
                    actor.own_writes[row["id"]] = row
                else:
                    actor.read_rows[row["id"]] = row
        elif step.kind.writes and rows is not None:
            for row in rows:
                actor.own_writes[row["id"]] = None if step.kind == StepKind.DELETE else row

    def _outcome(self, actor: _Actor, position: int, step: Step, status: str, **fields: Any) -> Outcome:
        committed = self.committed
        if self._observer is not None and status != BLOCKED:
            try:
                committed = self.committed = self._observer.committed()
            except Exception:
                logger.exception("step session: reading the committed rows failed")
        return Outcome(
            actor=actor.name,
            position=position,
            step=step,
            status=status,
            committed=committed,
            seen={name: other.seen() for name, other in self.actors.items()},
            actors={name: other.view() for name, other in self.actors.items()},
            **fields,
        )


def final_values(rows: list[Row]) -> dict[str, int]:
    """The rows as `{"<id>": value}`: a script's result at a glance."""
    return {str(row["id"]): row["value"] for row in rows}


def views_as_json(views: Mapping[str, ActorView]) -> dict[str, dict[str, Any]]:
    return {
        name: {
            "status": view.status,
            "isolation": view.isolation,
            "waits_for": list(view.waits_for),
            "next_step": view.next_step,
        }
        for name, view in views.items()
    }
