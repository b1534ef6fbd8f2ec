"""Network latency per actor: the job's socket proxy adds a one-way delay (and jitter) to an actor's connection.

The proxy is measured for what it says it adds (a trivial query's round trip within 5 ms of
twice the setting, the median of several), a counter race whose writers each sit 20 ms
from the server meets more conflicts than the same race without (the round trip between a
writer's read and its compare-and-swap is a window for the others' writes), bad values are
refused wherever they come from, and the live page's control changes a running job's delay.
"""

from __future__ import annotations

import os
import re
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, connections
from django.test import Client

from occviz.concurrency.latency import Network
from occviz.concurrency.proxy import ProxyProcess
from occviz.jobs.models import Event, Job, JobControl
from occviz.jobs.registry import ParamsError
from occviz.jobs.runner import run_job
from occviz.jobs.tasks import create_job
from occviz.store.session import PreparedSession
from tests.helpers import run_counter

pytestmark = pytest.mark.django_db(transaction=True)


def _upstream() -> tuple[str, int]:
    params = connection.settings_dict
    return str(params["HOST"] or ""), int(params["PORT"] or 5432)


def _round_trips_ms(session: PreparedSession, count: int = 9) -> list[float]:
    session.one("SELECT 1", [])  # prepared before the clock starts
    taken = []
    for _ in range(count):
        started = time.perf_counter()
        session.one("SELECT 1", [])
        taken.append((time.perf_counter() - started) * 1000.0)
    return taken


# -- the proxy ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("delay_ms", [0.0, 10.0, 20.0])
def test_the_proxy_adds_twice_its_one_way_delay_to_a_round_trip(delay_ms: float) -> None:
    with ProxyProcess(*_upstream()) as proxies:
        proxy = proxies.proxy("writer-1", delay_ms=delay_ms)
        session = PreparedSession(**proxy.connection)
        try:
            median = statistics.median(_round_trips_ms(session))
        finally:
            session.close()
    assert abs(median - 2 * delay_ms) <= 5.0, (delay_ms, median)


def test_a_new_delay_applies_to_a_connection_already_open() -> None:
    with ProxyProcess(*_upstream()) as proxies:
        proxy = proxies.proxy("writer-1", delay_ms=2.0)
        session = PreparedSession(**proxy.connection)
        try:
            before = statistics.median(_round_trips_ms(session))
            proxy.slow(15.0)
            after = statistics.median(_round_trips_ms(session))
        finally:
            session.close()
    assert abs(before - 4.0) <= 5.0 and abs(after - 30.0) <= 5.0, (before, after)
    assert (proxy.delay_ms, proxy.jitter_ms) == (15.0, 0.0)


@pytest.fixture
def echo_server() -> Iterator[tuple[str, int]]:
    """A peer that sends back every byte it gets, on a socket named as PostgreSQL names its own."""
    folder = tempfile.mkdtemp(prefix="occviz-echo-")
    port = 54329
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(os.path.join(folder, f".s.PGSQL.{port}"))
    listener.listen()

    def serve() -> None:
        with listener:
            peer, _ = listener.accept()
            with peer:
                while data := peer.recv(65536):
                    peer.sendall(data)

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    yield folder, port
    server.join(5)


def test_jittered_chunks_arrive_in_the_order_they_were_sent(echo_server: tuple[str, int]) -> None:
    folder, port = echo_server
    with ProxyProcess(folder, port) as proxies:
        # Each chunk's delay anywhere from 0 to 20 ms: unordered, most would overtake one another.
        proxy = proxies.proxy("writer-1", delay_ms=10.0, jitter_ms=10.0, seed=3)
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect(os.path.join(proxy.directory, f".s.PGSQL.{port}"))
        sent = b""
        with client:
            started = time.perf_counter()
            for n in range(60):
                chunk = f"<{n}>".encode()
                client.sendall(chunk)
                sent += chunk
                time.sleep(0.001)  # one chunk each, read apart by the proxy
            received = b""
            client.settimeout(5)
            while len(received) < len(sent):
                received += client.recv(65536)
            took_ms = (time.perf_counter() - started) * 1000.0
    assert received == sent
    assert took_ms >= 60 + 2 * 10 - 20, "each chunk was delayed, both ways"


