"""A class joining a live job from a student link: student sockets, and students pressing +1.

    from occviz.bench.students import students_bench
    figures = students_bench(None, students=60, pressing=30, seconds=10, rounds=3)

(`database_url=None` uses the database of the current settings.) A real Daphne on a free port
and a `db_worker` run a counter race of `seconds` (`none` by default: "everyone press +1 now"
with blind writes, so every press lands and is counted; `occ` answers most presses with a 409
against writers with no think time), in rounds that alternate: the job
alone, then the same job with `students` student pages open on it (the socket a student page
opens, `/ws/s/<token>/events/?after=0&html=1`, signed by the link's token, no session) and
`pressing` of those students pressing +1 once a second (each at its own phase in the second,
as a class does) as the student page's script does: over the student's open socket (`press_via`
"socket", the default), or through the press endpoint, a POST each (`press_via` "http"). It reports:

- the job's commits/s alone and watched (medians of the rounds) and their ratio, against 0.9;
- the event-to-student latency p50/p95 over every event of every student (as the streaming part
  counts it, against the job's clock), against 150 ms;
- whether every student saw every event exactly once and the end, with the page's fragments;
- whether every press the server acknowledged is counted by the job, on the student's own lane
  (and every 409 too), and none refused (a 503 "busy", while the job settles its accounts at
  its end, is counted apart: nothing was written).

With students pressing, each round has a third side, the class's floor: the same job with the
same student sockets open, and the same number of presses a second made by pgbench instead,
on the job's counter, as the engine's read and compare-and-swap (`occviz.pgbench`): the
cheapest press there is, with no seat, no rate, no log and no hand-off to the job. Its ratio to
the job alone is as far as any press made by the web server could bring the class's ratio.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import statistics
import time
from collections import Counter as Tally
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import connection
from django.middleware.csrf import _get_new_csrf_string

from occviz.bench.classroom import follow_page
from occviz.bench.streaming import (
    Viewer,
    check_layer,
    commits_per_s,
    current_database_url,
    latencies_ms,
    percentile,
    run_alone,
    start_worker,
    web_servers,
)
from occviz.bench.wsclient import WsClient
from occviz.jobs.models import Event, Job
from occviz.jobs.tasks import launch
from occviz.pgbench import run_pgbench
from occviz.store.models import Counter
from occviz.students import roster
from occviz.students.models import StudentLink
from occviz.students.tokens import token_for

PAGE_QUERY = "?after=0&html=1"
LATENCY_TARGET_MS = 150.0
RATIO_TARGET = 0.9
PRESS_EVERY_S = 1.0
PRESS_VIA = ("socket", "http")
FLOOR_VIA = "pgbench"


@dataclass
class Presses:
    """What the students' presses got back, by nickname: the acknowledged, the 409s, anything else."""

    acknowledged: Tally[str] = field(default_factory=Tally)
    conflicts: Tally[str] = field(default_factory=Tally)
    refused: list[str] = field(default_factory=list)
    busy: int = 0
    closed: bool = False
    """A press was told the job's writes are closed: the job is over."""

    def tally(self, nickname: str, status: int, message: str) -> None:
        """One press's answer, as its status and sentence say."""
        if status == 200:
            self.acknowledged[nickname] += 1
        elif status == 409 and "Conflict" in message:
            self.conflicts[nickname] += 1
        elif status == 409 and "writes are closed" in message:  # the job is over
            self.closed = True
        elif status == 503:  # the job is settling its accounts: nothing written, press again
            self.busy += 1
        else:
            self.refused.append(f"{nickname}: {status} {message[:120]!r}")

    def tally_for(self, nickname: str) -> Callable[[dict[str, Any]], None]:
        """What a student's socket does with a message that is not a frame: a press's answer is tallied."""

        def answered(message: dict[str, Any]) -> None:
            if message.get("type") == "pressed":
                self.tally(nickname, int(message["status"]), str(message["message"]))
            elif message.get("type") == "error":
                self.refused.append(f"{nickname}: {message.get('error')!r}")

        return answered


