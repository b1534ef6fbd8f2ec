"""One job over several processes: `runjob --processes N` (child processes) and `launch()` with N real workers.

Every shard is a real process: killed with SIGKILL for real, connected to the test's
PostgreSQL, meeting the others at the barrier in it, numbering its batches from the job row.
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connection

from occviz.jobs.figures import RunningTotals
from occviz.jobs.models import Event, EventBatch, Job, JobControl, JobShard
from occviz.jobs.reaper import end_stale_jobs
from occviz.jobs.recorder import EventRecorder
from occviz.jobs.registry import ParamsError, program
from occviz.jobs.runner import run_job
from occviz.jobs.snapshots import Snapshotter, State, snapshot_at
from occviz.jobs.tasks import connections_needed, create_job, launch
from occviz.scenarios.counter.scenario import CounterForm
from occviz.store.models import Counter
from tests.helpers import manage_children, output, wait_for
from tests.test_live_stream import assert_exactly_once, messages_until_close, session_cookie
from tests.test_live_stream import socket as page_socket
from tests.test_outside_writes import OutsideIncrementer

__all__ = ["session_cookie"]  # the fixture, used here by name

pytestmark = pytest.mark.django_db(transaction=True)

HOST = os.uname().nodename
SHARD_TIMEOUT_S = 2
CHILD_ENV = {"OCCVIZ_SHARD_HEARTBEAT_TIMEOUT_S": str(SHARD_TIMEOUT_S), "OCCVIZ_HEARTBEAT_TIMEOUT_S": "4"}


@pytest.fixture
def start_manage(database_url: str, tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """`start_manage("runjob", ...)`: manage.py as a child process on the test database, left running."""
    with manage_children(database_url, tmp_path, CHILD_ENV) as start:
        yield start


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].startswith("Z")


def assert_gapless_and_once(job: Job) -> list[Event]:
    """Events 1..last_seq, each stored once: the batches tile the sequence, nothing after its end."""
    batches = list(EventBatch.objects.filter(job=job).order_by("seq_from").values_list("seq_from", "seq_to"))
    expected = 1
    for seq_from, seq_to in batches:
        assert seq_from == expected, f"batches {batches}: a gap or an overlap at {expected}"
        expected = seq_to + 1
    assert expected - 1 == job.last_seq
    events = list(Event.objects.filter(job=job).order_by("seq"))
    assert [event.seq for event in events] == list(range(1, job.last_seq + 1))
    return events


COUNTER = ["runjob", "counter", "--strategy", "occ", "--rows", "1", "--retry", "immediate", "--max-attempts", "1000"]


@pytest.mark.parametrize("processes", [2, 3])
def test_a_counter_race_over_several_runjob_processes_is_one_whole_job(
    start_manage, admin_client, processes: int
) -> None:  # type: ignore[no-untyped-def]
    args = [*COUNTER, "--writers", "6", "--increments", "25", "--think-ms", "1", "--json"]
    one, many = start_manage(*args), start_manage(*args, "--processes", str(processes))
    assert one.wait(120) == 0, output(one)
    assert many.wait(120) == 0, output(many)
    single, summary = json.loads(output(one)[0]), json.loads(output(many)[0])
    assert "Traceback" not in output(many)[1] and "WARNING" not in output(many)[1], output(many)[1]
    assert summary.keys() == single.keys() | {"shards"}, "the shape of a one-process job's, and its shards"
    assert (single["processes"], summary["processes"]) == (1, processes)
    assert summary["invariant_ok"] is True, summary["invariant"]
    assert summary["committed"] == summary["final_value"] == 6 * 25
    assert summary["conflicts"] > 0, "writers in different processes raced on the one row"
    shards = summary["shards"]
    assert [shard["index"] for shard in shards] == list(range(processes))
    assert shards[0]["runner"] == f"runjob:{HOST}:{many.pid}"
    assert all(shard["runner"] == f"runshard:{HOST}:{shard['pid']}" for shard in shards[1:])
    assert len({shard["pid"] for shard in shards}) == processes, "each shard a process of its own"
    assert [a for shard in shards for a in range(shard["actors"][0], shard["actors"][1] + 1)] == [1, 2, 3, 4, 5, 6]
    job = Job.objects.get(pk=summary["id"])
    assert (job.status, summary["events"]) == (Job.Status.SUCCEEDED, job.last_seq)
    events = assert_gapless_and_once(job)
    by_actor: dict[int, int] = {}
    for event in events:
        if event.kind == "committed":
            by_actor[event.actor] = by_actor.get(event.actor, 0) + 1
    assert by_actor == dict.fromkeys(range(1, 7), 25), "every writer's every commit, once"
    # One clock: every shard's first event comes within moments of the release.
    firsts = {
        shard["index"]: min(e.t_ms for e in events if shard["actors"][0] <= e.actor <= shard["actors"][1])
        for shard in shards
    }
    assert all(0 <= t < 1000 for t in firsts.values()), firsts
    assert JobShard.objects.filter(job=job, status="done").count() == processes
    # The admin's job page lists its shards.
    page = admin_client.get(f"/admin/jobs/job/{job.pk}/change/").content.decode()
    assert all(shard["runner"] in page for shard in shards)


def shards_of(job_id: int) -> list[JobShard]:
    return list(JobShard.objects.filter(job_id=job_id).order_by("index"))


def running_shards(processes: int, events: int = 200) -> Callable[[], Job | None]:
    """The job running with all its shards, past its first `events` events."""

    def look() -> Job | None:
        job = Job.objects.filter(status=Job.Status.RUNNING, last_seq__gte=events).first()
        if job is None:
            return None
        shards = shards_of(job.pk)
        return job if len(shards) == processes and all(s.status == "running" and s.pid for s in shards) else None

    return look


def test_a_shard_killed_mid_job_fails_the_job_naming_it_and_the_other_shards_stop(start_manage) -> None:  # type: ignore[no-untyped-def]
    runjob = start_manage(*COUNTER, "--writers", "6", "--seconds", "60", "--think-ms", "2", "--processes", "3")
    job = wait_for(running_shards(3), timeout=60, what="the job's three shards to run")
    victim, other = shards_of(job.pk)[1:]
    os.kill(victim.pid, signal.SIGKILL)
    killed = time.monotonic()
    assert runjob.wait(30) == 1, output(runjob)
    ended_s = time.monotonic() - killed
    job.refresh_from_db()
    assert job.status == Job.Status.FAILED
    assert f"shard 1 of 3 (runshard:{HOST}:{victim.pid}) stopped renewing its heartbeat" in job.error, job.error
    assert f"shard 1 of 3 (runshard:{HOST}:{victim.pid})" in output(runjob)[1]
    print(f"\n[fault] shard killed with SIGKILL: job failed {ended_s:.2f} s after (shard timeout {SHARD_TIMEOUT_S} s)")
    assert ended_s < SHARD_TIMEOUT_S + 5
    # The others stopped within a second of the failure being seen, and their processes are gone.
    victim.refresh_from_db()
    other.refresh_from_db()
    assert (victim.status, other.status) == ("failed", "stopped")
    assert victim.finished_at is not None and other.finished_at is not None
    assert (other.finished_at - victim.finished_at).total_seconds() < 1.0
    wait_for(lambda: not alive(other.pid), timeout=5, what="shard 2's process to exit")
    assert not alive(victim.pid)
    # Nothing after the last stored event is claimed: the sequence ends where the store does.
    assert_gapless_and_once(job)
    assert job.summary is not None and job.summary["events"] == job.last_seq


def test_the_latency_control_reaches_the_writers_of_every_process(start_manage) -> None:  # type: ignore[no-untyped-def]
    """Set mid-job, the latency slows the reads of both processes' writers; one event; the summary says it."""
    args = ["--writers", "4", "--seconds", "6", "--think-ms", "2", "--latency-ms", "1", "--processes", "2", "--json"]
    runjob = start_manage(*COUNTER, *args)
    job = wait_for(running_shards(2, events=100), timeout=60, what="the job's two shards to run")
    refused = [job.request_control("latency", seconds=bad) for bad in (2.5, -0.001)]
    waiting = JobControl.objects.filter(job_id=job.pk, applied_at=None)
    wait_for(lambda: not waiting.exists(), timeout=10, what="the bad latencies' outcomes")
    for bad in refused:
        bad.refresh_from_db()
        assert "give a number of ms from 0 to 2000" in bad.outcome, bad.outcome
    control = job.request_control("latency", seconds=0.03)
    assert runjob.wait(60) == 0, output(runjob)
    summary = json.loads(output(runjob)[0])
    control.refresh_from_db()
    assert control.applied_at is not None and control.outcome == ""
    assert summary["invariant_ok"] is True and summary["network"]["latency_ms"] == 30.0, summary["network"]
    changed = Event.objects.get(job_id=job.pk, kind="latency_changed")  # recorded once, by the coordinator
    assert changed.detail == {"latency_ms": 30.0}
    reads = Event.objects.filter(job_id=job.pk, kind="read")
    for shard in summary["shards"]:
        own = [e for e in reads if shard["actors"][0] <= e.actor <= shard["actors"][1]]
        before = [e.duration_ms for e in own if e.t_ms < changed.t_ms]
        # Started a second after the change: every one a round trip of 2 x 30 ms through its process's proxies.
        after = [e.duration_ms for e in own if e.t_ms - e.duration_ms > changed.t_ms + 1000]
        slowed = min(e.t_ms - e.duration_ms for e in own if e.t_ms > changed.t_ms and e.duration_ms > 60)
        print(
            f"\n[latency] shard {shard['index']}: reads' median {statistics.median(before):.1f} ms before, "
            f"{statistics.median(after):.1f} ms after; the first slowed read began {slowed - changed.t_ms:.0f} ms after"
        )
        assert statistics.median(before) < 20 and len(after) > 20, (shard, before, after)
        assert min(after) > 60, (shard, sorted(after)[:5])
    job.refresh_from_db()
    assert_gapless_and_once(job)


