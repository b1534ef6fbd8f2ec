"""The replicas of a leader election: R electors sharing a stop event, and their failure controls.

The electors are threads of the job's process, or (`processes=True`) each in a process
of its own (replica.py), where kill is SIGKILL and pause SIGSTOP.

What the scenario does, in order:

    lease, counter = create_objects(f"job-{job.pk}", job=job)
    election = LeaderElection(lease_id=lease.pk, counter_id=counter.pk, replicas=R,
                              record=context.recorder.record, stop=context.stop, config=config)
    election.schedule(TimedControl("kill", at_s=20.0), ...)
    election.run(seconds, run_actors=context.run_actors)   # returns when the replicas have ended
    summary = summarize(read_events(job.pk), Lease.objects.get(pk=lease.pk), config)

While it runs, any thread may apply a control now: `election.apply(TimedControl("kill", 0))`
hits whoever leads, `election.kill(2)` replica 2; `leader()` says who leads.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from occviz.concurrency.latency import Network
from occviz.concurrency.writer import Record
from occviz.scenarios.leader_election.elector import Habits, LeaderElectionConfig, LeaderElector, Ready, first_line
from occviz.scenarios.leader_election.proxy import DatabaseProxy
from occviz.scenarios.leader_election.replica import ReplicaProcess, ReplicaSpawner, fork_server
from occviz.store.models import Counter, Lease

logger = logging.getLogger(__name__)

Actor = Callable[[Ready], None]
Replica = LeaderElector | ReplicaProcess
"""A replica as the election sees it: a thread's elector, or a process' mirror (the same controls and beliefs)."""
ControlAction = Literal["kill", "stop", "pause", "cut_off", "skew", "starve", "add"]


def create_objects(namespace: str, *, job: Any = None, name: str = "leader") -> tuple[Lease, Counter]:
    """The Lease the replicas contend for (no holder yet) and the counter their guarded writes increment."""
    lease = Lease.objects.create(namespace=namespace, name=name, job=job)
    counter = Counter.objects.create(namespace=namespace, name=f"{name}-guarded", job=job)
    return lease, counter


def objects_of(job_id: int, name: str = "leader") -> tuple[Lease, Counter]:
    """A job's Lease and guarded counter, as `create_objects` made them, read now (live state, summary)."""
    return Lease.objects.get(job_id=job_id, name=name), Counter.objects.get(job_id=job_id, name=f"{name}-guarded")


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
    """R replicas contending for one Lease, sharing a stop event, and their failure controls.

    `processes`: each replica runs in a process of its own (ReplicaProcess), else as a thread.
    `network`: the replicas' proxies and the delay they add (occviz.concurrency.latency; by
    default proxies with no delay), which the election closes when it ends.

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
        habits: Habits | None = None,
        lease_durations: Mapping[int, float] | None = None,
        processes: bool = False,
        network: Network | None = None,
    ) -> None:
        self.config = config or LeaderElectionConfig()
        self.habits = habits or Habits()
        # Replicas configured with a LeaseDuration of their own, which they judge every record by.
        self.lease_durations = dict(lease_durations or {})
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
        self.processes = processes
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
        # Every replica connects through a proxy of its own (cut off needs it), a latency away or not.
        self.network = network or Network("0", using=using, always=True)
        self._spawner: ReplicaSpawner | None = None
        self._electors = {number: self._elector(number) for number in range(1, replicas + 1)}
        self._reserved: set[int] = set()  # lanes of the election that are no replica (outside writers)
        self._initial = list(self._electors.values())

    def _elector(self, number: int) -> Replica:
        config, habits = self.config, self.habits
        own = self.lease_durations.get(number)
        if own is not None:
            # Its RenewDeadline and RetryPeriod scaled alike (a valid config of its own); it joins
            # one RetryPeriod late, as a rollout adds it next to a leader already elected.
            config = self.config.scaled_to(own)
            habits = replace(habits, own_lease=True, start_delay_s=self.config.retry_period)
        if self.processes:
            return ReplicaProcess(
                number,
                lease_id=self.lease_id,
                counter_id=self.counter_id,
                config=config,
                habits=habits,
                rng_seed=self.seed * 1_000 + number,
                record=self.record,
                end=self._end,
                proxies=self._proxy_of(number),
                spawner=self._replica_spawner,
                using=self.using,
                on_started=self._on_started,
            )
        return LeaderElector(
            number,
            lease_id=self.lease_id,
            counter_id=self.counter_id,
            config=config,
            habits=habits,
            record=self.record,
            end=self._end,
            rng=random.Random(self.seed * 1_000 + number),
            proxies=self._proxy_of(number),
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
        if self.processes:
            self._spawner = fork_server(self.using)  # started on the process' first election, kept for the next
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
            self.network.close()
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

    def _proxy_of(self, number: int) -> Callable[[str], DatabaseProxy]:
        """How replica `number` opens its proxy named `name`: the network's, at that replica's delay."""
        return lambda name: self.network.proxy(number, name)

    def _replica_spawner(self) -> ReplicaSpawner:
        if self._spawner is None:
            raise RuntimeError("the election is not running: no replica process can start")
        return self._spawner

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
            case "starve":
                self.starve(target, control.seconds)
        return target

    # -- looking ----------------------------------------------------------------------------------

    @property
    def replicas(self) -> list[int]:
        """Every replica's number, the added ones too."""
        return sorted(self._electors)

    def elector(self, replica: int) -> Replica:
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

    def _alive(self, replica: int) -> Replica:
        if not self._started.is_set() or self._end.is_set():
            raise ValueError("The election is not running.")
        elector = self.elector(replica)
        if elector.killed:
            raise ValueError(f"Replica {replica} was killed.")
        if elector.stop_requested or elector.finished:
            raise ValueError(f"Replica {replica} was stopped.")
        return elector

    def kill(self, replica: int) -> None:
        """Kill the replica (SIGKILL for a process): it stops at once, releases nothing, its connection drops."""
        self._alive(replica).kill()

    def stop(self, replica: int) -> None:
        """Stop the replica gracefully: it releases the lease if it holds it (with ReleaseOnCancel)."""
        self._alive(replica).request_stop()

    def pause(self, replica: int, seconds: float) -> None:
        """A stop-the-world pause of `seconds` (SIGSTOP, then SIGCONT, for a process): a leader wakes believing it
        leads and writes before renewing."""
        _positive(seconds, "A pause")
        self._alive(replica).pause(seconds)

    def cut_off(self, replica: int, seconds: float) -> None:
        """Cut the replica off from the database for `seconds`: its connection drops, reconnects fail."""
        _positive(seconds, "A cut-off")
        self._alive(replica).cut_off(seconds)

    def starve(self, replica: int, seconds: float) -> None:
        """Starve the leader of CPU for `seconds`: its next renewal comes that late, past RenewDeadline if longer."""
        _positive(seconds, "A starvation")
        self._alive(replica).starve(seconds)

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

    def _run_added(self, elector: Replica) -> None:
        try:
            elector.run(lambda: None)
        except Exception as error:
            logger.exception("leader election: %s failed", elector.identity)
            self.record(elector.number, elector.op, 0, "error", detail={"message": first_line(error)})


def _positive(seconds: float, what: str) -> None:
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"{what} must last a positive number of seconds.")
