"""Reading a long job's history: what a page costs, where it runs, and that a dropped viewer's read stops.

A student who joins a finished or long job at seq 0 is the normal case. Each page must cost
what it returns; pages run in the history threads (occviz/live/dbthreads.py), never in the
thread every socket's handshake shares; a read whose socket closed is dropped or cancelled
in PostgreSQL. The wedge test opens and drops many readers of a long job through a real
Daphne while a fresh socket on another job must get its hello within 1 s and every frame.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from asgiref.sync import sync_to_async
from django.db import connection
from django.test import Client

from occviz.bench.history import long_finished_job
from occviz.bench.wsclient import Closed, WsClient
from occviz.jobs.events import EVENT_FIELDS, read_events, read_events_json
from occviz.live.dbthreads import DatabaseThreads
from tests.servers import ROOT, free_port, stop, wait_for_port
from tests.test_live_stream import assert_exactly_once

pytestmark = pytest.mark.django_db(transaction=True)

EVERY_EVENT = f"SELECT {', '.join(EVENT_FIELDS)} FROM jobs_event WHERE job_id = %s AND seq > %s ORDER BY seq LIMIT %s"


def event_array(event: dict[str, Any]) -> list[Any]:
    """An event as the stream's JSON array says it: its values in EVENT_FIELDS order."""
    return [event[name] for name in EVENT_FIELDS]


