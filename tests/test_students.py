"""Student links: a signed token that opens one job, read-only, and a +1 that joins its race as a lane.

HTTP through Django's test client (no session: the token is the only credential), websockets
through the real ASGI application, jobs run by the real runner in this process with students
pressing from threads of their own, as a class does.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import Client
from django.utils import timezone

from occviz.asgi import application
from occviz.jobs.models import Job
from occviz.jobs.runner import run_job
from occviz.jobs.tasks import create_job
from occviz.store import writes
from occviz.store.models import Change, Counter
from occviz.students import roster
from occviz.students.models import MAX_STUDENTS_PER_JOB, Student, StudentLink
from occviz.students.presses import MAX_PRESSES_PER_S
from occviz.students.tokens import LinkRefused, token_for
from tests.helpers import events
from tests.test_outside_writes import OutsideIncrementer

pytestmark = pytest.mark.django_db(transaction=True)

ORIGIN = (b"origin", b"http://127.0.0.1")
HOST = (b"host", b"127.0.0.1")
QUICK = {"strategy": "occ", "writers": 2, "increments": 5}


def _job(user: User, **params: Any) -> Job:
    return create_job("counter", {**QUICK, **params}, user)


def _link(job: Job, **fields: Any) -> tuple[StudentLink, str]:
    link = StudentLink.make(job, job.created_by, 60)
    if fields:
        StudentLink.objects.filter(pk=link.pk).update(**fields)
        link.refresh_from_db()
    return link, token_for(link)


def _student_client(token: str, nickname: str) -> Client:
    """A browser with no account that joined through the link under `nickname`."""
    student = Client()
    response = student.post(f"/s/{token}/", {"nickname": nickname})
    assert response.status_code == 302, response.content.decode()[:300]
    return student


def _running_counter(user: User, strategy: str = "occ") -> tuple[Job, Counter]:
    """A job marked running with its row, no program behind it: for what a press checks before it writes."""
    job = _job(user, strategy=strategy)
    Job.objects.filter(pk=job.pk).update(status=Job.Status.RUNNING)
    row = Counter.objects.create(namespace=f"job-{job.pk}", name="row-1", value=0, job=job)
    return job, row


# --- the token -----------------------------------------------------------------------------------------------


def test_a_link_opens_the_nickname_form_then_the_job_read_only(alice: User) -> None:
    job = _job(alice)
    _, token = _link(job)
    visitor = Client()
    first = visitor.get(f"/s/{token}/")
    assert first.status_code == 200
    assert b'name="nickname"' in first.content and b"data-page" not in first.content

    student = _student_client(token, "Ada")
    page = student.get(f"/s/{token}/").content.decode()
    assert 'data-page="job"' in page and f'data-ws-path="/ws/s/{token}/events/"' in page
    assert "data-plus-one" in page and "Ada" in page
    # Nothing of the site beyond the job: no launch, no control, no admin, no navigation, no sign-in.
    for absent in ("/jobs/new/", "/control/", "/cancel/", "/admin/", "/lessons/", "data-cancel", "<nav", "Sign out"):
        assert absent not in page, absent
    assert "_auth_user_id" not in student.session  # no Django session user, ever


@pytest.mark.parametrize(
    ("how", "status", "said"),
    [
        ("tampered", 403, "altered"),
        ("revoked", 410, "revoked"),
        ("expired", 410, "expired"),
        ("garbage", 403, "altered"),
    ],
)
def test_a_refused_link_gets_a_clear_page_never_the_job(alice: User, how: str, status: int, said: str) -> None:
    job = _job(alice)
    link, token = _link(job)
    if how == "tampered":
        token = token[:-2] + ("AA" if not token.endswith("AA") else "BB")
    elif how == "revoked":
        assert link.revoke()
    elif how == "expired":
        StudentLink.objects.filter(pk=link.pk).update(expires=timezone.now() - timedelta(seconds=1))
    else:
        token = "not-a-token"
    for response in (Client().get(f"/s/{token}/"), Client().post(f"/s/{token}/", {"nickname": "Ada"})):
        assert response.status_code == status
        assert said in response.content.decode()
        assert 'data-page="job"' not in response.content.decode()
    events_page = Client().get(f"/s/{token}/events.json")
    assert events_page.status_code == status and said in events_page.json()["error"]
    assert not Student.objects.exists()


def test_a_token_for_job_a_never_reads_job_b(alice: User) -> None:
    job_a, job_b = _job(alice), _job(alice)
    _, token_a = _link(job_a)
    _, token_b = _link(job_b)
    # Job A's signature over job B's link id: refused as altered.
    forged = f"{StudentLink.objects.get(job=job_b).pk}:{token_a.split(':', 1)[1]}"
    assert Client().get(f"/s/{forged}/").status_code == 403
    # Job A's seat does not sit on job B's page.
    student = _student_client(token_a, "Ada")
    assert b'name="nickname"' in student.get(f"/s/{token_b}/").content
    assert student.post(f"/s/{token_b}/press/", HTTP_ACCEPT="application/json").status_code == 403


def test_a_student_cannot_launch_control_read_other_jobs_or_open_the_admin_or_the_api(alice: User) -> None:
    job, other = _job(alice), _job(alice)
    _, token = _link(job)
    student = _student_client(token, "Ada")
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    for method, path in [
        ("get", "/"),
        ("get", "/jobs/new/counter/"),
        ("post", "/jobs/new/counter/"),
        ("get", f"/jobs/{job.pk}/"),
        ("post", f"/jobs/{job.pk}/cancel/"),
        ("post", f"/jobs/{job.pk}/control/"),
        ("get", f"/jobs/{other.pk}/"),
        ("get", f"/jobs/{other.pk}/summary.json"),
        ("post", f"/jobs/{job.pk}/student-links/"),
        ("get", "/lessons/"),
        ("get", "/admin/"),
        ("get", "/admin/students/studentlink/"),
    ]:
        response = getattr(student, method)(path, **auth)
        assert response.status_code in (302, 401, 403), (path, response.status_code)
        if response.status_code == 302:
            assert "/login/" in response["Location"], (path, response["Location"])
    for path in ("/api/v1/namespaces/default/pods", "/apis/occviz.dev/v1/namespaces/default/counters"):
        assert student.get(path, **auth).status_code == 401, path
    events_of_other = student.get(f"/jobs/{other.pk}/events.json")
    assert events_of_other.status_code in (302, 401, 403)
    assert Job.objects.count() == 2 and Job.objects.get(pk=job.pk).status == Job.Status.QUEUED


# --- nicknames and the class's size --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nickname", "why"),
    [
        ("", "cannot be empty"),
        ("   ", "cannot be empty"),
        ("x" * 1_000_000, "at most 32 characters"),
        ("x" * 33, "at most 32 characters"),
        ("<script>alert(1)</script>", "markup"),
        ("Ada<b>", "markup"),
        ("Ada\x00", "NUL"),
        ("Ada\nLovelace", "control"),
        ("Ada\u202eLovelace", "control"),
    ],
)
def test_a_bad_nickname_is_refused_with_why_and_nothing_stored(alice: User, nickname: str, why: str) -> None:
    _, token = _link(_job(alice))
    response = Client().post(f"/s/{token}/", {"nickname": nickname})
    assert response.status_code == 400
    page = response.content.decode()
    assert why in page
    assert "<script>alert" not in page and "x" * 40 not in page  # the refused text is not sent back
    assert not Student.objects.exists()
    assert not any(name.startswith("occviz-student") for name in response.cookies)


def test_a_nickname_is_unique_per_job_whatever_its_case_and_escaped_on_every_page(alice: User) -> None:
    job, other = _job(alice), _job(alice)
    _, token = _link(job)
    _, other_token = _link(other)
    assert Client().post(f"/s/{token}/", {"nickname": "Zoë & co"}).status_code == 400  # & is markup
    _student_client(token, "Zoë")
    taken = Client().post(f"/s/{token}/", {"nickname": "ZOË"})
    assert taken.status_code == 400 and "taken" in taken.content.decode()
    _student_client(other_token, "zoë")  # another job: free
    assert Student.objects.filter(job=job).count() == 1


def test_the_201st_student_is_refused(alice: User) -> None:
    job = _job(alice)
    link, token = _link(job)
    Student.objects.bulk_create(
        Student(job=job, link=link, nickname=f"student {n}") for n in range(MAX_STUDENTS_PER_JOB - 1)
    )
    _student_client(token, "the 200th")
    refused = Client().post(f"/s/{token}/", {"nickname": "the 201st"})
    assert refused.status_code == 400
    assert f"{MAX_STUDENTS_PER_JOB} students have joined it already" in refused.content.decode()
    assert Student.objects.filter(job=job).count() == MAX_STUDENTS_PER_JOB


def test_students_joining_at_once_never_exceed_the_limit(alice: User) -> None:
    job = _job(alice)
    link, _ = _link(job)
    Student.objects.bulk_create(
        Student(job=job, link=link, nickname=f"student {n}") for n in range(MAX_STUDENTS_PER_JOB - 3)
    )
    joined, refused = [], []
    barrier = threading.Barrier(8)

    def arrive(n: int) -> None:
        try:
            barrier.wait()
            joined.append(roster.join(link, f"late {n}"))
        except roster.JoinRefused as why:
            refused.append(str(why))
        finally:
            connection.close()

    threads = [threading.Thread(target=arrive, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(joined) == 3 and len(refused) == 5
    assert Student.objects.filter(job=job).count() == MAX_STUDENTS_PER_JOB


# --- presses -------------------------------------------------------------------------------------------------


def test_presses_above_the_rate_are_refused_and_write_nothing(alice: User) -> None:
    job, row = _running_counter(alice)
    _, token = _link(job)
    student = _student_client(token, "Ada")
    answers = [student.post(f"/s/{token}/press/", HTTP_ACCEPT="application/json") for _ in range(MAX_PRESSES_PER_S + 3)]
    statuses = [answer.status_code for answer in answers]
    assert statuses.count(200) == MAX_PRESSES_PER_S, statuses
    assert statuses.count(429) == 3
    assert all("Too fast" in a.json()["message"] for a in answers if a.status_code == 429)
    row.refresh_from_db()
    assert row.value == MAX_PRESSES_PER_S and row.resource_version == 1 + MAX_PRESSES_PER_S
    assert Change.objects.filter(via="student", writer="Ada").count() == MAX_PRESSES_PER_S
    time.sleep(1.05)  # a new second: room again
    assert student.post(f"/s/{token}/press/", HTTP_ACCEPT="application/json").status_code == 200


def test_a_press_on_a_finished_or_unstarted_job_is_refused_clearly(alice: User) -> None:
    job = _job(alice)
    _, token = _link(job)
    student = _student_client(token, "Ada")
    queued = student.post(f"/s/{token}/press/", HTTP_ACCEPT="application/json")
    assert queued.status_code == 409 and "has not started" in queued.json()["message"]
    Job.objects.filter(pk=job.pk).update(status=Job.Status.SUCCEEDED)
    finished = student.post(f"/s/{token}/press/")  # the form without the script: the page again, with why
    assert finished.status_code == 409 and "has finished (succeeded)" in finished.content.decode()
    assert not Change.objects.filter(via="student").exists()


def test_a_press_without_a_nickname_writes_nothing(alice: User) -> None:
    job, row = _running_counter(alice)
    _, token = _link(job)
    anonymous = Client()
    anonymous.get(f"/s/{token}/")
    answer = anonymous.post(f"/s/{token}/press/", HTTP_ACCEPT="application/json")
    assert answer.status_code == 403 and "nickname" in answer.json()["message"]
    forged = Client()
    forged.cookies[f"occviz-student-{job.pk}"] = "1"  # an unsigned id
    assert forged.post(f"/s/{token}/press/", HTTP_ACCEPT="application/json").status_code == 403
    row.refresh_from_db()
    assert row.resource_version == 1


class Presser(threading.Thread):
    """A student pressing +1 every `every_s` until the job ends, retrying after a 409 as the page invites."""

    def __init__(self, job_id: int, token: str, nickname: str, every_s: float) -> None:
        super().__init__(name=f"student-{nickname}")
        self.job_id, self.token, self.nickname, self.every_s = job_id, token, nickname, every_s
        self.acknowledged = 0
        self.conflicts = 0
        self.refused: list[str] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            client = _student_client(self.token, self.nickname)
            while not Counter.objects.filter(job_id=self.job_id).exists():
                time.sleep(0.01)
            while True:
                answer = client.post(f"/s/{self.token}/press/", HTTP_ACCEPT="application/json")
                if answer.status_code == 200:
                    self.acknowledged += 1
                elif answer.status_code == 409 and "Conflict" in answer.json()["message"]:
                    self.conflicts += 1
                elif answer.status_code == 409:  # the job is over
                    return
                elif answer.status_code == 503:  # the job is busy settling its accounts: press again
                    pass
                else:
                    self.refused.append(answer.json()["message"])
                time.sleep(self.every_s)
        except BaseException as error:  # reported by the test
            self.error = error
        finally:
            connection.close()


def _race(alice: User, strategy: str, seconds: float) -> tuple[Job, list[Presser], OutsideIncrementer]:
    params = {"strategy": strategy, "writers": 1, "increments": None, "seconds": seconds, "think_ms": 12}
    job = create_job("counter", params, alice)
    _, token = _link(job)
    students = [Presser(job.pk, token, name, every_s=0.21) for name in ("Ada", "Grace")]
    # The API's increments are done well before the job ends (as in test_outside_writes.py).
    api = OutsideIncrementer(job.pk, increments=8, think_s=0.002, writer=writes.Writer("api", "bob (token ci)"))
    for thread in (*students, api):
        thread.start()
    job = run_job(job.pk)
    for thread in (*students, api):
        thread.join(timeout=30)
    assert api.error is None, api.error
    assert all(s.error is None for s in students), [s.error for s in students]
    assert job.status == Job.Status.SUCCEEDED, job.error
    return job, students, api


@pytest.mark.slow
def test_occ_race_with_students_and_the_api_final_value_is_every_acknowledged_write(alice: User) -> None:
    job, students, api = _race(alice, "occ", 2.5)
    summary = job.summary
    acknowledged = sum(s.acknowledged for s in students)
    # Against writers with little think time most presses meet a 409; one that lands is enough to count.
    assert acknowledged >= 1 and all(not s.refused for s in students), [s.refused for s in students]
    row = Counter.objects.get(job=job)
    assert row.value == summary["final_value"] == summary["committed"] + acknowledged + api.committed
    assert summary["invariant_ok"], summary["invariant"]
    assert summary["lost_updates"] == 0
    assert summary["outside_writes"] == acknowledged + api.committed
    # Each student a lane of their own, named by the nickname, their writes and 409s on it.
    for student in students:
        lane = [
            e
            for e in events(job, "outside_write", "outside_conflict")
            if e.detail["lane"] == f"student: {student.nickname}"
        ]
        assert len({e.actor for e in lane}) == 1
        assert sum(e.kind == "outside_write" for e in lane) == student.acknowledged
        assert sum(e.kind == "outside_conflict" for e in lane) == student.conflicts
    assert sum(s.conflicts for s in students) > 0, "no student ever collided: raise the think time"


@pytest.mark.slow
def test_none_race_counts_every_update_a_student_erased_and_names_them(alice: User) -> None:
    job, students, api = _race(alice, "none", 2.5)
    summary = job.summary
    acknowledged = sum(s.acknowledged for s in students)
    row = Counter.objects.get(job=job)
    assert row.value == summary["final_value"]
    # Every increment acknowledged, by the job's writers, the students and the API, is on the row or counted lost.
    intended = summary["committed"] + acknowledged + api.committed
    assert summary["lost_updates"] == intended - (summary["final_value"] - summary["initial_value"])
    assert summary["invariant_ok"], summary["invariant"]
    erased = {
        e.detail["lane"]: e.detail.get("erased", 0)
        for e in events(job, "outside_write")
        if e.detail["lane"].startswith("student: ") and e.detail.get("erased")
    }
    assert erased, "no student's blind write erased anything: raise the think time"
    for lane in erased:
        assert lane in summary["invariant"]
    assert summary["lost_to_outside_blind_writes"] >= sum(erased.values())


# --- websockets ----------------------------------------------------------------------------------------------


async def _messages(path: str, headers: list[tuple[bytes, bytes]] | None = None) -> tuple[list[dict[str, Any]], int]:
    communicator = WebsocketCommunicator(application, path, headers=[ORIGIN, HOST, *(headers or [])])
    connected, _ = await communicator.connect(timeout=10)
    assert connected
    received: list[dict[str, Any]] = []
    while True:
        message = await communicator.receive_output(timeout=10)
        if message["type"] == "websocket.close":
            return received, int(message.get("code", 1000))
        if message["type"] == "websocket.send":
            received.append(json.loads(message["text"]))


@pytest.mark.asyncio
async def test_the_student_socket_streams_exactly_what_the_job_pages_socket_streams(alice: User) -> None:
    from asgiref.sync import sync_to_async

    job = await sync_to_async(run_job)((await sync_to_async(_job)(alice)).pk)
    _, token = await sync_to_async(_link)(job)
    client = Client()
    await sync_to_async(client.force_login)(alice)
    cookie = (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())
    teacher, teacher_code = await _messages(f"/ws/jobs/{job.pk}/events/?html=1", [cookie])
    student, student_code = await _messages(f"/ws/s/{token}/events/?html=1")
    assert teacher_code == student_code == 1000
    assert student[0]["type"] == "hello" and student[-1]["type"] == "end"
    assert student == teacher
    assert sum(len(m.get("events") or []) for m in student if m["type"] == "frame") == job.last_seq


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["tampered", "revoked", "expired"])
async def test_a_refused_token_closes_the_socket_with_4403(alice: User, how: str) -> None:
    from asgiref.sync import sync_to_async

    job = await sync_to_async(_job)(alice)
    fields = {"tampered": {}, "revoked": {"revoked": True}, "expired": {"expires": timezone.now()}}[how]
    _, token = await sync_to_async(_link)(job, **fields)
    if how == "tampered":
        token = f"{int(token.split(':')[0]) + 1}:{token.split(':')[1]}"
    received, code = await _messages(f"/ws/s/{token}/events/")
    assert code == 4403
    assert [m["type"] for m in received] == ["error"]
    assert received[0]["code"] == 4403


@pytest.mark.asyncio
async def test_a_link_revoked_while_its_sockets_are_open_closes_them_with_4403(
    alice: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    from asgiref.sync import sync_to_async

    from occviz.students.consumers import StudentEventsConsumer

    monkeypatch.setattr(StudentEventsConsumer, "RECHECK_S", 0.2)
    job = await sync_to_async(_job)(alice)  # queued: its socket stays open, waiting for the job
    link, token = await sync_to_async(_link)(job)
    communicator = WebsocketCommunicator(application, f"/ws/s/{token}/events/?html=1", headers=[ORIGIN, HOST])
    connected, _ = await communicator.connect(timeout=10)
    assert connected
    assert (await communicator.receive_json_from(timeout=10))["type"] == "hello"
    await communicator.receive_nothing(timeout=0.5)  # still open, and following
    assert await sync_to_async(link.revoke)()
    error = await communicator.receive_json_from(timeout=10)
    assert error["code"] == 4403 and "revoked" in error["error"]
    closing = await communicator.receive_output(timeout=10)
    assert closing["type"] == "websocket.close" and closing["code"] == 4403


@pytest.mark.asyncio
async def test_the_sockets_on_one_link_share_its_rechecks(alice: User, monkeypatch: pytest.MonkeyPatch) -> None:
    """A class's sockets recheck their link with one read between them, and a revoke is seen once it is FRESH_S old."""
    from asgiref.sync import sync_to_async

    from occviz.students import consumers

    reads: list[str] = []
    real_read = consumers.read_for_handshake

    async def counted(fn: Any, token: str) -> Any:
        reads.append(token)
        return await real_read(fn, token)

    monkeypatch.setattr(consumers, "read_for_handshake", counted)
    monkeypatch.setattr(consumers._LinkChecks, "FRESH_S", 0.3)
    job = await sync_to_async(_job)(alice)
    link, token = await sync_to_async(_link)(job)
    _, other = await sync_to_async(_link)(job)
    checks = consumers._LinkChecks()
    found = await asyncio.gather(*(checks.job_of(token) for _ in range(20)), checks.job_of(other))
    assert found == [job.pk] * 21 and reads == [token, other]
    assert await sync_to_async(link.revoke)()
    assert await checks.job_of(token) == job.pk and len(reads) == 2  # read less than FRESH_S ago
    await asyncio.sleep(0.35)
    refused = await checks.job_of(token)
    assert isinstance(refused, LinkRefused) and "revoked" in refused.reason and len(reads) == 3