# -- the counter race ------------------------------------------------------------------------------


@pytest.mark.slow
def test_writers_20_ms_away_meet_more_conflicts_than_the_same_race_without(signed_in: Client) -> None:
    # The same seed, increments and think time; k8s-default-backoff waits after a conflict, so a
    # writer's read-to-swap window is a share of its time, and the latency widens it by 40 ms.
    race = {
        "strategy": "occ",
        "writers": 4,
        "increments": 10,
        "think_ms": 5,
        "retry": "k8s-default-backoff",
        "max_attempts": 50,
        "seed": 7,
    }
    direct_job, far_job = run_counter(**race), run_counter(**race, latency_ms="20")
    direct, far = direct_job.summary or {}, far_job.summary or {}
    for summary in (direct, far):
        assert summary["invariant_ok"], summary["invariant"]
        assert summary["committed"] == 40
    assert direct["network"] == {"latency_ms": 0.0, "jitter_ms": 0.0, "proxied": False}
    assert far["network"] == {"latency_ms": 20.0, "jitter_ms": 0.0, "proxied": True}
    rate = {name: s["conflicts"] / s["attempts"] for name, s in (("direct", direct), ("far", far))}
    assert rate["far"] > rate["direct"], rate
    # Compared side by side, the network is one of the rows.
    compared = signed_in.get(f"/jobs/compare/?ids={direct_job.pk},{far_job.pk}").content.decode()
    row = compared[compared.index("network latency, one way (ms)") :][:200]
    assert re.search(r"<td[^>]*>0(\.0)?</td>\s*<td[^>]*>20(\.0)?</td>", row), row


def test_one_writer_can_sit_further_away_than_the_others() -> None:
    job = run_counter(strategy="atomic", writers=2, increments=5, latency_ms="0 2=15", jitter_ms=1)
    summary = job.summary or {}
    assert summary["invariant_ok"], summary["invariant"]
    assert summary["network"] == {
        "latency_ms": 0.0,
        "jitter_ms": 1.0,
        "proxied": True,
        "latency_ms_by_actor": {"2": 15.0},
    }
    took = {
        writer: statistics.median(
            e.duration_ms for e in Event.objects.filter(job=job, kind="committed", actor=writer) if e.duration_ms
        )
        for writer in (1, 2)
    }
    # Writer 2 is 15 ms each way (jitter 1): a commit is at least its round trip, writer 1 far below it.
    assert 25 < took[2] < 70 and took[1] < took[2] - 15, took


# -- bad values ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("latency", "jitter", "error"),
    [
        ("abc", 0, "latency 'abc': give a number of ms from 0 to 2000."),
        ("-5", 0, "latency '-5': give a number of ms from 0 to 2000."),
        ("2001", 0, "latency '2001': give a number of ms from 0 to 2000."),
        ("nan", 0, "latency 'nan': give a number of ms from 0 to 2000."),
        ("٣", 0, "latency '٣': give a number of ms from 0 to 2000."),
        ("20 30", 0, "'30': give one latency for every writer, and writer=ms for the others."),
        ("5=20", 0, "'5=20': the job has 4 writers."),
        ("0=20", 0, "'0=20': name a writer by its number, as in 2=50."),
        ("2=20 2=30", 0, "'2=30': writer 2 is given twice."),
        ("2=", 0, "writer 2's latency '': give a number of ms from 0 to 2000."),
    ],
)
def test_a_bad_latency_is_refused_and_no_job_is_made(latency: str, jitter: float, error: str) -> None:
    with pytest.raises(ParamsError) as refused:
        create_job("counter", {"strategy": "occ", "writers": 4, "latency_ms": latency, "jitter_ms": jitter})
    assert refused.value.errors == {"latency_ms": [error]}
    assert not Job.objects.exists()


