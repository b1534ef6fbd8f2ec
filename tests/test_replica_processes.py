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
from django.test import Client

from occviz.jobs.models import Event, Job
from occviz.jobs.registry import ParamsError
from occviz.jobs.runner import run_job
from occviz.jobs.tasks import create_job
from occviz.scenarios import SCENARIOS
from occviz.scenarios.leader_election.actors import LeaderElection
from occviz.scenarios.leader_election.replica import ReplicaProcess, process_state
from occviz.scenarios.leader_election.summary import describe_failover, sentence
from occviz.store.models import Lease
from tests.helpers import JobThread, wait_for
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
        for number, pid in pids.items():
            assert "occviz.scenarios.leader_election.replica" in cmdline(pid)
            assert Path(f"/proc/{pid}/comm").read_text().strip() == f"replica-{number}"  # as ps shows it
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


def test_a_replica_killed_from_outside_the_job_is_recorded_as_killed_and_failed_over() -> None:
    """`kill -9 <pid>` from a shell: the job sees the pipe end with no word from it, a crash."""
    run = ProcessRun(3).start()
    try:
        leader = run.leader()
        pid = run.pid(leader)
        time.sleep(0.3)
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: run.log.of("killed"), what="the job to see its replica die", timeout=3)
        successor = run.leader(timeout=KILL_BOUND_S + 1, other_than=(leader,))
        with pytest.raises(ValueError, match=f"Replica {leader} was killed"):
            run.election.pause(leader, 1.0)
    finally:
        summary = run.finish(after_s=0.2)
    (killed,) = run.log.of("killed")
    assert killed["detail"] == {"leading": True, "pid": pid, "outside": True}
    assert sentence(killed) == f"replica-{leader}'s process {pid} died: killed from outside the job."
    (failover,) = summary["failovers"]
    assert (failover["cause"], failover["pid"], failover["new_leader"]) == ("kill", pid, f"replica-{successor}")
    assert failover["new_leader_after_s"] <= failover["bound_s"]
    assert_safe(summary)


# -- pause: SIGSTOP, then SIGCONT -----------------------------------------------------------------------------


@pytest.mark.slow
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
        (paused_at,) = [e["t_ms"] for e in run.log.of("paused")]
        assert [e for e in run.log.events if e["actor"] == leader and e["t_ms"] > paused_at] == []  # frozen
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


def test_a_replica_paused_when_the_election_ends_continues_only_to_end() -> None:
    run = ProcessRun(2).start()
    try:
        leader = run.leader()
        pid = run.pid(leader)
        time.sleep(0.3)
        run.election.pause(leader, 60.0)
        assert process_state(pid) == "T"
        time.sleep(0.3)  # shorter than its lease: it still holds it
    finally:
        started = time.monotonic()
        summary = run.finish()
    assert time.monotonic() - started < 5, "the end waited for the pause"
    assert gone(pid)
    # SIGCONT at the end: it takes the end before another step, and only releases (ReleaseOnCancel).
    (paused,) = run.log.of("paused")
    after = [e["kind"] for e in run.log.events if e["actor"] == leader and e["t_ms"] > paused["t_ms"]]
    assert after == ["released"], after
    assert not run.log.of("woke")
    assert_safe(summary)


# -- the other controls, on processes -------------------------------------------------------------------------


def test_skew_cut_off_add_and_stop_reach_a_replicas_process() -> None:
    run = ProcessRun(2).start()
    try:
        leader = run.leader()
        other = 3 - leader
        run.election.skew(leader, 30.0)
        run.election.cut_off(other, 0.6)
        time.sleep(0.6)  # a couple of renewals with the skewed clock, and the cut-off's errors
        with connection.cursor() as cursor:
            cursor.execute("SELECT renew_time - clock_timestamp() FROM store_lease WHERE id = %s", [run.lease.pk])
            (ahead,) = cursor.fetchone()
        assert ahead > timedelta(seconds=29)  # written by the leader's process with its skewed clock
        assert run.election.add_replica() == 3
        added = wait_for(lambda: run.replica(3).pid, what="the added replica's process", timeout=3)
        assert added not in (run.pid(1), run.pid(2))
        wait_for(lambda: run.log.of("backed_off", actor=3), what="the added replica to back off", timeout=3)
        wait_for(lambda: run.log.of("reconnected", actor=other), what="the cut-off replica to reconnect", timeout=3)
        run.election.stop(leader)  # a message: it releases, and another takes over within a retry
        successor = run.leader(timeout=2, other_than=(leader,))
        wait_for(lambda: gone(run.pid(leader)), what="the stopped replica's process to exit", timeout=3)
    finally:
        summary = run.finish(after_s=0.3)
    assert run.log.of("db_error", actor=other)
    (skewed,) = run.log.of("skewed")
    assert skewed["detail"]["ahead_s"] == 30 and skewed["detail"]["pid"] == run.pid(leader)
    (cut,) = run.log.of("cut_off")
    assert (cut["actor"], cut["detail"]["pid"]) == (other, run.pid(other))
    (stopped,) = run.log.of("stopped")
    assert stopped["detail"] == {"leading": True, "pid": run.pid(leader)}
    assert run.log.of("released", actor=leader)
    (failover,) = summary["failovers"]
    assert failover["cause"] == "stop" and failover["new_leader"] == f"replica-{successor}"
    assert failover["new_leader_after_s"] <= failover["bound_s"]
    assert (failover["pid"], failover["signal"]) == (run.pid(leader), None)  # a message, no signal
    assert summary["replicas"] == 3
    assert_safe(summary)


# -- a job's replicas, on its page and in its summary -----------------------------------------------------