async def _seated_socket(token: str, seat: str | None) -> WebsocketCommunicator:
    """A student page's socket, opened with the student's seat cookie (None: a page without one), its hello read."""
    headers = [ORIGIN, HOST]
    if seat is not None:
        headers.append((b"cookie", seat.encode()))
    communicator = WebsocketCommunicator(application, f"/ws/s/{token}/events/?html=1", headers=headers)
    connected, _ = await communicator.connect(timeout=10)
    assert connected
    assert (await communicator.receive_json_from(timeout=10))["type"] == "hello"
    return communicator


async def _answers(communicator: WebsocketCommunicator, count: int) -> list[dict[str, Any]]:
    """The next `count` messages that are not frames: presses' answers and errors."""
    found: list[dict[str, Any]] = []
    while len(found) < count:
        message = await communicator.receive_json_from(timeout=10)
        if message["type"] in ("pressed", "error"):
            found.append(message)
    return found


def _seat_of(job: Job, student: Client) -> str:
    name = f"occviz-student-{job.pk}"
    return f"{name}={student.cookies[name].value}"


@pytest.mark.asyncio
async def test_a_seated_student_presses_over_the_socket_and_hears_what_the_post_says(alice: User) -> None:
    from asgiref.sync import sync_to_async

    job, row = await sync_to_async(_running_counter)(alice)
    _, token = await sync_to_async(_link)(job)
    seat = _seat_of(job, await sync_to_async(_student_client)(token, "Ada"))
    communicator = await _seated_socket(token, seat)
    await communicator.send_json_to({"type": "press", "id": 7})
    [answer] = await _answers(communicator, 1)
    assert (answer["type"], answer["id"], answer["status"], answer["ok"]) == ("pressed", 7, 200, True), answer
    assert answer["message"].startswith("+1 written over v1: v2") and answer["version"] == 2
    await sync_to_async(row.refresh_from_db)()
    assert (row.value, row.resource_version) == (1, 2)
    assert await Change.objects.filter(via="student", writer="Ada", resource_version=2).aexists()
    await communicator.disconnect()

    anonymous = await _seated_socket(token, None)  # the page of someone who picked no nickname
    await anonymous.send_json_to({"type": "press"})
    [refused] = await _answers(anonymous, 1)
    assert (refused["status"], refused["ok"], refused["id"]) == (403, False, 0) and "nickname" in refused["message"]
    await anonymous.disconnect()
    await sync_to_async(row.refresh_from_db)()
    assert row.resource_version == 2