def students_bench(
    database_url: str | None = None,
    *,
    students: int = 60,
    pressing: int = 30,
    seconds: float = 10.0,
    writers: int = 4,
    rounds: int = 3,
    web_processes: int = 1,
    strategy: str = "none",
    press_via: str = "socket",
) -> dict[str, Any]:
    if not 0 <= pressing <= students:
        raise ValueError("pressing must be between 0 and students")
    if press_via not in PRESS_VIA:
        raise ValueError(f"press_via must be one of {', '.join(PRESS_VIA)}")
    env = {**os.environ, "DATABASE_URL": database_url or current_database_url()}
    asyncio.run(check_layer())
    params = {"strategy": strategy, "writers": writers, "seconds": seconds, "max_attempts": 1000}
    alone: list[float] = []
    watched: list[float] = []
    floor: list[float] = []
    floored: list[int] = []
    latencies: list[float] = []
    viewers_complete = viewers_total = 0
    counted: list[str] = []
    refused: list[str] = []
    busy = 0
    with web_servers(env, web_processes) as (port, _):
        # Rounds alternate, so a noisy machine slows both sides alike.
        for _ in range(rounds):
            alone.append(commits_per_s(run_alone(env, params)))
            job, viewers, presses = asyncio.run(_class_run(env, params, port, students, pressing, press_via))
            watched.append(commits_per_s(job))
            latencies.extend(latencies_ms(job, viewers))
            viewers_complete += sum(viewer.complete(job.last_seq, html=True) for viewer in viewers)
            viewers_total += len(viewers)
            counted.append(_counted(job, presses))
            refused.extend(presses.refused)
            busy += presses.busy
            if pressing:
                floor_job, _, floor_presses = asyncio.run(_class_run(env, params, port, students, pressing, FLOOR_VIA))
                floor.append(commits_per_s(floor_job))
                floored.append(floor_presses.acknowledged[FLOOR_VIA])
    commits_alone, commits_watched = statistics.median(alone), statistics.median(watched)
    return {
        "students": students,
        "pressing": pressing,
        "strategy": strategy,
        "press_via": press_via,
        "seconds": seconds,
        "writers": writers,
        "rounds": rounds,
        "web_processes": web_processes,
        "commits_per_s_alone_runs": alone,
        "commits_per_s_watched_runs": watched,
        "ratio": round(commits_watched / commits_alone, 3) if commits_alone else None,
        "ratio_target": RATIO_TARGET,
        "floor_commits_per_s_runs": floor,
        "floor_presses_runs": floored,
        "floor_ratio": round(statistics.median(floor) / commits_alone, 3) if floor and commits_alone else None,
        "latency_ms": {
            "p50": percentile(latencies, 0.50),
            "p95": percentile(latencies, 0.95),
            "max": round(max(latencies), 1) if latencies else None,
            "target_p95": LATENCY_TARGET_MS,
        },
        "complete": f"{viewers_complete} of {viewers_total} students saw every event exactly once and the end",
        "presses_counted": counted,
        "refused": refused[:5],
        "refused_count": len(refused),
        "busy": busy,
    }


async def _class_run(
    env: dict[str, str], params: dict[str, Any], port: int, students: int, pressing: int, press_via: str
) -> tuple[Job, list[Viewer], Presses]:
    """The job with the class on it: every student's page open before it starts, the pressers pressing while it runs."""
    from asgiref.sync import sync_to_async

    job = await sync_to_async(launch)("counter", params)
    token, cookie_name, seats = await sync_to_async(_seat_class)(job, students)
    path = f"/ws/s/{token}/events/{PAGE_QUERY}"
    # A student page's socket carries its seat cookie, as the browser sends it.
    clients = [await WsClient.connect(port, path, f"{cookie_name}={seat}") for _, seat in seats]
    for client in clients:
        await client.receive_text()  # the hello: every page is open before the job starts
    viewers = [Viewer() for _ in clients]
    presses = Presses()
    over_socket = press_via == "socket"
    following = [
        asyncio.create_task(
            follow_page(client, viewer, presses.tally_for(nickname) if over_socket and n < pressing else None)
        )
        for n, (client, viewer, (nickname, _)) in enumerate(zip(clients, viewers, seats, strict=True))
    ]
    worker = start_worker(env)
    while (await Job.objects.aget(pk=job.pk)).status == "queued":
        await asyncio.sleep(0.02)
    if press_via == FLOOR_VIA:
        pressers = [asyncio.create_task(_pgbench_pressing(job, pressing, params["seconds"] - 0.5, presses))]
    elif over_socket:
        pressers = [
            asyncio.create_task(_press_over_socket(client, follower, presses))
            for client, follower in zip(clients[:pressing], following, strict=False)
        ]
    else:
        pressers = [
            asyncio.create_task(_press_every_second(port, token, f"{cookie_name}={seat}", nickname, presses))
            for nickname, seat in seats[:pressing]
        ]
    await asyncio.wait_for(asyncio.gather(*following, *pressers), params["seconds"] + 120)
    await asyncio.to_thread(worker.wait, 60)
    return await Job.objects.aget(pk=job.pk), viewers, presses


