"""Jobs over several processes launched as the page launches them, run by real `manage.py worker`s.

A shard's task waits for a worker OCCVIZ_SHARD_CLAIM_S; then, or once the worker that claimed
it died before it arrived at the barrier, the coordinator starts it as a `runshard` process of
its own: a job of N processes runs on fewer than N workers.
"""

from __future__ import annotations

import signal
import time
from typing import Any

import psycopg
import pytest
from django_tasks_db.models import DBTaskResult

from occviz.jobs.models import Job, JobShard
from occviz.jobs.tasks import launch
from tests.helpers import output, wait_for
from tests.test_shards import (
    HOST,
    SHARD_TIMEOUT_S,
    WAIT_FOR_WORKERS,
    WORKER,
    alive,
    assert_gapless_and_once,
    start_manage,
)
from tests.test_shards_scenarios import shard_of

__all__ = ["start_manage"]  # the fixture, used here by name

pytestmark = pytest.mark.django_db(transaction=True)

COUNTER = {
    "strategy": "occ", "writers": 4, "increments": 30, "rows": 1, "think_ms": 1, "retry": "immediate",
    "max_attempts": 1000, "processes": 2,
}  # fmt: skip


def ended(job: Job, timeout: float = 90) -> Job:
    return wait_for(lambda: Job.objects.filter(pk=job.pk, status__in=Job.FINISHED).first(), timeout, "the job to end")


def assert_counted(job: Job) -> dict[str, Any]:
    """The counter job succeeded, every increment counted once, every event stored once."""
    assert job.status == Job.Status.SUCCEEDED, job.error
    summary = job.summary
    assert summary is not None and summary["invariant_ok"] is True, summary
    assert summary["committed"] == summary["final_value"] == 4 * 30
    assert summary["processes"] == 2 and [shard["actors"] for shard in summary["shards"]] == [[1, 2], [3, 4]]
    assert_gapless_and_once(job)
    return summary


def test_a_job_of_two_processes_on_one_worker_runs_its_second_shard_in_a_process_of_the_coordinators(  # type: ignore[no-untyped-def]
    start_manage,
) -> None:
    worker = start_manage(*WORKER, "--worker-id", "w1")
    job = launch("counter", COUNTER)
    summary = assert_counted(ended(job))
    coordinator, other = summary["shards"]
    assert coordinator["runner"] == f"worker:{HOST}:{worker.pid}"
    assert other["runner"] == f"runshard:{HOST}:{other['pid']}" and other["pid"] != worker.pid
    assert (
        f"job {job.pk} shard 1: no worker claimed it within 2 s: starting it in a process of this one"
        in (output(worker)[1])
    )
    assert not alive(other["pid"]), "the coordinator's child ended with the job"
    # The worker then takes the shard's task and finds its row taken: it runs nothing.
    task = wait_for(
        lambda: DBTaskResult.objects.filter(task_path__endswith="run_shard_task").successful().first(),
        10,
        "the shard's task to end",
    )
    assert (task.args_kwargs["args"], task.return_value, task.worker_ids) == ([job.pk, 1], "not run", ["w1"])
    assert JobShard.objects.get(job=job, index=1).runner == other["runner"]


