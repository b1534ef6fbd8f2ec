"""Leader-election replicas as processes of their own: SIGKILL and SIGSTOP for real, seen by the job.

Each replica is a child process (occviz/scenarios/leader_election/replica.py) with its own
PostgreSQL connection through its own proxy. A kill is SIGKILL (the test checks the process
is gone), a pause SIGSTOP (the test reads its state, T, in /proc while it lasts) and SIGCONT
after it; the events and the summary's failovers say which process and which signal.
Timings as in test_leader_election.py: LeaseDuration 1.5 s, RenewDeadline 1 s, RetryPeriod 0.25 s.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from occviz.jobs.models import Event
from occviz.jobs.registry import ParamsError
from occviz.jobs.runner import run_job
from occviz.jobs.tasks import create_job
from occviz.scenarios import SCENARIOS
from occviz.scenarios.leader_election.actors import LeaderElection
from occviz.scenarios.leader_election.replica import ReplicaProcess, process_state
from occviz.scenarios.leader_election.summary import describe_failover, sentence
from occviz.store.models import Lease
from tests.test_job_heartbeat import wait_for
from tests.test_leader_election import FAST, KILL_BOUND_S, Run, assert_safe

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parent.parent


class ProcessRun(Run):
    """An election whose replicas are processes of their own."""

    def __init__(self, replicas: int = 3, *, seed: int = 7) -> None:
        super().__init__(replicas, seed=seed)
        self.election = LeaderElection(
            lease_id=self.lease.pk,
            counter_id=self.counter.pk,
            replicas=replicas,
            record=self.log.record,
            stop=self.stop,
            config=FAST,
            seed=seed,
            processes=True,
        )

    def replica(self, number: int) -> ReplicaProcess:
        replica = self.election.elector(number)
        assert isinstance(replica, ReplicaProcess)
        return replica

    def pid(self, number: int) -> int:
        pid = self.replica(number).pid
        assert pid is not None
        return pid


def gone(pid: int) -> bool:
    """The process has exited and been reaped (or is a zombie nobody of ours will reap)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return process_state(pid) in ("", "Z")


def cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def test_each_replica_is_a_process_of_its_own_and_one_leads() -> None:
    run = ProcessRun(3).start()
    try:
        leader = run.leader()
        pids = {n: run.pid(n) for n in run.election.replicas}
        assert len(set(pids.values())) == 3 and os.getpid() not in pids.values()
        for pid in pids.values():
            assert "occviz.scenarios.leader_election.replica" in cmdline(pid)
            assert process_state(pid) in ("S", "R")
        time.sleep(0.6)
    finally:
        summary = run.finish()
    # Ended with the election: every child exited, and the leader released on its way out.
    assert all(gone(pid) for pid in pids.values())
    assert all(run.replica(n).failure == "" for n in pids)
    acquired = run.log.of("acquired")
    assert [e["actor"] for e in acquired] == [leader]
    assert len(run.log.of("renewed", actor=leader)) >= 2
    assert run.log.of("released", actor=leader)
    lease = Lease.objects.get(pk=run.lease.pk)
    assert (lease.holder_identity, lease.lease_transitions) == ("", 1)
    assert_safe(summary)


# -- kill: SIGKILL ---------------------------------------------------------------------------------------


