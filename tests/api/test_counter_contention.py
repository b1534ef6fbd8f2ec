"""A job and API writes on one counter: both sides' conflicts show on the watch page and in the job's events.

A counter race launched through the API runs in the live db_worker while a thread of
this test increments the job's hot row over real HTTP, as a student's controller would:
GET the counter, PUT `spec.value + 1` with the `metadata.resourceVersion` it read, and on
a 409 read the Status, GET again and retry. The job's think time keeps it running for
seconds and makes the row move between the client's GET and PUT, so the race happens.
The watch page's cursor, polled while several API writers write at once, counts every write.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
import requests
from django.contrib.auth.models import User
from django.db import connections
from django.test import Client

from occviz.store import writes
from occviz.store.cas import ANY
from occviz.store.models import Change, Counter
from tests.api.conftest import COUNTERS, JOBS
from tests.api.test_auth import _signed_in
from tests.api.test_resources import url

pytestmark = pytest.mark.slow

# Four writers with 100 ms of think time for 12 s: the row moves every 20-30 milliseconds, so many
# of the client's GET-then-PUT round trips (about 25 ms here) meet a 409, and its first PUT waits
# for the row to move, so at least one does. The client stops by
# API_SECONDS, well before the job ends, so each of its writes is one the job follows.
JOB_PARAMS: dict[str, Any] = {
    "strategy": "occ",
    "writers": 4,
    "seconds": 12,
    "think_ms": 100,
    "retry": "immediate",
    "max_attempts": 1000,
}
API_INCREMENTS = 30
API_SECONDS = 8.0
API_WRITER = "API: student (token laptop)"
LANE = "api: student (token laptop)"


def _conflict_status(name: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f'Operation cannot be fulfilled on counters.occviz.dev "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again",
        "reason": "Conflict",
        "details": {"name": name, "group": "occviz.dev", "kind": "counters"},
        "code": 409,
    }


class ApiIncrementer(threading.Thread):
    """Read-modify-write increments of one counter over HTTP, each 409 retried with a fresh GET.

    It stops after `increments` commits or `seconds`, whichever comes first.
    """

    def __init__(self, api: requests.Session, path: str, name: str, increments: int, seconds: float) -> None:
        super().__init__(name="api-incrementer")
        self.api, self.path, self.name, self.increments = api, path, name, increments
        self.deadline = time.monotonic() + seconds
        self.committed = 0
        self.conflicts = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while self.committed < self.increments and time.monotonic() < self.deadline:
                self._attempt()
        except BaseException as error:  # reported by the test
            self.error = error

    def _attempt(self) -> None:
        """One GET and PUT: a commit, or a 409 (whose Status must be the API server's) to retry from."""
        got = self.api.get(url(self.api, self.path))
        assert got.status_code == 200, got.text
        counter = got.json()
        counter["spec"]["value"] += 1  # metadata.resourceVersion stays the one read
        if not self.conflicts:
            # The race made to happen, not hoped for: until a 409 was met, the client PUTs only once
            # a job's writer has moved the row past the version it read.
            self._wait_until_moved(counter["metadata"]["resourceVersion"])
        put = self.api.put(url(self.api, self.path), json=counter)
        if put.status_code == 200:
            self.committed += 1
            return
        assert put.status_code == 409, put.text
        assert put.json() == _conflict_status(self.name)
        self.conflicts += 1

    def _wait_until_moved(self, version: str) -> None:
        while time.monotonic() < self.deadline:
            now = self.api.get(url(self.api, self.path)).json()["metadata"]["resourceVersion"]
            if now != version:
                return
            time.sleep(0.005)


def _wait(condition: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what} within {timeout} s")


def _job(api: requests.Session, name: str) -> dict[str, Any]:
    job: dict[str, Any] = api.get(url(api, f"{JOBS}/{name}")).json()
    return job


def _events(api: requests.Session, name: str) -> list[dict[str, Any]]:
    """Every stored event of the job, paged from the API's events endpoint."""
    every: list[dict[str, Any]] = []
    after = 0
    while True:
        page = api.get(url(api, f"{JOBS}/{name}/events"), params={"after": after, "limit": 5000})
        assert page.status_code == 200, page.text
        every += [json.loads(line) for line in page.text.splitlines()]
        after = int(page.headers["X-Occviz-Next-After"])
        if page.headers["X-Occviz-More"] != "true":
            return every


def test_api_increments_race_a_running_job_and_both_sides_conflicts_are_shown_and_nothing_is_lost(
    api: requests.Session,
) -> None:
    launched = api.post(url(api, JOBS), json={"spec": {"scenario": "counter", "params": JOB_PARAMS}})
    assert launched.status_code == 201, launched.text
    job_name = launched.json()["metadata"]["name"]
    namespace = f"job-{job_name}"
    path = COUNTERS.replace("/default/", f"/{namespace}/") + "/row-1"
    _wait(lambda: _job(api, job_name)["status"]["phase"] == "running", 30, "the job did not start")
    _wait(lambda: api.get(url(api, path)).status_code == 200, 10, "the job made no counter")

    client = ApiIncrementer(api, path, "row-1", API_INCREMENTS, API_SECONDS)
    client.start()
    client.join(timeout=API_SECONDS + 30)
    assert client.error is None, client.error
    assert not client.is_alive(), "the API client did not finish its increments"
    # Every API write landed while the job followed them: it is still running.
    assert _job(api, job_name)["status"]["phase"] == "running", "the job ended before the API client: lengthen it"
    done = _wait(
        lambda: (job := _job(api, job_name))["status"]["phase"] in ("succeeded", "failed") and job, 60, "no end"
    )
    status = done["status"]
    assert status["phase"] == "succeeded", status
    summary = status["summary"]

    # The race happened, on both sides.
    assert client.committed >= 5, f"the API client committed {client.committed} increments in {API_SECONDS} s"
    assert client.conflicts > 0, "the API client never got a 409: raise the job's think time or writers"
    assert summary["conflicts"] > 0

    # No update lost: the row holds the job's committed increments plus the API's.
    final = api.get(url(api, path)).json()
    assert final["spec"]["value"] == summary["final_value"] == summary["committed"] + client.committed
    assert status["invariantOk"] is True and summary["invariant_ok"] is True, summary["invariant"]
    assert summary["lost_updates"] == 0
    assert summary["outside_writes"] == client.committed
    assert summary["outside_conflicts"] == client.conflicts

    # The job's events: the API writer's lane holds each of its commits and 409s.
    every = _events(api, job_name)
    lane = [e for e in every if e["detail"].get("lane") == LANE]
    assert sum(e["kind"] == "outside_write" for e in lane) == client.committed
    assert sum(e["kind"] == "outside_conflict" for e in lane) == client.conflicts
    assert len({e["actor"] for e in lane}) == 1 and lane[0]["actor"] == JOB_PARAMS["writers"] + 1
    assert all(e["detail"]["via"] == "api" for e in lane)
    assert sum(e["kind"] == "committed" for e in every) == summary["committed"]

    # The watch page (signed in, as a browser reads it): the API writer by its token, and the job's writers.
    browser = _signed_in(api.base)  # type: ignore[attr-defined]
    watch = f"{api.base}/watch/counters/{namespace}/row-1/"  # type: ignore[attr-defined]
    history = browser.get(watch + "history.json")
    assert history.status_code == 200, history.text
    data = history.json()
    counts = data["counts"]
    assert counts[API_WRITER] == {"versions": client.committed, "conflicts": client.conflicts}
    writers = {f"job {job_name}: writer {n}" for n in range(1, JOB_PARAMS["writers"] + 1)}
    assert set(counts) == writers | {API_WRITER}
    assert sum(counts[w]["versions"] for w in writers) == summary["committed"]
    assert sum(counts[w]["conflicts"] for w in writers) == summary["conflicts"]
    # Every commit, the job's and the API's, moved the version once from the row's first (1).
    versions = 1 + summary["committed"] + client.committed
    assert data["object"]["version"] == int(final["metadata"]["resourceVersion"]) == versions
    html = browser.get(watch).text
    assert f'<tr data-writer="{API_WRITER}"><th scope="row">{API_WRITER}</th>' in html
    assert f"<td>{client.committed}</td><td>{client.conflicts}</td>" in html
    assert all(f'data-writer="{writer}"' in html for writer in writers)


# Serial: it needs 50 polls and 200 writes in 3 s, which other tests' load denied it (44 and 162).
@pytest.mark.serial
def test_a_viewer_polling_by_cursor_counts_every_write_of_writers_at_once(transactional_db: None) -> None:
    """The watch page's cursor: polled as fast as it goes while four API writers write at once, it misses none.

    Blind writes, so every Change is logged under the row's lock and commits in id order:
    what is tested is that a poll's counts and its new cursor agree, whatever commits meanwhile.
    """
    counter = writes.create(Counter, {"namespace": "default", "name": "hot", "value": 0}, writes.Writer("api", "a"))
    stop = threading.Event()

    def write(name: str) -> None:
        try:
            while not stop.is_set():
                writes.update(counter, {"value": 1}, writes.Writer("api", name), expected_version=ANY)
        finally:
            connections.close_all()

    writers = [threading.Thread(target=write, args=(f"w{n}",)) for n in range(4)]
    viewer = Client()
    viewer.force_login(User.objects.create_user("viewer"))
    counted, cursor, polls = 0, 0, 0

    def poll() -> None:
        nonlocal counted, cursor, polls
        data = viewer.get("/watch/counters/default/hot/history.json", {"after_change": cursor}).json()
        counted += sum(tally["versions"] + tally["conflicts"] for tally in data["counts"].values())
        cursor, polls = data["after_change"], polls + 1

    for thread in writers:
        thread.start()
    try:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            poll()
    finally:
        stop.set()
        for thread in writers:
            thread.join()
    poll()
    total = Change.objects.filter(name="hot").count()
    assert polls > 50 and total > 200, (polls, total)
    assert counted == total, f"{total - counted} of {total} writes never counted over {polls} polls"
