"""client-go's leader election, replica by replica, on a Lease row of real PostgreSQL.

`LeaderElector` is one replica: client-go's `tryAcquireOrRenew`, its acquire loop
(jittered), its renew loop (RenewDeadline), ReleaseOnCancel, and the guarded work
a leader does with its fencing token. `LeaderElection` runs R of them as threads,
each with its own connection through its own proxy (proxy.py), and offers the
failure controls a classroom needs: kill, stop, pause, cut off, skew, add.

What the scenario does, in order:

    lease, counter = create_objects(f"job-{job.pk}", job=job)
    election = LeaderElection(lease_id=lease.pk, counter_id=counter.pk, replicas=R,
                              record=context.recorder.record, stop=context.stop, config=config)
    election.schedule(TimedControl("kill", at_s=20.0), ...)
    election.run(seconds, run_actors=context.run_actors)   # returns when the replicas have ended
    summary = summarize(read_events(job.pk), Lease.objects.get(pk=lease.pk), config)

While it runs, any thread may apply a control now: `election.apply(TimedControl("kill", 0))`
hits whoever leads, `election.kill(2)` replica 2; `leader()` says who leads.

Every step is recorded through `record(actor, op, attempt, kind, row, **fields)`
(EventRecorder.record's signature); KINDS lists the kinds and the fields each uses.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal, Protocol

from django.conf import settings

from occviz.scenarios.leader_election.connection import DB_ERRORS, LeaseRecord, ReplicaConnection, Written
from occviz.scenarios.leader_election.fencing import fenced_increment
from occviz.scenarios.leader_election.proxy import DatabaseProxy, ProxyProcess
from occviz.store.models import Counter, Lease

logger = logging.getLogger(__name__)

JITTER_FACTOR: Final = 1.2
"""client-go's JitterFactor: the acquire loop waits RetryPeriod to (1 + 1.2) x RetryPeriod."""

Ready = Callable[[], object]
Actor = Callable[[Ready], None]


class Record(Protocol):
    """EventRecorder.record's signature."""

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


# The kinds a leader election records, and the fields each fills (row: the Lease's id, or the
# guarded counter's for guarded_write / fenced; versions: resource versions).
KINDS: Final[dict[str, str]] = {
    "acquired": "became leader. versions of the Lease; value_read/written: lease_transitions before/after "
    "(equal when it re-took a lease that still named it); detail db_time, holder (the previous one, if another)",
    "renewed": "renewed its lease. versions of the Lease; value_read/written: lease_transitions; detail db_time",
    "backed_off": "another holder's lease is still valid by this replica's observation. version_read, "
    "value_read: lease_transitions; detail holder",
    "conflict": "lost a compare-and-swap on the Lease. version_read: the version expected; value_read/written: "
    "transitions read/meant; detail phase (acquire, renew, release), path (fast: the leader's optimistic update)",
    "renew_failed": "a renew attempt failed; retried every RetryPeriod until RenewDeadline. detail reason",
    "lost": "stepped down: no renewal for RenewDeadline. detail since_renew_s",
    "released": "released the lease (ReleaseOnCancel): empty holder, lease_duration_seconds 1. versions, "
    "value_read: lease_transitions; detail db_time",
    "guarded_write": "the leader's guarded increment landed. row: the counter; versions of the counter; "
    "value_read: the newest token before; value_written: its token",
    "fenced": "the guarded increment was rejected: its token is older than the newest. row: the counter; "
    "version_read; value_read: the newest token; value_written: its token",
    "db_error": "a statement or connection failed. detail phase, message",
    "reconnected": "connected again after an error",
    "killed": "killed: stops at once, no release, its connection dropped",
    "stopped": "stopped gracefully (releases the lease if it holds it and ReleaseOnCancel is set)",
    "paused": "a stop-the-world pause began. detail seconds, leading",
    "woke": "the pause ended. detail seconds, believes_leader, token (if it believes it leads)",
    "cut_off": "cut off from the database. detail seconds, leading",
    "skewed": "its wall clock (acquire/renew times) runs off. detail seconds, ahead_s or behind_s",
    "added": "joined the election while it ran",
    "control_failed": "a scheduled control could not be applied. detail control, error",
    "error": "the replica's thread failed (a bug, not a database error). detail message",
}

ControlAction = Literal["kill", "stop", "pause", "cut_off", "skew", "add"]


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


def create_objects(namespace: str, *, job: Any = None, name: str = "leader") -> tuple[Lease, Counter]:
    """The Lease the replicas contend for (no holder yet) and the counter their guarded writes increment."""
    lease = Lease.objects.create(namespace=namespace, name=name, job=job)
    counter = Counter.objects.create(namespace=namespace, name=f"{name}-guarded", job=job)
    return lease, counter


