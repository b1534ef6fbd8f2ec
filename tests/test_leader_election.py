"""Leader election on a real Lease row: one leader, failovers within their bounds, fencing of stale leaders.

Replicas are real threads, each with its own PostgreSQL connection through its own
proxy; kills, stops, pauses, cut-offs and skews are applied while they run. The
classroom timings are compressed (LeaseDuration 1.5 s, RenewDeadline 1 s,
RetryPeriod 0.25 s) to keep the suite fast.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection

from occviz.jobs.context import JobContext
from occviz.jobs.models import Event, Job
from occviz.jobs.recorder import EventRecorder
from occviz.jobs.tasks import create_job
from occviz.scenarios.leader_election.actors import LeaderElection, TimedControl, create_objects, objects_of
from occviz.scenarios.leader_election.connection import ReplicaConnection
from occviz.scenarios.leader_election.elector import LeaderElectionConfig
from occviz.scenarios.leader_election.fencing import fenced_increment
from occviz.scenarios.leader_election.proxy import ProxyProcess
from occviz.scenarios.leader_election.summary import (
    describe_failover,
    failover_bound_s,
    read_events,
    sentence,
    summarize,
)
from occviz.store.models import Counter, Lease
from tests.helpers import JobThread, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

FAST = LeaderElectionConfig(lease_duration=1.5, renew_deadline=1.0, retry_period=0.25)
KILL_BOUND_S = failover_bound_s("kill", FAST)  # 1.5 + 2 x 0.55 + 0.5 = 3.1 s


class EventLog:
    """A recorder that keeps events in a list, as dicts shaped like the `jobs_event` view's rows."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self._t0 = time.perf_counter()
        self._lock = threading.Lock()

    def record(
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
    ) -> None:
        with self._lock:
            self.events.append(
                {
                    "seq": len(self.events) + 1,
                    "t_ms": (time.perf_counter() - self._t0) * 1000.0,
                    "actor": actor,
                    "op": op,
                    "attempt": attempt,
                    "kind": kind,
                    "row": row,
                    "version_read": version_read,
                    "version_written": version_written,
                    "value_read": value_read,
                    "value_written": value_written,
                    "duration_ms": duration_ms,
                    "latency_ms": latency_ms,
                    "detail": detail,
                }
            )

    def of(self, *kinds: str, actor: int | None = None) -> list[dict[str, Any]]:
        return [e for e in self.events if e["kind"] in kinds and (actor is None or e["actor"] == actor)]

    def kinds(self, actor: int) -> list[str]:
        return [e["kind"] for e in self.events if e["actor"] == actor]


class Run:
    """One election on fresh objects, run in a background thread so the test can act on it meanwhile."""

    def __init__(self, replicas: int = 3, *, config: LeaderElectionConfig = FAST, seed: int = 7) -> None:
        self.lease, self.counter = create_objects("test-election")
        self.log = EventLog()
        self.stop = threading.Event()
        self.config = config
        self.election = LeaderElection(
            lease_id=self.lease.pk,
            counter_id=self.counter.pk,
            replicas=replicas,
            record=self.log.record,
            stop=self.stop,
            config=config,
            seed=seed,
        )
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self, seconds: float | None = None) -> Run:
        def main() -> None:
            try:
                self.election.run(seconds)
            except BaseException as error:
                self._error = error

        self._thread = threading.Thread(target=main)
        self._thread.start()
        return self

    def finish(self, after_s: float | None = None) -> dict[str, Any]:
        """Stop the election (now, or after `after_s`), wait for it, and summarize it."""
        if after_s is not None:
            time.sleep(after_s)
        self.stop.set()
        assert self._thread is not None
        self._thread.join(timeout=30)
        assert not self._thread.is_alive(), "the election did not end"
        if self._error is not None:
            raise self._error
        return self.summary()

    def run(self, seconds: float) -> dict[str, Any]:
        self.election.run(seconds)
        return self.summary()

    def summary(self) -> dict[str, Any]:
        return summarize(self.log.events, Lease.objects.get(pk=self.lease.pk), self.config)

    def leader(self, timeout: float = 5.0, other_than: tuple[int, ...] = ()) -> int:
        leader = self.election.wait_for_leader(timeout, other_than=other_than)
        assert leader is not None, f"no leader within {timeout} s"
        return leader


def assert_safe(summary: dict[str, Any]) -> None:
    assert summary["max_leaders_at_once"] == 1, summary["invariant"]
    assert summary["fenced_writes_landed"] == 0
    assert summary["invariant_ok"], summary["invariant"]