def test_bad_processes_are_refused_clearly_and_nothing_is_made(run_manage) -> None:  # type: ignore[no-untyped-def]
    base = {"strategy": "occ", "writers": 2, "increments": 5}
    for value, words in [
        ("0", "1 to 16 processes, not 0"),
        ("17", "1 to 16 processes, not 17"),
        ("two", 'whole number of processes from 1 to 16, or "auto"'),
        ("٣", 'whole number of processes from 1 to 16, or "auto"'),
        ("3", "3 processes for 2 actors: each process runs at least one"),
    ]:
        form = CounterForm(data={**base, "processes": value})
        assert not form.is_valid()
        assert words in " ".join(form.errors["processes"]), form.errors
        with pytest.raises(ParamsError):
            create_job("counter", {**base, "processes": value})
    assert CounterForm(data={**base, "processes": "auto"}).is_valid()
    form = CounterForm(data={**base, "processes": " 2 "})
    assert form.is_valid() and form.cleaned_data["processes"] == 2
    form = CounterForm(data=base)
    assert form.is_valid() and form.cleaned_data["processes"] == 1
    # A scenario that cannot spread its actors yet says so.
    with pytest.raises(ParamsError, match="A anomalies job runs in one process for now"):
        create_job("anomalies", {"processes": "2"})
    result = run_manage(*COUNTER, "--writers", "2", "--increments", "5", "--processes", "17")
    assert result.returncode == 2 and "--processes: A job runs in 1 to 16 processes, not 17." in result.stderr
    assert not Job.objects.exists()
    # Every shard's own connections are admitted with the job.
    params = CounterForm(data={**base, "writers": 6, "processes": "3"})
    assert params.is_valid()
    assert connections_needed("counter", params.cleaned_data) == 6 + 3 + 3 * 3 - 2