def objects_of(job_id: int, name: str = "leader") -> tuple[Lease, Counter]:
    """A job's Lease and guarded counter, as `create_objects` made them, read now (live state, summary)."""
    return Lease.objects.get(job_id=job_id, name=name), Counter.objects.get(job_id=job_id, name=f"{name}-guarded")


def identity(number: int) -> str:
    """A replica's holder identity in the Lease."""
    return f"replica-{number}"


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return (text.splitlines() or [type(error).__name__])[0][:200]


class LeaderElector:
    """One replica: client-go's LeaderElector on the Lease `lease_id`, doing guarded work on `counter_id`.

    `run(ready)` is the replica's thread. Its controls (`kill`, `request_stop`, `pause`,
    `cut_off`, `skew`) may be called from any other thread at any moment; they take
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
    ) -> None:
        self.number = number
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
        return self.observed_time + self.config.duration_of(self.observed) > now

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
            wall = self.wall_clock()
            desired = LeaseRecord("", 1, wall, wall, current.lease_transitions)
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

    def guarded_write(self) -> None:
        """Increment the guarded counter with this leader's fencing token; record whether it landed."""
        if self.token is None or self.connection is None:
            return
        started = time.perf_counter()
        try:
            self._ensure_connected()
            result = fenced_increment(self.connection, self.counter_id, self.token)
        except DB_ERRORS as error:
            self._database_failed(error, "guarded_write")
            return
        took_ms = (time.perf_counter() - started) * 1000.0
        if result.landed:
            self.record(
                "guarded_write",
                self.counter_id,
                version_read=result.version_read,
                version_written=result.version_written,
                value_read=result.newest_token,
                value_written=result.token,
                duration_ms=took_ms,
            )
        else:
            self.record(
                "fenced",
                self.counter_id,
                version_read=result.version_read,
                value_read=result.newest_token,
                value_written=result.token,
                duration_ms=took_ms,
            )

    # -- the loops --------------------------------------------------------------------------------

    def run(self, ready: Ready) -> None:
        """The replica's thread: connect, wait for the others, then elect until stopped, killed or ended."""
        self.proxy = self._proxies(self.identity)
        self.connection = ReplicaConnection(self.proxy, self.using)
        try:
            self.connection.ensure()  # before the barrier: connecting is not part of the race
            ready()
            self._on_started()
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
        try:
            while self._wait(self.config.retry_period) and self._pause_point():
                self.op += 1
                attempt += 1
                self.guarded_write()
                if self._done():
                    return
                if self._try(attempt, renewing=True):
                    last_renew = time.monotonic()
                    attempt = 0
                    continue
                self.record("renew_failed", self.lease_id, attempt, detail={"reason": self.last_failure})
                since = time.monotonic() - last_renew
                if since >= self.config.renew_deadline:
                    self.record("lost", self.lease_id, attempt, detail={"since_renew_s": round(since, 3)})
                    return
        finally:
            self.leading = False
            self.token = None

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
        self.record("db_error", self.lease_id, attempt, detail={"phase": phase, "message": _first_line(error)})

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


def _upstream(using: str) -> tuple[str, int]:
    """The real server's host (a socket folder or a name) and port, for a replica's proxy."""
    params = settings.DATABASES[using]
    return str(params.get("HOST") or ""), int(params.get("PORT") or 5432)


@dataclass(frozen=True)
class TimedControl:
    """A failure control to apply `at_s` seconds after the replicas were released.

    `replica` None hits whoever leads at that moment (waiting for a leader if there is
    none yet); `seconds` is the pause, cut-off or skew length.
    """

    action: ControlAction
    at_s: float
    replica: int | None = None
    seconds: float = 0.0