def test_jitter_needs_a_latency_and_stays_within_bounds() -> None:
    with pytest.raises(ParamsError) as refused:
        create_job("counter", {"strategy": "occ", "jitter_ms": 5})
    assert refused.value.errors == {"jitter_ms": ["Jitter varies a latency: give a latency too."]}
    with pytest.raises(ParamsError) as too_much:
        create_job("counter", {"strategy": "occ", "latency_ms": "5", "jitter_ms": 5000})
    assert list(too_much.value.errors) == ["jitter_ms"]
    assert not Job.objects.exists()
    job = create_job("counter", {"strategy": "occ", "writers": 3, "latency_ms": "20, 3=0.5", "jitter_ms": 2})
    assert (job.params["latency_ms"], job.params["jitter_ms"]) == ("20 3=0.5", 2.0)
    # From the API's JSON: a number, or a list of words.
    assert create_job("counter", {"strategy": "occ", "latency_ms": 20}).params["latency_ms"] == "20"
    listed = create_job("counter", {"strategy": "occ", "writers": 2, "latency_ms": ["5", "2=7.5"]})
    assert listed.params["latency_ms"] == "5 2=7.5"


def test_runjob_takes_latency_for_all_and_per_writer_and_refuses_a_bad_one(capsys: Any) -> None:
    call_command(
        "runjob", "counter", "--strategy", "atomic", "--writers", "2", "--increments", "3",
        "--latency-ms", "1", "2=3", "--jitter-ms", "0.5", "--json",
    )  # fmt: skip
    job = Job.objects.get()
    assert job.params["latency_ms"] == "1 2=3"
    assert (job.summary or {})["network"]["latency_ms_by_actor"] == {"2": 3.0}
    with pytest.raises(CommandError, match=r"--latency-ms: latency 'fast': give a number of ms from 0 to 2000\."):
        call_command("runjob", "counter", "--strategy", "atomic", "--latency-ms", "fast")
    assert Job.objects.count() == 1


def test_network_refuses_a_change_it_cannot_make() -> None:
    with Network("0") as direct:
        assert direct.connection(1) == {}
        with pytest.raises(ValueError, match="connections are direct"):
            direct.set_latency(20)
    with Network("5") as far:
        with pytest.raises(ValueError, match="from 0 to 2000"):
            far.set_latency(-1)
        assert far.everyone == 5.0


# -- the live control ------------------------------------------------------------------------------


def _run_in_thread(job_id: int) -> None:
    try:
        run_job(job_id)
    finally:
        connections.close_all()