@pytest.mark.asyncio
async def test_a_press_over_the_socket_needs_a_seat_signed_for_its_job_and_a_usable_link(alice: User) -> None:
    """A seat on another job (under its own cookie's name or this job's), a forged seat, a revoked link or a
    job settling its accounts: each press is refused with why, and nothing is written."""
    from asgiref.sync import sync_to_async

    job, row = await sync_to_async(_running_counter)(alice)
    other, _ = await sync_to_async(_running_counter)(alice)
    link, token = await sync_to_async(_link)(job)
    _, other_token = await sync_to_async(_link)(other)
    grace = (await sync_to_async(_student_client)(other_token, "Grace")).cookies[f"occviz-student-{other.pk}"].value
    for cookie in (
        f"occviz-student-{other.pk}={grace}",  # seated on the other job
        f"occviz-student-{job.pk}={grace}",  # the same seat under this job's cookie name
        f"occviz-student-{job.pk}=1",  # not signed by us
        f"occviz-student-{job.pk}=1:forged; occviz-student-x={grace}",
    ):
        socket = await _seated_socket(token, cookie)
        await socket.send_json_to({"type": "press", "id": 1})
        [answer] = await _answers(socket, 1)
        assert (answer["status"], answer["ok"]) == (403, False) and "nickname" in answer["message"], (cookie, answer)
        await socket.disconnect()

    seat = _seat_of(job, await sync_to_async(_student_client)(token, "Ada"))
    socket = await _seated_socket(token, seat)
    closing = Job.objects.filter(pk=job.pk)
    await sync_to_async(closing.update)(outside_writes_closed_at=timezone.now())  # the job settling its accounts
    await socket.send_json_to({"type": "press", "id": 2})
    [finishing] = await _answers(socket, 1)
    assert finishing["status"] == 409 and "is finishing: writes are closed" in finishing["message"], finishing
    await sync_to_async(closing.update)(outside_writes_closed_at=None)
    await socket.send_json_to({"type": "press", "id": 3})
    [written] = await _answers(socket, 1)
    assert written["status"] == 200 and written["message"].startswith("+1 written over v1: v2"), written
    assert await sync_to_async(link.revoke)()
    await socket.send_json_to({"type": "press", "id": 4})
    [revoked] = await _answers(socket, 1)
    assert revoked["status"] == 410 and "revoked" in revoked["message"], revoked
    await socket.disconnect()
    await sync_to_async(row.refresh_from_db)()
    assert (row.value, row.resource_version) == (1, 2)
    assert await Change.objects.filter(via="student").acount() == 1