WORKER = ("worker", "--no-reload", "--interval", "0.1", "--no-startup-delay")
# A shard's task waits this long for a worker (however slow the second worker's start), not the default 2 s.
WAIT_FOR_WORKERS = {"OCCVIZ_SHARD_CLAIM_S": "60"}


@pytest.mark.slow
def test_a_shard_no_process_takes_fails_the_job_with_why(start_manage) -> None:  # type: ignore[no-untyped-def]
    job = launch("counter", {"strategy": "occ", "writers": 2, "increments": 5, "processes": 2})
    start_manage(*WORKER, "--worker-id", "w1", env={"OCCVIZ_SHARD_ARRIVAL_S": "2", **WAIT_FOR_WORKERS})
    job = wait_for(lambda: Job.objects.filter(pk=job.pk, status__in=Job.FINISHED).first(), 60, "the job to end")
    assert job.status == Job.Status.FAILED
    assert job.error == "shard 1 of 2 never arrived within 2 s: no process took it", job.error
    # The one worker then takes the shard's task, and finds nothing to run.
    shard = wait_for(lambda: JobShard.objects.filter(job=job, index=1).first(), 5, "shard 1's row")
    assert shard.status == "stopped" and shard.pid is None
    assert Event.objects.filter(job=job).count() == job.last_seq


