"""Lessons: the shipped ones are valid, every step page answers, "Run this step" launches through the
launch form's path and limits, a lesson run keeps its jobs, and the admin refuses a step its scenario would."""

from __future__ import annotations

import importlib
import json
import re
from typing import Any

import pytest
from django.apps import apps
from django.contrib.auth.models import User
from django.test import Client
from django.utils.html import escape
from django_tasks_db.models import DBTaskResult

from occviz.jobs.models import Job
from occviz.jobs.runner import run_job
from occviz.jobs.tasks import create_job
from occviz.lessons.models import Lesson, LessonRun, LessonRunJob, Step
from occviz.scenarios import SCENARIOS

pytestmark = pytest.mark.django_db

SHIPPED = importlib.import_module("occviz.lessons.migrations.0002_shipped_lessons")
STORY = "optimistic-concurrency-in-kubernetes"


def ship() -> None:
    """The shipped lessons as the data migration writes them (a test that flushed the database removed them)."""
    SHIPPED.ship_lessons(apps)


@pytest.fixture
def shipped(db: None) -> list[Lesson]:
    ship()
    return list(Lesson.objects.all())


def step_url(lesson: Lesson, number: int, query: str = "") -> str:
    return f"/lessons/{lesson.slug}/{number}/{query}"


def run_url(lesson: Lesson, number: int) -> str:
    return f"/lessons/{lesson.slug}/{number}/run/"


# -- what ships ------------------------------------------------------------------------------------


def test_every_shipped_step_is_a_valid_preset_of_its_scenario() -> None:
    for lesson in SHIPPED.LESSONS:
        for scenario, preset in lesson["steps"]:
            spec = SCENARIOS[scenario]
            found = [p for p in spec.presets if p.slug == preset]
            assert found, f"{lesson['slug']}: {scenario} has no preset {preset}"
            spec.clean(found[0].params)  # raises ParamsError if the scenario's form refuses it


def test_one_lesson_per_scenario_and_the_whole_story_first(shipped: list[Lesson]) -> None:
    first, *per_scenario = [lesson for lesson in shipped if lesson.slug in {s["slug"] for s in SHIPPED.LESSONS}]
    assert (first.slug, first.minutes) == (STORY, 50)
    assert [{step.scenario for step in lesson.ordered_steps()} for lesson in per_scenario] == [
        {"counter"},
        {"leader-election"},
        {"quota"},
        {"controllers"},
    ]
    story = [(step.scenario, step.preset) for step in first.ordered_steps()]
    assert story == [
        ("counter", "lost-update-demo"),
        ("counter", "k8s-default-backoff"),
        ("counter", "pessimistic-lock-queue"),
        ("counter", "serializable-retries"),
        ("leader-election", "classroom"),
        ("leader-election", "kill-the-leader"),
        ("leader-election", "stale-leader"),
        ("quota", "two-pods-one-gpu"),
        ("quota", "leak-and-repair"),
        ("controllers", "two-none"),
        ("controllers", "two-occ"),
    ]


def test_every_shipped_step_validates_as_stored_and_reads_aloud_briefly(shipped: list[Lesson]) -> None:
    for step in Step.objects.all():
        step.full_clean()
        for text in (step.say, step.ask, step.point_at):
            # About 20 seconds said aloud at most: a step is spoken, not read from the projector.
            assert 5 <= len(text.split()) <= 60, f"{step.lesson.slug} {step.title}: {len(text.split())} words"
        assert step.ask.rstrip().endswith("?"), step.ask


def test_shipping_again_restores_the_lessons_as_written(shipped: list[Lesson]) -> None:
    story = Lesson.objects.get(slug=STORY)
    story.steps.filter(order=10).update(say="changed")
    ship()
    assert story.ordered_steps()[0].say.startswith("Eight writers share one counter.")
    assert Lesson.objects.filter(slug=STORY).count() == 1


# -- pages -----------------------------------------------------------------------------------------


def test_every_step_of_every_lesson_answers_with_what_to_say_ask_and_point_at(
    signed_in: Client, shipped: list[Lesson]
) -> None:
    listed = signed_in.get("/lessons/").content.decode()
    for lesson in shipped:
        assert f'href="/lessons/{lesson.slug}/"' in listed
        assert signed_in.get(f"/lessons/{lesson.slug}/").status_code == 200
        steps = lesson.ordered_steps()
        for number, step in enumerate(steps, start=1):
            response = signed_in.get(step_url(lesson, number))
            assert response.status_code == 200, (lesson.slug, number)
            page = response.content.decode()
            for text in (step.title, step.say, step.ask, step.point_at):
                assert escape(text) in page
            assert f"Step {number} of {len(steps)}" in page
            assert "data-run-step" in page


