"""`manage.py serve`, what `make run` runs: it serves, prints a working sign-in, keeps its children up,
refuses what would disturb another installation before it changes anything, and stops cleanly on Ctrl-C.

The harness here (a serve child process and a signed-in dashboard client) is shared with the fault
suite, tests/test_faults.py.
"""

from __future__ import annotations

import http.cookiejar
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from occviz.connections import machine_cores
from occviz.management.commands.serve import ensure_demo_data
from occviz.store.kinds import KINDS
from occviz.supervisor import AlreadyServing, ServeAddress, ServeLock, Supervisor
from tests.conftest import ROOT, manage
from tests.servers import free_port


def wait_until[T](probe: Callable[[], T], timeout: float, what: str, every: float = 0.05) -> tuple[T, float]:
    """Call `probe` until it returns something true; that value and the seconds it took."""
    start = time.monotonic()
    while True:
        value = probe()
        if value:
            return value, time.monotonic() - start
        if time.monotonic() - start > timeout:
            pytest.fail(f"{what}: not within {timeout} s (last seen: {value!r})")
        time.sleep(every)


class Served:
    """A `manage.py serve` child process: its output as it comes, its sign-in, its children."""

    def __init__(self, env: dict[str, str], *, workers: int | None = 2, args: tuple[str, ...] = ()) -> None:
        self.port, self.tls_port = free_port(), free_port()
        self.url, self.tls_url = f"http://127.0.0.1:{self.port}", f"https://127.0.0.1:{self.tls_port}"
        self.process = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "serve", "--port", str(self.port)]
            + (["--workers", str(workers)] if workers is not None else [])
            + ["--tls-port", str(self.tls_port), *args],
            cwd=ROOT,
            env={**env, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.password = ""

    def _read(self) -> None:
        assert self.process.stdout is not None
        with self.process.stdout:
            for line in self.process.stdout:
                self._lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self._lines)

    def wait_for(self, pattern: str, timeout: float = 30.0) -> re.Match[str]:
        """The first match of `pattern` in the output, waiting for it."""

        def seen() -> re.Match[str] | None:
            if self.process.poll() is not None and not self._reader.is_alive():
                pytest.fail(f"serve exited with {self.process.returncode} before {pattern!r}:\n{self.output}")
            return re.search(pattern, self.output)

        try:
            match, _ = wait_until(seen, timeout, f"serve printing {pattern!r}")
        except pytest.fail.Exception as missing:
            pytest.fail(f"{missing}\n--- serve's output ---\n{self.output}")
        return match

    def started(self, timeout: float = 60.0) -> Served:
        """Wait for the banner (its demo password) and for the web server to answer."""
        self.password = self.wait_for(r"Sign in as 'demo' with password '([^']+)'", timeout).group(1)

        def answers() -> bool:
            try:
                with urllib.request.urlopen(f"{self.url}/accounts/login/", timeout=2) as response:
                    return bool(response.status == 200)
            except OSError:
                return False

        wait_until(answers, 30, "the web server answering", every=0.1)
        return self

    def children(self) -> list[psutil.Process]:
        return psutil.Process(self.process.pid).children()

    def worker(self, runner: str) -> psutil.Process:
        """The worker process that records itself as `runner` on the jobs it runs."""
        found = [child for child in self.children() if child.cmdline()[-2:] == ["--worker-id", runner]]
        assert len(found) == 1, (runner, [child.cmdline() for child in self.children()])
        return found[0]

    def stop(self, signum: int = signal.SIGINT, timeout: float = 30.0) -> str:
        """Signal serve and wait for it to exit; its whole output."""
        self.process.send_signal(signum)
        self.process.wait(timeout=timeout)
        self._reader.join(timeout=5)
        return self.output

    def kill(self) -> None:
        if self.process.poll() is None:
            for child in self.children():
                child.kill()
            self.process.kill()
            self.process.wait()
        self._reader.join(timeout=5)


class Dashboard:
    """A person at the dashboard, signed in, without a browser: the launch form posted as the page posts it."""

    def __init__(self, base_url: str, password: str, username: str = "demo") -> None:
        self.base_url = base_url
        self.cookies = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.cookies))
        landed = self._post("/accounts/login/", {"username": username, "password": password})
        self.signed_in = "/accounts/login/" not in landed

    def _post(self, path: str, data: dict[str, Any]) -> str:
        """POST a form (after a GET for its CSRF cookie); the URL it ends on."""
        with self.opener.open(f"{self.base_url}{path}", timeout=10) as page:
            page.read()
        token = next(cookie.value for cookie in self.cookies if cookie.name == "csrftoken")
        body = urllib.parse.urlencode({**data, "csrfmiddlewaretoken": token}).encode()
        with self.opener.open(f"{self.base_url}{path}", body, timeout=10) as response:
            response.read()
            return str(response.geturl())

    def launch(self, **params: Any) -> int:
        """Launch a counter race; its job id."""
        url = self._post("/jobs/new/counter/", params)
        match = re.search(r"/jobs/(\d+)/$", url)
        assert match, f"the launch did not lead to a job page: {url}"
        return int(match.group(1))