# -- configuration ---------------------------------------------------------------------------------


def test_config_validation_gives_client_go_errors() -> None:
    assert LeaderElectionConfig().validate() == []
    assert FAST.validate() == []
    assert LeaderElectionConfig(3, 3, 0.5).validate() == ["leaseDuration must be greater than renewDeadline"]
    assert LeaderElectionConfig(3, 4, 0.5).validate() == ["leaseDuration must be greater than renewDeadline"]
    # RenewDeadline must leave room for a jittered retry: 0.6 <= 1.2 x 0.5.
    jitter_error = "renewDeadline must be greater than retryPeriod*JitterFactor"
    assert LeaderElectionConfig(3, 0.6, 0.5).validate() == [jitter_error]
    assert LeaderElectionConfig(3, 2, 0).validate() == ["retryPeriod must be greater than zero"]
    assert LeaderElectionConfig(0, -1, -1).validate() == [
        "leaseDuration must be greater than zero",
        "renewDeadline must be greater than zero",
        "retryPeriod must be greater than zero",
    ]
    with pytest.raises(ValueError, match="leaseDuration must be greater than renewDeadline"):
        LeaderElection(
            lease_id=1, counter_id=1, replicas=3, record=EventLog().record, stop=threading.Event(),
            config=LeaderElectionConfig(10, 10, 2),
        )  # fmt: skip


def test_fenced_increment_rejects_a_token_older_than_the_newest() -> None:
    _, counter = create_objects("test-fencing")
    params = connection.settings_dict
    with ProxyProcess(params["HOST"], int(params["PORT"] or 5432)) as proxies:
        replica = ReplicaConnection(proxies.proxy("test"))
        try:
            assert fenced_increment(replica, counter.pk, 2).landed
            stale = fenced_increment(replica, counter.pk, 1)
            assert not stale.landed
            assert (stale.token, stale.newest_token, stale.version_read) == (1, 2, 2)
            again = fenced_increment(replica, counter.pk, 2)  # the same leader writes again
            assert (again.landed, again.newest_token, again.version_written, again.value) == (True, 2, 3, 2)
        finally:
            replica.close()
    counter.refresh_from_db()
    assert (counter.value, counter.fencing_token, counter.resource_version) == (2, 2, 3)


# -- one leader --------------------------------------------------------------------------------------


def test_exactly_one_leader_emerges_among_three_and_renews() -> None:
    run = Run(3)
    summary = run.run(seconds=2.0)
    log = run.log

    acquired = log.of("acquired")
    assert len(acquired) == 1, acquired
    leader = acquired[0]["actor"]
    assert acquired[0]["value_written"] == 1
    # Released together at the barrier, the others lost the race: a conflict, or a lease already taken.
    for other in set(run.election.replicas) - {leader}:
        assert log.kinds(other)[0] in ("conflict", "backed_off")
        assert not log.of("guarded_write", "renewed", actor=other)
    renewed = log.of("renewed", actor=leader)
    assert len(renewed) >= 4  # about every 0.25 s for 2 s
    writes = log.of("guarded_write", actor=leader)
    assert len(writes) == len(renewed) + 1 or len(writes) == len(renewed) + 2
    assert {w["value_written"] for w in writes} == {1}

    assert summary["replicas"] == 3
    assert summary["transitions"] == 1
    assert [(entry["identity"], entry["ended"]) for entry in summary["leaders"]] == [(f"replica-{leader}", "released")]
    assert summary["renewals"] == len(renewed)
    assert summary["acquire_attempts"] >= 3
    assert summary["failovers"] == []
    assert_safe(summary)
    # ReleaseOnCancel: the leader gave the lease up on the way out.
    lease = Lease.objects.get(pk=run.lease.pk)
    assert (lease.holder_identity, lease.lease_duration_seconds, lease.lease_transitions) == ("", 1, 1)
    counter = Counter.objects.get(pk=run.counter.pk)
    assert (counter.value, counter.fencing_token) == (len(writes), 1)


# -- failovers -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_leader_failover_within_lease_plus_retry_after_a_kill() -> None:
    run = Run(3)
    run.election.schedule(TimedControl("kill", at_s=1.0))
    summary = run.run(seconds=5.0)

    (killed,) = run.log.of("killed")
    assert killed["detail"]["leading"]
    victim = killed["actor"]
    # Killed means gone: no release, nothing more from it.
    assert run.log.kinds(victim)[-1] == "killed"
    assert not run.log.of("released", actor=victim)
    (failover,) = summary["failovers"]
    assert failover["cause"] == "kill"
    assert failover["new_leader"] != f"replica-{victim}"
    assert failover["transition"] == 2
    assert failover["bound_s"] == pytest.approx(KILL_BOUND_S)
    # A follower waits out the whole lease after it last saw the renewal: never sooner.
    assert FAST.lease_duration - FAST.retry_period - 0.1 < failover["new_leader_after_s"] <= failover["bound_s"]
    print(f"\nkill: {describe_failover(failover)}")
    assert summary["transitions"] == 2
    assert_safe(summary)