def test_previous_and_next_stop_at_the_first_and_last_steps(signed_in: Client, shipped: list[Lesson]) -> None:
    lesson = Lesson.objects.get(slug="quota-race")
    pages = [signed_in.get(step_url(lesson, n)).content.decode() for n in (1, 2, 3)]
    links = [(re.findall(r'rel="prev" href="([^"]+)"', p), re.findall(r'rel="next" href="([^"]+)"', p)) for p in pages]
    assert links == [
        ([], ["/lessons/quota-race/2/"]),
        (["/lessons/quota-race/1/"], ["/lessons/quota-race/3/"]),
        (["/lessons/quota-race/2/"], []),
    ]
    assert "The last step." in pages[2]


@pytest.mark.parametrize("number", [0, 4, 99])
def test_a_step_beyond_the_lesson_is_404(signed_in: Client, shipped: list[Lesson], number: int) -> None:
    lesson = Lesson.objects.get(slug="quota-race")
    assert signed_in.get(step_url(lesson, number)).status_code == 404
    assert signed_in.post(run_url(lesson, number)).status_code == 404
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    "url",
    [
        "/lessons/no-such-lesson/",
        "/lessons/no-such-lesson/1/",
        "/lessons/runs/999999/",
        "/lessons/runs/99999999999999999999999/",
        "/lessons/quota-race/x/",
        "/lessons/quota-race/99999999999999999999999/",
        "/lessons/quota-race/1/?run=99999999999999999999999",
        "/lessons/quota-race/1/?run=%D9%A3",
    ],
)
def test_unknown_lessons_steps_and_runs_are_404(signed_in: Client, shipped: list[Lesson], url: str) -> None:
    assert signed_in.get(url).status_code == 404


@pytest.mark.parametrize("url", ["/lessons/", f"/lessons/{STORY}/", f"/lessons/{STORY}/1/", "/lessons/runs/1/"])
def test_signed_out_visitors_are_sent_to_sign_in(client: Client, shipped: list[Lesson], url: str) -> None:
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=")


def test_a_signed_out_run_is_sent_to_sign_in_and_launches_nothing(client: Client, shipped: list[Lesson]) -> None:
    response = client.post(f"/lessons/{STORY}/1/run/")
    assert (response.status_code, response["Location"].startswith("/accounts/login/")) == (302, True)
    assert not Job.objects.exists()
    assert not LessonRun.objects.exists()


def test_the_home_page_lists_the_lessons_before_the_scenarios(signed_in: Client, shipped: list[Lesson]) -> None:
    page = signed_in.get("/").content.decode()
    assert page.index("Where to start: lessons") < page.index("<h1>Scenarios</h1>")
    assert page.index(f'href="/lessons/{STORY}/1/"') < page.index('data-scenario="counter"')
    listed = re.findall(r'data-lesson="([^"]+)"', page)
    assert listed[: len(SHIPPED.LESSONS)] == [lesson["slug"] for lesson in SHIPPED.LESSONS]  # the whole story first


# -- running a step --------------------------------------------------------------------------------


def test_running_a_step_launches_its_preset_through_the_launch_path(
    signed_in: Client, alice: User, shipped: list[Lesson], django_capture_on_commit_callbacks: Any
) -> None:
    story = Lesson.objects.get(slug=STORY)
    with django_capture_on_commit_callbacks(execute=True):
        response = signed_in.post(run_url(story, 2))
    job = Job.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/jobs/{job.pk}/"
    preset = next(p for p in SCENARIOS["counter"].presets if p.slug == "k8s-default-backoff")
    assert (job.scenario, job.status, job.created_by) == ("counter", "queued", alice)
    assert job.params == SCENARIOS["counter"].clean(preset.params)
    assert DBTaskResult.objects.get().args_kwargs["args"] == [job.pk]  # enqueued for a worker, as a launch is
    run = LessonRun.objects.get()
    assert (run.lesson, run.started_by) == (story, alice)
    assert [(found.step.title, found.job) for found in LessonRunJob.objects.all()] == [
        (story.ordered_steps()[1].title, job)
    ]
    # The job page says which step launched it, and leads back to it and on to the next.
    page = signed_in.get(f"/jobs/{job.pk}/").content.decode()
    assert f'href="/lessons/{STORY}/2/?run={run.pk}"' in page
    assert f'href="/lessons/{STORY}/3/?run={run.pk}"' in page