def serve_environment(database_url: str | None, data_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a serve (or runjob) child: its own data folder (for its lock and key), the given database."""
    values = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "SECRET_KEY", "ALLOWED_HOSTS")}
    values["OCCVIZ_DATA_DIR"] = str(data_dir)
    if database_url:
        values["DATABASE_URL"] = database_url
    return {**values, **extra}


def gone(pid: int) -> bool:
    """Whether the process has ended (a zombie not yet reaped by init counts as ended)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def signs_in(served: Served) -> bool:
    """Whether the demo sign-in works now (the web server answers and reaches the database)."""
    try:
        return Dashboard(served.url, served.password).signed_in
    except OSError:
        return False


@pytest.fixture
def start_serve() -> Iterator[Callable[..., Served]]:
    """`start_serve(env, workers=2)`: a serve child, started; killed at the end if a test left it running."""
    started: list[Served] = []

    def start(env: dict[str, str], **options: Any) -> Served:
        served = Served(env, **options)
        started.append(served)
        return served.started()

    yield start
    for served in started:
        served.kill()


def test_a_second_serve_lock_on_the_same_data_folder_names_the_first(tmp_path: Path) -> None:
    first, second = ServeLock(tmp_path), ServeLock(tmp_path)
    first.acquire(ServeAddress("http://127.0.0.1:8000/", 1, "https://127.0.0.1:8443/"))
    with pytest.raises(AlreadyServing, match=re.escape("http://127.0.0.1:8000/ (pid 1), https://127.0.0.1:8443/")):
        second.acquire(ServeAddress("http://127.0.0.1:8001/", 2))
    first.release()
    second.acquire(ServeAddress("http://127.0.0.1:8001/", 2))
    second.release()


def test_the_serve_lock_tells_a_reader_the_holders_addresses_and_keeps_its_first_line(tmp_path: Path) -> None:
    lock, reader = ServeLock(tmp_path), ServeLock(tmp_path)
    assert reader.holder() is None, "no file yet"
    address = ServeAddress("http://127.0.0.1:8000/", 1, "https://127.0.0.1:9443/")
    lock.acquire(address)
    assert reader.holder() == address
    # The line readers of the file have always matched comes first, as it was.
    assert lock.path.read_text().splitlines()[0] == "http://127.0.0.1:8000/ (pid 1)"
    with pytest.raises(AlreadyServing):  # a reader's look let go of nothing
        ServeLock(tmp_path).acquire(ServeAddress("http://127.0.0.1:8001/", 2))
    lock.release()
    assert reader.holder() is None
    # What a serve killed outright leaves: its addresses in a file no one holds.
    lock.path.write_text(address.text())
    assert reader.holder() is None


@pytest.mark.django_db
def test_serve_makes_demo_objects_of_every_kind_once() -> None:
    ensure_demo_data()
    ensure_demo_data()  # each start: the same objects, not new ones
    for kind in KINDS:
        stored = set(kind.model._default_manager.filter(namespace="demo").values_list("name", flat=True))
        assert stored == {demo["name"] for demo in kind.demo} != set(), kind.plural


@pytest.mark.slow
def test_a_child_that_stops_is_started_again_with_growing_backoff() -> None:
    lines: list[str] = []
    supervisor = Supervisor(lines.append)
    child = supervisor.add("quitter", [sys.executable, "-c", "raise SystemExit(3)"], dict(os.environ))
    supervisor.start()
    wait_until(lambda: supervisor.tend() or child.restarts == 2, 10, "two restarts")
    stops = [line for line in lines if "exited with status 3" in line]
    assert "starting it again in 1 s" in stops[0]
    assert "starting it again in 2 s" in stops[1]
    assert lines[-1].startswith(f"quitter started again (pid {child.process and child.process.pid}), restart 2")
    assert str(supervisor) == "restarts: quitter 2"
    supervisor.stop(supervisor.children, grace_s=5)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_serve_runs_the_app_and_its_workers_and_stops_on_ctrl_c(
    database_url: str, tmp_path: Path, start_serve: Callable[..., Served]
) -> None:
    from django.contrib.auth import authenticate

    # No --workers, no OCCVIZ_WORKERS: one worker a core, at least 2.
    environment = serve_environment(database_url, tmp_path)
    environment.pop("OCCVIZ_WORKERS", None)
    served = start_serve(environment, workers=None)
    assert authenticate(username="demo", password=served.password) is not None
    children = served.children()
    commands = sorted(" ".join(child.cmdline()[1:3]) for child in children)
    workers = max(2, machine_cores())
    assert commands == ["-m daphne", *[f"{ROOT / 'manage.py'} worker"] * workers]
    output = served.stop(signal.SIGINT)
    assert served.process.returncode == 0, output
    restarts = ", ".join(f"worker w{n} 0" for n in range(1, workers + 1))
    assert f"restarts: {restarts}, web server 0" in output
    assert output.rstrip().endswith("occviz stopped.")
    assert all(gone(child.pid) for child in children)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_serve_stopped_by_sigterm_cancels_only_the_jobs_its_own_workers_run(
    database_url: str, tmp_path: Path, start_serve: Callable[..., Served]
) -> None:
    from occviz.jobs.models import Job

    first = start_serve(serve_environment(database_url, tmp_path / "first"), workers=1)
    second = start_serve(serve_environment(database_url, tmp_path / "second"), workers=1)
    dashboard = Dashboard(first.url, second.password)  # the second serve reset the shared demo sign-in
    assert dashboard.signed_in
    launched = [dashboard.launch(strategy="occ", writers=2, seconds=30, think_ms=20) for _ in range(2)]
    runjob = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "runjob", "counter", "--strategy", "occ", "--writers", "2"]
        + ["--seconds", "30", "--think-ms", "20"],
        cwd=ROOT,
        env=serve_environment(database_url, tmp_path / "runjob"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        running = Job.objects.filter(status=Job.Status.RUNNING)
        wait_until(lambda: running.count() == 3, 30, "two serve jobs and a runjob job running")
        runners = dict(running.values_list("runner", "id"))
        [own] = [job for runner, job in runners.items() if runner.endswith(f".{first.process.pid}:w1")]

        output = first.stop(signal.SIGTERM)
        assert first.process.returncode == 0, output
        assert "Asked 1 running job(s) to cancel." in output
        assert Job.objects.get(pk=own).status == Job.Status.CANCELLED
        others = Job.objects.exclude(pk=own).filter(pk__in=runners.values())
        assert sorted(others.values_list("status", "cancel_requested")) == [(Job.Status.RUNNING, False)] * 2
        assert set(launched) <= set(runners.values())
    finally:
        runjob.send_signal(signal.SIGINT)
        runjob.wait(timeout=30)


@pytest.mark.slow
def test_serve_starts_its_embedded_postgresql_again_if_it_dies_and_stops_it_on_sighup(
    start_serve: Callable[..., Served],
) -> None:
    parent = ROOT / ".pgdata" / "tests"  # inside the project, as the embedded server wants
    parent.mkdir(parents=True, exist_ok=True)
    data_dir = Path(tempfile.mkdtemp(prefix="serve-", dir=parent))
    try:
        served = start_serve(serve_environment(None, data_dir), workers=1)
        postmaster = psutil.Process(int((data_dir / "data" / "postmaster.pid").read_text().split()[0]))

        postmaster.kill()
        restarted = served.wait_for(
            rf"serve: PostgreSQL \(pid {postmaster.pid}\) had stopped: it runs again \(pid (\d+)\)", 30
        )
        wait_until(lambda: signs_in(served), 30, "signing in again")

        output = served.stop(signal.SIGHUP)
        assert served.process.returncode == 0, output
        assert "PostgreSQL stopped.\noccviz stopped." in output
        wait_until(lambda: gone(int(restarted.group(1))), 5, "the restarted postmaster gone")
        assert not (data_dir / "data" / "postmaster.pid").exists()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.mark.django_db(transaction=True)
def test_serve_refuses_a_public_address_without_secret_key_and_allowed_hosts_before_changing_anything(
    database_url: str, tmp_path: Path
) -> None:
    from django.contrib.auth.models import User

    refused = manage(
        "serve", "--host", "0.0.0.0", "--port", str(free_port()), env=serve_environment(database_url, tmp_path)
    )
    assert refused.returncode == 2, refused.stderr
    assert "Refusing to serve on 0.0.0.0" in refused.stderr
    assert "SECRET_KEY is not set" in refused.stderr and "ALLOWED_HOSTS is not set" in refused.stderr
    assert not User.objects.filter(username="demo").exists()
    assert not (tmp_path / "serve.lock").exists()


@pytest.mark.django_db(transaction=True)
def test_serve_refuses_a_port_in_use_before_changing_anything(database_url: str, tmp_path: Path) -> None:
    from django.contrib.auth.models import User

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        refused = manage("serve", "--port", str(port), env=serve_environment(database_url, tmp_path))
    assert refused.returncode == 2, refused.stderr
    assert f"Cannot listen on 127.0.0.1:{port}: Address already in use." in refused.stderr
    assert not User.objects.filter(username="demo").exists()


@pytest.mark.django_db(transaction=True)
def test_a_shutdown_step_survives_a_connection_broken_under_it() -> None:
    """What a PostgreSQL restart does to serve's connection: the step reconnects and runs once more."""
    import psycopg
    from django.contrib.auth.models import User
    from django.db import connection

    from occviz.management.commands.serve import with_database

    connection.ensure_connection()
    assert connection.connection is not None
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [connection.connection.info.backend_pid])
    assert with_database(lambda: User.objects.count()) == 0


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_serve_with_two_web_processes_shares_the_port_and_keeps_answering_while_one_restarts(
    database_url: str, tmp_path: Path, start_serve: Callable[..., Served]
) -> None:
    served = start_serve(serve_environment(database_url, tmp_path), workers=1, args=("--web-processes", "2"))
    webs = [child for child in served.children() if child.cmdline()[1:3] == ["-m", "daphne"]]
    assert len(webs) == 2, [child.cmdline() for child in served.children()]
    # Only the first serves HTTPS; both accept from the one HTTP socket serve holds.
    assert [any(arg.startswith("ssl:") for arg in web.cmdline()) for web in webs] == [True, False]

    webs[0].kill()
    # While the first waits out its backoff, the second answers every request on the shared port.
    for _ in range(10):
        with urllib.request.urlopen(f"{served.url}/accounts/login/", timeout=5) as response:
            assert response.status == 200
    served.wait_for(r"web server 1 \(pid \d+\) killed by SIGKILL")
    served.wait_for(r"web server 1 started again")
    again = [child for child in served.children() if child.cmdline()[1:3] == ["-m", "daphne"]]
    assert len(again) == 2 and webs[1].pid in {child.pid for child in again}
    output = served.stop(signal.SIGINT)
    assert served.process.returncode == 0, output
    assert "web server 1 1, web server 2 0" in output


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("--web-processes", "0"), "--web-processes 0: give between 1 and 8."),
        (("--web-processes", "9"), "--web-processes 9: give between 1 and 8."),
        (("--web-processes", "2", "--host", "::1"), "several web processes share an IPv4 socket only"),
    ],
)
def test_serve_refuses_a_bad_number_of_web_processes(
    args: tuple[str, ...], error: str, database_url: str, tmp_path: Path
) -> None:
    refused = manage("serve", *args, env=serve_environment(database_url, tmp_path))
    assert refused.returncode == 2, refused.stderr
    assert error in refused.stderr


