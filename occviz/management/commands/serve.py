"""serve: everything `make run` needs, in one foreground command, kept up until it is asked to stop.

Before it changes anything it refuses, with the reason, a public address without
SECRET_KEY and ALLOWED_HOSTS, a data folder another serve holds, and a port in use.
Then it migrates, creates the demo data and a demo sign-in (printed), and supervises
the job workers (`manage.py worker`) and the web server (Daphne, on HTTP and, with the
certificate from occviz/tls.py, on HTTPS for kubectl): one that stops is
started again with backoff (occviz/supervisor.py), and so is the embedded PostgreSQL.
Meanwhile it ends the jobs whose runner stopped (every few seconds) and prunes old
events (at start, then daily). Ctrl-C, SIGTERM or SIGHUP stop it in order: the jobs
its own workers run are asked to cancel, workers finish, the web server stops, and the
embedded PostgreSQL stops unless another process still uses it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, InterfaceError, connections

from occviz import embedded
from occviz.connections import Reserve, default_reserve
from occviz.deploy import public_bind_problems
from occviz.jobs.models import Job
from occviz.jobs.reaper import start_reaper
from occviz.jobs.retention import prune_events
from occviz.management.schema import apply_migrations
from occviz.store.kinds import KINDS
from occviz.supervisor import AlreadyServing, Child, ServeAddress, ServeLock, Supervisor
from occviz.tls import LISTEN_BACKLOG, TlsFiles, daphne_endpoint, fingerprint, http_endpoint, tls_files

MANAGE = str(Path(settings.BASE_DIR) / "manage.py")
DEMO_USER = "demo"
DEMO_NAMESPACE = "demo"
GRACE_S = 10.0
TEND_EVERY_S = 0.2
REAP_EVERY_S = 2.0
PRUNE_EVERY_S = 24 * 3600.0


def ensure_demo_data() -> None:
    """Each kind's demo objects in the `demo` namespace, to look at in the admin and to contend on from curl."""
    for kind in KINDS:
        for demo in kind.demo:
            fields = dict(demo)
            name = fields.pop("name")
            kind.model._default_manager.get_or_create(namespace=DEMO_NAMESPACE, name=name, defaults=fields)


def reset_demo_user() -> str:
    """The demo sign-in, with a fresh password each start (only its hash is stored)."""
    password = secrets.token_urlsafe(9)
    user, _ = get_user_model().objects.get_or_create(username=DEMO_USER, defaults={"is_staff": True})
    user.is_staff = True
    user.is_superuser = True
    user.set_password(password)
    user.save()
    return password


def port_problem(host: str, port: int) -> str:
    """Why Daphne could not listen on host:port ("" if it can), found by binding it as Daphne will."""
    name = host.strip("[]")
    family = socket.AF_INET6 if ":" in name else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Twisted does
        try:
            probe.bind((name, port))
        except OSError as error:
            return error.strerror or str(error)
    return ""


def host_port(host: str, port: int) -> str:
    """host:port as it goes in a URL (an IPv6 address in brackets)."""
    return f"[{host.strip('[]')}]:{port}" if ":" in host else f"{host}:{port}"


@contextlib.contextmanager
def shared_listener(host: str, port: int, web_processes: int) -> Iterator[socket.socket | None]:
    """The HTTP socket several web processes accept from (Daphne's --fd), listening as serve listens; None for one.

    One web process listens by itself, on IPv4 or IPv6 (Daphne's tcp endpoint).
    """
    if web_processes == 1:
        yield None
        return
    try:
        listener = socket.create_server((host, port), backlog=LISTEN_BACKLOG)
    except OSError as error:
        problem = error.strerror or str(error)
        raise CommandError(f"Cannot listen on {host_port(host, port)}: {problem}.", returncode=2) from None
    with listener:
        yield listener


def with_database[T](action: Callable[[], T]) -> T:
    """`action()`, again on a new connection if the first attempt met a broken one (PostgreSQL restarted)."""
    try:
        return action()
    except (DatabaseError, InterfaceError):
        connections.close_all()
        return action()