def test_a_run_keeps_its_jobs_by_step_and_compares_a_step_run_twice(
    signed_in: Client, alice: User, shipped: list[Lesson]
) -> None:
    story = Lesson.objects.get(slug=STORY)
    signed_in.post(run_url(story, 1))
    run = LessonRun.objects.get()
    signed_in.post(run_url(story, 1), {"run": run.pk})
    signed_in.post(run_url(story, 3), {"run": run.pk, "present": "1"})
    assert LessonRun.objects.count() == 1  # the steps joined the run the form named
    first, again, third = Job.objects.order_by("id")
    assert [(f.step.order, f.job) for f in LessonRunJob.objects.all()] == [(10, first), (10, again), (30, third)]
    step_page = signed_in.get(step_url(story, 1, f"?run={run.pk}")).content.decode()
    assert f'href="/jobs/compare/?ids={first.pk},{again.pk}"' in step_page
    assert f'name="run" value="{run.pk}"' in step_page
    assert f'href="/lessons/{STORY}/2/?run={run.pk}"' in step_page  # next keeps the run
    run_page = signed_in.get(f"/lessons/runs/{run.pk}/")
    assert run_page.status_code == 200
    html = run_page.content.decode()
    for job in (first, again, third):
        assert f'href="/jobs/{job.pk}/"' in html
    assert html.count("/jobs/compare/?ids=") == 1
    assert html.count("not run") == len(story.ordered_steps()) - 2
    assert signed_in.get(f"/jobs/compare/?ids={first.pk},{again.pk}").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_a_run_shows_what_each_job_lost_not_a_plain_success(signed_in: Client, shipped: list[Lesson]) -> None:
    story = Lesson.objects.get(slug=STORY)
    signed_in.post(run_url(story, 1))
    job = run_job(Job.objects.get().pk)  # the lost update demo, run to its end here
    lost = job.summary["lost_updates"]  # type: ignore[index]
    assert job.invariant_ok is True and lost > 0
    run = LessonRun.objects.get()
    for url in (f"/lessons/runs/{run.pk}/", step_url(story, 1, f"?run={run.pk}")):
        page = signed_in.get(url).content.decode()
        assert f"⚠ {lost} lost updates" in page, url
        assert "invariant holds</span>" not in page


def test_present_passes_through_to_the_links_and_the_job_page(signed_in: Client, shipped: list[Lesson]) -> None:
    story = Lesson.objects.get(slug=STORY)
    page = signed_in.get(step_url(story, 2, "?present=1")).content.decode()
    assert 'name="present" value="1"' in page
    assert f'href="/lessons/{STORY}/3/?present=1"' in page
    response = signed_in.post(run_url(story, 2), {"present": "1"})
    job = Job.objects.get()
    assert response["Location"] == f"/jobs/{job.pk}/?present=1"
    run = LessonRun.objects.get()
    assert f"/lessons/{STORY}/3/?run={run.pk}&amp;present=1" in signed_in.get(response["Location"]).content.decode()


def test_a_run_at_the_job_limit_is_refused_with_why_and_starts_nothing(
    signed_in: Client, alice: User, shipped: list[Lesson], settings: Any
) -> None:
    settings.OCCVIZ_MAX_JOBS_PER_USER = 1
    create_job("counter", {"strategy": "occ", "writers": 2, "increments": 5}, alice)
    story = Lesson.objects.get(slug=STORY)
    response = signed_in.post(run_url(story, 1))
    assert response.status_code == 409
    assert "You have 1 jobs queued or running" in response.content.decode()
    assert "OCCVIZ_MAX_JOBS_PER_USER" in response.content.decode()
    assert Job.objects.count() == 1
    assert not LessonRun.objects.exists()
    assert not LessonRunJob.objects.exists()


def test_someone_elses_run_is_not_joined(signed_in: Client, shipped: list[Lesson]) -> None:
    story = Lesson.objects.get(slug=STORY)
    bob = User.objects.create_user("bob", password="correct horse battery")
    bobs = LessonRun.objects.create(lesson=story, started_by=bob)
    assert signed_in.post(run_url(story, 1), {"run": bobs.pk}).status_code == 404
    assert signed_in.get(step_url(story, 1, f"?run={bobs.pk}")).status_code == 404
    assert signed_in.post(run_url(story, 1), {"run": "1x"}).status_code == 404
    assert not Job.objects.exists()
    # Anyone signed in may look at it, as at any job, without being offered to join it.
    page = signed_in.get(f"/lessons/runs/{bobs.pk}/").content.decode()
    assert f"?run={bobs.pk}" not in page