@pytest.mark.asyncio
async def test_presses_over_a_socket_above_the_rate_are_refused_and_bad_ones_get_why(alice: User) -> None:
    from asgiref.sync import sync_to_async

    # Blind: presses in flight together all land (with occ they would race each other to 409s).
    job, row = await sync_to_async(_running_counter)(alice, "none")
    _, token = await sync_to_async(_link)(job)
    communicator = await _seated_socket(token, _seat_of(job, await sync_to_async(_student_client)(token, "Ada")))
    for bad in (
        {"type": "press", "id": "1"},
        {"type": "press", "id": True},
        {"type": "press", "id": -1},
        {"type": "press", "as": "Grace"},
    ):
        await communicator.send_json_to(bad)
        [error] = await _answers(communicator, 1)
        assert error["type"] == "error" and "press takes" in error["error"], (bad, error)
    for number in range(1, MAX_PRESSES_PER_S + 4):
        await communicator.send_json_to({"type": "press", "id": number})
    answers = await _answers(communicator, MAX_PRESSES_PER_S + 3)
    statuses = sorted(answer["status"] for answer in answers)
    assert statuses == [200] * MAX_PRESSES_PER_S + [429] * 3, answers
    assert all("Too fast" in a["message"] for a in answers if a["status"] == 429)
    await communicator.disconnect()
    await sync_to_async(row.refresh_from_db)()
    assert row.resource_version == 1 + MAX_PRESSES_PER_S
    assert await Change.objects.filter(via="student", writer="Ada").acount() == MAX_PRESSES_PER_S


