"""A class arriving: hundreds of job pages open on one live job at once, most drop and reopen from seq 0.

    from occviz.bench.classroom import class_arrival_bench
    figures = class_arrival_bench(None, sockets=300, reopen=200, seconds=20)

(`database_url=None` uses the database of the current settings.) A real Daphne on a free port
of 127.0.0.1, listening as serve's does (its backlog; `web_processes` of them accepting from the
one socket), and a `db_worker` run an `occ` counter race of `seconds`. Once the job runs,
`sockets` clients open the job page's socket (`?after=0&html=1`, signed in, with an Origin) at
once. After `seconds / 4`, `reopen` of them leave (half with a close frame, half by dropping
the connection, as a closed laptop does) and open the page again from seq 0, at once; the
others follow the job throughout. It reports:

- every hello's time from the connection's start (first opening and reopening), against 2 s;
- the event-to-client latency p50/p95 of the clients that stayed (as the streaming part counts
  it: every event of every client once, against the job's clock), against the job page's
  target of 250 ms. The events recorded before a page's hello came reach it as history (the
  page asked for the job from seq 0), not live: they are left out of the latency, and counted;
- whether every client saw every event exactly once and the end (the reopened ones, from
  their reopening);
- the web server's memory (RSS): when it listens and has served one socket, its peak, and
  once every client has gone, against a return to within 50 MB of the start.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

from occviz.bench.streaming import (
    SEQ_RANGE,
    Viewer,
    check_layer,
    current_database_url,
    latencies_ms,
    percentile,
    session_cookie,
    start_worker,
    web_servers,
)
from occviz.bench.wsclient import Closed, WsClient
from occviz.jobs.models import Job
from occviz.jobs.tasks import launch

PAGE_QUERY = "?after=0&html=1"
HELLO_TARGET_MS = 2000.0
LATENCY_TARGET_MS = 250.0
MEMORY_TARGET_MB = 50.0


@dataclass
class Arrival:
    """What the class saw: hello times, what each client received, and the server's memory over time."""

    hellos_ms: list[float] = field(default_factory=list)
    reopened_hellos_ms: list[float] = field(default_factory=list)
    stayed: list[Viewer] = field(default_factory=list)
    reopened: list[Viewer] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    memory_mb: list[float] = field(default_factory=list)


def class_arrival_bench(
    database_url: str | None = None,
    *,
    sockets: int = 300,
    reopen: int = 200,
    seconds: float = 20.0,
    writers: int = 4,
    web_processes: int = 1,
) -> dict[str, Any]:
    if not 0 <= reopen <= sockets:
        raise ValueError("reopen must be between 0 and sockets")
    env = {**os.environ, "DATABASE_URL": database_url or current_database_url()}
    asyncio.run(check_layer())
    cookie = session_cookie()
    with web_servers(env, web_processes) as (port, servers):
        processes = [psutil.Process(server.pid) for server in servers]
        params = {"strategy": "occ", "writers": writers, "seconds": seconds, "max_attempts": 1000}
        job, arrival, memory = asyncio.run(_arrive(env, params, port, cookie, processes, sockets, reopen))
    return _figures(job, arrival, memory, sockets=sockets, reopen=reopen, seconds=seconds, web_processes=web_processes)


async def _arrive(
    env: dict[str, str],
    params: dict[str, Any],
    port: int,
    cookie: str,
    server: list[psutil.Process],
    sockets: int,
    reopen: int,
) -> tuple[Job, Arrival, dict[str, float]]:
    from asgiref.sync import sync_to_async

    job = await sync_to_async(launch)("counter", params)
    # The server as it stands ready: listening, its code loaded by one socket served (the job still queued).
    client = await WsClient.connect(port, f"/ws/jobs/{job.pk}/events/{PAGE_QUERY}", cookie)
    await client.receive_text()
    await client.close()
    await asyncio.sleep(1)
    memory = {"start_mb": _rss_mb(server)}
    worker = start_worker(env)
    arrival = Arrival()
    sampling = asyncio.create_task(_sample_memory(server, arrival.memory_mb))
    while (await Job.objects.aget(pk=job.pk)).status == "queued":
        await asyncio.sleep(0.05)
    leave = asyncio.Event()
    clients = [
        asyncio.create_task(_page(port, cookie, job.pk, arrival, leave if number < reopen else None, number))
        for number in range(sockets)
    ]
    await asyncio.sleep(params["seconds"] / 4)
    leave.set()
    await asyncio.wait_for(asyncio.gather(*clients), params["seconds"] + 180)
    await asyncio.to_thread(worker.wait, 60)
    # Every client has gone: the server's memory once it has let go of them.
    await asyncio.sleep(5)
    sampling.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await sampling
    memory["peak_mb"] = max(arrival.memory_mb, default=memory["start_mb"])
    memory["end_mb"] = _rss_mb(server)
    return await Job.objects.aget(pk=job.pk), arrival, memory


