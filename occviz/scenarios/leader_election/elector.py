"""client-go's leader election for one replica, on a Lease row of real PostgreSQL.

`LeaderElector` is one replica: client-go's `tryAcquireOrRenew`, its acquire loop
(jittered), its renew loop (RenewDeadline), ReleaseOnCancel, and the guarded work a
leader does with its fencing token, over a connection of its own through its own proxy
(connection.py, proxy.py). Its failure controls (kill, stop, pause, cut off, skew, starve) may
be called from any thread; the replicas as a group are actors.py. Its `Habits` are how its
controller departs from a careful one, the stuff of the incidents from the field.

Every step is recorded through `record(actor, op, attempt, kind, row, **fields)`
(occviz.concurrency.writer.Record: the job recorder's signature).
"""

from __future__ import annotations

import contextlib
import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from occviz.concurrency.writer import Record
from occviz.scenarios.leader_election.connection import DB_ERRORS, LeaseRecord, ReplicaConnection, Written
from occviz.scenarios.leader_election.fencing import fenced_increment, unfenced_increment
from occviz.scenarios.leader_election.proxy import DatabaseProxy
from occviz.store.leases import released

JITTER_FACTOR: Final = 1.2
"""client-go's JitterFactor: the acquire loop waits RetryPeriod to (1 + 1.2) x RetryPeriod."""

Ready = Callable[[], object]


@dataclass(frozen=True)
class LeaderElectionConfig:
    """client-go's LeaderElectionConfig timings, in seconds (defaults: kube-controller-manager's)."""

    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    release_on_cancel: bool = True

    def validate(self) -> list[str]:
        """client-go's NewLeaderElector checks, in its order and words; empty when the config is valid."""
        errors = []
        if self.lease_duration <= self.renew_deadline:
            errors.append("leaseDuration must be greater than renewDeadline")
        if self.renew_deadline <= JITTER_FACTOR * self.retry_period:
            errors.append("renewDeadline must be greater than retryPeriod*JitterFactor")
        if self.lease_duration <= 0:
            errors.append("leaseDuration must be greater than zero")
        if self.renew_deadline <= 0:
            errors.append("renewDeadline must be greater than zero")
        if self.retry_period <= 0:
            errors.append("retryPeriod must be greater than zero")
        return errors

    @property
    def lease_seconds(self) -> int:
        """LeaseDuration as the Lease stores it: whole seconds (rounded up, at least 1)."""
        return max(1, math.ceil(self.lease_duration))

    def duration_of(self, record: LeaseRecord) -> float:
        """How long `record` is valid after it was observed.

        The Lease stores whole seconds, as Kubernetes' does; replicas that share this config
        read their own stored value back as the exact LeaseDuration, so a fast classroom
        setting (1.5 s) is not turned into 2 s. Any other value (a release's 1 s, or a holder
        configured otherwise) is taken as stored.
        """
        if record.lease_duration_seconds == self.lease_seconds:
            return self.lease_duration
        return float(record.lease_duration_seconds)

    def jittered_retry(self, rng: random.Random) -> float:
        """The acquire loop's wait: client-go's wait.Jitter(RetryPeriod, JitterFactor)."""
        return self.retry_period * (1.0 + rng.random() * JITTER_FACTOR)

    def scaled_to(self, lease_duration: float) -> LeaderElectionConfig:
        """This config with LeaseDuration `lease_duration`, RenewDeadline and RetryPeriod in the same ratios."""
        factor = lease_duration / self.lease_duration
        return LeaderElectionConfig(
            lease_duration, self.renew_deadline * factor, self.retry_period * factor, self.release_on_cancel
        )