@pytest.mark.slow
def test_graceful_stop_hands_over_within_one_jittered_retry() -> None:
    run = Run(3)
    run.election.schedule(TimedControl("stop", at_s=1.0))
    summary = run.run(seconds=3.0)

    (stopped,) = run.log.of("stopped")
    assert run.log.of("released", actor=stopped["actor"])
    (failover,) = summary["failovers"]
    assert failover["cause"] == "stop"
    assert failover["bound_s"] == pytest.approx(2.2 * FAST.retry_period + 0.5)
    assert failover["new_leader_after_s"] <= failover["bound_s"]
    # Far sooner than waiting out a lease.
    assert failover["new_leader_after_s"] < FAST.lease_duration
    print(f"\nstop: {describe_failover(failover)}")
    assert_safe(summary)


@pytest.mark.slow
def test_paused_leader_wakes_believing_it_leads_and_its_write_is_fenced() -> None:
    run = Run(3)
    pause_s = KILL_BOUND_S + 0.5  # long enough that another replica has surely taken over
    run.election.schedule(TimedControl("pause", at_s=1.0, seconds=pause_s))
    summary = run.run(seconds=pause_s + 3.0)
    log = run.log

    (paused,) = log.of("paused")
    stale = paused["actor"]
    assert paused["detail"]["leading"]
    (woke,) = log.of("woke", actor=stale)
    assert woke["detail"]["believes_leader"]
    # Meanwhile another replica acquired the lease with a newer token and wrote with it.
    successor = next(e for e in log.of("acquired") if e["actor"] != stale)
    assert successor["t_ms"] < woke["t_ms"]
    assert successor["value_written"] == 2
    # On waking, the stale leader writes first (with its old token): fenced. Then it tries to renew,
    # fails, and steps down: RenewDeadline passed long ago.
    after = [e["kind"] for e in log.events if e["actor"] == stale and e["t_ms"] > woke["t_ms"]]
    assert after[:3] == ["fenced", "renew_failed", "lost"], after
    (fenced,) = log.of("fenced")
    assert (fenced["value_written"], fenced["value_read"]) == (1, 2)
    assert not [e for e in log.of("guarded_write", actor=stale) if e["t_ms"] > woke["t_ms"]]
    print(f"\npause: {sentence(woke)} {sentence(fenced)}")

    (failover,) = summary["failovers"]
    assert failover["cause"] == "pause"
    assert failover["new_leader_after_s"] <= failover["bound_s"]
    print(f"pause: {describe_failover(failover)}")
    assert summary["fenced_writes_rejected"] == 1
    # Its leadership as it lived it overlaps its successor's; by the database's clock it never does.
    leaderships = {entry["identity"]: entry for entry in summary["leaders"]}
    assert leaderships[f"replica-{stale}"]["to_s"] > leaderships[successor_name(successor)]["from_s"]
    assert_safe(summary)


def successor_name(event: dict[str, Any]) -> str:
    return f"replica-{event['actor']}"


@pytest.mark.slow
def test_cut_off_leader_steps_down_within_renew_deadline_and_reconnects() -> None:
    run = Run(3)
    cut_s = 3.0
    run.election.schedule(TimedControl("cut_off", at_s=1.0, seconds=cut_s))
    summary = run.run(seconds=cut_s + 3.0)
    log = run.log

    (cut,) = log.of("cut_off")
    victim = cut["actor"]
    assert cut["detail"]["leading"]
    errors = log.of("db_error", actor=victim)
    assert errors and all(e["t_ms"] >= cut["t_ms"] for e in errors)
    # It steps down once RenewDeadline has passed since its last renewal (before the cut),
    # on its next retry: at most RenewDeadline + RetryPeriod after the cut, plus a margin.
    (lost,) = log.of("lost", actor=victim)
    stepped_down_s = (lost["t_ms"] - cut["t_ms"]) / 1000.0
    assert stepped_down_s <= FAST.renew_deadline + FAST.retry_period + 0.5
    (failover,) = summary["failovers"]
    assert failover["cause"] == "cut-off"
    assert failover["new_leader_after_s"] <= failover["bound_s"]
    print(f"\ncut-off: stepped down {stepped_down_s:.2f} s after the cut; {describe_failover(failover)}")
    # After the cut it connects again, and follows the new leader.
    (reconnected,) = log.of("reconnected", actor=victim)
    assert reconnected["t_ms"] >= cut["t_ms"] + cut_s * 1000.0
    later = [e["kind"] for e in log.events if e["actor"] == victim and e["t_ms"] > reconnected["t_ms"]]
    assert "backed_off" in later and "acquired" not in later
    assert_safe(summary)