def test_kill_sends_sigkill_to_the_leaders_process_and_the_failover_stays_within_its_bound() -> None:
    run = ProcessRun(3).start()
    try:
        leader = run.leader()
        pid = run.pid(leader)
        time.sleep(0.3)  # a renewal or two
        run.election.kill(leader)
        # The process is gone: SIGKILL, reaped by its follower thread. Nothing it held was released.
        wait_for(lambda: gone(pid), what=f"process {pid} gone", timeout=5)
        lease = Lease.objects.get(pk=run.lease.pk)
        if lease.lease_transitions == 1:  # nobody has waited out its lease yet
            assert lease.holder_identity == f"replica-{leader}"
        successor = run.leader(timeout=KILL_BOUND_S + 1, other_than=(leader,))
        assert run.pid(successor) != pid
    finally:
        summary = run.finish(after_s=0.3)

    (killed,) = run.log.of("killed")
    assert killed["actor"] == leader
    assert killed["detail"] == {"leading": True, "pid": pid, "signal": "SIGKILL"}
    assert run.log.kinds(leader)[-1] == "killed"  # nothing from it after: it is dead
    assert not run.log.of("released", actor=leader)
    (failover,) = summary["failovers"]
    assert (failover["cause"], failover["pid"], failover["signal"]) == ("kill", pid, "SIGKILL")
    assert failover["new_leader"] == f"replica-{successor}" and failover["transition"] == 2
    assert FAST.lease_duration - FAST.retry_period - 0.1 < failover["new_leader_after_s"] <= failover["bound_s"]
    assert failover["bound_s"] == pytest.approx(KILL_BOUND_S)
    words = describe_failover(failover)
    assert f"after replica-{leader} (process {pid}) was killed with SIGKILL" in words
    assert sentence(killed) == f"replica-{leader} (process {pid}) was killed with SIGKILL."
    print(f"\nkill: {words}")
    assert_safe(summary)


# -- pause: SIGSTOP, then SIGCONT -----------------------------------------------------------------------------


def test_pause_stops_the_process_and_on_waking_its_write_is_fenced() -> None:
    run = ProcessRun(3).start()
    pause_s = KILL_BOUND_S + 0.5  # long enough that another replica has surely taken over
    try:
        leader = run.leader()
        pid = run.pid(leader)
        time.sleep(0.3)
        run.election.pause(leader, pause_s)
        assert process_state(pid) == "T"  # stopped by SIGSTOP, for real
        assert run.replica(leader).paused
        with pytest.raises(ValueError, match="already paused"):
            run.election.pause(leader, 1.0)
        successor = run.leader(timeout=KILL_BOUND_S + 0.3, other_than=(leader,))
        assert process_state(pid) == "T"  # still stopped while another leads
        assert not run.log.of("renewed", "guarded_write", "fenced", "lost", "woke", actor=leader)[-1:] or all(
            e["t_ms"] < run.log.of("paused")[0]["t_ms"]
            for e in run.log.of("renewed", "guarded_write", "fenced", "lost", "woke", actor=leader)
        )
        wait_for(lambda: run.log.of("lost", actor=leader), what="the woken leader to step down", timeout=pause_s + 3)
        assert process_state(pid) in ("S", "R")  # SIGCONT: it runs again
    finally:
        summary = run.finish(after_s=0.2)
    log = run.log

    (paused,) = log.of("paused")
    assert paused["actor"] == leader
    assert paused["detail"] == {"seconds": pause_s, "leading": True, "pid": pid, "signal": "SIGSTOP"}
    (woke,) = log.of("woke", actor=leader)
    assert woke["detail"] == {"seconds": pause_s, "believes_leader": True, "token": 1, "pid": pid}
    assert (woke["t_ms"] - paused["t_ms"]) / 1000.0 == pytest.approx(pause_s, abs=0.2)
    acquired = next(e for e in log.of("acquired") if e["actor"] == successor)
    assert paused["t_ms"] < acquired["t_ms"] < woke["t_ms"] and acquired["value_written"] == 2
    # Nothing of it ran while it was stopped; on waking it wrote first, with its old token: fenced.
    during = [e for e in log.events if e["actor"] == leader and paused["t_ms"] < e["t_ms"] < woke["t_ms"]]
    assert during == []
    after = [e["kind"] for e in log.events if e["actor"] == leader and e["t_ms"] > woke["t_ms"]]
    assert after[:3] == ["fenced", "renew_failed", "lost"], after
    (fenced,) = log.of("fenced")
    assert (fenced["value_written"], fenced["value_read"]) == (1, 2)
    assert sentence(paused).startswith(f"replica-{leader} (process {pid}) was stopped with SIGSTOP for")
    (failover,) = summary["failovers"]
    assert (failover["cause"], failover["pid"], failover["signal"]) == ("pause", pid, "SIGSTOP")
    assert failover["new_leader_after_s"] <= failover["bound_s"]
    print(f"\npause: {sentence(paused)} {sentence(woke)} {sentence(fenced)}")
    assert summary["fenced_writes_rejected"] == 1
    assert_safe(summary)