def unnested_batches(job_id: int, after: int, limit: int) -> int:
    """How many batches the page's query unnested, from PostgreSQL's own count (EXPLAIN ANALYZE)."""
    from occviz.jobs.events import _READ_EVENTS

    with connection.cursor() as cursor:
        params = {"job": job_id, "after": after, "reach": after + limit, "limit": limit}
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + _READ_EVENTS, params)
        plan = cursor.fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan

    def scans(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
        if node.get("Relation Name") == "jobs_eventbatch" and node.get("Alias") == "batch":
            yield node
        for child in node.get("Plans", []):
            yield from scans(child)

    (scan,) = scans(plan[0]["Plan"])
    return int(scan["Actual Rows"] * scan.get("Actual Loops", 1))


def test_a_page_unnests_only_the_batches_that_hold_it() -> None:
    job = long_finished_job(60_000, batch=600)
    for after, limit in ((0, 2000), (30_000, 2000), (59_000, 2000), (599, 1), (600, 600)):
        # 2000 events from a batch boundary lie in 4 batches of 600; from inside one, in at most 5.
        assert unnested_batches(job.pk, after, limit) <= -(-limit // 600) + 1
    assert unnested_batches(job.pk, 60_000, 2000) == 0


def test_pages_are_exactly_the_stored_events_wherever_they_start() -> None:
    job = long_finished_job(6_000, batch=600)
    with connection.cursor() as cursor:
        for after in (0, 1, 599, 600, 601, 3_333, 5_400, 5_999, 6_000, 10**17):
            for limit in (1, 599, 600, 601, 2000, 5000):
                cursor.execute(EVERY_EVENT, [job.pk, after, limit])
                expected = [row[0] for row in cursor.fetchall()]
                assert [event["seq"] for event in read_events(job.pk, after, limit)] == expected, (after, limit)


def test_pages_encoded_by_the_store_say_what_the_events_say() -> None:
    """A viewer catching up gets the events as PostgreSQL wrote them to JSON: the same values, in order."""
    job = long_finished_job(6_000, batch=600)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE jobs_eventbatch SET detail = %s, t_us[2] = 3000 WHERE job_id = %s AND seq_from = 601",
            ['{"0": {"lane": "api: alice (laptop, \\"x\\")", "n": 1.5}, "3": {"ü": [1, null]}}', job.pk],
        )
    for after, limit in ((0, 2000), (598, 5), (1_000, 600), (5_990, 2000)):
        first, last, count, text = read_events_json(job.pk, after, limit)
        events = read_events(job.pk, after, limit)
        assert (first, last, count) == (events[0]["seq"], events[-1]["seq"], len(events))
        assert json.loads(f"[{text}]") == json.loads(json.dumps([event_array(event) for event in events]))
        if not any(event["detail"] for event in events):  # byte for byte, as Python writes them
            assert text == json.dumps([event_array(event) for event in events], separators=(",", ":"))[1:-1]
    assert read_events(job.pk, 600, 2)[1]["t_ms"] == 3.0 and "[602,3.0," in read_events_json(job.pk, 600, 2)[3]
    assert read_events_json(job.pk, 6_000, 2000) is None


@dataclass
class Gate:
    """A read that holds its thread until released: how many run at once, and at most."""

    release: threading.Event
    lock: threading.Lock
    running: int = 0
    most: int = 0
    started: int = 0

    def read(self, number: int) -> int:
        with self.lock:
            self.running += 1
            self.started += 1
            self.most = max(self.most, self.running)
        self.release.wait(30)
        with self.lock:
            self.running -= 1
        return number


@pytest.mark.asyncio
async def test_reads_run_a_bounded_number_at_once_and_the_rest_wait() -> None:
    readers = DatabaseThreads(3, "test")
    gate = Gate(threading.Event(), threading.Lock())
    reads = [asyncio.create_task(readers.read(gate.read, number)) for number in range(8)]
    while gate.started < 3:
        await asyncio.sleep(0.01)
    assert (gate.running, readers.waiting) == (3, 5)
    reads[5].cancel()  # its viewer left while it waited: it never runs
    await asyncio.wait([reads[5]])  # its cancellation has reached the read
    gate.release.set()
    results = await asyncio.gather(*reads, return_exceptions=True)
    assert results[:5] == [0, 1, 2, 3, 4] and results[6:] == [6, 7]
    assert isinstance(results[5], asyncio.CancelledError)
    assert gate.most == 3 and gate.started == 7


def backends_running(query: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE state = 'active' AND query LIKE %s AND pid <> pg_backend_pid()",
            [query + "%"],
        )
        return int(cursor.fetchone()[0])


@pytest.mark.asyncio
async def test_a_cancelled_read_stops_its_statement_in_postgresql() -> None:
    readers = DatabaseThreads(1, "test")
    started, ended = threading.Event(), threading.Event()
    outcome: list[BaseException] = []

    def slow_read() -> None:
        started.set()
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_sleep(60) /* a long history read */")
        except BaseException as error:
            outcome.append(error)
            raise
        finally:
            ended.set()

    read = asyncio.create_task(readers.read(slow_read))
    await asyncio.to_thread(started.wait, 10)
    while not await sync_to_async(backends_running)("SELECT pg_sleep(60)"):
        await asyncio.sleep(0.01)
    read.cancel()
    with pytest.raises(asyncio.CancelledError):
        await read
    assert await asyncio.to_thread(ended.wait, 10), "the statement ran on after its reader was cancelled"
    assert outcome and isinstance(outcome[0].__cause__, psycopg.errors.QueryCanceled)
    # The thread goes on with the next read, on a fresh connection.
    assert await readers.read(lambda: 42) == 42


# -- through a real Daphne ---------------------------------------------------------------------


@pytest.fixture
def daphne(database_url: str, tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """Daphne serving occviz on the test database, as a deployment runs it: its port and its log."""
    port = free_port()
    log = tmp_path / "daphne.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "occviz.asgi:application"],
            cwd=ROOT,
            env={**os.environ, "DATABASE_URL": database_url, "DEBUG": "false"},
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for_port(port, process)
        yield port, log
    finally:
        stop(process)


@pytest.fixture
def cookie(transactional_db: None) -> str:
    from django.contrib.auth import get_user_model

    client = Client()
    client.force_login(get_user_model().objects.create_user("student", password="correct horse battery"))
    return f"sessionid={client.cookies['sessionid'].value}"


async def read_to_the_end(client: WsClient) -> tuple[list[dict[str, Any]], dict[str, Any], int | None]:
    frames: list[dict[str, Any]] = []
    end: dict[str, Any] = {}
    while True:
        try:
            message = json.loads(await client.receive_text())
        except Closed as closed:
            return frames, end, closed.code
        if message["type"] == "frame":
            frames.append(message)
        elif message["type"] == "end":
            end = message


@pytest.mark.slow
@pytest.mark.asyncio
async def test_dropped_history_readers_never_wedge_another_jobs_socket(daphne: tuple[int, Path], cookie: str) -> None:
    port, log = daphne
    long_job = await sync_to_async(long_finished_job)(400_000)
    other = await sync_to_async(long_finished_job)(12_000)
    leaving = asyncio.Event()
    dropped = 0

    async def drop(number: int, after: int) -> None:
        """Open the long job from `after`, read its hello and two frames, leave (close or abort)."""
        nonlocal dropped
        client = await WsClient.connect(port, f"/ws/jobs/{long_job.pk}/events/?after={after}", cookie)
        for _ in range(3):
            await client.receive_text()
        if number % 2:
            client.abort()
        else:
            await client.close()
        dropped += 1

    async def rounds() -> None:
        """30 readers open together and drop, round after round (the issue's reproduction), each from its
        own place in the history, so that their pages are read from the store (pages read once are shared)."""
        places = itertools.count(0, 2_371)
        while not leaving.is_set():
            await asyncio.gather(*(drop(number, next(places) % 390_000) for number in range(30)))

    readers = [asyncio.create_task(rounds())]
    hellos: list[float] = []
    for _ in range(8):
        opened = time.monotonic()
        client = await WsClient.connect(port, f"/ws/jobs/{other.pk}/events/?after=0&html=1", cookie)
        hello = json.loads(await asyncio.wait_for(client.receive_text(), 5))
        hellos.append(time.monotonic() - opened)
        assert hello["type"] == "hello" and hello["job"]["id"] == other.pk
        frames, end, code = await asyncio.wait_for(read_to_the_end(client), 30)
        await client.close()
        assert_exactly_once(frames, 0, other.last_seq)
        assert end["type"] == "end" and end["status"] == "succeeded" and 'id="live-status"' in end["html"]
        assert code == 1000
    leaving.set()
    await asyncio.wait_for(asyncio.gather(*readers), 30)
    assert max(hellos) < 1.0, f"hellos took {[round(s, 3) for s in hellos]} s"
    assert dropped >= 100, f"only {dropped} readers came and went meanwhile"
    await asyncio.sleep(0.5)  # Daphne logs a slow shutdown, if any, as the sockets close
    text = log.read_text()
    for sign in ("Traceback", "took too long to shut down", "Attempt to send on a closed protocol"):
        assert sign not in text, text[-3000:]


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_reader_slower_than_its_frames_gets_every_event_in_order_and_holds_up_nobody(
    daphne: tuple[int, Path], cookie: str
) -> None:
    """Frames go to the kernel as they are sent while nothing waits on the connection; one the kernel
    does not take whole has its rest queued, and the frames after it wait behind it, in order."""
    port, log = daphne
    job = await sync_to_async(long_finished_job)(120_000)
    slow = await WsClient.connect(port, f"/ws/jobs/{job.pk}/events/?after=0", cookie, receive_buffer=4096)
    await asyncio.sleep(2)  # not reading: its buffers fill, and the server's sends to it come back short
    opened = time.monotonic()
    other = await WsClient.connect(port, f"/ws/jobs/{job.pk}/events/?after={job.last_seq - 10}", cookie)
    hello = json.loads(await asyncio.wait_for(other.receive_text(), 5))
    assert hello["type"] == "hello" and time.monotonic() - opened < 1.0
    frames, end, code = await asyncio.wait_for(read_to_the_end(other), 30)
    await other.close()
    assert_exactly_once(frames, job.last_seq - 10, job.last_seq)
    assert end["type"] == "end" and code == 1000
    frames, end, code = await asyncio.wait_for(read_to_the_end(slow), 60)
    await slow.close()
    assert_exactly_once(frames, 0, job.last_seq)
    assert end["type"] == "end" and code == 1000
    assert sum(len(json.dumps(frame)) for frame in frames) > 4_000_000, "more than the kernel's buffers hold"
    assert "Traceback" not in log.read_text()


@pytest.mark.asyncio
async def test_memory_is_released_once_the_last_socket_has_stayed_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    from occviz.live import memory

    released: list[int] = []
    monkeypatch.setattr(memory, "RELEASE_AFTER_S", 0.05)
    monkeypatch.setattr(memory, "release_freed_memory", lambda: released.append(1))
    sockets = memory.OpenSockets()
    sockets.opened()
    sockets.opened()
    sockets.closed()
    await asyncio.sleep(0.1)
    assert released == [], "a socket is still open"
    sockets.closed()
    sockets.opened()  # a page reloaded at once: nothing to give back yet
    await asyncio.sleep(0.1)
    assert released == []
    sockets.closed()
    await asyncio.sleep(0.1)
    assert released == [1]


def test_freed_memory_goes_back_to_the_system() -> None:
    from occviz.live.memory import _trim, release_freed_memory

    assert _trim is not None, "glibc's malloc_trim is found on Linux"
    release_freed_memory()


@pytest.mark.asyncio
async def test_viewers_asking_for_the_same_page_share_one_read(monkeypatch: pytest.MonkeyPatch) -> None:
    from occviz.live import history
    from occviz.live.frames import JobInfo, StoreReader

    job = await sync_to_async(long_finished_job)(6_000)
    info = JobInfo(id=job.pk, scenario=job.scenario, params=dict(job.params))
    reads: list[tuple[int, int]] = []
    read_page = history._read_page

    def counted(job: JobInfo, after: int, reach: int) -> Any:
        reads.append((after, reach))
        return read_page(job, after, reach)

    monkeypatch.setattr(history, "_read_page", counted)
    pages = history.HistoryPages(size=2)
    first = await asyncio.gather(*(pages.page(info, 0, job.last_seq) for _ in range(50)))
    assert reads == [(0, 2000)] and all(page is first[0] for page in first)
    expected = await sync_to_async(lambda: StoreReader(info, 0).next_frame(job.last_seq))()
    assert expected is not None
    assert (first[0].seq_from, first[0].seq_to, first[0].events_json) == (1, 2000, expected.events_json)
    assert await pages.page(info, 0, job.last_seq) is first[0] and len(reads) == 1, "kept for those who come later"
    # A viewer that asks for less gets exactly that range: another page.
    short = await pages.page(info, 0, 10)
    assert short is not None and (short.seq_from, short.seq_to, short.count) == (1, 10, 10)
    await pages.page(info, 2000, job.last_seq)
    assert len(pages) == 2 and len(reads) == 3, "the oldest page made room"
    assert await pages.page(info, job.last_seq, job.last_seq) is None


@pytest.mark.asyncio
async def test_sockets_catching_up_to_one_event_share_one_render_of_the_pages_fragments(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from occviz.live import fragments, history
    from occviz.live.jobstate import read_job_state

    job = await sync_to_async(long_finished_job)(6_000)
    state = await sync_to_async(read_job_state)(job.pk)
    assert state is not None
    renders: list[int] = []
    render_at = history._fragments_at

    def counted(state: Any, seq: int) -> Any:
        renders.append(seq)
        return render_at(state, seq)

    monkeypatch.setattr(history, "_fragments_at", counted)
    shared = await asyncio.gather(*(history.fragments_at(state, 2000) for _ in range(50)))
    assert renders == [2000] and all(parts is shared[0] for parts in shared)
    expected = await sync_to_async(lambda: fragments.render_parts(fragments.context_at(state, 2000)))()
    assert shared[0] == expected and "2000" in "".join(expected.values()), "the figures as of event 2000"
    assert await history.fragments_at(state, 2000) is shared[0] and renders == [2000], "kept for those who come later"
    later = await history.fragments_at(state, 4000)
    assert renders == [2000, 4000] and later != shared[0]


@pytest.mark.asyncio
async def test_sockets_opening_one_job_at_once_share_one_read_of_its_row(monkeypatch: pytest.MonkeyPatch) -> None:
    from occviz.live import jobstate

    job = await sync_to_async(long_finished_job)(600)
    reads: list[int] = []
    read_job_state = jobstate.read_job_state

    def counted(job_id: int) -> Any:
        reads.append(job_id)
        return read_job_state(job_id)

    monkeypatch.setattr(jobstate, "read_job_state", counted)
    states = await asyncio.gather(*(jobstate.read_for_new_socket(job.pk) for _ in range(50)))
    assert reads == [job.pk] and all(state is states[0] for state in states)
    assert states[0] is not None and (states[0].last_seq, states[0].status) == (job.last_seq, job.status)
    assert states[0].vocabulary is states[1].vocabulary, "the hello's vocabulary built once for them"
    # A socket that comes once the read has ended reads the row afresh; a job that does not exist is None.
    again = await jobstate.read_for_new_socket(job.pk)
    assert again is not states[0] and reads == [job.pk, job.pk]
    assert await jobstate.read_for_new_socket(job.pk + 10_000) is None


@pytest.mark.asyncio
async def test_a_page_nobody_waits_for_any_more_is_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    from occviz.live import history
    from occviz.live.frames import JobInfo

    job = await sync_to_async(long_finished_job)(6_000)
    info = JobInfo(id=job.pk, scenario=job.scenario, params=dict(job.params))
    gate = threading.Event()
    readers = DatabaseThreads(1, "test")
    blocker = asyncio.create_task(readers.read(gate.wait, 30))  # the only thread is busy
    monkeypatch.setattr(history, "read_history", readers.read)
    reads: list[int] = []
    monkeypatch.setattr(history, "_read_page", lambda *args: reads.append(1))
    pages = history.HistoryPages()
    waiting = [asyncio.create_task(pages.page(info, 0, job.last_seq)) for _ in range(3)]
    while readers.waiting < 1:
        await asyncio.sleep(0.01)
    for viewer in waiting[:2]:
        viewer.cancel()
    await asyncio.sleep(0.05)
    assert not pages._reading[(job.pk, 0, 2000)].task.cancelled(), "one viewer still waits"
    waiting[2].cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
    assert (job.pk, 0, 2000) not in pages._reading
    gate.set()
    await blocker
    assert await readers.read(lambda: "moved on") == "moved on"  # the thread is past the dropped read
    assert reads == [], "the read was dropped before it ran"
