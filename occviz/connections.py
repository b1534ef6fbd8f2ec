"""The database connections occviz holds outside its jobs, each bounded, and the reserve that covers them.

Jobs are admitted against the database's connections less OCCVIZ_RESERVED_CONNECTIONS
(occviz/jobs/tasks.py). That promise, "a job admitted is a job that gets its
connections", holds only if everything else stays inside the reserve, so everything
else has a bound, counted here:

- serve's own process: its main thread, the reaper and the pruner;
- each job worker: its polling connection, and its channel layer's pool, which stays
  open between jobs (a running job's own connections are counted in the job);
- the web server: its channel layer's pool and LISTEN connection, channels-postgres's
  Django alias (it deletes a closed socket's group membership), and Django's
  connection pool, which gets what the others leave;
- a margin for a manage.py command run beside them (`runjob` with its channel layer's
  pool: its job is counted in the budget like any other).

Before, the web server opened a connection per thread and kept it for CONN_MAX_AGE:
200 API watches held 207 connections and an admitted 64-writer job failed with "too
many clients". Now its requests, watches and sockets borrow from a pool of at most
`web_pool` connections and give them back when they are done (docs/performance.md).

Code in the web server that reads the database outside a request must give its connection
back when done, or it keeps a slot of the pool: channels' `database_sync_to_async` does
(it closes the thread's connection around each call, and with CONN_MAX_AGE 0 closing
returns it to the pool), as Django does at the end of each request.

Plain Python, no Django: the settings size the pool from it before Django is set up.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import PurePath

SERVE_OWN = 3
"""serve's main thread, its reaper and its pruner."""
WORKER_OWN = 1
"""A job worker's polling connection (a running job's runner connection is counted in the job)."""
LAYER_POOL = 2
"""The channel layer's pool in a process that only publishes (PostgreSQL layer only): a job's
publisher sends one message at a time."""
WEB_LAYER_POOL = 4
"""The web server's channel layer pool: its sockets join and leave groups and take their messages at once."""
LAYER_LISTENER = 1
"""The web server's LISTEN connection, on which the PostgreSQL layer's messages arrive."""
LAYER_ALIAS = 1
"""channels-postgres's Django alias in the web server."""
TOOLS = 1 + LAYER_POOL
"""A manage.py command beside the servers: its own connection and its channel layer's pool (runjob's)."""
MIN_WEB_POOL = 4
"""Fewer, and a page that makes several queries while a few watches poll would queue for them."""


RESERVED_FOR_TWO_WORKERS = 32
"""OCCVIZ_RESERVED_CONNECTIONS with 2 workers; each further worker adds its own connections to the default."""


def default_reserve(workers: int, layer_on_postgres: bool) -> int:
    """The reserve when OCCVIZ_RESERVED_CONNECTIONS is not set: 32 for 2 workers, plus each further worker's share."""
    per_worker = WORKER_OWN + (LAYER_POOL if layer_on_postgres else 0)
    return RESERVED_FOR_TWO_WORKERS + max(0, workers - 2) * per_worker


def machine_cores() -> int:
    """The cores this process may run on (its CPU affinity where the system says, else the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class Reserve:
    """OCCVIZ_RESERVED_CONNECTIONS shared out: what each part outside the jobs may hold at most."""

    reserved: int
    workers: int
    layer_on_postgres: bool
    web_processes: int = 1

    def parts(self) -> dict[str, int]:
        """Each bounded part outside the jobs and the web servers' pools, and its connections."""
        layer = LAYER_POOL if self.layer_on_postgres else 0
        web_layer = WEB_LAYER_POOL + LAYER_LISTENER + LAYER_ALIAS if self.layer_on_postgres else 0
        return {
            "serve": SERVE_OWN,
            "workers": self.workers * (WORKER_OWN + layer),
            "web servers' channel layers": self.web_processes * web_layer,
            "manage.py commands": TOOLS,
        }

    @property
    def web_pool(self) -> int:
        """The most connections each web server process's Django pool opens: its share of what the other parts leave."""
        return (self.reserved - sum(self.parts().values())) // self.web_processes

    def problem(self) -> str:
        """Why this reserve is too small ("" if it is not)."""
        if self.web_pool >= MIN_WEB_POOL:
            return ""
        needed = sum(self.parts().values()) + self.web_processes * MIN_WEB_POOL
        shares = ", ".join(f"{name} {count}" for name, count in self.parts().items())
        return (
            f"OCCVIZ_RESERVED_CONNECTIONS={self.reserved} is too few for {self.web_processes} web server process(es) "
            f"(OCCVIZ_WEB_PROCESSES) and {self.workers} worker(s) (OCCVIZ_WORKERS): {shares}, leaving each web "
            f"server's pool {self.web_pool}, under its minimum of {MIN_WEB_POOL}. Reserve at least {needed}."
        )


def process_kind(argv: list[str]) -> str:
    """What a process is, from its command line: its manage.py command ("worker", "runjob"), else its program."""
    program = PurePath(argv[0]) if argv and argv[0] else PurePath("python")
    if program.name == "manage.py" and len(argv) > 1:
        return argv[1]
    # `python -m pytest` runs .../pytest/__main__.py
    return program.parent.name if program.name == "__main__.py" else program.name
