"""The app served as a deployment serves it, for tests: a real Daphne and a real db_worker, child processes.

Both read the test database through DATABASE_URL and listen on a free port; their output
goes to log files, which is where to look when a test against them fails.
"""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

from django.db import connection

ROOT = Path(__file__).resolve().parent.parent


def child_database_url() -> str:
    """A DATABASE_URL for the test database, for child processes (runjob, db_worker, daphne)."""
    params = connection.settings_dict
    host = params["HOST"] or "127.0.0.1"
    if host.startswith("/"):
        return f"postgresql://{params['USER']}@/{params['NAME']}?host={quote(host)}"
    return f"postgresql://{params['USER']}:{params['PASSWORD']}@{host}:{params['PORT'] or 5432}/{params['NAME']}"


@contextmanager
def machine_wide(lock: Path) -> Iterator[None]:
    """The block runs alone among those on this machine that hold `lock` (xdist workers, other checkouts)."""
    with lock.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # let go of when the file is closed
        yield


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, process: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"daphne exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout} s")


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def served_app(database_url: str, logs_dir: Path) -> Iterator[str]:
    """The base URL of Daphne serving occviz on `database_url`, with one db_worker running its jobs."""
    port = free_port()
    env = {**os.environ, "DATABASE_URL": database_url, "DEBUG": "false", "PYTHONUNBUFFERED": "1"}
    logs = {name: (logs_dir / f"{name}.log").open("wb") for name in ("daphne", "worker")}
    daphne = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "occviz.asgi:application"],
        cwd=ROOT,
        env=env,
        stdout=logs["daphne"],
        stderr=subprocess.STDOUT,
    )
    worker = subprocess.Popen(
        [sys.executable, "manage.py", "db_worker", "--interval", "0.1", "--no-startup-delay"],
        cwd=ROOT,
        env=env,
        stdout=logs["worker"],
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for_port(port, daphne)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(worker)
        stop(daphne)
        for log in logs.values():
            log.close()
