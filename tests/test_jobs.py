"""Job lifecycle: queued, running, finished; cancel; the worker path through django.tasks."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection, connections, transaction
from django_tasks_db.models import DBTaskResult

from occviz.concurrency.writer import ActorContext
from occviz.jobs.models import Event, EventBatch, Job
from occviz.jobs.recorder import BATCH_COLUMNS, _insert_batch
from occviz.jobs.runner import run_job
from occviz.jobs.tasks import create_job, launch
from tests.conftest import ROOT
from tests.helpers import events

pytestmark = pytest.mark.django_db(transaction=True)


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.05) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError("timed out waiting")


def run_in_thread(job_id: int) -> None:
    try:
        run_job(job_id)
    finally:
        connections.close_all()


def test_a_cancelled_job_stops_its_actors_and_keeps_its_events() -> None:
    job = create_job("counter", {"strategy": "occ", "writers": 4, "seconds": 60, "think_ms": 2})
    runner = threading.Thread(target=run_in_thread, args=(job.pk,))
    runner.start()
    wait_for(lambda: Job.objects.get(pk=job.pk).last_seq > 50)
    asked = time.monotonic()
    Job.objects.get(pk=job.pk).request_cancel()
    runner.join(timeout=10)
    assert not runner.is_alive(), "the actors must stop within moments of a cancel"
    assert time.monotonic() - asked < 5
    job.refresh_from_db()
    assert job.status == Job.Status.CANCELLED
    assert job.summary["stopped_by"] == "cancelled"
    assert job.summary["invariant_ok"] is True
    stored = Event.objects.filter(job=job).count()
    assert stored == job.last_seq > 50
    # Numbered 1..n without a hole.
    assert list(Event.objects.filter(job=job).order_by("seq").values_list("seq", flat=True)) == list(
        range(1, stored + 1)
    )
    time.sleep(0.3)
    assert Event.objects.filter(job=job).count() == stored, "no actor writes after the job ended"


def test_a_job_deleted_while_running_stops_and_leaves_no_events_behind() -> None:
    # Events carry no foreign-key constraint (it cost more than the insert): the recorder
    # itself must refuse to store events for a job that is gone.
    job = create_job("counter", {"strategy": "occ", "writers": 2, "seconds": 60, "think_ms": 2})
    runner = threading.Thread(target=run_in_thread, args=(job.pk,))
    runner.start()
    wait_for(lambda: Job.objects.get(pk=job.pk).last_seq > 20)
    Job.objects.filter(pk=job.pk).delete()
    runner.join(timeout=10)
    assert not runner.is_alive(), "the actors must stop once their job is deleted"
    assert not Event.objects.filter(job_id=job.pk).exists()
    assert not Job.objects.filter(pk=job.pk).exists()


def test_a_job_deleted_while_its_recorder_stores_a_batch_is_deleted_with_the_batch() -> None:
    """The recorder holds the job's row while it stores a batch; a deletion then waits for it, and takes the batch."""
    job = Job.objects.create(scenario="counter", status=Job.Status.RUNNING)
    columns: dict[str, list[Any]] = {name: [None if nullable else 0] for name, (_, nullable) in BATCH_COLUMNS.items()}
    columns |= {"kind": ["committed"], "detail": [None]}
    held, go = threading.Event(), threading.Event()
    deleted: list[object] = []

    def store_a_batch() -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("UPDATE jobs_job SET last_seq = last_seq + 1 WHERE id = %s", [job.pk])
                _insert_batch(job.pk, 1, 1, columns)
                held.set()
                go.wait(10)
        finally:
            connection.close()

    def delete() -> None:
        try:
            deleted.append(Job.objects.filter(pk=job.pk).delete())
        except Exception as error:
            deleted.append(error)
        finally:
            connection.close()

    recorder = threading.Thread(target=store_a_batch)
    recorder.start()
    assert held.wait(10)
    deleter = threading.Thread(target=delete)
    deleter.start()
    deleter.join(0.5)
    assert deleter.is_alive(), "the deletion waits for the job's row"
    go.set()
    recorder.join(10)
    deleter.join(10)
    assert deleted and not isinstance(deleted[0], Exception), deleted
    assert not Job.objects.filter(pk=job.pk).exists() and not EventBatch.objects.filter(job_id=job.pk).exists()


def test_a_job_cancelled_while_queued_never_runs() -> None:
    job = create_job("counter", {"strategy": "occ", "writers": 2, "increments": 5})
    job.request_cancel()
    assert job.status == Job.Status.CANCELLED
    assert run_job(job.pk).status == Job.Status.CANCELLED
    assert not Event.objects.filter(job=job).exists()


def test_a_job_runs_only_once() -> None:
    job = create_job("counter", {"strategy": "atomic", "writers": 2, "increments": 5})
    assert run_job(job.pk).status == Job.Status.SUCCEEDED
    seq = Job.objects.get(pk=job.pk).last_seq
    assert run_job(job.pk).status == Job.Status.SUCCEEDED
    assert Job.objects.get(pk=job.pk).last_seq == seq == 10


