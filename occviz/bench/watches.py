"""The watches benchmark: does a class of open API watches slow everyone else, and what do they cost in connections?

    from occviz.bench.watches import watches_bench
    figures = watches_bench(None, watches=200, samples=40, rounds=3)

(`database_url=None` uses the database of the current settings.) It starts a real Daphne
on a free port of 127.0.0.1, as `make run` serves the app, with its own PGAPPNAME so that
its database connections can be told apart in `pg_stat_activity`. Each round then times
`samples` GETs of an API list and of the home page one after the other (each on a new
connection, to the end of its body) with no watch open, then opens `watches` watches
(`?watch=1` on the leases of one namespace, as `kubectl get leases -w` does), waits until
each has its ADDED lines, times the same GETs again, and counts the web server's
connections while the watches are open and `settle_s` seconds after they have all
dropped. The figures are the medians of each round, their median and range.

The watches stay open and idle, as a class's do between changes: what they cost is their
polls, their threads and their connections, not what they send.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connection

from occviz.api.models import ApiToken
from occviz.bench.streaming import current_database_url, session_cookie, web_servers
from occviz.jobs.tasks import database_max_connections
from occviz.store.models import Lease

NAMESPACE = "bench-watches"
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases"
APP_NAME = "occviz bench web"


def watches_bench(
    database_url: str | None = None,
    *,
    watches: int = 200,
    samples: int = 40,
    rounds: int = 3,
    settle_s: float = 5.0,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """GET timings (ms) of the API and the home page with no watch and with `watches` open,
    and the web server's connections while they are open and after they dropped."""
    token = _token()
    cookie = session_cookie()
    _leases()
    server_env = {
        **os.environ,
        "DATABASE_URL": database_url or current_database_url(),
        "PGAPPNAME": APP_NAME,
        **(env or {}),
    }
    runs: list[dict[str, Any]] = []
    with web_servers(server_env) as (port, _):
        for _ in range(rounds):
            runs.append(asyncio.run(_round(port, token, cookie, watches, samples, settle_s)))
    return {
        "watches": watches,
        "samples": samples,
        "rounds": rounds,
        "runs": runs,
        **{
            f"{page}_{side}_ms": _spread([run[f"{page}_{side}_ms"] for run in runs])
            for page in ("api", "home")
            for side in ("quiet", "watched")
        },
        "connections_watched": _spread([run["connections_watched"] for run in runs]),
        "connections_after": _spread([run["connections_after"] for run in runs]),
        "max_connections": database_max_connections(),
    }


def web_connections(app_name: str = APP_NAME) -> int:
    """The connections the benchmark's web server holds now (its channel layer's included)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [app_name])
        return int(cursor.fetchone()[0])


def _counted() -> int:
    """web_connections() from a thread of the client's loop, closing the connection that thread opened for it."""
    try:
        return web_connections()
    finally:
        connection.close()


async def _round(port: int, token: str, cookie: str, watches: int, samples: int, settle_s: float) -> dict[str, Any]:
    api_quiet, home_quiet = await _timings(port, token, cookie, samples)
    opened = [asyncio.create_task(_watch(port, token)) for _ in range(watches)]
    streams = await asyncio.gather(*opened)
    try:
        api_watched, home_watched = await _timings(port, token, cookie, samples)
        connections_watched = await asyncio.to_thread(_counted)
    finally:
        for _, writer in streams:
            writer.close()
    await asyncio.sleep(settle_s)
    return {
        "api_quiet_ms": _median(api_quiet),
        "home_quiet_ms": _median(home_quiet),
        "api_watched_ms": _median(api_watched),
        "home_watched_ms": _median(home_watched),
        "connections_watched": connections_watched,
        "connections_after": await asyncio.to_thread(_counted),
    }


async def _timings(port: int, token: str, cookie: str, samples: int) -> tuple[list[float], list[float]]:
    """`samples` GETs of the API list and of the home page, alternating; each one's time in ms."""
    api: list[float] = []
    home: list[float] = []
    for _ in range(samples):
        api.append(await _get(port, LEASES, f"Authorization: Bearer {token}"))
        home.append(await _get(port, "/", f"Cookie: {cookie}"))
    return api, home


async def _get(port: int, path: str, credentials: str) -> float:
    """One GET (signed in by the `credentials` header) on a new connection, read to its end: its time in ms."""
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{credentials}\r\nConnection: close\r\n\r\n".encode()
    )
    response = await reader.read()
    took = (time.perf_counter() - started) * 1000.0
    writer.close()
    status = response.split(b"\r\n", 1)[0]
    if b" 200 " not in status:
        raise RuntimeError(f"GET {path}: {status[:80]!r}")
    return took


async def _watch(port: int, token: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A watch of the namespace's leases, open once its headers and its first ADDED line have come."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"GET {LEASES}?watch=1 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n\r\n".encode()
    )
    headers = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60)
    if b" 200 " not in headers.split(b"\r\n", 1)[0]:
        raise RuntimeError(f"watch refused: {headers[:80]!r}")
    while b'"ADDED"' not in await asyncio.wait_for(reader.readline(), 60):
        pass
    return reader, writer


def _token() -> str:
    user, _ = get_user_model().objects.get_or_create(username="watches-bench")
    return ApiToken.issue(user, "bench")[1]


def _leases() -> None:
    for number in range(5):
        Lease.objects.get_or_create(namespace=NAMESPACE, name=f"lease-{number}")


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 1)


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 1), "min": min(values), "max": max(values)}