@pytest.mark.slow
def test_launch_runs_the_shards_on_several_workers_and_a_cancel_stops_them_all(start_manage) -> None:  # type: ignore[no-untyped-def]
    workers = [start_manage(*WORKER, "--worker-id", f"w{n}", env=WAIT_FOR_WORKERS) for n in (1, 2)]
    data = {"strategy": "occ", "writers": 4, "increments": 30, "rows": 1, "think_ms": 1, "processes": 2}
    job = launch("counter", {**data, "retry": "immediate", "max_attempts": 1000})
    job = wait_for(lambda: Job.objects.filter(pk=job.pk, status__in=Job.FINISHED).first(), 90, "the job to end")
    assert job.status == Job.Status.SUCCEEDED, job.error
    summary = job.summary
    assert summary is not None and summary["invariant_ok"] is True and summary["committed"] == 120
    assert summary["processes"] == 2
    pids = {worker.pid for worker in workers}
    assert {shard["pid"] for shard in summary["shards"]} == pids, "each worker ran one shard"
    assert all(shard["runner"] == f"worker:{HOST}:{shard['pid']}" for shard in summary["shards"])
    assert_gapless_and_once(job)

    job = launch("counter", {**data, "increments": None, "seconds": 60})
    job = wait_for(running_shards(2), timeout=60, what="the second job's two shards to run")
    job.request_cancel()
    asked = time.monotonic()
    job = wait_for(lambda: Job.objects.filter(pk=job.pk, status__in=Job.FINISHED).first(), 10, "the job to end")
    assert time.monotonic() - asked < 3
    assert (job.status, job.error) == (Job.Status.CANCELLED, ""), job.error
    assert job.summary is not None
    assert {shard.status for shard in shards_of(job.pk)} <= {"done", "stopped"}
    assert all(shard.finished_at for shard in shards_of(job.pk))
    assert_gapless_and_once(job)


def test_a_job_reaped_after_its_coordinator_died_leaves_no_shard_running(start_manage) -> None:  # type: ignore[no-untyped-def]
    runjob = start_manage(*COUNTER, "--writers", "4", "--seconds", "60", "--think-ms", "2", "--processes", "2")
    job = wait_for(running_shards(2), timeout=60, what="the job's two shards to run")
    shard = shards_of(job.pk)[1]
    runjob.send_signal(signal.SIGKILL)
    runjob.wait()
    assert alive(shard.pid), "its shard runs on, alone, until the job is ended"
    [ended] = wait_for(lambda: end_stale_jobs(timeout_s=1), timeout=10, what="a reaper to end the job")
    reaped = time.monotonic()
    assert ended == job.pk
    wait_for(lambda: not alive(shard.pid), timeout=5, what="the shard's process to exit")
    exited_s = time.monotonic() - reaped
    print(f"\n[fault] coordinator killed, job reaped: its shard's process exited {exited_s:.2f} s after")
    shard.refresh_from_db()
    job.refresh_from_db()
    assert shard.status == "stopped" and shard.error == "ended elsewhere"
    assert shard.finished_at is not None and job.finished_at is not None
    stopped_s = (shard.finished_at - job.finished_at).total_seconds()
    print(f"[fault] its shard's actors had stopped and stored their events {stopped_s:.2f} s after the reap")
    assert stopped_s < 1.0, "the shard stopped within a second of its job's end"
    assert_gapless_and_once(job)