def test_the_time_limit_stops_a_job(settings) -> None:  # type: ignore[no-untyped-def]
    settings.OCCVIZ_MAX_SECONDS = 1
    job = run_job(create_job("counter", {"strategy": "occ", "writers": 2, "increments": 10_000, "think_ms": 0.1}).pk)
    assert job.status == Job.Status.SUCCEEDED
    assert job.summary["stopped_by"] == "time limit"
    assert job.summary["duration_s"] < 3
    assert job.summary["invariant_ok"] is True


def test_events_carry_versions_and_timings() -> None:
    job = run_job(create_job("counter", {"strategy": "occ", "writers": 2, "increments": 10}).pk)
    commit = events(job, "committed")[0]
    assert commit.version_written == commit.version_read + 1
    assert commit.value_written == commit.value_read + 1
    assert commit.latency_ms > 0 and commit.duration_ms > 0 and commit.t_ms >= 0
    reads = events(job, "read")
    assert all(event.version_read is not None and event.duration_ms is not None for event in reads)
    assert [event.seq for event in events(job)] == list(range(1, job.last_seq + 1))


def test_the_job_row_says_when_its_actors_were_released_and_its_event_times_count_from_there() -> None:
    job = Job.objects.get(pk=run_job(create_job("counter", {"strategy": "occ", "writers": 3, "increments": 20}).pk).pk)
    assert job.started_at is not None and job.released_at is not None and job.finished_at is not None
    # Set up and connected after the start; every event recorded after the release and before the end.
    assert job.started_at < job.released_at < job.finished_at
    last = max(event.t_ms for event in events(job))
    assert job.released_at.timestamp() + last / 1000.0 <= job.finished_at.timestamp()


@pytest.mark.slow
def test_a_launched_job_is_run_by_a_db_worker(database_url: str) -> None:
    job = launch("counter", {"strategy": "occ", "writers": 4, "increments": 20})
    assert DBTaskResult.objects.filter(args_kwargs__args=[job.pk]).exists(), "launch enqueues a django.tasks task"
    worker = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "db_worker", "--no-reload", "--interval", "0.1"]
        + ["--no-startup-delay", "--batch"],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": database_url},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output, _ = worker.communicate(timeout=120)
    assert worker.returncode == 0, output
    job.refresh_from_db()
    assert job.status == Job.Status.SUCCEEDED, output
    assert job.summary["committed"] + job.summary["gave_up"] == 80
    assert job.summary["invariant_ok"] is True


def test_events_are_stored_a_batch_a_flush_and_read_one_by_one() -> None:
    job = create_job("counter", {"strategy": "none", "writers": 4, "seconds": 0.6, "think_ms": 1, "rows": 2})
    job = run_job(job.pk)
    batches = list(EventBatch.objects.filter(job=job).order_by("seq_from"))
    assert len(batches) >= 3, "a 0.6 s job flushes several times (every 0.1 s)"
    # Contiguous ranges, each as long as its arrays, ending at the job's last_seq.
    assert batches[0].seq_from == 1 and batches[-1].seq_to == job.last_seq
    for before, after in itertools.pairwise(batches):
        assert after.seq_from == before.seq_to + 1
    for batch in batches:
        size = batch.seq_to - batch.seq_from + 1
        assert {len(batch.t_us), len(batch.kind), len(batch.latency_us), len(batch.version_written)} == {size}
    # The view gives back exactly what the arrays hold, NULLs and details included.
    stored = events(job)
    assert [event.seq for event in stored] == list(range(1, job.last_seq + 1))
    last = batches[-1]
    for position, event in enumerate(stored[last.seq_from - 1 :]):
        assert (event.kind, event.t_ms, event.version_written) == (
            last.kind[position],
            last.t_us[position] / 1000,
            last.version_written[position],
        )
    reads = [event for event in stored if event.kind == "read"]
    assert all(event.version_written is None and event.latency_ms is None for event in reads)
    # `none` with think time overwrites other writers: those commits say by how many.
    overwriting = [event for event in stored if event.detail]
    assert overwriting and all(event.kind == "committed" and event.detail["overwrote"] >= 1 for event in overwriting)


def test_analyze_leaves_the_event_arrays_alone() -> None:
    # Autovacuum analyzes the batch table as jobs fill it: statistics on the arrays would
    # mean detoasting every sampled batch (seconds of a core beside the running jobs).
    job = run_job(create_job("counter", {"strategy": "occ", "writers": 2, "increments": 50}).pk)
    assert EventBatch.objects.filter(job=job).exists()
    with connections["default"].cursor() as cursor:
        cursor.execute("ANALYZE jobs_eventbatch")
        cursor.execute("SELECT attname FROM pg_stats WHERE tablename = 'jobs_eventbatch'")
        analyzed = {name for (name,) in cursor.fetchall()}
    assert analyzed == {"id", "job_id", "seq_from", "seq_to"}


