"""Connections stay within the budget: watches opened and dropped never make an admitted job fail.

The web server and a job worker run as a deployment runs them, child processes, but connect
as a role of their own whose CONNECTION LIMIT is all the database lets them open, as a small
server's max_connections would be: PostgreSQL itself refuses the connection one over it. With
the reserve at 20 of its 40, the web server's pool gets 5 (occviz/connections.py) and jobs 20.
While a class's worth of watches open and drop, a job that takes the whole budget is admitted
and gets every connection it needs, and pg_stat_activity shows the web server's connections
bounded by its pool and its channel layer, far fewer than the watches open.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import requests
from django.contrib.auth.models import User
from django.db import connection

from occviz.api.models import ApiToken
from occviz.bench.watches import watches_bench
from occviz.connections import LAYER_ALIAS, LAYER_LISTENER, WEB_LAYER_POOL, Reserve, process_kind
from occviz.store.models import Lease
from tests.conftest import manage
from tests.servers import ROOT, free_port, stop, wait_for_port

ROLE_LIMIT = 40
RESERVED = 20
WEB = "class web"
WORKER = "class worker"
NAMESPACES = [f"class-{number}" for number in range(4)]
JOBS = "/apis/occviz.dev/v1/namespaces/default/jobs"
# The whole budget: 17 writers and the runner's 3 connections.
WHOLE_BUDGET = {"strategy": "atomic", "writers": 17, "seconds": 4, "think_ms": 20}


@pytest.fixture
def limited_role(transactional_db: None) -> Iterator[str]:
    """A DATABASE_URL for the test database as a role that may open at most ROLE_LIMIT connections."""
    role = f"occviz_class_{uuid.uuid4().hex[:8]}"
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT {ROLE_LIMIT}")
        cursor.execute(f"GRANT USAGE ON SCHEMA public TO {role}")
        cursor.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}")
        cursor.execute(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role}")
    params = connection.settings_dict
    try:
        yield f"postgresql://{role}@/{params['NAME']}?host={quote(params['HOST'])}"
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [role])
            deadline = time.monotonic() + 10
            while connections_of_role(cursor, role) and time.monotonic() < deadline:
                time.sleep(0.1)  # a terminated backend exits on its own time
            cursor.execute(f"DROP OWNED BY {role}")
            cursor.execute(f"DROP ROLE {role}")


@pytest.fixture
def served_as_role(limited_role: str, tmp_path: Path) -> Iterator[str]:
    """Daphne and one db_worker on the limited role, each naming its connections; the base URL."""
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": limited_role,
        "OCCVIZ_DB_CONNECTIONS": "0",  # the role's limit is the database's room
        "OCCVIZ_RESERVED_CONNECTIONS": str(RESERVED),
        "OCCVIZ_WORKERS": "1",
        "DEBUG": "false",
    }
    with (tmp_path / "daphne.log").open("wb") as web_log, (tmp_path / "worker.log").open("wb") as worker_log:
        daphne = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "occviz.asgi:application"],
            cwd=ROOT,
            env={**env, "PGAPPNAME": WEB},
            stdout=web_log,
            stderr=subprocess.STDOUT,
        )
        worker = subprocess.Popen(
            [sys.executable, "manage.py", "db_worker", "--interval", "0.1", "--no-startup-delay"],
            cwd=ROOT,
            env={**env, "PGAPPNAME": WORKER},
            stdout=worker_log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_for_port(port, daphne)
            yield f"http://127.0.0.1:{port}"
        finally:
            stop(worker)
            stop(daphne)


class Watch:
    """A `?watch=1` of one namespace's leases on a plain socket, open once its first ADDED line came."""

    def __init__(self, base: str, token: str, namespace: str) -> None:
        port = int(base.rsplit(":", 1)[1])
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases?watch=1"
        self.sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\r\n".encode())
        stream = self.sock.makefile("rb")
        status = stream.readline()
        assert b" 200 " in status, status
        while b'"ADDED"' not in (line := stream.readline()):
            assert line, "the watch closed before its first line"

    def drop(self, *, abort: bool) -> None:
        """Close as a client going away does: politely, or with a reset (SO_LINGER 0) as a killed one does."""
        if abort:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()


def connections_of_role(cursor: Any, role: str) -> int:
    cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE usename = %s", [role])
    return int(cursor.fetchone()[0])