@pytest.mark.slow
def test_a_jobs_replicas_are_processes_by_default_and_its_page_and_summary_name_them(
    signed_in: Client, alice: Any
) -> None:
    params = {"replicas": 3, "lease_duration": 1, "renew_deadline": 0.6, "retry_period": 0.2, "seconds": 3.5}
    job = create_job("leader-election", {**params, "kill_leader_at": 1.5}, alice)
    assert job.params["replicas_as"] == "processes"
    spec = SCENARIOS["leader-election"]
    runner = JobThread(job.pk)
    ran = runner.ran
    runner.start()
    try:
        state = wait_for(
            lambda: (
                (s := spec.read_state(job.pk, job.params).data)["replicas"]
                and any(r["leading"] for r in s["replicas"])
                and s
            ),
            what="a leader in the live state",
            timeout=30,
        )
        pids = [replica["pid"] for replica in state["replicas"]]
        assert len(set(pids)) == 3 and all(isinstance(pid, int) and pid != os.getpid() for pid in pids)
        # The page shows the stored snapshot, a batch (a tenth of a second) behind the state read here.
        wait_for(
            lambda: all(f"process {pid}" in signed_in.get(f"/jobs/{job.pk}/").content.decode() for pid in pids),
            what="the page to say which process each replica is",
            timeout=10,
        )
    finally:
        runner.join(timeout=30)
    (job,) = ran
    assert job.summary is not None and job.summary["invariant_ok"], job.summary
    (killed,) = Event.objects.filter(job=job, kind="killed")
    pid = killed.detail["pid"]
    assert pid in pids and killed.detail["signal"] == "SIGKILL" and killed.detail["leading"]
    (failover,) = job.summary["failovers"]
    assert (failover["pid"], failover["signal"], failover["within_bound"]) == (pid, "SIGKILL", True)
    name = f"replica-{killed.actor}"
    assert f"after {name} (process {pid}) was killed with SIGKILL" in job.summary["failovers_in_words"][0]
    event = {"kind": "killed", "actor": killed.actor, "detail": killed.detail}
    assert spec.describe(event) == f"{name} (process {pid}) was killed with SIGKILL."
    assert spec.caption(event).startswith(f"{name}'s process {pid} was killed with SIGKILL (a crashed pod, kill -9)")
    # The next acquisition says whose death it followed, process and all (the narrator, as it happens).
    acquired = Event.objects.filter(job=job, kind="acquired", seq__gt=killed.seq).first()
    assert acquired is not None and acquired.detail["after"] == f"{name} (process {pid}) was killed"
    assert all(gone(p) for p in pids)


def test_replicas_as_threads_stays_available() -> None:
    params = {"replicas": 2, "lease_duration": 1, "renew_deadline": 0.6, "retry_period": 0.2, "seconds": 2.5}
    job = run_job(create_job("leader-election", {**params, "kill_leader_at": 0.5, "replicas_as": "threads"}).pk)
    assert job.summary is not None and job.summary["invariant_ok"], job.summary
    (killed,) = Event.objects.filter(job=job, kind="killed")
    assert "pid" not in killed.detail and "signal" not in killed.detail
    (failover,) = job.summary["failovers"]
    assert (failover["pid"], failover["signal"]) == (None, None)
    assert "replicas as threads" in SCENARIOS["leader-election"].setup(job.params)


def test_a_bad_replicas_as_is_refused_and_makes_no_job(run_manage: Any) -> None:
    with pytest.raises(ParamsError) as refused:
        create_job("leader-election", {"replicas_as": "fibers"})
    assert "replicas_as" in refused.value.errors
    assert "fibers is not one of the available choices" in refused.value.errors["replicas_as"][0]
    result = run_manage("runjob", "leader-election", "--replicas-as", "fibers", "--json")
    assert result.returncode == 2 and "invalid choice: 'fibers'" in result.stderr
    assert not Job.objects.exists()


# -- never outliving the job's process -----------------------------------------------------------------------


def descendants(pid: int) -> dict[int, str]:
    """Every live process below `pid`: its pid and its name (a replica names itself replica-N)."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat[stat.rindex(")") + 2 :].split()[1])
            names[int(entry.name)] = stat[stat.index("(") + 1 : stat.rindex(")")]
    found: dict[int, str] = {}
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for child, its_parent in parents.items():
            if its_parent == parent and child not in found:
                found[child] = names[child]
                frontier.append(child)
    return found


def test_replica_processes_die_with_the_jobs_process(database_url: str) -> None:
    """SIGKILL of runjob: its fork server and replicas die too, the one stopped by SIGSTOP as well.

    A running replica would also end on reading the end of its commands; a stopped one reads
    nothing: the kernel's SIGKILL on its parent's death (PR_SET_PDEATHSIG) is what ends it.
    """
    flags = ["--replicas", "3", "--lease-duration", "1", "--renew-deadline", "0.6", "--retry-period", "0.2"]
    runjob = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "runjob", "leader-election", *flags, "--seconds", "60"]
        + ["--pause-leader-at", "0.5", "--pause-for", "50"],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": database_url},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def paused_replicas() -> dict[int, str] | None:
            found = descendants(runjob.pid)
            replicas = [pid for pid, name in found.items() if name.startswith("replica-")]
            stopped = [pid for pid in replicas if process_state(pid) == "T"]
            return found if len(replicas) == 3 and len(stopped) == 1 else None

        below = wait_for(paused_replicas, what="runjob's three replicas, its leader stopped", timeout=30)
        runjob.kill()  # SIGKILL: nothing of runjob ends them but the kernel
        runjob.wait()
        wait_for(lambda: all(gone(pid) for pid in below), what="its replicas and fork server to die", timeout=5)
    finally:
        if runjob.poll() is None:
            runjob.kill()
            runjob.wait()