@pytest.mark.asyncio
async def test_a_student_without_a_session_cannot_open_the_job_pages_socket(alice: User) -> None:
    from asgiref.sync import sync_to_async

    job = await sync_to_async(_job)(alice)
    received, code = await _messages(f"/ws/jobs/{job.pk}/events/")
    assert code == 4401 and received[0]["type"] == "error"


# --- the teacher's side --------------------------------------------------------------------------------------


def test_the_owner_makes_shows_and_revokes_a_link_on_the_job_page(signed_in: Client, alice: User) -> None:
    job = _job(alice)
    page = signed_in.get(f"/jobs/{job.pk}/").content.decode()
    assert '<section id="student-link" class="student-link"' in page and "data-student-url" not in page
    made = signed_in.post(f"/jobs/{job.pk}/student-links/", {"minutes": "45", "next": f"/jobs/{job.pk}/"})
    assert made.status_code == 302 and made["Location"] == f"/jobs/{job.pk}/#student-link"
    link = StudentLink.objects.get(job=job)
    assert timedelta(minutes=44) < link.expires - link.created <= timedelta(minutes=45)
    page = signed_in.get(f"/jobs/{job.pk}/").content.decode()
    url = f"http://testserver/s/{token_for(link)}/"
    assert url in page and 'class="student-link-qr"' in page and "<svg" in page
    assert signed_in.post(f"/student-links/{link.pk}/revoke/", {"next": f"/jobs/{job.pk}/"}).status_code == 302
    assert Client().get(url).status_code == 410
    assert url not in signed_in.get(f"/jobs/{job.pk}/").content.decode()