@pytest.mark.slow
def test_clock_skew_does_not_break_safety() -> None:
    run = Run(3).start()
    leader = run.leader()
    follower = next(n for n in run.election.replicas if n != leader)
    run.election.skew(leader, 30.0)
    run.election.skew(follower, -30.0)
    time.sleep(0.6)  # a couple of renewals with the skewed clock
    with connection.cursor() as cursor:
        cursor.execute("SELECT renew_time - clock_timestamp() FROM store_lease WHERE id = %s", [run.lease.pk])
        (ahead,) = cursor.fetchone()
    assert ahead > timedelta(seconds=29)  # the leader writes times 30 s in the future; nobody trusts them
    run.election.kill(leader)
    successor = run.leader(timeout=KILL_BOUND_S + 1, other_than=(leader,))
    summary = run.finish(after_s=1.0)

    (failover,) = summary["failovers"]
    assert failover["new_leader_after_s"] <= failover["bound_s"]
    assert failover["new_leader"] == f"replica-{successor}"
    print(f"\nskew: {describe_failover(failover)}")
    assert_safe(summary)


@pytest.mark.slow
def test_added_replica_joins_and_takes_over_after_a_stop() -> None:
    run = Run(1).start()
    assert run.leader() == 1
    assert run.election.add_replica() == 2
    time.sleep(0.6)
    assert run.log.of("backed_off", actor=2)  # it sees replica-1's valid lease
    run.election.stop(1)
    assert run.leader(other_than=(1,)) == 2
    summary = run.finish(after_s=0.3)
    assert summary["replicas"] == 2
    assert summary["transitions"] == 2
    assert [entry["identity"] for entry in summary["leaders"]] == ["replica-1", "replica-2"]
    assert_safe(summary)


# -- controls ----------------------------------------------------------------------------------------


def test_controls_on_an_unknown_or_dead_replica_raise() -> None:
    run = Run(2)
    with pytest.raises(ValueError, match="not running"):
        run.election.kill(1)
    run.start()
    try:
        leader = run.leader()
        with pytest.raises(ValueError, match="no replica 9"):
            run.election.kill(9)
        with pytest.raises(ValueError, match="no replica 0"):
            run.election.pause(0, 1.0)
        with pytest.raises(ValueError, match="positive number of seconds"):
            run.election.cut_off(leader, 0)
        with pytest.raises(ValueError, match="finite"):
            run.election.skew(leader, float("nan"))
        run.election.kill(leader)
        with pytest.raises(ValueError, match=f"Replica {leader} was killed"):
            run.election.stop(leader)
        other = 3 - leader
        run.election.stop(other)
        with pytest.raises(ValueError, match=f"Replica {other} was stopped"):
            run.election.pause(other, 1.0)
    finally:
        run.finish()
    with pytest.raises(ValueError, match="not running"):
        run.election.add_replica()


def test_a_control_applied_now_hits_the_leader_and_a_scheduled_one_that_cannot_apply_is_recorded() -> None:
    run = Run(2)
    run.election.schedule(TimedControl("kill", at_s=0.2, replica=5))
    run.start()
    try:
        leader = run.leader()
        # What a page's button does: no replica named, so the leader.
        assert run.election.apply(TimedControl("pause", at_s=0, seconds=0.3)) == leader
        with pytest.raises(ValueError, match="already paused"):
            run.election.apply(TimedControl("pause", at_s=0, replica=leader, seconds=0.3))
    finally:
        summary = run.finish(after_s=0.5)
    (failed,) = run.log.of("control_failed")
    assert failed["detail"] == {"control": "kill", "error": "There is no replica 5: the replicas are 1 to 2."}
    (paused,) = run.log.of("paused")
    assert paused["actor"] == leader
    assert_safe(summary)


# -- the job's events --------------------------------------------------------------------------------


