"""The streaming benchmark: does watching a job slow it down, and how late do its events reach viewers?

    from occviz.bench.streaming import JOB_PAGE_QUERY, streaming_bench
    figures = streaming_bench(None, seconds=4.0, writers=4, viewers=50, rounds=3)
    pages = streaming_bench(None, viewers=60, query=JOB_PAGE_QUERY)

(`database_url=None` uses the database of the current settings.) It runs the same `occ`
counter race `rounds` times each way, alternating, in a `db_worker` process: once with no
viewers, once with `viewers` websocket clients following `/ws/jobs/<id>/events/<query>`
through a real Daphne server started on a free port of 127.0.0.1, signed in with a session
cookie of a user it creates and an Origin header. With no query they are programs on the JSON
stream; with JOB_PAGE_QUERY they open the one socket the job page opens, whose frames also
carry the page's fragments. It returns both sides' commits per second (the job's own figure),
their ratio, the event-to-client latency percentiles, and the web server's CPU time per
thousand events while watched (less noisy than the ratio on a shared machine: what the viewers
cost the server, whatever the neighbours do).

It refuses to measure when the channel layer carries nothing, since the feeds would then
poll the job row once a second and the latency would be that poll's. A latency is the
client's wall-clock time on reading a whole message, minus the event's time: the job's
`released_at` (when its actors were released, and its event times start) plus its `t_ms`.
Every event of every client counts once, so batching more cannot look better. Every client
reads every message whole, checks its frames' `seq_from`/`seq_to` chain and keeps the `end`
(which carries the fragments when the query asks for them); the first also decodes the event
arrays and checks every `seq` once. Why these choices make the figures fair: docs/performance.md.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote

from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.sessions.backends.db import SessionStore
from django.db import connection

from occviz.jobs.models import Event, Job
from occviz.jobs.tasks import launch
from occviz.tls import LISTEN_BACKLOG

SEQ_RANGE = re.compile(rb'"seq_from":(\d+),"seq_to":(\d+)')

# The socket the job page opens: the whole stream, each frame with the page's fragments.
JOB_PAGE_QUERY = "?after=0&html=1"


@dataclass
class Viewer:
    """What one client received: (seq_from, seq_to, receive time) of each frame, and the `end` message."""

    frames: list[tuple[int, int, float]] = field(default_factory=list)
    end: dict[str, Any] | None = None
    opened_at: float = 0.0
    """The wall time its hello came: an event recorded before it reached the page as history, not live."""

    def complete(self, last_seq: int, *, html: bool) -> bool:
        """Every event once, in order, up to `last_seq`, then the end (with the fragments if asked for)."""
        ended = self.end is not None and (not html or bool(self.end.get("html")))
        return ended and _covered(self.frames) == last_seq


def streaming_bench(
    database_url: str | None = None,
    *,
    seconds: float = 4.0,
    writers: int = 4,
    viewers: int = 50,
    rounds: int = 3,
    query: str = "",
) -> dict[str, Any]:
    """Commits/s without and with `viewers` websocket clients on `/ws/jobs/<id>/events/<query>`
    (medians of `rounds` alternating runs), their ratio, and the latency p50/p95 in ms over
    every event of every watched run."""
    html = parse_qs(query.removeprefix("?")).get("html", ["0"])[-1] == "1"
    env = {**os.environ, "DATABASE_URL": database_url or current_database_url()}
    asyncio.run(check_layer())
    cookie = session_cookie()
    with web_servers(env) as (port, servers):
        params = {"strategy": "occ", "writers": writers, "seconds": seconds, "max_attempts": 1000}
        # Rounds alternate, so a noisy machine slows both sides alike.
        alone: list[float] = []
        watched: list[float] = []
        latencies: list[float] = []
        web_cpu_ms: list[float] = []
        complete = 0
        decoded_ok = 0
        for _ in range(rounds):
            alone.append(commits_per_s(run_alone(env, params)))
            watching = _watched_run(env, params, servers, port, cookie, viewers, query)
            job, received, decoded, cpu_s = asyncio.run(watching)
            web_cpu_ms.append(1e6 * cpu_s / max(job.last_seq, 1))
            watched.append(commits_per_s(job))
            latencies.extend(latencies_ms(job, received))
            complete += sum(viewer.complete(job.last_seq, html=html) for viewer in received)
            decoded_ok += decoded == list(range(1, job.last_seq + 1))
    commits_alone = statistics.median(alone)
    commits_watched = statistics.median(watched)
    return {
        "writers": writers,
        "seconds": seconds,
        "viewers": viewers,
        "query": query,
        "rounds": rounds,
        "commits_per_s_alone": commits_alone,
        "commits_per_s_watched": commits_watched,
        "commits_per_s_alone_runs": alone,
        "commits_per_s_watched_runs": watched,
        "ratio": round(commits_watched / commits_alone, 3) if commits_alone else None,
        "viewers_complete": (
            f"{complete} of {viewers * rounds} saw every event exactly once and the end"
            + (" with its fragments" if html else "")
        ),
        "decoded_complete": f"{decoded_ok} of {rounds} decoded runs had every event exactly once",
        "web_cpu_ms_per_1000_events": round(statistics.median(web_cpu_ms), 1),
        "web_cpu_ms_per_1000_events_runs": [round(ms, 1) for ms in web_cpu_ms],
        "latency_ms": {
            "p50": percentile(latencies, 0.50),
            "p95": percentile(latencies, 0.95),
            "max": round(max(latencies), 1) if latencies else None,
        },
    }


async def check_layer() -> None:
    """One message through the channel layer and back, or a clear error instead of a misleading figure."""
    layer = get_channel_layer()
    if layer is None:
        raise RuntimeError("no channel layer configured: the stream would only poll")
    try:
        channel = await layer.new_channel()
        await layer.group_add("bench-layer-check", channel)
        await layer.group_send("bench-layer-check", {"type": "bench.check"})
        message = await asyncio.wait_for(layer.receive(channel), 10)
        await layer.group_discard("bench-layer-check", channel)
    except Exception as error:
        raise RuntimeError(
            f"the channel layer does not carry messages ({type(error).__name__}: {error}); "
            "viewers would only poll once a second. Run `manage.py migrate` (channels-postgres has tables) "
            "or check REDIS_URL."
        ) from error
    if message.get("type") != "bench.check":
        raise RuntimeError(f"the channel layer returned {message!r}")


def commits_per_s(job: Job) -> float:
    return float(job.summary["commits_per_s"]) if job.summary else 0.0


def current_database_url() -> str:
    params = connection.settings_dict
    host = params["HOST"] or "127.0.0.1"
    if host.startswith("/"):
        return f"postgresql://{params['USER']}@/{params['NAME']}?host={quote(host)}"
    return f"postgresql://{params['USER']}:{params['PASSWORD']}@{host}:{params['PORT'] or 5432}/{params['NAME']}"


def session_cookie() -> str:
    user, _ = get_user_model().objects.get_or_create(username="streaming-bench")
    session = SessionStore()
    session["_auth_user_id"] = str(user.pk)
    session["_auth_user_backend"] = "django.contrib.auth.backends.ModelBackend"
    session["_auth_user_hash"] = user.get_session_auth_hash()
    session.create()
    return f"{settings.SESSION_COOKIE_NAME}={session.session_key}"


@contextlib.contextmanager
def web_servers(env: dict[str, str], processes: int = 1) -> Iterator[tuple[int, list[subprocess.Popen[bytes]]]]:
    """`processes` Daphnes serving occviz on one listening socket, as serve listens (its backlog): (port, servers).

    Several share the socket (Daphne's --fd) and the reserve's web connections, as serve's
    `--web-processes` do; they are stopped when the block ends.
    """
    listening = socket.create_server(("127.0.0.1", 0), backlog=LISTEN_BACKLOG)
    port = int(listening.getsockname()[1])
    servers = [
        subprocess.Popen(
            [sys.executable, "-m", "daphne", "--fd", str(listening.fileno()), "occviz.asgi:application"],
            cwd=settings.BASE_DIR,
            env={**env, "OCCVIZ_WEB_PROCESSES": str(processes)},
            pass_fds=[listening.fileno()],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(processes)
    ]
    try:
        wait_for_port(port)
        yield port, servers
    finally:
        listening.close()
        for server in servers:
            server.terminate()
        for server in servers:
            server.wait(30)


def cpu_seconds(processes: list[subprocess.Popen[bytes]]) -> float:
    """The CPU time (user and system) the processes have used so far, from /proc/<pid>/stat."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for process in processes:
        # Fields after the command's closing parenthesis; utime and stime are the 14th and 15th of the line.
        fields = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / ticks


def wait_for_port(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.1)
    raise RuntimeError(f"daphne did not listen on 127.0.0.1:{port} within {timeout} s")


def start_worker(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "db_worker", "--max-tasks", "1"],
        cwd=settings.BASE_DIR,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def run_alone(env: dict[str, str], params: dict[str, Any]) -> Job:
    job = launch("counter", params)
    worker = start_worker(env)
    worker.wait(params["seconds"] + 120)
    return Job.objects.get(pk=job.pk)


async def _watched_run(
    env: dict[str, str],
    params: dict[str, Any],
    servers: list[subprocess.Popen[bytes]],
    port: int,
    cookie: str,
    viewers: int,
    query: str,
) -> tuple[Job, list[Viewer], list[int], float]:
    """The job watched by `viewers` clients: the job, what each client received, the seqs of
    the events the first client decoded, and the CPU seconds the servers used from the job's
    start to the last client's end (the sockets' opening, before the job, not counted)."""
    from asgiref.sync import sync_to_async

    job = await sync_to_async(launch)("counter", params)
    received = [Viewer() for _ in range(viewers)]
    connected = [asyncio.Event() for _ in range(viewers)]
    decoded: list[int] = []
    clients = [
        asyncio.create_task(_follow(port, cookie, job.pk, query, viewer, ready, decoded if number == 0 else None))
        for number, (viewer, ready) in enumerate(zip(received, connected, strict=True))
    ]
    await asyncio.wait_for(asyncio.gather(*(ready.wait() for ready in connected)), 60)
    cpu_before = cpu_seconds(servers)
    worker = start_worker(env)
    await asyncio.wait_for(asyncio.gather(*clients), params["seconds"] + 120)
    cpu_s = cpu_seconds(servers) - cpu_before
    await asyncio.to_thread(worker.wait, 60)
    return await Job.objects.aget(pk=job.pk), received, decoded, cpu_s


async def _follow(
    port: int,
    cookie: str,
    job_id: int,
    query: str,
    viewer: Viewer,
    ready: asyncio.Event,
    decoded: list[int] | None = None,
) -> None:
    """A minimal websocket client (RFC 6455) on `/ws/jobs/<job_id>/events/<query>`: records
    (seq_from, seq_to, receive time) of each frame and keeps the `end`.

    Frames are read whole but parsed only as far as their range; the other messages are
    parsed. With `decoded`, it also parses every frame and appends the `seq` of each event,
    read from the event arrays through the hello's `event_fields`, as a program would.
    """
    fields: list[str] = []
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(
        (
            f"GET /ws/jobs/{job_id}/events/{query} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            f"Origin: http://127.0.0.1:{port}\r\nCookie: {cookie}\r\n\r\n"
        ).encode()
    )
    status = await reader.readuntil(b"\r\n\r\n")
    if b" 101 " not in status.split(b"\r\n", 1)[0]:
        raise RuntimeError(f"websocket refused: {status[:80]!r}")
    ready.set()
    message = b""
    while True:
        head = await reader.readexactly(2)
        length = head[1] & 0x7F
        if length == 126:
            length = int.from_bytes(await reader.readexactly(2), "big")
        elif length == 127:
            length = int.from_bytes(await reader.readexactly(8), "big")
        payload = await reader.readexactly(length)
        opcode = head[0] & 0x0F
        if opcode == 0x8:  # close: the server sent `end` and closed
            break
        if opcode in (0x1, 0x0):
            message += payload
            if head[0] & 0x80:  # final fragment
                at = time.time()
                found = SEQ_RANGE.search(message, 0, 200)
                if found:
                    viewer.frames.append((int(found[1]), int(found[2]), at))
                if found is None or decoded is not None:
                    data = json.loads(message)
                    if data["type"] == "hello":
                        fields = data["event_fields"]
                    elif data["type"] == "frame" and decoded is not None:
                        decoded.extend(dict(zip(fields, event, strict=True))["seq"] for event in data["events"])
                    elif data["type"] == "end":
                        viewer.end = data
                    elif data["type"] == "error":
                        raise RuntimeError(f"the stream refused: {data['error']}")
                message = b""
    writer.close()
    with contextlib.suppress(Exception):
        await writer.wait_closed()


def _covered(frames: list[tuple[int, int, float]]) -> int:
    """The last sequence number a client saw with no gap and no duplicate before it (-1 if broken)."""
    position = 0
    for seq_from, seq_to, _ in frames:
        if seq_from != position + 1:
            return -1
        position = seq_to
    return position


def latencies_ms(job: Job, received: list[Viewer]) -> list[float]:
    if job.released_at is None:
        return []
    start = job.released_at.timestamp()
    t_ms = dict(Event.objects.filter(job=job).values_list("seq", "t_ms"))
    latencies: list[float] = []
    for viewer in received:
        # On the job's clock, in ms: the events recorded once this page was open are the live ones.
        opened_ms = (viewer.opened_at - start) * 1000.0
        for seq_from, seq_to, at in viewer.frames:
            at_ms = (at - start) * 1000.0
            latencies.extend(at_ms - t_ms[seq] for seq in range(seq_from, seq_to + 1) if t_ms[seq] >= opened_ms)
    return latencies


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return round(values[0], 1)
    return round(statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1], 1)