@pytest.mark.parametrize(("minutes", "why"), [("0", "1 to 1440"), ("1441", "at most 24 hours"), ("ten", "whole")])
def test_a_link_beyond_24_hours_or_not_a_number_is_refused(
    signed_in: Client, alice: User, minutes: str, why: str
) -> None:
    job = _job(alice)
    refused = signed_in.post(f"/jobs/{job.pk}/student-links/", {"minutes": minutes})
    assert refused.status_code == 400 and why in refused.content.decode()
    assert not StudentLink.objects.exists()


def test_only_the_owner_or_staff_make_or_revoke_links(alice: User) -> None:
    job = _job(alice)
    link, _ = _link(job)
    bob = Client()
    bob.force_login(User.objects.create_user("bob", password="pw"))
    assert "student-link" not in bob.get(f"/jobs/{job.pk}/").content.decode()
    assert bob.post(f"/jobs/{job.pk}/student-links/", {"minutes": "10"}).status_code == 403
    assert bob.post(f"/student-links/{link.pk}/revoke/").status_code == 403
    link.refresh_from_db()
    assert not link.revoked and StudentLink.objects.count() == 1


def test_the_admin_revokes_links(alice: User) -> None:
    job = _job(alice)
    link, token = _link(job)
    admin = Client()
    admin.force_login(User.objects.create_superuser("root", password="pw"))
    answer = admin.post(
        "/admin/students/studentlink/", {"action": "revoke_links", "_selected_action": [str(link.pk)]}, follow=True
    )
    assert answer.status_code == 200 and "1 student link revoked" in answer.content.decode()
    assert Client().get(f"/s/{token}/").status_code == 410
    assert admin.get(f"/admin/students/studentlink/{link.pk}/change/").status_code == 200