@pytest.mark.slow
def test_watches_opened_and_dropped_never_make_an_admitted_job_fail(served_as_role: str) -> None:
    student = User.objects.create_user("student")
    token = ApiToken.issue(student, "laptop")[1]
    for namespace in NAMESPACES:
        Lease.objects.create(namespace=namespace, name="lock")
    api = requests.Session()
    api.headers["Authorization"] = f"Bearer {token}"
    web_bound = Reserve(RESERVED, 1, layer_on_postgres=True).web_pool + WEB_LAYER_POOL + LAYER_LISTENER + LAYER_ALIAS

    watches = [Watch(served_as_role, token, NAMESPACES[n % len(NAMESPACES)]) for n in range(60)]
    seen = {"web": 0, "role": 0}
    job_done = threading.Event()

    def sample() -> None:
        """The most connections the web server, and the role's processes together, held at once."""
        own = connection.copy()  # a connection of this thread's own
        with contextlib.closing(own), own.cursor() as cursor:
            while not job_done.wait(0.05):
                cursor.execute(
                    "SELECT count(*) FILTER (WHERE application_name = %s), count(*) FILTER (WHERE usename ~ %s) "
                    "FROM pg_stat_activity",
                    [WEB, "^occviz_class_"],
                )
                web, role = cursor.fetchone()
                seen["web"], seen["role"] = max(seen["web"], web), max(seen["role"], role)

    sampler = threading.Thread(target=sample)
    sampler.start()
    rng = random.Random(16)
    try:
        launched = api.post(f"{served_as_role}{JOBS}", json={"spec": {"scenario": "counter", "params": WHOLE_BUDGET}})
        assert launched.status_code == 201, launched.text
        name = launched.json()["metadata"]["name"]
        # The budget is full: one more writer is refused, with why, before it could fail for want of a connection.
        refused = api.post(f"{served_as_role}{JOBS}", json={"spec": {"scenario": "counter", "params": WHOLE_BUDGET}})
        assert refused.status_code == 403 and "needs 20 database connections" in refused.text, refused.text
        # While it runs, the class comes and goes: watches dropped (some reset) and opened again.
        deadline = time.monotonic() + 60
        while (phase := api.get(f"{served_as_role}{JOBS}/{name}").json()["status"]["phase"]) not in (
            "succeeded",
            "failed",
        ):
            assert time.monotonic() < deadline, "the job never ended"
            for gone in rng.sample(range(len(watches)), 15):
                watches[gone].drop(abort=gone % 2 == 0)
                watches[gone] = Watch(served_as_role, token, NAMESPACES[gone % len(NAMESPACES)])
    finally:
        job_done.set()
        sampler.join()
        for watch in watches:
            watch.drop(abort=False)
    job = api.get(f"{served_as_role}{JOBS}/{name}").json()
    assert phase == "succeeded", json.dumps(job["status"])
    summary = job["status"]["summary"]
    assert (summary["writers"], summary["errors"]) == (17, 0) and summary["committed"] > 0, summary
    # 60 watches open throughout, yet the web server held at most its pool and its channel layer.
    assert 0 < seen["web"] <= web_bound < len(watches), seen
    assert seen["role"] < ROLE_LIMIT, seen


def test_each_process_names_its_connections_by_what_it_is() -> None:
    assert process_kind(["manage.py", "runjob", "counter"]) == "runjob"
    assert process_kind(["/venv/lib/python3.12/site-packages/pytest/__main__.py"]) == "pytest"
    assert process_kind(["/usr/bin/daphne", "occviz.asgi:application"]) == "daphne"
    assert process_kind([]) == "python"


def test_web_processes_share_what_the_other_parts_leave_each_with_its_own_channel_layer() -> None:
    one, two = (Reserve(32, 2, layer_on_postgres=True, web_processes=n) for n in (1, 2))
    assert one.web_pool == 32 - (3 + 2 * 3 + 6 + 3) == 14
    assert two.web_pool == (32 - (3 + 2 * 3 + 2 * 6 + 3)) // 2 == 4
    assert not two.problem()
    three = Reserve(32, 2, layer_on_postgres=True, web_processes=3)
    assert "too few for 3 web server process(es)" in three.problem()
    assert "Reserve at least 42." in three.problem()  # 3 + 6 + 18 + 3, and 3 pools of 4


def test_a_reserve_too_small_for_the_web_server_is_refused_before_anything_starts() -> None:
    # 8 workers: serve 3, the workers 8 x 3, the web server's channel layer 6, a command 3: 36 of 32 (set:
    # unset, the reserve would grow with the workers).
    served = manage(
        "serve", "--workers", "8", "--port", str(free_port()), "--tls-port", "0",
        env={"OCCVIZ_RESERVED_CONNECTIONS": "32"}, timeout=60,
    )  # fmt: skip
    assert served.returncode == 2, served.stderr
    assert (
        "OCCVIZ_RESERVED_CONNECTIONS=32 is too few for 1 web server process(es) (OCCVIZ_WEB_PROCESSES) "
        "and 8 worker(s)" in served.stderr
    )
    assert "leaving each web server's pool -4, under its minimum of 4. Reserve at least 40." in served.stderr
    daphne = subprocess.run(
        [sys.executable, "-m", "daphne", "-p", str(free_port()), "occviz.asgi:application"],
        cwd=ROOT,
        env={**os.environ, "OCCVIZ_RESERVED_CONNECTIONS": "10"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert daphne.returncode != 0
    assert "OCCVIZ_RESERVED_CONNECTIONS=10 is too few for 1 web server process(es)" in daphne.stderr


def test_the_watches_benchmark_times_gets_with_watches_open_and_counts_the_web_servers_connections(
    database_url: str,
) -> None:
    figures = watches_bench(database_url, watches=20, samples=3, rounds=1, settle_s=0.5)
    run = figures["runs"][0]
    assert all(run[f"{page}_{side}_ms"] > 0 for page in ("api", "home") for side in ("quiet", "watched")), run
    # The web server's pool (14 with the default reserve) and its channel layer (6), whatever the watches.
    assert 0 < run["connections_watched"] <= Reserve(32, 2, layer_on_postgres=True).web_pool + 6 < 20 + 1, run