async def _page(
    port: int, cookie: str, job_id: int, arrival: Arrival, leave: asyncio.Event | None, number: int
) -> None:
    """One job page: open, follow; with `leave`, drop when it is set and open again from seq 0, to the end."""
    path = f"/ws/jobs/{job_id}/events/{PAGE_QUERY}"
    opened = await _arrive_at(port, path, cookie, arrival, arrival.hellos_ms)
    if opened is None:
        return
    client, opened_at = opened
    first = Viewer(opened_at=opened_at)
    if leave is None:
        arrival.stayed.append(first)
        await follow_page(client, first)
        return
    following = asyncio.create_task(follow_page(client, first))
    await leave.wait()
    following.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await following
    if number % 2:
        client.abort()
    else:
        await client.close()
    opened = await _arrive_at(port, path, cookie, arrival, arrival.reopened_hellos_ms)
    if opened is None:
        return
    client, opened_at = opened
    again = Viewer(opened_at=opened_at)
    arrival.reopened.append(again)
    await follow_page(client, again)


async def _arrive_at(
    port: int, path: str, cookie: str, arrival: Arrival, hellos_ms: list[float]
) -> tuple[WsClient, float] | None:
    """A page's socket and the wall time its hello came, the hello's time added to `hellos_ms`;
    None, with why in `arrival.refused`, if refused."""
    try:
        client, elapsed, opened_at = await _open(port, path, cookie)
    except Exception as error:
        arrival.refused.append(f"{type(error).__name__}: {error}")
        return None
    hellos_ms.append(elapsed)
    return client, opened_at


async def _open(port: int, path: str, cookie: str) -> tuple[WsClient, float, float]:
    """A page's socket, how long its hello took in ms from the connection's start, and the wall time it came."""
    started = time.monotonic()
    client = await WsClient.connect(port, path, cookie)
    hello = json.loads(await asyncio.wait_for(client.receive_text(), 30))
    if hello.get("type") != "hello":
        raise RuntimeError(f"the stream refused: {hello}")
    return client, (time.monotonic() - started) * 1000.0, time.time()


async def follow_page(client: WsClient, viewer: Viewer, other: Callable[[dict[str, Any]], None] | None = None) -> None:
    """Frames as (seq_from, seq_to, receive time) until the end; the end kept, any other message to `other`."""
    try:
        while True:
            text = await client.receive_bytes()
            at = time.time()
            found = SEQ_RANGE.search(text, 0, 200)
            if found:
                viewer.frames.append((int(found[1]), int(found[2]), at))
                continue
            message = json.loads(text)
            if message["type"] == "end":
                viewer.end = message
            elif other is not None:
                other(message)
    except (Closed, asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        client.writer.close()


async def _sample_memory(server: list[psutil.Process], samples: list[float]) -> None:
    while True:
        with contextlib.suppress(psutil.Error):
            samples.append(_rss_mb(server))
        await asyncio.sleep(0.25)


def _rss_mb(servers: list[psutil.Process]) -> float:
    """The web processes' resident memory, together."""
    return round(sum(server.memory_info().rss for server in servers) / 2**20, 1)


def _figures(job: Job, arrival: Arrival, memory: dict[str, float], **run: Any) -> dict[str, Any]:
    hellos = arrival.hellos_ms + arrival.reopened_hellos_ms
    stayed_latency = latencies_ms(job, arrival.stayed)
    complete = sum(viewer.complete(job.last_seq, html=True) for viewer in arrival.stayed + arrival.reopened)
    return {
        **run,
        "events": job.last_seq,
        "status": job.status,
        "refused": arrival.refused[:5],
        "refused_count": len(arrival.refused),
        "hello_ms": {
            "median": percentile(hellos, 0.5),
            "p95": percentile(hellos, 0.95),
            "max": round(max(hellos), 1) if hellos else None,
            "reopened_max": round(max(arrival.reopened_hellos_ms), 1) if arrival.reopened_hellos_ms else None,
            "within_target": f"{sum(ms <= HELLO_TARGET_MS for ms in hellos)} of {len(hellos)}",
            "target": HELLO_TARGET_MS,
        },
        "latency_ms": {
            "p50": percentile(stayed_latency, 0.50),
            "p95": percentile(stayed_latency, 0.95),
            "max": round(max(stayed_latency), 1) if stayed_latency else None,
            "target_p95": LATENCY_TARGET_MS,
            "live": len(stayed_latency),
            "history": job.last_seq * len(arrival.stayed) - len(stayed_latency),
        },
        "complete": f"{complete} of {len(arrival.stayed) + len(arrival.reopened)} saw every event once and the end",
        "memory_mb": {**memory, "returned_within": round(memory["end_mb"] - memory["start_mb"], 1)},
        "memory_target_mb": MEMORY_TARGET_MB,
    }