@pytest.mark.django_db(transaction=True, databases=["default", "channels_postgres"])
@pytest.mark.asyncio
async def test_a_page_watching_a_job_over_two_processes_sees_every_event_once_then_the_end(  # type: ignore[no-untyped-def]
    start_manage, session_cookie: bytes
) -> None:
    """The shards' batches, stored by two processes, reach a live viewer as one job's."""
    runjob = start_manage(*COUNTER, "--writers", "4", "--seconds", "3", "--think-ms", "1", "--processes", "2")
    job = await sync_to_async(wait_for)(running_shards(2, events=50), 60, "the job's two shards to run")
    communicator = page_socket(f"/ws/jobs/{job.pk}/events/", session_cookie)
    assert (await communicator.connect())[0]
    hello, *frames, end, code = [message async for message in messages_until_close(communicator, timeout=60)]
    assert await sync_to_async(runjob.wait)(60) == 0
    job = await Job.objects.aget(pk=job.pk)
    assert hello["type"] == "hello" and hello["job"]["status"] == "running", "watched live"
    assert_exactly_once(frames, 0, job.last_seq)
    assert frames[-1]["totals"]["committed"] == job.summary["committed"] == frames[-1]["rows"][0]["value"]
    assert end == {"type": "end", "status": "succeeded", "summary": job.summary, "invariant_ok": True}
    assert code == 1000


def test_an_actor_failing_in_one_shard_stops_every_shard_and_fails_the_job_with_its_error(start_manage) -> None:  # type: ignore[no-untyped-def]
    runjob = start_manage(*COUNTER, "--writers", "4", "--seconds", "60", "--think-ms", "2", "--processes", "2")
    job = wait_for(running_shards(2), timeout=60, what="the job's two shards to run")
    shard = shards_of(job.pk)[1]

    def shard_writers() -> list[int]:
        # runshard names its connections after itself; its writers' are those with prepared counter statements.
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = 'occviz runshard' "
                "AND query LIKE '%%store_counter%%' AND query LIKE '%%$1%%'"
            )
            return [pid for (pid,) in cursor.fetchall()]

    backend = wait_for(shard_writers, 10, "shard 1's writers' backends")[0]
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [backend])
    terminated = time.monotonic()
    assert runjob.wait(30) == 1, output(runjob)
    ended_s = time.monotonic() - terminated
    print(f"\n[fault] a writer's backend in shard 1 terminated: the job ended {ended_s:.2f} s after")
    assert ended_s < 5
    job.refresh_from_db()
    assert job.status == Job.Status.FAILED
    assert re.match(rf"shard 1 of 2 \(runshard:{HOST}:{shard.pid}\) failed: actor [34]: \w+: ", job.error), job.error
    coordinator, failed = shards_of(job.pk)
    assert (failed.status, coordinator.status) == ("failed", "failed"), "the coordinator failed with it"
    assert failed.error.startswith("actor ") and failed.error in coordinator.error
    assert job.summary is not None and job.summary["invariant_ok"] is True, "what committed is counted"
    assert_gapless_and_once(job)


def test_interleaved_recorders_number_one_sequence_and_their_snapshots_count_on_without_recounting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two shards' recorders (here two in one process) store batches in turn: each snapshot counts every batch."""
    job = create_job("counter", {"strategy": "occ", "writers": 2, "increments": 1})
    spec = program("counter")
    recounts: list[int] = []
    from_store = RunningTotals.from_store.__func__  # type: ignore[attr-defined]

    def counted_recount(cls: type[RunningTotals], job_id: int, upto: int, figures: Any) -> RunningTotals:
        recounts.append(upto)
        return from_store(cls, job_id, upto, figures)

    monkeypatch.setattr(RunningTotals, "from_store", classmethod(counted_recount))
    recorders = []
    for _ in range(2):
        snapshots = Snapshotter(job.pk, spec.figures, lambda: State())
        recorder = EventRecorder(job.pk, snapshot=snapshots.take)
        recorder.interleaved = True
        recorders.append(recorder)
    for round_number in range(1, 21):
        for actor, recorder in enumerate(recorders, start=1):
            for _ in range(round_number):  # batches of different lengths
                recorder.record(actor, round_number, 1, "read", duration_ms=1.0)
            recorder.record(actor, round_number, 1, "committed", latency_ms=2.0)
            recorder.flush()
    job.refresh_from_db()
    assert job.last_seq == 2 * sum(n + 1 for n in range(1, 21))
    assert_gapless_and_once(job)
    assert recounts == [], "each snapshot counted on from the batches stored since its last"
    last = snapshot_at(job.pk, job.last_seq)
    assert last is not None
    recounted = RunningTotals.from_store(job.pk, job.last_seq, spec.figures).snapshot({})
    assert last["figures"]["committed"] == recounted["committed"] == 40
    assert last["figures"] == {**recounted, "lost_updates": last["figures"]["lost_updates"]}