def test_the_admin_lists_a_jobs_events_and_shows_one(client) -> None:  # type: ignore[no-untyped-def]
    User.objects.create_superuser("root", "root@example.com", "pw-for-root")
    client.login(username="root", password="pw-for-root")
    job = run_job(create_job("counter", {"strategy": "occ", "writers": 2, "increments": 5}).pk)
    other = run_job(create_job("counter", {"strategy": "atomic", "writers": 1, "increments": 3}).pk)
    everything = client.get("/admin/jobs/event/")
    assert everything.status_code == 200
    assert f"{job.last_seq + other.last_seq} events" in everything.content.decode()
    one_job = client.get(f"/admin/jobs/event/?job={other.pk}")
    assert one_job.status_code == 200
    assert f"{other.last_seq} events" in one_job.content.decode()
    event = Event.objects.get(job=job, seq=3)
    page = client.get(f"/admin/jobs/event/{event.pk}/change/")
    assert page.status_code == 200
    assert event.kind in page.content.decode()
    assert client.get(f"/admin/jobs/event/{(job.pk << 32) + 10_000}/change/").status_code == 302  # no such event


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning needs two CPUs to choose from")
def test_when_pinned_a_running_jobs_threads_share_one_cpu(settings) -> None:  # type: ignore[no-untyped-def]
    from occviz.jobs.affinity import one_cpu

    settings.OCCVIZ_PIN_ACTORS = True
    before = os.sched_getaffinity(0)
    seen: list[set[int]] = []

    def started_inside() -> None:
        seen.append(os.sched_getaffinity(0))

    with one_cpu() as cpu:
        thread = threading.Thread(target=started_inside)
        thread.start()
        thread.join()
    assert cpu in before and seen == [{cpu}]
    assert os.sched_getaffinity(0) == before, "the runner's thread gets its CPUs back"

    settings.OCCVIZ_PIN_ACTORS = False
    with one_cpu() as cpu:
        thread = threading.Thread(target=started_inside)
        thread.start()
        thread.join()
    assert cpu is None and seen[-1] == before


def test_while_jobs_run_the_interpreter_lock_changes_hands_quickly(monkeypatch: pytest.MonkeyPatch) -> None:
    from occviz.jobs.affinity import JOB_SWITCH_INTERVAL_S, quick_handoffs

    before = sys.getswitchinterval()
    assert before > JOB_SWITCH_INTERVAL_S
    with quick_handoffs():
        assert sys.getswitchinterval() == pytest.approx(JOB_SWITCH_INTERVAL_S)
        with quick_handoffs():  # a second job in the same process
            pass
        assert sys.getswitchinterval() == pytest.approx(JOB_SWITCH_INTERVAL_S), "still one job running"
    assert sys.getswitchinterval() == before

    seen: list[float] = []
    pause = ActorContext.pause

    def watched_pause(writer: ActorContext, ms: float) -> bool:
        seen.append(sys.getswitchinterval())
        return pause(writer, ms)

    monkeypatch.setattr(ActorContext, "pause", watched_pause)
    run_job(create_job("counter", {"strategy": "none", "writers": 2, "increments": 3}).pk)
    assert len(seen) == 6 and all(value == pytest.approx(JOB_SWITCH_INTERVAL_S) for value in seen)
    assert sys.getswitchinterval() == before


def test_the_recorder_stores_what_it_was_given_extremes_and_none_included() -> None:
    # Batches travel as binary arrays with a stand-in for NULL: every value must come back as recorded.
    from occviz.jobs.recorder import EventRecorder

    job = create_job("counter", {"strategy": "occ", "writers": 1, "increments": 1})
    recorder = EventRecorder(job.pk)
    recorder.start_clock()
    big = 2**62
    recorder.record(1, 1, 1, "read", 7, version_read=1, value_read=-big, duration_ms=0.0004)
    recorder.record(2, 1, 1, "committed", 7, version_read=1, version_written=2, value_read=-1, value_written=big)
    recorder.record(3, 2, 9, "gave_up")
    recorder.record(4, 0, 0, "error", detail={"message": 'quote " and \\ backslash'})
    recorder.flush()
    stored = events(Job.objects.get(pk=job.pk))
    assert [(e.seq, e.actor, e.op, e.attempt, e.kind, e.row) for e in stored] == [
        (1, 1, 1, 1, "read", 7),
        (2, 2, 1, 1, "committed", 7),
        (3, 3, 2, 9, "gave_up", None),
        (4, 4, 0, 0, "error", None),
    ]
    assert (stored[0].value_read, stored[0].version_written, stored[0].duration_ms) == (-big, None, 0.0)
    assert (stored[1].value_written, stored[1].value_read, stored[1].latency_ms) == (big, -1, None)
    assert stored[2].version_read is None and stored[2].detail == {}
    assert stored[3].detail == {"message": 'quote " and \\ backslash'}
    assert all(e.t_ms >= 0 for e in stored) and Job.objects.get(pk=job.pk).last_seq == 4
