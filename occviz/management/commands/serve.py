"""serve: everything `make run` needs, in one foreground command.

Migrates, creates the demo data and a demo sign-in (printed), starts the job
workers (`db_worker` processes) and the web server (Daphne, HTTP and websockets),
and on Ctrl-C stops them in order: running jobs are asked to cancel, workers
finish, the web server stops, and the embedded PostgreSQL stops with the last
process that holds it.
"""

from __future__ import annotations

import contextlib
import ctypes
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from occviz.jobs.models import Job
from occviz.store.models import Counter, Lease, Pod, ResourceQuota

MANAGE = str(Path(settings.BASE_DIR) / "manage.py")
DEMO_USER = "demo"
GRACE_S = 10.0


def _die_with_parent() -> None:
    """In the child, before exec: if serve is killed outright, the child gets SIGTERM instead of living on."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _spawn(*args: str) -> subprocess.Popen[bytes]:
    """A child in a session of its own: Ctrl-C reaches only serve, which stops the children in order."""
    return subprocess.Popen([sys.executable, *args], start_new_session=True, preexec_fn=_die_with_parent)


def ensure_demo_data() -> None:
    """A few objects in the `demo` namespace, to look at in the admin and to contend on from curl."""
    for name in ("hot", "warm", "cold"):
        Counter.objects.get_or_create(namespace="demo", name=name)
    Lease.objects.get_or_create(namespace="demo", name="leader", defaults={"lease_duration_seconds": 15})
    ResourceQuota.objects.get_or_create(
        namespace="demo",
        name="gpu-quota",
        defaults={"hard": {"requests.nvidia.com/gpu": 1}, "used": {"requests.nvidia.com/gpu": 0}},
    )
    Pod.objects.get_or_create(namespace="demo", name="trainer-0", defaults={"requests": {"requests.nvidia.com/gpu": 1}})


def reset_demo_user() -> str:
    """The demo sign-in, with a fresh password each start (only its hash is stored)."""
    password = secrets.token_urlsafe(9)
    user, _ = get_user_model().objects.get_or_create(username=DEMO_USER, defaults={"is_staff": True})
    user.is_staff = True
    user.is_superuser = True
    user.set_password(password)
    user.save()
    return password


class Command(BaseCommand):
    help = "Serve occviz: migrate, demo data, job workers and the web server, until Ctrl-C."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--workers", type=int, default=settings.OCCVIZ_WORKERS, help="job worker processes")

    def handle(self, *args: Any, **options: Any) -> None:
        host, port, workers = options["host"], options["port"], options["workers"]
        if not 1 <= port <= 65535:
            raise CommandError(f"--port {port} is not a TCP port (1-65535).", returncode=2)
        if not 1 <= workers <= 32:
            raise CommandError(f"--workers {workers}: give between 1 and 32 worker processes.", returncode=2)
        call_command("migrate", interactive=False, verbosity=0)
        ensure_demo_data()
        password = reset_demo_user()

        stopping = False

        def stop(signum: int, frame: object) -> None:
            nonlocal stopping
            stopping = True

        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, stop)
        children = [
            _spawn(MANAGE, "db_worker", "--no-reload", "--interval", "0.2", "--worker-id", f"w{number}")
            for number in range(1, workers + 1)
        ]
        children.append(_spawn("-m", "daphne", "-b", host, "-p", str(port), "occviz.asgi:application"))
        try:
            self._say(
                f"\noccviz is serving http://{host}:{port}/  (admin: http://{host}:{port}/admin/)\n"
                f"Sign in as {DEMO_USER!r} with password {password!r}\n"
                f"{workers} job worker(s) running. Press Ctrl-C to stop.\n"
            )
            while not stopping:
                dead = [child.args for child in children if child.poll() is not None]
                if dead:
                    raise CommandError(f"a server process stopped unexpectedly: {dead}")
                time.sleep(0.2)
        finally:
            self._shut_down(children)
        self._say("occviz stopped.")

    def _say(self, text: str) -> None:
        # Whoever read our output may be gone (a pipe closed by the same Ctrl-C): never let that skip the shutdown.
        with contextlib.suppress(OSError):
            self.stdout.write(text)

    def _shut_down(self, children: list[subprocess.Popen[bytes]]) -> None:
        self._say("\nStopping: cancelling running jobs, then workers and the web server...")
        Job.objects.filter(status=Job.Status.RUNNING).update(cancel_requested=True)
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + GRACE_S
        for child in children:
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
