"""Two hosts: a worker in a network namespace of its own runs jobs on a PostgreSQL it reaches only over
TCP across a veth pair, as a worker on another machine would (tests/hosts.py makes the second host).

Skipped, saying why, where network namespaces cannot be made (not root, no `ip`, EPERM); failed
instead with OCCVIZ_REQUIRE_NETNS=1, as CI sets it. The database is a PostgreSQL of this module's
own, listening on the veth's address on this side: jobs are launched by this process through the
ORM on it, as the launch form would, and run by the workers.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from occviz.jobs import tasks
from occviz.jobs.models import Job
from occviz.jobs.tasks import launch
from tests.hosts import Network, Workers, django_on, migrate, namespace_of, network_or_skip, postgres_on

# A namespace, a PostgreSQL started and migrated, workers started: 9 to 14 s for the first test on this 2-core
# machine, some 22 s with the sharded one (run on the shards branch).
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def network() -> Iterator[Network]:
    with network_or_skip() as net:
        yield net


@pytest.fixture(scope="module")
def remote_database(network: Network) -> Iterator[str]:
    """The DATABASE_URL, over TCP at the veth's address on this side, of a migrated PostgreSQL of the module's own."""
    with postgres_on(network.host_ip, network.subnet) as url:
        migrate(url)
        yield url


@pytest.fixture
def on_remote(remote_database: str, django_db_blocker: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """This process's ORM on the remote database for the test; the suite's test database is back afterwards."""
    monkeypatch.setattr(tasks, "_max_connections", None)  # admission asks this server (and forgets it afterwards)
    with django_db_blocker.unblock(), django_on(remote_database):
        yield remote_database


@pytest.fixture
def workers(on_remote: str, network: Network, tmp_path: Path) -> Iterator[Workers]:
    # A shard's task waits for the other host's worker, however slow its start (not the coordinator's 2 s).
    with Workers(on_remote, network, tmp_path, env={"OCCVIZ_SHARD_CLAIM_S": "60"}) as started:
        yield started


def wait_for[T](predicate: Callable[[], T], workers: Workers, timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; the workers said:\n{workers.output()}")
        time.sleep(0.05)


def connections_from(address: str) -> int:
    """The sessions occviz workers hold on the database from `address` (pg_stat_activity's client_addr)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'occviz worker' AND host(client_addr) = %s",
            [address],
        )
        return int(cursor.fetchone()[0])


def finished(job: Job) -> Job | None:
    return Job.objects.filter(pk=job.pk, status__in=Job.FINISHED).first()


def assert_counter_held(job: Job, writers: int, increments: int) -> None:
    assert (job.status, job.error) == (Job.Status.SUCCEEDED, "")
    assert job.invariant_ok is True and job.summary is not None and job.summary["invariant_ok"] is True
    assert job.summary["committed"] + job.summary["gave_up"] == writers * increments
    seqs = list(job.events.order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, job.last_seq + 1)), "every event once, gapless"


def test_a_worker_on_another_host_runs_a_job_over_tcp(workers: Workers, network: Network) -> None:
    b = workers.start("host-b")
    assert namespace_of(b.pid) == network.inode() != namespace_of(os.getpid()), "host-b is in the namespace"
    writers, increments = 4, 100
    job = launch("counter", {"strategy": "occ", "writers": writers, "increments": increments, "think_ms": 5})
    # While it runs, its actors' sessions come from the namespace's side of the veth: they crossed it over TCP.
    running = wait_for(
        lambda: Job.objects.filter(pk=job.pk, status=Job.Status.RUNNING).exists() and connections_from(network.peer_ip),
        workers,
        timeout=60,
        what="host-b to run the job",
    )
    peak = running
    while not finished(job):
        peak = max(peak, connections_from(network.peer_ip))
        time.sleep(0.05)
    assert peak >= writers + 1, f"the writers' sessions and the worker's from {network.peer_ip}; at most {peak} seen"
    job = wait_for(lambda: finished(job), workers, timeout=5, what="the job to end")
    assert job.runner == f"worker:host-b:{b.pid}", "the job records the host that ran it"
    assert_counter_held(job, writers, increments)
    assert b.poll() is None, "the worker is still there for the next job"


def test_a_sharded_job_runs_on_both_hosts(workers: Workers, network: Network) -> None:
    a, b = workers.start("host-a"), workers.start("host-b")
    writers, increments = 4, 50
    job = launch("counter", {"strategy": "occ", "writers": writers, "increments": increments, "processes": 2})
    job = wait_for(lambda: finished(job), workers, timeout=120, what="the sharded job to end")
    assert_counter_held(job, writers, increments)
    assert job.summary is not None and job.summary["processes"] == 2
    shards = job.summary["shards"]
    runners = sorted(shard["runner"] for shard in shards)
    assert runners == [f"worker:host-a:{a.pid}", f"worker:host-b:{b.pid}"], "one shard on each host"
    assert sorted(shard["pid"] for shard in shards) == sorted([a.pid, b.pid])
    assert sorted(shard["index"] for shard in shards) == [0, 1]
    actors = sorted(n for shard in shards for n in range(shard["actors"][0], shard["actors"][1] + 1))  # [first, last]
    assert actors == list(range(1, writers + 1)), "the writers split between the shards, each once"