def test_a_step_its_scenario_no_longer_takes_says_why_and_cannot_run(signed_in: Client, shipped: list[Lesson]) -> None:
    story = Lesson.objects.get(slug=STORY)
    Step.objects.filter(pk=story.ordered_steps()[0].pk).update(params={"writers": 100000})
    page = signed_in.get(step_url(story, 1))
    assert page.status_code == 200
    assert "This step cannot run as it stands: writers: At most 64 writers" in page.content.decode()
    response = signed_in.post(run_url(story, 1))
    assert response.status_code == 400
    assert not Job.objects.exists()
    assert not LessonRun.objects.exists()


# -- the admin -------------------------------------------------------------------------------------


@pytest.fixture
def editor(client: Client) -> Client:
    client.force_login(User.objects.create_superuser("editor", password=None))
    return client


def admin_post(lesson: Lesson, changes: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The lesson's change form as loaded, with `changes` made to the steps at those indexes."""
    steps = lesson.ordered_steps()
    data: dict[str, Any] = {
        "slug": lesson.slug,
        "title": lesson.title,
        "summary": lesson.summary,
        "minutes": lesson.minutes,
        "position": lesson.position,
        "steps-TOTAL_FORMS": len(steps),
        "steps-INITIAL_FORMS": len(steps),
        "steps-MIN_NUM_FORMS": 0,
        "steps-MAX_NUM_FORMS": 1000,
        "_save": "Save",
    }
    for index, step in enumerate(steps):
        fields = {
            "id": step.pk,
            "lesson": lesson.pk,
            "order": step.order,
            "title": step.title,
            "scenario": step.scenario,
            "preset": step.preset,
            "params": json.dumps(step.params),
            "say": step.say,
            "ask": step.ask,
            "point_at": step.point_at,
            **changes.get(index, {}),
        }
        data.update({f"steps-{index}-{name}": value for name, value in fields.items()})
    return data


def test_the_admin_reorders_steps(editor: Client, shipped: list[Lesson]) -> None:
    lesson = Lesson.objects.get(slug="quota-race")
    before = [step.title for step in lesson.ordered_steps()]
    response = editor.post(f"/admin/lessons/lesson/{lesson.pk}/change/", admin_post(lesson, {0: {"order": 99}}))
    assert response.status_code == 302, response.content.decode()[:2000]
    assert [step.title for step in lesson.ordered_steps()] == [*before[1:], before[0]]
    assert "Step 3 of 3" in editor.get(step_url(lesson, 3)).content.decode()


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"params": '{"pods": 0}'}, "pods: Ensure this value is greater than or equal to 1."),
        ({"params": '{"workers": "many"}'}, "workers: Enter a whole number."),
        ({"preset": "three-pods"}, "Quota race has no preset &#x27;three-pods&#x27;"),
        ({"params": "[1, 2]"}, "Give the parameters as a JSON object"),
        ({"params": "{not json"}, "Enter a valid JSON."),
        ({"scenario": "dining-philosophers"}, "Select a valid choice."),
    ],
)
def test_the_admin_refuses_a_step_its_scenario_refuses_and_says_why(
    editor: Client, shipped: list[Lesson], changes: dict[str, str], why: str
) -> None:
    lesson = Lesson.objects.get(slug="quota-race")
    before = [(step.title, step.preset, step.params, step.order) for step in lesson.ordered_steps()]
    data = admin_post(lesson, {1: changes, 0: {"order": 99}})
    response = editor.post(f"/admin/lessons/lesson/{lesson.pk}/change/", data)
    assert response.status_code == 200  # the form again, with the error
    page = response.content.decode()
    assert why in page, re.findall(r'<ul class="errorlist[^>]*>.*?</ul>', page, re.S)
    assert [(step.title, step.preset, step.params, step.order) for step in lesson.ordered_steps()] == before


def test_the_admin_lists_lessons_and_runs(editor: Client, shipped: list[Lesson]) -> None:
    assert editor.get("/admin/lessons/lesson/").status_code == 200
    story = Lesson.objects.get(slug=STORY)
    run = LessonRun.objects.create(lesson=story, started_by=None)
    assert editor.get("/admin/lessons/lessonrun/").status_code == 200
    assert editor.get(f"/admin/lessons/lessonrun/{run.pk}/change/").status_code == 200
    change = editor.get(f"/admin/lessons/lesson/{story.pk}/change/").content.decode()
    assert "/admin/r/" in change  # "View on site": the lesson's own page