def test_a_worker_killed_after_claiming_a_shard_before_it_arrived_has_the_coordinator_run_it(  # type: ignore[no-untyped-def]
    start_manage, database_url: str
) -> None:
    """w2 claims shard 1 and is held, before its arrival, by the test's lock on the counters; then it is killed."""
    env = {**WAIT_FOR_WORKERS, "OCCVIZ_SHARD_ARRIVAL_S": "90"}
    w1 = start_manage(*WORKER, "--worker-id", "w1", env=env)
    job = launch("counter", COUNTER)
    wait_for(
        lambda: JobShard.objects.filter(job=job, index=0).exclude(arrived_at=None).exists(),
        60,
        "the coordinator to arrive at the barrier",
    )
    with psycopg.connect(database_url) as lock:
        # Rebuilding its writers, a shard reads the job's counters: it waits here, claimed, not arrived.
        lock.execute("LOCK TABLE store_counter IN ACCESS EXCLUSIVE MODE")
        w2 = start_manage(*WORKER, "--worker-id", "w2", env=env)

        def held() -> bool:
            [(waiting,)] = lock.execute(
                "SELECT count(*) FROM pg_locks WHERE relation = 'store_counter'::regclass AND NOT granted"
            ).fetchall()
            shard = JobShard.objects.get(job=job, index=1)
            return (shard.status, shard.pid, shard.arrived_at) == ("running", w2.pid, None) and waiting >= 1

        wait_for(held, 60, "w2 to claim shard 1 and wait for the counters")
        # Alive, a claimed shard renews its heartbeat while it rebuilds its actors: it stays w2's.
        time.sleep(SHARD_TIMEOUT_S + 0.5)
        shard = JobShard.objects.get(job=job, index=1)
        assert (shard.runner, shard.status) == (f"worker:{HOST}:{w2.pid}", "running")
        w2.send_signal(signal.SIGKILL)
        w2.wait()
        killed = time.monotonic()
        lock.rollback()
    shard = wait_for(
        lambda: JobShard.objects.filter(job=job, index=1).exclude(arrived_at=None).first(), 30, "shard 1 to arrive"
    )
    arrived_s = time.monotonic() - killed
    print(f"\n[fault] worker killed holding an unarrived shard: the shard arrived {arrived_s:.2f} s after, run anew")
    assert arrived_s < SHARD_TIMEOUT_S + 10, "its heartbeat's timeout, then a process's start"
    assert shard.runner == f"runshard:{HOST}:{shard.pid}" and shard.pid not in (w1.pid, w2.pid)
    summary = assert_counted(ended(job))
    assert [s["runner"] for s in summary["shards"]] == [f"worker:{HOST}:{w1.pid}", shard.runner]
    assert JobShard.objects.get(job=job, index=1).status == "done"
    assert (
        f"job {job.pk} shard 1: shard 1 of 2 (worker:{HOST}:{w2.pid}) stopped renewing its heartbeat before it "
        "arrived (its process died): starting it in a process of this one"
    ) in output(w1)[1]


WORKERS_JOBS = {
    "quota": {
        "pods": 40, "hard": 10, "request": 1, "workers": 4, "think_ms": 3, "create_failure_rate": 0.25,
        "resync_seconds": 1, "seed": 7,
    },
    "controllers": {"strategy": "occ", "controllers": 4, "seconds": 2, "rate_per_s": 40, "think_ms": 5, "seed": 3},
}  # fmt: skip


@pytest.mark.parametrize("scenario", WORKERS_JOBS)
def test_a_quota_or_controller_race_of_two_processes_runs_on_two_workers(start_manage, scenario: str) -> None:  # type: ignore[no-untyped-def]
    workers = [start_manage(*WORKER, "--worker-id", f"w{n}", env=WAIT_FOR_WORKERS) for n in (1, 2)]
    job = ended(launch(scenario, {**WORKERS_JOBS[scenario], "processes": 2}))
    assert job.status == Job.Status.SUCCEEDED, job.error
    summary = job.summary
    assert summary is not None and summary["invariant_ok"] is True, summary["invariant"]
    assert summary["processes"] == 2
    assert sorted(shard["runner"] for shard in summary["shards"]) == sorted(
        f"worker:{HOST}:{worker.pid}" for worker in workers
    ), "each worker ran one shard"
    events = assert_gapless_and_once(job)
    if scenario == "quota":
        assert summary["admitted"] + summary["denied"] == 40 and summary["over_admitted"] == 0
        assert summary["most_admitted_usage"] <= 10 and summary["used_final"] == summary["actual_final"]
        decided = sorted(e.op for e in events if e.kind in ("admitted", "denied", "retries_exhausted"))
        assert decided == list(range(1, 41)), "every pod decided once, across the two workers"
        deciders = {shard_of(summary, e.actor) for e in events if e.kind in ("admitted", "denied")}
        assert deciders == {0, 1}, "workers of both processes admitted pods"
    else:
        assert summary["lost_fields"] == 0 and summary["object_version"] - 1 == summary["writes"]
        assert sorted({e.actor for e in events if e.kind == "committed"}) == [1, 2, 3, 4]