def _wait_for(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_the_live_control_changes_the_delay_of_a_running_job(signed_in: Client, alice: Any) -> None:
    job = create_job("counter", {"strategy": "atomic", "writers": 2, "seconds": 4, "latency_ms": "2"}, alice)
    runner = threading.Thread(target=_run_in_thread, args=(job.pk,))
    runner.start()
    try:
        _wait_for(lambda: Event.objects.filter(job=job, kind="committed").count() >= 10)
        page = signed_in.get(f"/jobs/{job.pk}/").content.decode()
        assert 'name="ms"' in page and 'data-control="latency"' in page
        for bad in ("", "fast", "-1", "2001", "inf"):
            refused = signed_in.post(f"/jobs/{job.pk}/control/", {"action": "latency", "ms": bad})
            assert refused.status_code == 400, bad
            assert "give a number of milliseconds from 0 to 2000" in refused.content.decode()
        assert not JobControl.objects.filter(job=job).exists()
        response = signed_in.post(f"/jobs/{job.pk}/control/", {"action": "latency", "ms": "25"}, HTTP_HX_REQUEST="true")
        assert response.status_code == 202
        assert "Sent: latency 25 ms." in response.content.decode()
        _wait_for(lambda: Event.objects.filter(job=job, kind="latency_changed").exists())
    finally:
        runner.join(30)
    job.refresh_from_db()
    assert job.status == Job.Status.SUCCEEDED and (job.summary or {})["invariant_ok"]
    control = JobControl.objects.get(job=job)
    assert control.applied_at is not None and control.outcome == ""
    changed = Event.objects.get(job=job, kind="latency_changed")
    assert changed.detail == {"latency_ms": 25.0}
    took = {"before": [], "after": []}
    for event in Event.objects.filter(job=job, kind="committed").order_by("seq"):
        took["before" if event.seq < changed.seq else "after"].append(event.duration_ms)
    # One statement, one round trip: about 4 ms before, about 50 ms after.
    medians = {when: statistics.median(values) for when, values in took.items()}
    assert 45 < medians["after"] < 100 and medians["before"] < medians["after"] - 30, medians
    assert (job.summary or {})["network"]["latency_ms"] == 25.0


def test_the_latency_control_on_a_directly_connected_job_is_recorded_as_refused(alice: Any) -> None:
    job = create_job("counter", {"strategy": "atomic", "writers": 1, "seconds": 2}, alice)
    runner = threading.Thread(target=_run_in_thread, args=(job.pk,))
    runner.start()
    try:
        _wait_for(lambda: Event.objects.filter(job=job, kind="committed").exists())
        control = Job.objects.get(pk=job.pk).request_control("latency", seconds=0.02, user=alice)
        _wait_for(lambda: JobControl.objects.get(pk=control.pk).applied_at is not None)
    finally:
        runner.join(30)
    control.refresh_from_db()
    assert "connections are direct" in control.outcome
    assert not Event.objects.filter(job=job, kind="latency_changed").exists()


# -- the contention curve over latency -----------------------------------------------------------------


def test_a_sweep_over_latency_refuses_what_it_cannot_run() -> None:
    with pytest.raises(ParamsError) as refused:
        create_job("sweep", {"strategies": "occ", "axis": "latency", "max_latency_ms": 0})
    assert list(refused.value.errors) == ["max_latency_ms"]
    with pytest.raises(ParamsError) as too_long:
        create_job("sweep", {"strategies": "occ", "axis": "latency", "seconds": 40})
    assert "5 levels x 2 series x 40 s is 400 s, more than the 300 s" in " ".join(too_long.value.errors["seconds"])
    assert not Job.objects.exists()


@pytest.mark.slow
def test_a_sweep_over_latency_measures_each_level_at_the_same_writers(signed_in: Client, alice: Any) -> None:
    sweep = run_job(
        create_job(
            "sweep",
            {"strategies": "occ", "axis": "latency", "max_writers": 2, "max_latency_ms": 20, "seconds": 1},
            alice,
        ).pk
    )
    summary = sweep.summary or {}
    assert summary["invariant_ok"], summary["invariant"]
    assert (summary["axis"], summary["writers"], summary["levels"]) == ("latency", 2, [0.0, 2.5, 5.0, 10.0, 20.0])
    points = summary["points"]
    assert [(p["strategy"], p["writers"], p["latency_ms"]) for p in points] == [
        (name, 2, ms) for ms in (0.0, 2.5, 5.0, 10.0, 20.0) for name in ("occ", "pgbench")
    ]
    for point in (p for p in points if p["strategy"] == "occ"):
        part = Job.objects.get(pk=point["job"])
        assert part.params["latency_ms"] == f"{point['latency_ms']:g}"
        assert part.summary["network"]["latency_ms"] == point["latency_ms"]
    # pgbench through the proxy too: a transaction is two round trips, 80 ms at 20 ms one way (2 clients).
    pgbench = {p["latency_ms"]: p["commits_per_s"] for p in points if p["strategy"] == "pgbench"}
    assert pgbench[20.0] <= 2 * 1000 / 80 < 100 < pgbench[0.0], pgbench
    page = signed_in.get(f"/jobs/{sweep.pk}/").content.decode()
    assert '<th scope="col">latency (ms)</th>' in page and 'data-cell="occ-2-2.5ms"' in page
    assert page.count('data-state="measured"') == 10
