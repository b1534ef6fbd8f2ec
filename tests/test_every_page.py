"""Every page of a finished and of a running job of every scenario answers, without a server error.

The jobs run for real (the finished ones in this process, the running ones in `runjob` child
processes on the test database, cancelled at the end);
each page of each is opened through Django's test client. `PAGES` is the list of a job's
pages: a new one is one line there; `lesson_urls` are the lesson pages. The browser half (what the scripts render) is
tests/browser/test_every_page_browser.py, over the same jobs and pages.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.http import StreamingHttpResponse
from django.test import Client, override_settings

from occviz.jobs.models import Job
from occviz.jobs.runner import run_job
from occviz.jobs.tasks import create_job
from occviz.lessons.models import Lesson, LessonRun
from occviz.scenarios import SCENARIOS
from occviz.store.kinds import KINDS
from tests.conftest import ROOT
from tests.servers import child_database_url
from tests.test_lessons import SHIPPED, ship

# Small jobs: a finished one ends in about a second; a running one runs until it is cancelled.
FINISHED: dict[str, dict[str, Any]] = {
    "counter": {"strategy": "none", "writers": 3, "increments": 10, "think_ms": 2},
    "leader-election": {
        "replicas": 2,
        "lease_duration": 1,
        "renew_deadline": 0.8,
        "retry_period": 0.2,
        "seconds": 1,
    },
    "quota": {"pods": 4, "hard": 2, "request": 1, "workers": 2, "think_ms": 1},
    "controllers": {"strategy": "occ", "controllers": 2, "rate_per_s": 50, "think_ms": 5, "seconds": 0.5},
    "step": {"script": "for-update-wait", "pace": "written order"},
    "anomalies": {"anomalies": "P4", "levels": "read-committed"},
    "sweep": {"strategies": "atomic", "max_writers": 1, "seconds": 1},
}
# Slow ones: they share this process with the pages it opens.
RUNNING: dict[str, dict[str, Any]] = {
    # Over two processes (runjob's children): its page has the table of shards.
    "counter": {
        "strategy": "occ",
        "writers": 2,
        "seconds": 300,
        "think_ms": 50,
        "latency_ms": "5",
        "jitter_ms": 1,
        "processes": 2,
    },
    "leader-election": {
        **FINISHED["leader-election"],
        "lease_duration": 3,
        "renew_deadline": 2,
        "seconds": 300,
        "latency_ms": "2 replica-2=5",
    },
    "quota": {"pods": 500, "hard": 20, "request": 1, "workers": 1, "think_ms": 200, "seconds": 300, "latency_ms": "3"},
    "controllers": {**FINISHED["controllers"], "rate_per_s": 4, "seconds": 300, "latency_ms": "5", "jitter_ms": 1},
    "step": {"script": "for-update-wait", "pace": "by hand"},
    "anomalies": {"step_ms": 5000},
    # 1 to 16 writers, each level a minute of occ and one of pgbench: still running when a busy worker's module ends.
    "sweep": {"strategies": "occ", "max_writers": 16, "seconds": 60, "think_ms": 50},
}
STATES = ("finished", "running")
WITHOUT_OBJECTS = ("step", "anomalies")
"""Scenarios whose rows are not objects of the store (a step job's live in a schema of its own): nothing to watch."""


@dataclass(frozen=True)
class Subject:
    """A job whose pages are opened, with a job of its own scenario and one of another, to compare it with."""

    job: Job
    same: Job
    other: Job


@dataclass(frozen=True)
class Page:
    name: str
    url: Callable[[Subject], str]
    html: bool = False
    """A page a person looks at (checked in the browser too), not a download."""


PAGES = (
    Page("detail", lambda s: f"/jobs/{s.job.pk}/", html=True),
    Page("replay", lambda s: f"/jobs/{s.job.pk}/replay/", html=True),
    Page("compare with its scenario", lambda s: f"/jobs/compare/?id={s.job.pk}&id={s.same.pk}", html=True),
    Page("compare with another scenario", lambda s: f"/jobs/compare/?ids={s.job.pk},{s.other.pk}", html=True),
    Page("export.jsonl", lambda s: f"/jobs/{s.job.pk}/export.jsonl"),
    Page("export.csv", lambda s: f"/jobs/{s.job.pk}/export.csv"),
    Page("summary.json", lambda s: f"/jobs/{s.job.pk}/summary.json"),
    Page("events.json", lambda s: f"/jobs/{s.job.pk}/events.json?after=0&limit=100"),
    Page("snapshot.json", lambda s: f"/jobs/{s.job.pk}/snapshot.json"),
    Page("snapshot.json midway", lambda s: f"/jobs/{s.job.pk}/snapshot.json?seq={s.job.last_seq // 2}"),
    Page("replay's fragments", lambda s: f"/jobs/{s.job.pk}/fragments/?seq={s.job.last_seq}", html=True),
)
OBJECTS_PER_KIND = 2


def watch_urls(job: Job) -> list[str]:
    """The watch page of each kind of object the job uses (the first few of each kind)."""
    urls = []
    for kind in KINDS:
        rows = kind.model._default_manager.filter(job=job).order_by("pk").values_list("namespace", "name")
        urls += [f"/watch/{kind.plural}/{namespace}/{name}/" for namespace, name in rows[:OBJECTS_PER_KIND]]
    return urls


def _runjob(scenario: str, params: dict[str, Any]) -> subprocess.Popen[bytes]:
    """`manage.py runjob` of the scenario in a child process on the test database: no thread of this
    process runs it while the tests change settings around it."""
    flags = [word for name, value in params.items() for word in (f"--{name.replace('_', '-')}", str(value))]
    return subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "runjob", scenario, *flags],
        cwd=ROOT,
        # The running sweep's ten minute-long points go past the 300 s a job may run by default.
        env={**os.environ, "DATABASE_URL": child_database_url(), "OCCVIZ_MAX_SECONDS": "900"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@dataclass
class JobSet:
    """A finished and a running job of every scenario."""

    jobs: dict[tuple[str, str], Job] = field(default_factory=dict)
    runners: list[subprocess.Popen[bytes]] = field(default_factory=list)
    viewer: User | None = None

    @classmethod
    def start(cls, user: User | None = None) -> JobSet:
        made = cls(viewer=User.objects.create_user("every-page-viewer"))
        for scenario in SCENARIOS:
            made.jobs[scenario, "finished"] = run_job(create_job(scenario, FINISHED[scenario], user).pk)
            assert made.jobs[scenario, "finished"].status == "succeeded", made.jobs[scenario, "finished"].error
        finished = [job.pk for job in made.jobs.values()]
        made.runners = [_runjob(scenario, RUNNING[scenario]) for scenario in SCENARIOS]
        made.wait_until_running(finished)
        return made

    def wait_until_running(self, finished: list[int], timeout: float = 60.0) -> None:
        """Until every runjob's job has stored events (its objects are made by then)."""
        deadline = time.monotonic() + timeout
        while True:
            # A job's parts (a sweep's counter races, an anomalies table's step jobs) are not the runjobs' own.
            running = Job.objects.filter(status="running", last_seq__gt=0, parent=None).exclude(pk__in=finished)
            found = {job.scenario: job for job in running}
            if len(found) == len(SCENARIOS):
                break
            assert all(runner.poll() is None for runner in self.runners), "a runjob ended before its job ran"
            assert time.monotonic() < deadline, f"the running jobs did not start (running: {sorted(found)})"
            time.sleep(0.05)
        for scenario, job in found.items():
            self.jobs[scenario, "running"] = job

    def subject(self, scenario: str, state: str) -> Subject:
        names = list(SCENARIOS)
        another = names[(names.index(scenario) + 1) % len(names)]
        fresh = {key: Job.objects.get(pk=job.pk) for key, job in self.jobs.items()}
        same = fresh[scenario, "running" if state == "finished" else "finished"]
        return Subject(job=fresh[scenario, state], same=same, other=fresh[another, "finished"])

    def stop(self) -> None:
        for (_, state), job in self.jobs.items():
            if state == "running":
                Job.objects.get(pk=job.pk).request_cancel()
        for runner in self.runners:
            try:
                runner.wait(timeout=30)
            except subprocess.TimeoutExpired:
                runner.kill()
                raise AssertionError("a cancelled job kept running") from None
        for (scenario, state), job in self.jobs.items():
            if state == "running":
                job.refresh_from_db()
                assert job.status == "cancelled", f"{scenario}: {job.status} {job.error}"


def body(response: Any) -> str:
    if isinstance(response, StreamingHttpResponse):
        return b"".join(response.streaming_content).decode()  # type: ignore[arg-type]
    return response.content.decode()


def problems(client: Client, url: str) -> list[str]:
    """What is wrong with the page at `url`: a status other than 200, or a JavaScript object written out as text."""
    response = client.get(url)
    text = body(response)
    found = []
    if response.status_code != 200:
        found.append(f"{url}: {response.status_code} {text[:300]}")
    if "[object Object]" in text:
        found.append(f"{url}: [object Object]")
    return found


# The jobs are made once for the module, outside the tests' transactions (their threads write
# for real), and removed at its end.
@pytest.fixture(scope="module")
def job_set(django_db_setup: None, django_db_blocker: Any) -> Iterator[JobSet]:
    # As conftest's in_memory_channel_layer does per test: the jobs publish in this process only.
    in_memory = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    with django_db_blocker.unblock(), override_settings(CHANNEL_LAYERS=in_memory):
        made = JobSet()
        try:
            made = JobSet.start()
            yield made
        finally:
            made.stop()
            Job.objects.filter(pk__in=[job.pk for job in made.jobs.values()]).delete()
            User.objects.filter(pk=made.viewer.pk if made.viewer else None).delete()


@pytest.fixture
def viewer(job_set: JobSet, db: None) -> Client:
    client = Client()
    client.force_login(job_set.viewer)
    return client


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_every_page_of_a_job_answers(job_set: JobSet, viewer: Client, scenario: str, state: str, page: Page) -> None:
    subject = job_set.subject(scenario, state)
    assert subject.job.status == ("succeeded" if state == "finished" else "running")
    assert problems(viewer, page.url(subject)) == []


@pytest.mark.slow
def test_the_running_race_over_two_processes_shows_its_shards_on_its_page_and_replay(
    job_set: JobSet, viewer: Client
) -> None:
    job = job_set.subject("counter", "running").job
    for url in (f"/jobs/{job.pk}/", f"/jobs/{job.pk}/replay/"):
        page = viewer.get(url).content.decode()
        assert page.count('<tr data-shard="') == 2 and page.count('data-shard-status="running"') == 2, url
        assert f'hx-get="/jobs/{job.pk}/"' in page, "the table asks the job page for itself"


@pytest.mark.slow
@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("scenario", [name for name in SCENARIOS if name not in WITHOUT_OBJECTS])
def test_the_watch_page_of_every_object_a_job_uses_answers(
    job_set: JobSet, viewer: Client, scenario: str, state: str
) -> None:
    job = job_set.subject(scenario, state).job
    urls = watch_urls(job)
    assert urls, f"{scenario} {state}: no objects found"
    found = [problem for url in urls for problem in problems(viewer, url)]
    found += [problem for url in urls for problem in problems(viewer, url + "history.json")]
    assert found == []


def lesson_urls() -> list[str]:
    """Every lesson page: the list, each lesson and each of its steps, and a run of each lesson."""
    urls = ["/lessons/"]
    for lesson in Lesson.objects.all():
        urls.append(f"/lessons/{lesson.slug}/")
        urls += [f"/lessons/{lesson.slug}/{n}/" for n in range(1, len(lesson.ordered_steps()) + 1)]
        urls.append(f"/lessons/runs/{LessonRun.objects.create(lesson=lesson).pk}/")
    return urls


@pytest.mark.django_db
def test_every_page_of_every_lesson_answers(signed_in: Client) -> None:
    ship()
    urls = lesson_urls()
    assert len(urls) > 1 + 2 * len(SHIPPED.LESSONS)
    assert [problem for url in urls for problem in problems(signed_in, url)] == []


def test_every_scenario_words_a_job_of_any_parameters() -> None:
    """Compare, lists and old rows show jobs whatever their parameters: a missing one is no error."""
    for spec in SCENARIOS.values():
        assert spec.vocabulary({})["actors"] == spec.actor_names({})
        assert spec.actor_names({}), spec.name