def test_ctrl_c_to_runjob_cancels_the_job_in_every_shard(start_manage) -> None:  # type: ignore[no-untyped-def]
    runjob = start_manage(*COUNTER, "--writers", "4", "--seconds", "60", "--think-ms", "2", "--processes", "2")
    job = wait_for(running_shards(2), timeout=60, what="the job's two shards to run")
    shard = shards_of(job.pk)[1]
    runjob.send_signal(signal.SIGINT)
    asked = time.monotonic()
    assert runjob.wait(15) == 130, output(runjob)
    print(f"\n[fault] Ctrl-C to runjob over 2 processes: it exited {time.monotonic() - asked:.2f} s after")
    assert time.monotonic() - asked < 5
    assert not alive(shard.pid), "its shard's process ended with it"
    job.refresh_from_db()
    assert (job.status, job.error) == (Job.Status.CANCELLED, "")
    assert {s.status for s in shards_of(job.pk)} == {"stopped"}
    assert_gapless_and_once(job)


def test_bench_refuses_bad_processes(run_manage) -> None:  # type: ignore[no-untyped-def]
    result = run_manage("bench", "--part", "engine", "--processes", "17")
    assert result.returncode == 2 and "--processes 1..16" in result.stderr


def test_outside_writes_to_a_job_over_two_processes_are_its_events_and_no_update_is_lost(  # type: ignore[no-untyped-def]
    database_url: str, monkeypatch: pytest.MonkeyPatch, alice
) -> None:
    """The coordinator follows the API's writes; the writers of both shards race them on the one row."""
    monkeypatch.setenv("DATABASE_URL", database_url)  # for the runshard child of this process's runner
    for name, value in CHILD_ENV.items():
        monkeypatch.setenv(name, value)
    params = {"strategy": "occ", "writers": 4, "increments": 200, "think_ms": 3, "max_attempts": 50, "processes": 2}
    job = create_job("counter", params, alice)
    outside = OutsideIncrementer(job.pk, increments=30, think_s=0.003)
    outside.start()
    job = run_job(job.pk, shards="children")
    outside.join(timeout=60)
    assert outside.error is None, outside.error
    summary = job.summary
    assert job.status == Job.Status.SUCCEEDED, job.error
    assert summary is not None and summary["invariant_ok"], summary
    assert [shard["actors"] for shard in summary["shards"]] == [[1, 2], [3, 4]]
    row = Counter.objects.get(job=job)
    assert row.value == summary["final_value"] == summary["committed"] + outside.committed
    assert summary["committed"] + summary["gave_up"] == 4 * 200
    assert summary["outside_writes"] == outside.committed == 30 and summary["lost_updates"] == 0
    assert outside.conflicts > 0 and summary["conflicts"] > 0, "the race happened, on both sides"
    lane = Event.objects.filter(job=job, kind__in=["outside_write", "outside_conflict"])
    assert {event.actor for event in lane} == {5}, "one lane, after the job's four writers"
    assert assert_gapless_and_once(job)


def test_runjob_of_a_scenario_that_cannot_shard_refuses_processes_in_words(run_manage) -> None:  # type: ignore[no-untyped-def]
    result = run_manage("runjob", "anomalies", "--processes", "2")
    assert result.returncode == 2, result.stderr
    assert "--processes: A anomalies job runs in one process for now" in result.stderr
    assert not Job.objects.exists()