class Command(BaseCommand):
    help = "Serve occviz: migrate, demo data, job workers and the web server, until Ctrl-C."
    _postgres_failing = False
    _postmaster: int | None = None

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument(
            "--tls-port",
            type=int,
            default=settings.OCCVIZ_TLS_PORT,
            help=f"also serve HTTPS here, as kubectl needs (default {settings.OCCVIZ_TLS_PORT}; 0: no HTTPS)",
        )
        parser.add_argument(
            "--workers",
            type=int,
            default=settings.OCCVIZ_WORKERS,
            help=f"job worker processes (default {settings.OCCVIZ_WORKERS}: OCCVIZ_WORKERS, else one a core, >= 2)",
        )
        parser.add_argument(
            "--web-processes",
            type=int,
            default=settings.OCCVIZ_WEB_PROCESSES,
            help="web server processes sharing the HTTP port, a class's sockets spread over them (IPv4 only above 1)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        host, port, tls_port, workers = options["host"], options["port"], options["tls_port"], options["workers"]
        web_processes = options["web_processes"]
        if not 1 <= port <= 65535:
            raise CommandError(f"--port {port} is not a TCP port (1-65535).", returncode=2)
        if not 0 <= tls_port <= 65535 or tls_port == port:
            raise CommandError(
                f"--tls-port {tls_port}: give another TCP port than --port (1-65535), or 0 for no HTTPS.", returncode=2
            )
        if not 1 <= workers <= 32:
            raise CommandError(f"--workers {workers}: give between 1 and 32 worker processes.", returncode=2)
        if not 1 <= web_processes <= 8:
            raise CommandError(f"--web-processes {web_processes}: give between 1 and 8.", returncode=2)
        if web_processes > 1 and ":" in host:
            raise CommandError(
                f"--web-processes {web_processes} on {host}: several web processes share an IPv4 socket only; "
                "give an IPv4 --host or one web process.",
                returncode=2,
            )
        reserve = Reserve(
            # Unless set, the reserve grows with the workers (the children read it from OCCVIZ_WORKERS too).
            settings.OCCVIZ_RESERVED_CONNECTIONS
            if "OCCVIZ_RESERVED_CONNECTIONS" in os.environ
            else default_reserve(workers, not settings.REDIS_URL),
            workers,
            layer_on_postgres=not settings.REDIS_URL,
            web_processes=web_processes,
        )
        if reserve.problem():
            raise CommandError(reserve.problem(), returncode=2)
        problems = public_bind_problems(host)
        if problems:
            raise CommandError(
                f"Refusing to serve on {host}, an address others can reach:\n"
                + "".join(f"  - {problem}\n" for problem in problems),
                returncode=2,
            )
        address = host_port(host, port)
        lock = ServeLock(settings.DATA_DIR)
        try:
            https = f"https://{host_port(host, tls_port)}/" if tls_port else ""
            lock.acquire(ServeAddress(f"http://{address}/", os.getpid(), https))
        except AlreadyServing as holder:
            raise CommandError(
                f"Another serve already runs on the data folder {settings.DATA_DIR}: {holder}. "
                "Stop it first, or give this one another OCCVIZ_DATA_DIR."
            ) from None
        try:
            for listen in [port, tls_port] if tls_port else [port]:
                problem = port_problem(host, listen)
                if problem:
                    raise CommandError(f"Cannot listen on {host_port(host, listen)}: {problem}.", returncode=2)
            tls = None
            if tls_port:
                try:
                    tls = tls_files()
                except ImproperlyConfigured as error:
                    raise CommandError(f"Cannot serve HTTPS: {error}", returncode=2) from None
            with shared_listener(host, port, web_processes) as listener:
                self._serve(host, port, address, workers, tls_port, tls, web_processes, listener)
        finally:
            lock.release()

    def _serve(
        self,
        host: str,
        port: int,
        address: str,
        workers: int,
        tls_port: int,
        tls: TlsFiles | None,
        web_processes: int,
        listener: socket.socket | None,
    ) -> None:
        apply_migrations()
        ensure_demo_data()
        password = reset_demo_user()
        # The connection opened so far may be dead by the time of the shutdown: start that afresh.
        connections.close_all()

        stopping = threading.Event()

        def stop(signum: int, frame: object) -> None:
            stopping.set()

        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, stop)

        # Every job this serve's workers run records a runner starting with this, and only those
        # are cancelled when it stops: never a job of another serve, or of a separate runjob.
        runners = f"serve:{socket.gethostname()[:32]}.{os.getpid()}:"
        # Each web server sizes its connection pool from the reserve, which counts these workers' connections
        # and shares the rest between the web processes.
        environ = {**os.environ, "OCCVIZ_WORKERS": str(workers), "OCCVIZ_WEB_PROCESSES": str(web_processes)}
        supervisor = Supervisor(self._log)
        worker_children: list[Child] = []
        for number in range(1, workers + 1):
            runner = f"{runners}w{number}"
            worker_children.append(
                supervisor.add(
                    f"worker w{number}",
                    [sys.executable, MANAGE, "worker", "--no-reload", "--interval", "0.2", "--worker-id", runner],
                    # PGAPPNAME names its connections in pg_stat_activity as the runner.
                    env={**environ, "OCCVIZ_RUNNER_ID": runner, "PGAPPNAME": runner},
                )
            )
        https = ["-e", daphne_endpoint(tls, host, tls_port)] if tls else []
        web: list[Child] = []
        for number in range(1, web_processes + 1):
            # Several accept from one listening socket that serve holds (and hands again to one restarted);
            # HTTPS, for kubectl and API clients rather than a class, is served by the first.
            http = ["--fd", str(listener.fileno())] if listener else ["-e", http_endpoint(host, port)]
            web.append(
                supervisor.add(
                    "web server" if web_processes == 1 else f"web server {number}",
                    [sys.executable, "-m", "daphne", *http, *(https if number == 1 else []), "occviz.asgi:application"],
                    env={**environ, "PGAPPNAME": f"{runners}web{number}"},
                    pass_fds=(listener.fileno(),) if listener else (),
                )
            )
        supervisor.start()
        reaper = start_reaper(REAP_EVERY_S)
        pruner = threading.Thread(target=self._prune_daily, args=[stopping], name="pruner", daemon=True)
        pruner.start()
        try:
            self._say(
                f"\noccviz is serving http://{address}/  (admin: http://{address}/admin/)\n"
                f"Sign in as {DEMO_USER!r} with password {password!r}\n"
                + (self._https_banner(host, tls_port, tls) if tls else "")
                + f"{workers} job worker(s) and {web_processes} web server process(es) running. "
                "Press Ctrl-C to stop.\n"
            )
            postgres = embedded.is_embedded(settings.DATA_DIR)
            next_postgres_check = 0.0
            while not stopping.wait(TEND_EVERY_S):
                supervisor.tend()
                if postgres and time.monotonic() >= next_postgres_check:
                    next_postgres_check = time.monotonic() + 1.0
                    self._keep_postgres_up()
        finally:
            stopping.set()
            self._shut_down(runners, supervisor, worker_children, web, [reaper.stop, lambda: pruner.join(GRACE_S)])
        self._say("occviz stopped.")

    @staticmethod
    def _https_banner(host: str, tls_port: int, tls: TlsFiles) -> str:
        trust = f"its CA: {tls.authority}" if tls.authority else "a certificate of your own"
        return (
            f"HTTPS for kubectl and API clients: https://{host_port(host, tls_port)}/  ({trust}; "
            f"certificate SHA-256 {fingerprint(tls.certificate)})\n"
            # kubeconfig finds this serve's HTTPS address in its lock.
            f"  python manage.py kubeconfig {DEMO_USER} > kubeconfig\n"
            "  kubectl --kubeconfig kubeconfig get leases\n"
        )

    def _keep_postgres_up(self) -> None:
        """Start the embedded PostgreSQL again if it stopped under us (its postmaster killed, say)."""
        try:
            pid = embedded.keep_running(settings.DATA_DIR)
        except Exception as error:  # pg_ctl failing: the dead server's backends may still be exiting
            if not self._postgres_failing:  # said once, not every second until it starts
                self._log(f"PostgreSQL is down and could not be started yet ({error}): trying again every second")
            self._postgres_failing = True
            return
        self._postgres_failing = False
        if pid is not None and pid != self._postmaster:
            if self._postmaster is not None:
                self._log(f"PostgreSQL (pid {self._postmaster}) had stopped: it runs again (pid {pid})")
            self._postmaster = pid

    def _prune_daily(self, stopping: threading.Event) -> None:
        """Delete old finished jobs' events now, then once a day, on a connection of this thread's own."""
        try:
            while True:
                try:
                    pruned = prune_events()
                except (DatabaseError, InterfaceError) as error:
                    self._log(f"pruning old events failed, trying again in an hour: {error}")
                    connections.close_all()
                    if stopping.wait(3600.0):
                        return
                    continue
                if pruned.jobs:
                    self._log(str(pruned))
                if stopping.wait(PRUNE_EVERY_S):
                    return
        finally:
            connections.close_all()

    def _shut_down(
        self,
        runners: str,
        supervisor: Supervisor,
        workers: list[Child],
        web: list[Child],
        chores: list[Callable[[], None]],
    ) -> None:
        self._say("\nStopping: cancelling this serve's running jobs, then its workers and the web server...")
        for wait_for_chore in chores:
            wait_for_chore()
        # Every step below must run even if PostgreSQL restarted meanwhile, or is gone.
        try:
            cancelled = with_database(
                lambda: Job.objects.filter(status=Job.Status.RUNNING, runner__startswith=runners).update(
                    cancel_requested=True
                )
            )
        except (DatabaseError, InterfaceError) as error:
            self._say(f"Could not ask the running jobs to cancel: {error}")
        else:
            if cancelled:
                self._say(f"Asked {cancelled} running job(s) to cancel.")
        connections.close_all()
        supervisor.stop(workers, GRACE_S)
        supervisor.stop(web, GRACE_S)
        self._say(str(supervisor))
        if embedded.is_embedded(settings.DATA_DIR):
            holders = embedded.release(settings.DATA_DIR)
            if holders:
                self._say(f"PostgreSQL left running: other processes use it (pid {', '.join(map(str, holders))}).")
            else:
                self._say("PostgreSQL stopped.")

    def _log(self, text: str) -> None:
        self._say(f"{time.strftime('%H:%M:%S')} serve: {text}")

    def _say(self, text: str) -> None:
        # Whoever read our output may be gone (a pipe closed by the same Ctrl-C): never let that skip the shutdown.
        with contextlib.suppress(OSError, ValueError):
            self.stdout.write(text)
            self.stdout.flush()