@dataclass(frozen=True)
class Habits:
    """How a replica's controller departs from a careful one: what the incidents from the field are made of.

    `fencing` off: its guarded writes carry a token nobody checks. `work_after_loss_s`: its
    work loop is bound to the process, not to its leadership, and runs on that long after it
    stepped down. `shutdown_s`: stopped while leading, it stops renewing at once but drains
    its work that long before it releases. `own_lease`: it judges every record's expiry by its
    own LeaseDuration instead of the record's leaseDurationSeconds. `start_delay_s`: it starts
    that long after the others (a rollout adding it).
    """

    fencing: bool = True
    work_after_loss_s: float = 0.0
    shutdown_s: float = 0.0
    own_lease: bool = False
    start_delay_s: float = 0.0


def identity(number: int) -> str:
    """A replica's holder identity in the Lease."""
    return f"replica-{number}"


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return (text.splitlines() or [type(error).__name__])[0][:200]


class LeaderElector:
    """One replica: client-go's LeaderElector on the Lease `lease_id`, doing guarded work on `counter_id`.

    `run(ready)` is the replica's thread. Its controls (`kill`, `request_stop`, `pause`,
    `cut_off`, `skew`, `starve`) may be called from any other thread at any moment; they take
    effect at once (a sleeping replica is woken).
    """

    def __init__(
        self,
        number: int,
        *,
        lease_id: int,
        counter_id: int,
        config: LeaderElectionConfig,
        record: Record,
        end: threading.Event,
        rng: random.Random,
        proxies: Callable[[str], DatabaseProxy],
        using: str = "default",
        on_started: Callable[[], None] = lambda: None,
        habits: Habits | None = None,
    ) -> None:
        self.number = number
        self.habits = habits or Habits()
        self.identity = identity(number)
        self.lease_id = lease_id
        self.counter_id = counter_id
        self.config = config
        self.rng = rng
        self.using = using
        self._record_event = record
        self._end = end
        self._on_started = on_started
        self._proxies = proxies
        self.connection: ReplicaConnection | None = None
        self.proxy: DatabaseProxy | None = None
        # client-go's observedRecord and observedTime: the time is this replica's monotonic clock
        # when it last saw the record change, never the holder's renew_time (clocks skew).
        self.observed: LeaseRecord | None = None
        self.observed_time = 0.0
        self.leading = False  # between acquiring and stepping down: what this replica believes
        self.token: int | None = None  # its fencing token while it leads
        self.clock_offset_s = 0.0
        self.op = 0
        self.killed = False
        self.stop_requested = False
        self.finished = False
        self.paused = False
        self.last_failure = ""
        self._pending_pause: float | None = None
        self._pending_starve: float | None = None
        self._wake = threading.Event()
        self._record_lock = threading.Lock()

    # -- what the replica records ---------------------------------------------------------------

    def record(self, kind: str, row: int | None = None, attempt: int = 0, **fields: Any) -> None:
        # A killed replica is gone: nothing it was in the middle of is recorded after its `killed`.
        with self._record_lock:
            if not self.killed:
                self._record_event(self.number, self.op, attempt, kind, row, **fields)

    def _record_control(self, kind: str, **fields: Any) -> None:
        self._record_event(self.number, self.op, 0, kind, **fields)

    # -- the clocks -------------------------------------------------------------------------------

    def wall_clock(self) -> datetime:
        """This replica's wall clock, as it writes acquire_time and renew_time (skewed by `skew`)."""
        return datetime.now(UTC) + timedelta(seconds=self.clock_offset_s)

    def is_leader(self) -> bool:
        """client-go's IsLeader: the last observed record names this replica."""
        return self.observed is not None and self.observed.holder_identity == self.identity

    def lease_valid(self, now: float) -> bool:
        """client-go's isLeaseValid: observed + the record's duration is still ahead of `now` (monotonic)."""
        if self.observed is None:
            return False
        return self.observed_time + self.lease_duration_of(self.observed) > now

    def lease_duration_of(self, record: LeaseRecord) -> float:
        """How long `record` is valid for this replica: the record's duration, or its own if it judges by its own."""
        return self.config.lease_duration if self.habits.own_lease else self.config.duration_of(record)

    @property
    def observed_holder(self) -> str | None:
        """The holder in the Lease this replica saw last (None before it saw one)."""
        return None if self.observed is None else self.observed.holder_identity

    @property
    def observed_expiry(self) -> float | None:
        """When the lease it saw last runs out by its own clock (time.monotonic()), or None."""
        if self.observed is None:
            return None
        return self.observed_time + self.lease_duration_of(self.observed)

    def _observe(self, record: LeaseRecord) -> None:
        self.observed = record
        self.observed_time = time.monotonic()

    # -- client-go's tryAcquireOrRenew --------------------------------------------------------------

    def try_acquire_or_renew(self, attempt: int = 1, *, renewing: bool = False) -> bool:
        """One try: True if this replica holds the lease afterwards (acquired or renewed).

        A database error propagates (the loops record it and retry). `last_failure` says
        why a try returned False.
        """
        assert self.connection is not None
        phase = "renew" if renewing else "acquire"
        now = time.monotonic()
        wall = self.wall_clock()

        # 1. The leader's fast path: update optimistically, assuming the record it observed last
        #    (its own write) is still the current version.
        observed = self.observed
        if observed is not None and self.is_leader() and self.lease_valid(now):
            desired = LeaseRecord(
                self.identity, self.config.lease_seconds, observed.acquire_time, wall, observed.lease_transitions
            )
            if self._write(observed, desired, attempt, renewing):
                return True
            self._conflict(observed, desired, attempt, phase, path="fast")

        # 2. Get the record (the scenario created it).
        current = self.connection.read_lease(self.lease_id)

        # 3. Restart the local observed clock only when the record changed: a holder that keeps
        #    renewing keeps changing it, a dead one does not.
        if self.observed is None or current.resource_version != self.observed.resource_version:
            self._observe(current)
        if current.holder_identity and self.lease_valid(now) and not self.is_leader():
            self.last_failure = f"{current.holder_identity} holds the lease"
            if not renewing:
                self.record(
                    "backed_off",
                    self.lease_id,
                    attempt,
                    version_read=current.resource_version,
                    value_read=current.lease_transitions,
                    detail={"holder": current.holder_identity},
                )
            return False

        # 4. Write: a holder keeps its acquire time and the transitions; a new holder counts one more.
        if self.is_leader():
            desired = LeaseRecord(
                self.identity, self.config.lease_seconds, current.acquire_time, wall, current.lease_transitions
            )
        else:
            desired = LeaseRecord(self.identity, self.config.lease_seconds, wall, wall, current.lease_transitions + 1)
        if self._write(current, desired, attempt, renewing):
            return True
        self._conflict(current, desired, attempt, phase)
        return False

    def _write(self, read: LeaseRecord, desired: LeaseRecord, attempt: int, renewing: bool) -> bool:
        assert self.connection is not None
        started = time.perf_counter()
        written = self.connection.write_lease(self.lease_id, read.resource_version, desired)
        took_ms = (time.perf_counter() - started) * 1000.0
        if written is None:
            return False
        previous_holder = read.holder_identity
        self._observe(_with_version(desired, written))
        detail: dict[str, Any] = {"db_time": written.db_time.isoformat()}
        if self.habits.own_lease:
            detail["lease_s"] = self.config.lease_duration
        if not renewing and previous_holder not in ("", self.identity):
            detail["holder"] = previous_holder
        self.record(
            "renewed" if renewing else "acquired",
            self.lease_id,
            attempt,
            version_read=read.resource_version,
            version_written=written.resource_version,
            value_read=read.lease_transitions,
            value_written=desired.lease_transitions,
            duration_ms=took_ms,
            detail=detail,
        )
        return True

    def _conflict(self, read: LeaseRecord, desired: LeaseRecord, attempt: int, phase: str, path: str = "") -> None:
        self.last_failure = "conflict"
        detail = {"phase": phase, "path": path} if path else {"phase": phase}
        self.record(
            "conflict",
            self.lease_id,
            attempt,
            version_read=read.resource_version,
            value_read=read.lease_transitions,
            value_written=desired.lease_transitions,
            detail=detail,
        )

    def release(self) -> bool:
        """ReleaseOnCancel: write an empty holder with lease_duration_seconds 1, by compare-and-swap.

        client-go releases when its observed record names it; this re-reads the record first and
        releases only what the record says this replica holds, so a replica that was paused
        past its lease gives up nothing that another replica has taken since.
        """
        if self.connection is None:
            return False
        try:
            self._ensure_connected()
            current = self.connection.read_lease(self.lease_id)
            if current.holder_identity != self.identity:
                return False
            desired = LeaseRecord(**released(current.lease_transitions, self.wall_clock()))
            written = self.connection.write_lease(self.lease_id, current.resource_version, desired)
        except DB_ERRORS as error:
            self._database_failed(error, "release")
            return False
        if written is None:
            self._conflict(current, desired, 0, "release")
            return False
        self._observe(_with_version(desired, written))
        self.record(
            "released",
            self.lease_id,
            version_read=current.resource_version,
            version_written=written.resource_version,
            value_read=current.lease_transitions,
            detail={"db_time": written.db_time.isoformat()},
        )
        return True

    # -- the guarded work ---------------------------------------------------------------------------

    def guarded_write(self, token: int | None = None, *, working_on: str = "") -> None:
        """Increment the guarded counter with this leader's fencing token; record whether it landed.

        `token` and `working_on` ("after it lost the lease", "while it shuts down") for the work a replica goes on
        doing when it no longer leads. The database's clock at the write is recorded with it.
        """
        token = self.token if token is None else token
        if token is None or self.connection is None:
            return
        started = time.perf_counter()
        try:
            self._ensure_connected()
            if self.habits.fencing:
                result = fenced_increment(self.connection, self.counter_id, token, self.lease_id)
            else:
                result = unfenced_increment(self.connection, self.counter_id, token)
        except DB_ERRORS as error:
            self._database_failed(error, "guarded_write")
            return
        took_ms = (time.perf_counter() - started) * 1000.0
        detail: dict[str, Any] = {"db_time": result.db_time.isoformat()}
        if not self.habits.fencing:
            detail["unfenced"] = True
        if working_on:
            detail["working_on"] = working_on
        if result.landed:
            self.record(
                "guarded_write",
                self.counter_id,
                version_read=result.version_read,
                version_written=result.version_written,
                value_read=result.newest_token,
                value_written=result.token,
                duration_ms=took_ms,
                detail=detail,
            )
        else:
            self.record(
                "fenced",
                self.counter_id,
                version_read=result.version_read,
                value_read=result.newest_token,
                value_written=result.token,
                duration_ms=took_ms,
                detail=detail,
            )

    def _keep_working(self, token: int, seconds: float, why: str) -> None:
        """The guarded work every RetryPeriod for `seconds`, not leading: only a kill or the end stops it."""
        self.record("working_on", self.counter_id, detail={"seconds": seconds, "why": why, "token": token})
        deadline = time.monotonic() + seconds
        next_write = time.monotonic() + self.config.retry_period
        while next_write <= deadline:
            if not self._sleep_until(next_write):
                return
            self.guarded_write(token, working_on=why)
            next_write += self.config.retry_period
        if self._sleep_until(deadline):
            self.record("work_stopped", self.counter_id, detail={"why": why, "token": token})

    def _sleep_until(self, moment: float) -> bool:
        """Sleep until `moment` (monotonic), whatever is requested meanwhile; False if killed or the job ended."""
        while not (self.killed or self._end.is_set()):
            remaining = moment - time.monotonic()
            if remaining <= 0:
                return True
            self._wake.wait(remaining)
            self._wake.clear()
        return False

    # -- the loops --------------------------------------------------------------------------------

    def run(self, ready: Ready) -> None:
        """The replica's thread: connect, wait for the others, then elect until stopped, killed or ended."""
        self.proxy = self._proxies(self.identity)
        self.connection = ReplicaConnection(self.proxy, self.using)
        try:
            self.connection.ensure()  # before the barrier: connecting is not part of the race
            ready()
            self._on_started()
            if self.habits.start_delay_s:
                self._wait(self.habits.start_delay_s)
            while not self._done():
                if self._acquire():
                    self._lead()
            if not self.killed and self.config.release_on_cancel:
                self.release()
        finally:
            self.finished = True
            self.leading = False
            self.connection.close()
            self.proxy.close()

    def _acquire(self) -> bool:
        """client-go's acquire: try, then wait RetryPeriod jittered up to 2.2 x, until it leads."""
        attempt = 0
        while self._pause_point():
            attempt += 1
            self.op += 1
            if self._try(attempt, renewing=False):
                return True
            if not self._wait(self.config.jittered_retry(self.rng)):
                return False
        return False

    def _lead(self) -> None:
        """Lead until the lease cannot be renewed within RenewDeadline (or the replica is stopped).

        Every RetryPeriod the leader does its guarded write, then renews. The pause point comes
        first: a leader paused there wakes still believing it leads and writes before its
        renewal can tell it otherwise (the stale leader its fencing token is for). A failed
        renewal is retried every RetryPeriod; once RenewDeadline has passed since the last
        successful one, the leader steps down. (client-go times RenewDeadline from the start
        of each renew round, one RetryPeriod after the last success; timing it from the
        success itself steps down no later.)
        """
        assert self.observed is not None
        self.token = self.observed.lease_transitions
        self.leading = True
        self.guarded_write()
        last_renew = time.monotonic()
        attempt = 0
        token = self.token
        try:
            while self._wait(self.config.retry_period) and self._pause_point():
                self.op += 1
                attempt += 1
                self.guarded_write()
                if self._done():
                    break
                if self._starve_point():
                    # The renewal comes too late: client-go's renew runs under a RenewDeadline
                    # timeout, which expired while the thread was starved.
                    since = time.monotonic() - last_renew
                    if since >= self.config.renew_deadline:
                        self._step_down(token, since, attempt)
                        return
                if self._try(attempt, renewing=True):
                    last_renew = time.monotonic()
                    attempt = 0
                    continue
                self.record("renew_failed", self.lease_id, attempt, detail={"reason": self.last_failure})
                since = time.monotonic() - last_renew
                if since >= self.config.renew_deadline:
                    self._step_down(token, since, attempt)
                    return
            if self.stop_requested and self.habits.shutdown_s and not (self.killed or self._end.is_set()):
                # Stopped: no more renewals, but the work drains before the release.
                self._keep_working(token, self.habits.shutdown_s, "while it shuts down")
        finally:
            self.leading = False
            self.token = None

    def _step_down(self, token: int | None, since: float, attempt: int) -> None:
        """OnStoppedLeading: no renewal for RenewDeadline. A work loop bound to the process runs on."""
        self.record("lost", self.lease_id, attempt, detail={"since_renew_s": round(since, 3)})
        if token is not None and self.habits.work_after_loss_s and not self._done():
            self.leading = False
            self._keep_working(token, self.habits.work_after_loss_s, "after it lost the lease")

    def _try(self, attempt: int, *, renewing: bool) -> bool:
        try:
            self._ensure_connected()
            return self.try_acquire_or_renew(attempt, renewing=renewing)
        except DB_ERRORS as error:
            self._database_failed(error, "renew" if renewing else "acquire", attempt)
            self.last_failure = "database error"
            return False

    def _ensure_connected(self) -> None:
        assert self.connection is not None
        if self.connection.ensure():
            self.record("reconnected")

    def _database_failed(self, error: BaseException, phase: str, attempt: int = 0) -> None:
        assert self.connection is not None
        self.connection.reset()
        self.record("db_error", self.lease_id, attempt, detail={"phase": phase, "message": first_line(error)})

    def _done(self) -> bool:
        return self.killed or self.stop_requested or self._end.is_set()

    def _wait(self, seconds: float) -> bool:
        """Sleep `seconds`; False if the replica must end, True early if a pause is pending."""
        deadline = time.monotonic() + seconds
        while not self._done():
            if self._pending_pause is not None:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            self._wake.wait(remaining)
            self._wake.clear()  # flags are set before the wake-up, and checked again after this
        return False

    def _pause_point(self) -> bool:
        """Freeze here if a pause is pending; False if the replica must end."""
        seconds = self._pending_pause
        if seconds is not None and not self._done():
            self._pending_pause = None
            self.paused = True
            self.record("paused", detail={"seconds": seconds, "leading": self.leading})
            # Stop-the-world: nothing of this replica runs, not even a graceful stop (handled when
            # it wakes). Only a kill, or the end of the job, cuts the pause short.
            deadline = time.monotonic() + seconds
            while not (self.killed or self._end.is_set()):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._wake.wait(remaining)
                self._wake.clear()
            self.paused = False
            if not self._done():
                woke: dict[str, Any] = {"seconds": seconds, "believes_leader": self.leading}
                if self.leading:
                    woke["token"] = self.token
                self.record("woke", detail=woke)
        return not self._done()

    def _starve_point(self) -> bool:
        """Stall here if a CPU starvation is pending (the renewal's turn comes that late); True if it stalled."""
        seconds = self._pending_starve
        if seconds is None or self._done():
            return False
        self._pending_starve = None
        self.record("starved", detail={"seconds": seconds, "leading": self.leading})
        self._sleep_until(time.monotonic() + seconds)
        return True

    # -- the controls (from other threads) ------------------------------------------------------------

    def wake(self) -> None:
        self._wake.set()

    def kill(self) -> None:
        with self._record_lock:
            self._record_control("killed", detail={"leading": self.leading})
            self.killed = True
        if self.proxy is not None:
            with contextlib.suppress(RuntimeError):  # no proxy process left: nothing to drop
                self.proxy.cut(None)  # its connection drops now, mid-statement if need be
        self.wake()

    def request_stop(self) -> None:
        self._record_control("stopped", detail={"leading": self.leading})
        self.stop_requested = True
        self.wake()

    def pause(self, seconds: float) -> None:
        if self.paused or self._pending_pause is not None:
            raise ValueError(f"{self.identity} is already paused")
        self._pending_pause = seconds
        self.wake()

    def starve(self, seconds: float) -> None:
        if self._pending_starve is not None:
            raise ValueError(f"{self.identity} is already starved")
        if not self.leading:
            raise ValueError(f"{self.identity} does not lead: only a leader's renewals can be starved")
        self._pending_starve = seconds

    def cut_off(self, seconds: float) -> None:
        if self.proxy is None:
            raise ValueError(f"{self.identity} has not connected yet")
        self._record_control("cut_off", detail={"seconds": seconds, "leading": self.leading})
        self.proxy.cut(seconds)

    def skew(self, seconds: float) -> None:
        self.clock_offset_s = seconds
        detail: dict[str, Any] = {"seconds": seconds}
        if seconds:
            detail["ahead_s" if seconds > 0 else "behind_s"] = abs(seconds)
        self._record_control("skewed", detail=detail)


def _with_version(record: LeaseRecord, written: Written) -> LeaseRecord:
    return LeaseRecord(
        record.holder_identity,
        record.lease_duration_seconds,
        record.acquire_time,
        record.renew_time,
        record.lease_transitions,
        written.resource_version,
    )
