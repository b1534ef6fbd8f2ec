"""The official Python client's leader election joins a running leader-election job through the live API.

`kubernetes.leaderelection` with its `LeaseLock` runs in a child process against the
live server (plain HTTP with a bearer token: this client sends it over http), on the
job's own Lease. The job's only replica is killed; the client waits the lease out and
wins, renews, then is killed itself; a replica added meanwhile takes over once the
client's lease expires. The client's writes are the job's events on its own lane.
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import pytest

from occviz.jobs.models import Job
from occviz.jobs.tasks import launch
from occviz.store.models import Lease
from tests.helpers import events

pytestmark = pytest.mark.slow

CLIENT = """
import logging, sys, time
logging.basicConfig(level=logging.INFO)
from kubernetes import client
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

host, token, namespace, name = sys.argv[1:5]
config = client.Configuration(host=host)
config.api_key = {"authorization": token}
config.api_key_prefix = {"authorization": "Bearer"}
client.Configuration.set_default(config)

def lead():
    print("leading", flush=True)
    time.sleep(3600)

election = electionconfig.Config(
    LeaseLock(name, namespace, "alice-laptop"), lease_duration=4, renew_deadline=3, retry_period=2,
    onstarted_leading=lead, onstopped_leading=lambda: print("stopped", flush=True),
)
leaderelection.LeaderElection(election).run()
"""


def _wait(condition: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what} within {timeout} s")


def test_the_official_clients_leader_election_wins_renews_and_loses_a_jobs_lease(
    api_url: str, token: str, student: Any
) -> None:
    params = {"replicas": 1, "lease_duration": 2, "renew_deadline": 1.5, "retry_period": 0.3, "seconds": 30}
    job = launch("leader-election", {**params, "kill_leader_at": 1}, student)
    lease = _wait(
        lambda: Lease.objects.filter(job=job).exclude(holder_identity="").first(), 30, "no replica took the lease"
    )
    client = subprocess.Popen(
        [sys.executable, "-c", CLIENT, api_url, token, lease.namespace, lease.name],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        # It leads once the killed replica's lease has expired by its own observation.
        try:
            _wait(
                lambda: client.poll() is not None or Lease.objects.filter(pk=lease.pk, holder_identity="alice-laptop"),
                30,
                "the client did not lead",
            )
        except AssertionError:
            client.kill()
            raise AssertionError(f"the client did not lead: {client.communicate()[0][-3000:]}") from None
        assert client.poll() is None, client.communicate()
        time.sleep(7.0)  # it renews every retry period (2 s: the client wants more than one)
    finally:
        client.kill()  # killed: no release, its lease runs out
        client.communicate()  # reaps it and closes its pipe
    Job(pk=job.pk).request_control("add", user=student)  # a replica joins, and takes over once that lease expires
    job = _wait(lambda: Job.objects.filter(pk=job.pk, status__in=Job.FINISHED).first(), 60, "the job did not end")

    assert job.status == Job.Status.SUCCEEDED, job.error
    summary = job.summary
    assert summary["invariant_ok"], summary["invariant"]
    every = events(job)
    lane = [e for e in every if e.detail.get("lane") == "alice-laptop"]
    kinds = [e.kind for e in lane]
    assert kinds.count("acquired") == 1 and kinds.count("renewed") >= 3, kinds
    assert all(e.detail["via"] == "api" for e in lane)
    last = max(e.seq for e in lane if e.kind in ("acquired", "renewed"))
    taken = next(e for e in every if e.seq > last and e.kind == "acquired")
    assert taken.detail["holder"] == "alice-laptop" and not taken.detail.get("lane")
    leaders = [(entry["identity"], entry["ended"]) for entry in summary["leaders"]]
    assert leaders[0] == ("replica-1", "killed") and leaders[1] == ("alice-laptop", "taken over"), leaders
    # Two transitions, not three: replica-1's acquisition counts 1, the added replica's from the client
    # counts 2, and the client's own acquisition counts none. The official client's LeaseLock builds the
    # Lease it writes from the spec it read and sets only holderIdentity, leaseDurationSeconds,
    # acquireTime and renewTime (resourcelock/leaselock.py, get_lease_spec): it never touches
    # leaseTransitions, where client-go adds one when the holder changes. Our replicas count one more
    # than the Lease holds when they take it (elector.py), so they go on from the 1 the client left.
    client_acquired = next(e for e in lane if e.kind == "acquired")
    assert client_acquired.value_read == client_acquired.value_written == 1
    assert taken.value_read == 1 and taken.value_written == 2
    assert Lease.objects.get(pk=lease.pk).lease_transitions == summary["transitions"] == 2