def _workers_and_reserve(cores: int, **env: str) -> tuple[int, int]:
    """The settings' OCCVIZ_WORKERS and OCCVIZ_RESERVED_CONNECTIONS in a new process seeing `cores` cores."""
    code = (
        f"import os; os.sched_getaffinity = lambda pid: set(range({cores})); import django; django.setup(); "
        "from django.conf import settings; print(settings.OCCVIZ_WORKERS, settings.OCCVIZ_RESERVED_CONNECTIONS)"
    )
    environment = {k: v for k, v in os.environ.items() if k not in ("OCCVIZ_WORKERS", "OCCVIZ_RESERVED_CONNECTIONS")}
    environment.update(DJANGO_SETTINGS_MODULE="occviz.settings", REDIS_URL="", **env)
    printed = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=60
    )
    assert printed.returncode == 0, printed.stderr
    workers, reserve = printed.stdout.split()
    return int(workers), int(reserve)


def test_serve_starts_a_worker_a_core_at_least_two_and_the_reserve_grows_with_them() -> None:
    # Each worker beyond 2 holds 3 connections more (its own, its channel layer's pool of 2).
    assert _workers_and_reserve(1) == (2, 32)
    assert _workers_and_reserve(2) == (2, 32)
    assert _workers_and_reserve(8) == (8, 32 + 6 * 3)
    assert _workers_and_reserve(64) == (32, 32 + 30 * 3)
    # WORKERS= (OCCVIZ_WORKERS) still chooses, and a reserve that is set stays as set.
    assert _workers_and_reserve(8, OCCVIZ_WORKERS="3") == (3, 35)
    assert _workers_and_reserve(8, OCCVIZ_RESERVED_CONNECTIONS="40") == (8, 40)