class LeaderElection:
    """R replicas contending for one Lease, as threads sharing a stop event, and their failure controls.

    Controls take a replica number (1..R, and more once added) and may be called from any
    thread while the election runs; on an unknown, killed, stopped or ended replica they
    raise ValueError.
    """

    def __init__(
        self,
        *,
        lease_id: int,
        counter_id: int,
        replicas: int,
        record: Record,
        stop: threading.Event,
        config: LeaderElectionConfig | None = None,
        seed: int | None = None,
        using: str = "default",
    ) -> None:
        self.config = config or LeaderElectionConfig()
        errors = self.config.validate()
        if errors:
            raise ValueError("; ".join(errors))
        if replicas < 1:
            raise ValueError("a leader election needs at least one replica")
        self.lease_id = lease_id
        self.counter_id = counter_id
        self.record = record
        self.seed = seed if seed is not None else random.randrange(2**32)
        self.using = using
        self.started_at: float | None = None  # time.monotonic() when the replicas were released
        self._stop = stop
        self._end = threading.Event()  # the replicas' own end: the stop event, or `seconds` elapsed
        self._started = threading.Event()
        self._lock = threading.Lock()
        self._seconds: float | None = None
        self._controls: list[TimedControl] = []
        self._helpers: list[threading.Thread] = []
        self._added: list[threading.Thread] = []
        self._errors: list[BaseException] = []
        self._proxy_process: ProxyProcess | None = None
        self._electors = {number: self._elector(number) for number in range(1, replicas + 1)}
        self._reserved: set[int] = set()  # lanes of the election that are no replica (outside writers)
        self._initial = list(self._electors.values())

    def _elector(self, number: int) -> LeaderElector:
        return LeaderElector(
            number,
            lease_id=self.lease_id,
            counter_id=self.counter_id,
            config=self.config,
            record=self.record,
            end=self._end,
            rng=random.Random(self.seed * 1_000 + number),
            proxies=self._proxy,
            using=self.using,
            on_started=self._on_started,
        )

    # -- running ----------------------------------------------------------------------------------

    def actors(self) -> list[Actor]:
        """The initial replicas as actors `act(ready)`: connect, `ready()` at the barrier, then elect."""
        return [elector.run for elector in self._initial]

    def schedule(self, *controls: TimedControl) -> None:
        """Apply `controls` at their times after the release (call before `run`)."""
        self._controls.extend(controls)

    def run(self, seconds: float | None = None, run_actors: Callable[[Sequence[Actor]], None] | None = None) -> None:
        """Run the replicas until the stop event is set, or `seconds` after their release.

        `run_actors` is the job's (JobContext.run_actors: a barrier, then all released at once);
        without it the election runs its own threads behind a barrier. Leaders release on the
        way out when ReleaseOnCancel is set. The election lasts that long even if every replica
        was killed (one may still be added); it returns when every replica has ended.
        """
        self._seconds = seconds
        try:
            (run_actors or self._run_threads)(self.actors())
            if self._started.is_set():
                # The initial replicas may all be gone (killed, stopped) while added ones run, or
                # before one is added: the election itself lasts until its stop event or its time.
                self._end.wait()
        finally:
            self._end.set()
            self._wake_all()
            for thread in [*self._added, *self._helpers]:
                thread.join()
            if self._proxy_process is not None:
                self._proxy_process.close()
        if self._errors:
            raise self._errors[0]

    def _run_threads(self, actors: Sequence[Actor]) -> None:
        barrier = threading.Barrier(len(actors))

        def main(actor: Actor) -> None:
            try:
                actor(barrier.wait)
            except threading.BrokenBarrierError:
                pass  # another replica failed before the start: its error is the one raised
            except BaseException as error:
                logger.exception("leader election: a replica failed")
                self._errors.append(error)
                barrier.abort()
                self._end.set()
                self._wake_all()

        threads = [
            threading.Thread(target=main, args=(actor,), name=f"replica-{n}") for n, actor in enumerate(actors, 1)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def _proxy(self, name: str) -> DatabaseProxy:
        """A proxy for replica `name`, in the election's proxy process (started with the first replica)."""
        with self._lock:
            if self._proxy_process is None:
                self._proxy_process = ProxyProcess(*_upstream(self.using))
            process = self._proxy_process
        return process.proxy(name)

    def _on_started(self) -> None:
        # Called by every replica past the barrier; the first one starts the clock and the helpers.
        with self._lock:
            if self._started.is_set():
                return
            self.started_at = time.monotonic()
            self._started.set()
            self._helpers = [
                threading.Thread(target=self._watch_end, name="election-end", daemon=True),
                threading.Thread(target=self._run_schedule, name="election-controls", daemon=True),
            ]
        for thread in self._helpers:
            thread.start()

    def _watch_end(self) -> None:
        """End the replicas when the job's stop event is set or the election's time is up."""
        assert self.started_at is not None
        deadline = self.started_at + self._seconds if self._seconds is not None else math.inf
        while not self._end.is_set():
            remaining = deadline - time.monotonic()
            # Polled: a thread cannot wait on two events, and the replicas wait on their own.
            if remaining <= 0 or self._stop.wait(min(0.05, remaining)):
                break
        self._end.set()
        self._wake_all()

    def _wake_all(self) -> None:
        for elector in list(self._electors.values()):
            elector.wake()

    def _run_schedule(self) -> None:
        assert self.started_at is not None
        for control in sorted(self._controls, key=lambda c: c.at_s):
            if self._end.wait(max(0.0, self.started_at + control.at_s - time.monotonic())):
                return
            try:
                self.apply(control, wait_for_leader_s=math.inf)
            except ValueError as error:
                actor = control.replica or 0
                self.record(actor, 0, 0, "control_failed", detail={"control": control.action, "error": str(error)})

    def apply(self, control: TimedControl, *, wait_for_leader_s: float = 0.0) -> int:
        """Apply `control` now (its `at_s` aside): what a scheduled control, or a page's button, does.

        With no replica named it hits whoever leads, waiting up to `wait_for_leader_s` for
        one. Returns the replica it hit (or added); ValueError as the controls raise it, or
        when no replica leads.
        """
        if control.action == "add":
            return self.add_replica()
        target = control.replica
        if target is None:
            target = self.wait_for_leader(wait_for_leader_s)
            if target is None:
                raise ValueError("No replica leads now.")
        match control.action:
            case "kill":
                self.kill(target)
            case "stop":
                self.stop(target)
            case "pause":
                self.pause(target, control.seconds)
            case "cut_off":
                self.cut_off(target, control.seconds)
            case "skew":
                self.skew(target, control.seconds)
        return target

    # -- looking ----------------------------------------------------------------------------------

    @property
    def replicas(self) -> list[int]:
        """Every replica's number, the added ones too."""
        return sorted(self._electors)

    def elector(self, replica: int) -> LeaderElector:
        """Replica `replica`'s elector, dead or alive (ValueError if there is no such replica)."""
        elector = self._electors.get(replica)
        if elector is None:
            raise ValueError(f"There is no replica {replica}: the replicas are 1 to {max(self._electors)}.")
        return elector

    def alive(self) -> list[int]:
        """The replicas still running (paused and cut-off ones included)."""
        # list(): a replica may be added meanwhile, from another thread.
        electors = sorted(list(self._electors.items()))
        return [n for n, e in electors if not (e.killed or e.stop_requested or e.finished)]

    def leader(self) -> int | None:
        """The replica that leads now: of those that believe they lead, the newest (highest token)."""
        leading = [e for e in list(self._electors.values()) if e.leading and not (e.killed or e.stop_requested)]
        if not leading:
            return None
        return max(leading, key=lambda e: e.token or 0).number

    def wait_for_leader(self, timeout: float, *, other_than: Iterable[int] = ()) -> int | None:
        """Wait up to `timeout` seconds for a leader (not one of `other_than`); its number, or None."""
        excluded = set(other_than)
        deadline = time.monotonic() + timeout
        while True:
            leader = self.leader()
            if leader is not None and leader not in excluded:
                return leader
            if time.monotonic() >= deadline or self._end.wait(0.01):
                return None

    # -- the failure controls -----------------------------------------------------------------------

    def _alive(self, replica: int) -> LeaderElector:
        if not self._started.is_set() or self._end.is_set():
            raise ValueError("The election is not running.")
        elector = self.elector(replica)
        if elector.killed:
            raise ValueError(f"Replica {replica} was killed.")
        if elector.stop_requested or elector.finished:
            raise ValueError(f"Replica {replica} was stopped.")
        return elector

    def kill(self, replica: int) -> None:
        """Kill the replica: it stops at once, releases nothing, and its connection is dropped."""
        self._alive(replica).kill()

    def stop(self, replica: int) -> None:
        """Stop the replica gracefully: it releases the lease if it holds it (with ReleaseOnCancel)."""
        self._alive(replica).request_stop()

    def pause(self, replica: int, seconds: float) -> None:
        """A stop-the-world pause of `seconds`: a leader wakes believing it leads and writes before renewing."""
        _positive(seconds, "A pause")
        self._alive(replica).pause(seconds)

    def cut_off(self, replica: int, seconds: float) -> None:
        """Cut the replica off from the database for `seconds`: its connection drops, reconnects fail."""
        _positive(seconds, "A cut-off")
        self._alive(replica).cut_off(seconds)

    def skew(self, replica: int, seconds: float) -> None:
        """Make the replica's wall clock run `seconds` off (negative: behind)."""
        if not math.isfinite(seconds):
            raise ValueError("A clock skew must be a finite number of seconds.")
        self._alive(replica).skew(seconds)

    def add_replica(self) -> int:
        """A new replica joins the election now; its number."""
        with self._lock:
            if not self._started.is_set() or self._end.is_set():
                raise ValueError("The election is not running.")
            number = max(self._electors.keys() | self._reserved) + 1
            elector = self._electors[number] = self._elector(number)
            thread = threading.Thread(target=self._run_added, args=(elector,), name=f"replica-{number}")
            self._added.append(thread)
        self.record(number, 0, 0, "added")
        thread.start()
        return number

    def reserve_number(self) -> int:
        """A number no replica has or will have: the lane of an outside writer to the Lease."""
        with self._lock:
            number = max(self._electors.keys() | self._reserved) + 1
            self._reserved.add(number)
            return number

    def _run_added(self, elector: LeaderElector) -> None:
        try:
            elector.run(lambda: None)
        except Exception as error:
            logger.exception("leader election: %s failed", elector.identity)
            self.record(elector.number, elector.op, 0, "error", detail={"message": _first_line(error)})


def _positive(seconds: float, what: str) -> None:
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"{what} must last a positive number of seconds.")