def _seat_class(job: Job, students: int) -> tuple[str, str, list[tuple[str, str]]]:
    """A link to the job and `students` students joined through it: the token, the seat cookie's name,
    and each student's (nickname, seat)."""
    link = StudentLink.make(job, None)
    seats = []
    for number in range(1, students + 1):
        student = roster.join(link, f"student {number}")
        seats.append((student.nickname, roster.seat_value(student)))
    return token_for(link), roster.seat_cookie_name(link), seats


async def _press_over_socket(client: WsClient, follower: asyncio.Task[None], presses: Presses) -> None:
    """+1 once a second over the student's socket, at a phase of its own, until its writes are closed or it ends."""
    await asyncio.sleep(random.uniform(0, PRESS_EVERY_S))
    sent = 0
    while not (follower.done() or presses.closed):
        started = time.monotonic()
        sent += 1
        client.send_text(json.dumps({"type": "press", "id": sent}))
        await asyncio.sleep(max(0.0, PRESS_EVERY_S - (time.monotonic() - started)))


async def _pgbench_pressing(job: Job, rate: int, seconds: float, presses: Presses) -> None:
    """The floor's presses: `rate` a second by pgbench on the job's counter from its making, as many as fit in
    `seconds`, counted as acknowledged under FLOOR_VIA (pgbench's count, not a share of the row's versions)."""
    while (counter := await Counter.objects.filter(job=job).order_by("pk").afirst()) is None:
        await asyncio.sleep(0.01)
    presses.acknowledged[FLOOR_VIA] += await asyncio.to_thread(_pgbench_presses, counter.pk, rate, seconds)


def _pgbench_presses(row_id: int, rate: int, seconds: float) -> int:
    try:
        # Its commits do not wait for their WAL flush, as a press's do not: the row is not held through an fsync.
        return run_pgbench(
            row_id,
            1,
            math.ceil(seconds),
            rate=rate,
            transactions=max(1, int(rate * seconds)),
            settings={"synchronous_commit": "off"},
        ).transactions
    finally:
        connection.close()  # this thread's, opened for the row's versions


async def _press_every_second(port: int, token: str, seat: str, nickname: str, presses: Presses) -> None:
    """+1 once a second, at a phase of its own, until the job says its writes are closed."""
    await asyncio.sleep(random.uniform(0, PRESS_EVERY_S))
    csrf = _get_new_csrf_string()
    cookie = f"csrftoken={csrf}; {seat}"
    while True:
        started = time.monotonic()
        status, body = await _post(port, f"/s/{token}/press/", cookie, csrf)
        presses.tally(nickname, status, body.decode(errors="replace"))
        if presses.closed:
            return
        await asyncio.sleep(max(0.0, PRESS_EVERY_S - (time.monotonic() - started)))


async def _post(port: int, path: str, cookie: str, csrf: str) -> tuple[int, bytes]:
    """One POST as the student page's script sends it (JSON asked for, the CSRF header, the same origin)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            (
                f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nOrigin: http://127.0.0.1:{port}\r\n"
                f"Accept: application/json\r\nX-CSRFToken: {csrf}\r\nCookie: {cookie}\r\n"
                "Content-Length: 0\r\nConnection: close\r\n\r\n"
            ).encode()
        )
        response = await reader.read()
    finally:
        writer.close()
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def _counted(job: Job, presses: Presses) -> str:
    """Whether the job recorded exactly the presses acknowledged (and the 409s), each on its student's lane."""
    recorded: dict[str, Tally[str]] = {"outside_write": Tally(), "outside_conflict": Tally()}
    for kind, detail in Event.objects.filter(job=job, kind__in=recorded).values_list("kind", "detail"):
        recorded[kind][str(detail.get("lane", "")).removeprefix("student: ")] += 1
    writes_ok = recorded["outside_write"] == presses.acknowledged
    conflicts_ok = recorded["outside_conflict"] == presses.conflicts
    acknowledged, conflicts = sum(presses.acknowledged.values()), sum(presses.conflicts.values())
    verdict = "every press counted on its lane" if writes_ok and conflicts_ok else "PRESSES MISCOUNTED"
    return (
        f"{verdict}: {acknowledged} acknowledged, {recorded['outside_write'].total()} recorded; "
        f"{conflicts} conflicts, {recorded['outside_conflict'].total()} recorded"
    )