def test_studentlink_prints_the_link_and_revokes_it(alice: User, capsys: pytest.CaptureFixture[str]) -> None:
    job = _job(alice)
    call_command("studentlink", str(job.pk), "--minutes", "30", "--base-url", "https://class.example/")
    url = capsys.readouterr().out.strip()
    link = StudentLink.objects.get(job=job)
    assert url == f"https://class.example/s/{token_for(link)}/"
    assert Client().get(url.removeprefix("https://class.example")).status_code == 200
    call_command("studentlink", "--revoke", url)
    assert "revoked student link" in capsys.readouterr().out
    assert StudentLink.objects.get(pk=link.pk).revoked


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["999999"], "does not exist"),
        (["abc"], "whole number"),
        ([], "give a job id"),
        (["{job}", "--minutes", "0"], "1 to 1440"),
        (["{job}", "--minutes", "2000"], "24 hours"),
        (["{job}", "--base-url", "ftp://x"], "--base-url"),
        (["--revoke", "nope"], "no student link"),
    ],
)
def test_studentlink_refuses_bad_flags_clearly(alice: User, args: list[str], why: str) -> None:
    job = _job(alice)
    with pytest.raises(CommandError, match=why):
        call_command("studentlink", *[a.format(job=job.pk) for a in args])
    assert not StudentLink.objects.exists()