def test_a_job_runs_the_election_through_its_context_and_summarizes_its_stored_events() -> None:
    job = Job.objects.create(scenario="leader-election")
    recorder = EventRecorder(job.pk)
    context = JobContext(job, recorder)
    recorder.start()
    # As the scenario wires it: the job's objects, its recorder and stop event, its barrier.
    lease, counter = create_objects(f"job-{job.pk}", job=job)
    election = LeaderElection(
        lease_id=lease.pk,
        counter_id=counter.pk,
        replicas=2,
        record=context.recorder.record,
        stop=context.stop,
        config=FAST,
    )
    election.schedule(TimedControl("stop", at_s=0.6))
    election.run(seconds=1.5, run_actors=context.run_actors)
    recorder.stop()
    assert not context.errors

    events = read_events(job.pk)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert objects_of(job.pk) == (lease, counter)
    summary = summarize(events, objects_of(job.pk)[0], FAST)
    assert set(summary) == {
        "replicas",
        "transitions",
        "leaders",
        "failovers",
        "max_leaders_at_once",
        "renewals",
        "acquire_attempts",
        "conflicts",
        "fenced_writes_rejected",
        "fenced_writes_landed",
        "split_brain_s",
        "non_leader_writes_landed",
        "non_leader_writes_fenced",
        "invariant_ok",
        "invariant",
    }
    assert summary["replicas"] == 2 and summary["transitions"] == 2 and summary["renewals"] >= 2
    (failover,) = summary["failovers"]
    assert failover["cause"] == "stop" and failover["within_bound"]
    assert_safe(summary)
    for event in events:
        assert sentence(event)


@pytest.mark.slow
def test_a_jobs_duration_is_its_run_time_after_its_replicas_were_killed_and_others_added() -> None:
    """The initial replicas end early (killed), an added one runs on: the summary's duration is the job's."""
    seconds = 4.0
    params = {"replicas": 2, "lease_duration": 1, "renew_deadline": 0.7, "retry_period": 0.2, "seconds": seconds}
    job = create_job("leader-election", params)
    runner = JobThread(job.pk)
    ran = runner.ran
    runner.start()
    try:
        wait_for(lambda: Event.objects.filter(job=job, kind="acquired").exists(), what="a leader")
        # As the job page's buttons ask: both replicas killed, then one added.
        job.request_control("kill", actor=1)
        job.request_control("kill", actor=2)
        job.request_control("add")
        wait_for(lambda: Event.objects.filter(job=job, kind__in=["killed", "added"]).count() == 3, what="the controls")
    finally:
        runner.join(timeout=30)
    (job,) = ran
    killed = Event.objects.filter(job=job, kind="killed").order_by("-seq").first()
    assert killed is not None and killed.t_ms < 2000, "the initial replicas ended early"
    assert Event.objects.filter(job=job, kind="acquired", actor=3).exists(), "the added replica led"
    assert job.summary is not None and job.summary["replicas"] == 3
    run_time_s = (job.finished_at - job.started_at).total_seconds()
    assert seconds <= job.summary["duration_s"] < seconds + 0.5
    assert job.summary["duration_s"] <= run_time_s


def test_the_wording_of_failovers_and_stale_leaders() -> None:
    failover = {
        "cause": "kill",
        "at_s": 5.0,
        "new_leader_after_s": 4.1,
        "bound_s": 6.9,
        "leader": "replica-1",
        "new_leader": "replica-2",
        "transition": 3,
    }
    assert describe_failover(failover) == (
        "replica-2 acquired the lease (transition 3), 4.1 s after replica-1 was killed (bound 6.9 s)."
    )
    woke = {"actor": 1, "kind": "woke", "detail": {"seconds": 6.0, "believes_leader": True, "token": 2}}
    fenced = {"actor": 1, "kind": "fenced", "value_written": 2, "value_read": 3, "detail": None}
    assert sentence(woke) == "replica-1 woke from a 6.0 s pause believing it leads (token 2)."
    assert sentence(fenced) == "replica-1's write with token 2 was fenced: the counter has seen token 3."
    # Stored events give their detail back as JSON text; a follower's wake-up reads otherwise.
    woke_as_follower = {"actor": 3, "kind": "woke", "detail": '{"seconds": 2.5, "believes_leader": false}'}
    assert sentence(woke_as_follower) == "replica-3 woke from a 2.5 s pause as a follower."
    skewed = {"actor": 2, "kind": "skewed", "detail": {"seconds": -30.0, "behind_s": 30.0}}
    # Worded as the browser words it: a whole number of seconds without ".0".
    assert sentence(skewed, who="replica two") == "replica two's clock now runs 30 s behind."
