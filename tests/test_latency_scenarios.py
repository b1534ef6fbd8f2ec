"""Network latency for every scenario's actors: leader-election replicas, quota admission and controller, controllers.

Each scenario's job with a latency runs its actors' statements through the job's proxies:
a statement's round trip, as its events time it, is twice the one-way setting (it cannot
be, directly, on this machine's Unix socket: a round trip there is well under a
millisecond). The summary says what the network was, bad values are refused wherever
they come from and make no job, and the live page's control changes a running job's delay.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, connections
from django.test import Client

from occviz.concurrency.latency import Network
from occviz.jobs.models import Event, Job, JobControl
from occviz.jobs.registry import ParamsError
from occviz.jobs.runner import run_job
from occviz.jobs.tasks import create_job
from occviz.scenarios import SCENARIOS

pytestmark = pytest.mark.django_db(transaction=True)

ELECTION = {"replicas": 2, "lease_duration": 1, "renew_deadline": 0.8, "retry_period": 0.2, "seconds": 2, "seed": 3}
QUOTA = {"pods": 6, "hard": 3, "request": 1, "workers": 2, "think_ms": 1, "seed": 3}
CONTROLLERS = {"strategy": "occ", "controllers": 2, "rate_per_s": 20, "think_ms": 1, "seconds": 1, "seed": 3}


def _run(scenario: str, **params: Any) -> Job:
    job = run_job(create_job(scenario, params).pk)
    assert job.status == Job.Status.SUCCEEDED, (job.status, job.error)
    return job


def _durations(job: Job, kind: str, *, field: str = "duration_ms", actor: int | None = None) -> list[float]:
    found = Event.objects.filter(job=job, kind=kind)
    if actor is not None:
        found = found.filter(actor=actor)
    return [value for value in found.values_list(field, flat=True) if value is not None]


# -- leader election -------------------------------------------------------------------------------


def test_a_leader_elections_replicas_each_sit_their_latency_from_the_database() -> None:
    # replica-2 further away than replica-1: each renewal is one compare-and-swap, one round trip.
    # The first leader is killed at 1.5 s, so that both lead (and renew) in turn.
    job = _run("leader-election", **{**ELECTION, "seconds": 5, "kill_leader_at": 1.5}, latency_ms="10 replica-2=25")
    assert job.params["latency_ms"] == "10 2=25"
    summary = job.summary or {}
    assert summary["invariant_ok"], summary["invariant"]
    assert summary["network"] == {
        "latency_ms": 10.0,
        "jitter_ms": 0.0,
        "proxied": True,
        "latency_ms_by_actor": {"2": 25.0},
    }
    writes = {n: _durations(job, "renewed", actor=n) + _durations(job, "acquired", actor=n) for n in (1, 2)}
    assert len(Event.objects.filter(job=job, kind="acquired")) == 2
    # Never quicker than the round trip; slower by what the replica's own work takes on a busy machine.
    for number, took in writes.items():
        expected = 20.0 if number == 1 else 50.0
        assert expected <= statistics.median(took) < expected + 40, (number, took)


def test_a_leader_election_without_a_latency_says_its_replicas_still_go_through_their_proxies() -> None:
    job = _run("leader-election", **ELECTION, replicas_as="threads")
    summary = job.summary or {}
    assert summary["invariant_ok"], summary["invariant"]
    assert summary["network"] == {"latency_ms": 0.0, "jitter_ms": 0.0, "proxied": True}
    assert statistics.median(_durations(job, "renewed")) < 20  # no delay: far below the 20 ms of 10 ms each way


# -- quota -----------------------------------------------------------------------------------------


def test_a_quota_races_admissions_go_through_the_proxy() -> None:
    job = _run("quota", **QUOTA, latency_ms="15", jitter_ms=1)
    summary = job.summary or {}
    assert (summary["admitted"], summary["over_admitted"], summary["errors"]) == (3, 0, 0)
    assert summary["network"] == {"latency_ms": 15.0, "jitter_ms": 1.0, "proxied": True}
    assert set(summary["latency_ms"]) == {"p50", "p95", "p99"}  # the admission latency figure, not the parameter
    # An admission reads the quota, then writes it by compare-and-swap: two round trips at least.
    admitted = _durations(job, "admitted", field="latency_ms")
    assert len(admitted) == 3 and min(admitted) >= 4 * 14, admitted
    direct = _run("quota", **QUOTA)
    assert (direct.summary or {})["network"] == {"latency_ms": 0.0, "jitter_ms": 0.0, "proxied": False}
    assert statistics.median(_durations(direct, "admitted", field="latency_ms")) < min(admitted) - 25


def test_routed_puts_this_threads_django_connection_behind_the_proxy_and_no_other_thread() -> None:
    def round_trip_ms() -> float:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")  # connected before the clock starts
            taken = []
            for _ in range(5):
                started = time.perf_counter()
                cursor.execute("SELECT 1")
                taken.append((time.perf_counter() - started) * 1000.0)
        return statistics.median(taken)

    other: list[float] = []

    def elsewhere() -> None:
        try:
            other.append(round_trip_ms())
        finally:
            connections.close_all()

    with Network("20") as network:
        with network.routed(1):
            far = round_trip_ms()
            thread = threading.Thread(target=elsewhere)
            thread.start()
            thread.join()
        near = round_trip_ms()
    assert 40 <= far < 80 and other[0] < far - 25 and near < far - 25, (far, other, near)


# -- controllers -----------------------------------------------------------------------------------


def test_a_controller_race_gets_and_writes_through_the_proxy() -> None:
    job = _run("controllers", **CONTROLLERS, latency_ms="0 2=20")
    summary = job.summary or {}
    assert summary["invariant_ok"], summary
    assert summary["network"]["latency_ms_by_actor"] == {"2": 20.0}
    near, far = (statistics.median(_durations(job, "read", actor=n)) for n in (1, 2))
    assert 40 <= far < 80 and near < far - 25, (near, far)


# -- bad values ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scenario", "params", "latency", "error"),
    [
        ("leader-election", ELECTION, "fast", "latency 'fast': give a number of ms from 0 to 2000."),
        ("leader-election", ELECTION, "replica-3=5", "'replica-3=5': the job has 2 replicas."),
        ("leader-election", ELECTION, "2=5 replica-2=6", "'replica-2=6': replica 2 is given twice."),
        ("quota", QUOTA, "-1", "latency '-1': give a number of ms from 0 to 2000."),
        ("quota", QUOTA, "admission-3=5", "'admission-3=5': the job has 3 actors."),
        ("quota", QUOTA, "pod-1=5", "'pod-1=5': name an actor by its number, as in 2=50."),
        ("quota", QUOTA, "4=5", "'4=5': the job has 3 actors."),
        ("controllers", CONTROLLERS, "2001", "latency '2001': give a number of ms from 0 to 2000."),
        ("controllers", CONTROLLERS, "20 30", "'30': give one latency for every controller, and controller=ms for "
         "the others."),
    ],
)  # fmt: skip
def test_a_bad_latency_is_refused_and_no_job_is_made(
    scenario: str, params: dict[str, Any], latency: str, error: str
) -> None:
    with pytest.raises(ParamsError) as refused:
        create_job(scenario, {**params, "latency_ms": latency})
    assert refused.value.errors == {"latency_ms": [error]}
    with pytest.raises(ParamsError) as jitter_alone:
        create_job(scenario, {**params, "jitter_ms": 5})
    assert jitter_alone.value.errors == {"jitter_ms": ["Jitter varies a latency: give a latency too."]}
    assert not Job.objects.exists()


def test_quota_actors_are_named_by_number_or_name() -> None:
    job = create_job("quota", {**QUOTA, "latency_ms": "5 quota-controller=1 ADMISSION-2=9"})
    assert job.params["latency_ms"] == "5 1=1 3=9"


@pytest.mark.parametrize("scenario", ["leader-election", "quota", "controllers"])
def test_runjob_shows_and_takes_the_latency_flags_and_refuses_a_bad_one(scenario: str, capsys: Any) -> None:
    with pytest.raises(SystemExit):
        call_command("runjob", scenario, "--help")
    shown = capsys.readouterr().out
    assert "--latency-ms LATENCY_MS [LATENCY_MS ...]" in shown and "--jitter-ms JITTER_MS" in shown
    with pytest.raises(CommandError, match=r"--latency-ms: latency 'far': give a number of ms from 0 to 2000\."):
        call_command("runjob", scenario, "--latency-ms", "far")
    assert not Job.objects.exists()


def test_runjob_runs_a_controller_race_a_latency_away(capsys: Any) -> None:
    call_command(
        "runjob", "controllers", "--controllers", "2", "--seconds", "0.5", "--latency-ms", "3", "2=4",
        "--jitter-ms", "0.5", "--json",
    )  # fmt: skip
    summary = Job.objects.get().summary or {}
    assert summary["network"] == {
        "latency_ms": 3.0,
        "jitter_ms": 0.5,
        "proxied": True,
        "latency_ms_by_actor": {"2": 4.0},
    }


def test_the_setup_line_and_compare_say_the_network() -> None:
    for name, params in (("leader-election", ELECTION), ("quota", QUOTA), ("controllers", CONTROLLERS)):
        spec = SCENARIOS[name]
        cleaned = spec.clean({**params, "latency_ms": "20", "jitter_ms": 2})
        assert ", latency 20 ms ± 2" in spec.setup(cleaned), name
        assert ("network.latency_ms", "network latency, one way (ms)") in spec.compared, name


# -- the live control ------------------------------------------------------------------------------


def _run_in_thread(job_id: int) -> None:
    try:
        run_job(job_id)
    finally:
        connections.close_all()


def _wait_for(condition: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.mark.parametrize("scenario", ["controllers", "leader-election"])
def test_the_live_control_changes_the_delay_of_a_running_job(scenario: str, signed_in: Client, alice: Any) -> None:
    params = {**CONTROLLERS, "seconds": 3} if scenario == "controllers" else {**ELECTION, "seconds": 4}
    job = create_job(scenario, {**params, "latency_ms": "1"}, alice)
    runner = threading.Thread(target=_run_in_thread, args=(job.pk,))
    runner.start()
    timed = "read" if scenario == "controllers" else "renewed"
    try:
        _wait_for(lambda: Event.objects.filter(job=job, kind=timed).count() >= 3)
        page = signed_in.get(f"/jobs/{job.pk}/").content.decode()
        assert 'name="ms"' in page and 'data-control="latency"' in page
        for bad in ("", "fast", "-1", "2001", "nan"):
            refused = signed_in.post(f"/jobs/{job.pk}/control/", {"action": "latency", "ms": bad})
            assert refused.status_code == 400, bad
        assert not JobControl.objects.filter(job=job).exists()
        sent = signed_in.post(f"/jobs/{job.pk}/control/", {"action": "latency", "ms": "20"}, HTTP_HX_REQUEST="true")
        assert sent.status_code == 202 and "Sent: latency 20 ms." in sent.content.decode()
        _wait_for(lambda: Event.objects.filter(job=job, kind="latency_changed").exists())
    finally:
        runner.join(30)
    job.refresh_from_db()
    assert job.status == Job.Status.SUCCEEDED and (job.summary or {})["invariant_ok"]
    assert (job.summary or {})["network"]["latency_ms"] == 20.0
    control = JobControl.objects.get(job=job)
    assert control.applied_at is not None and control.outcome == ""
    changed = Event.objects.get(job=job, kind="latency_changed")
    assert changed.detail == {"latency_ms": 20.0}
    before = [e.duration_ms for e in Event.objects.filter(job=job, kind=timed, seq__lt=changed.seq)]
    # A statement already on its way when the delay changed may take either: the first after is left out.
    after = [e.duration_ms for e in Event.objects.filter(job=job, kind=timed, seq__gt=changed.seq)][1:]
    assert 40 <= statistics.median(after) < 80 and statistics.median(before) < statistics.median(after) - 25, (
        before,
        after,
    )