def test_a_lesson_run_page_offers_a_link_to_its_newest_job(signed_in: Client, alice: User) -> None:
    from occviz.lessons.models import Lesson, LessonRun, LessonRunJob
    from tests.test_lessons import ship

    ship()
    lesson = Lesson.objects.order_by("position").first()
    assert lesson is not None
    step = lesson.ordered_steps()[0]
    run = LessonRun.objects.create(lesson=lesson, started_by=alice)
    older, newer = _job(alice), _job(alice)
    for job in (older, newer):
        LessonRunJob.objects.create(run=run, step=step, job=job)
    page = signed_in.get(f"/lessons/runs/{run.pk}/").content.decode()
    assert f'id="student-link" class="student-link" aria-label="Student link" data-job="{newer.pk}"' in page
    made = signed_in.post(f"/jobs/{newer.pk}/student-links/", {"minutes": "20", "next": f"/lessons/runs/{run.pk}/"})
    assert made["Location"] == f"/lessons/runs/{run.pk}/#student-link"
    assert token_for(StudentLink.objects.get(job=newer)) in signed_in.get(f"/lessons/runs/{run.pk}/").content.decode()
    # An address elsewhere is not followed back.
    elsewhere = signed_in.post(f"/jobs/{newer.pk}/student-links/", {"minutes": "20", "next": "https://evil.example/"})
    assert elsewhere["Location"] == f"/jobs/{newer.pk}/#student-link"


@pytest.mark.parametrize("scenario", ["counter", "leader-election", "quota", "controllers"])
def test_the_student_page_of_a_finished_job_of_every_scenario_renders_read_only(alice: User, scenario: str) -> None:
    from tests.test_every_page import FINISHED

    job = run_job(create_job(scenario, FINISHED[scenario], alice).pk)
    _, token = _link(job)
    student = _student_client(token, "Ada")
    page = student.get(f"/s/{token}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="live-status"' in html and 'data-finished="1"' in html
    assert ("data-plus-one" in html) == (scenario in ("counter", "controllers"))
    if "data-plus-one" in html:
        answer = student.post(f"/s/{token}/press/", HTTP_ACCEPT="application/json")
        assert answer.status_code == 409 and "has finished" in answer.json()["message"]
    assert student.get(f"/s/{token}/events.json?after=0&limit=5").json()["events"]


# Serial: a press every 0.21 s must land within the 2.5 s race; under other tests' load every one met a conflict.
@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.parametrize("strategy", ["none", "occ"])
def test_students_join_the_controllers_race_on_lanes_of_their_own(alice: User, strategy: str) -> None:
    from occviz.store.models import Deployment
    from occviz.students.presses import PRESS_ANNOTATION

    params = {"strategy": strategy, "controllers": 2, "rate_per_s": 40, "think_ms": 20, "seconds": 2.5}
    job = create_job("controllers", params, alice)
    _, token = _link(job)
    acknowledged: list[int] = []
    conflicts: list[int] = []

    def press_along() -> None:
        try:
            client = _student_client(token, "Grace")
            while not Deployment.objects.filter(job_id=job.pk).exists():
                time.sleep(0.01)
            while True:
                answer = client.post(f"/s/{token}/press/", HTTP_ACCEPT="application/json")
                if answer.status_code == 200:
                    acknowledged.append(answer.json()["version"])
                elif "Conflict" in answer.json()["message"]:
                    conflicts.append(1)
                elif answer.status_code == 409:
                    return
                time.sleep(0.21)
        finally:
            connection.close()

    grace = threading.Thread(target=press_along)
    grace.start()
    job = run_job(job.pk)
    grace.join(timeout=30)
    assert job.status == Job.Status.SUCCEEDED, job.error
    assert job.invariant_ok, job.summary["invariant"]
    lane = [e for e in events(job) if (e.detail or {}).get("lane") == "student: Grace"]
    assert sum(e.kind == "outside_write" for e in lane) == len(acknowledged) > 0
    assert sum(e.kind == "outside_conflict" for e in lane) == len(conflicts)
    deployment = Deployment.objects.get(job=job)
    presses = int(deployment.annotations.get(PRESS_ANNOTATION, 0))
    if strategy == "occ":
        assert presses == len(acknowledged) and conflicts, "Grace never collided: raise the think time"
    else:
        # Blind both ways: the controllers' blind writes drop Grace's presses, and what her blind writes
        # erased of the controllers' fields is put on her lane, by name.
        assert presses <= len(acknowledged)
        assert any(e.kind == "outside_erased" for e in lane), [e.kind for e in lane]
