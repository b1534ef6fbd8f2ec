"""The lesson pages: a teacher picks a lesson, walks its steps one page at a time, and runs each step's job.

"Run this step" launches through `occviz.jobs.tasks.launch`, the launch form's own path, so a
step meets the same validation and the same limits (jobs per user, the connection budget); a
refused launch changes nothing, not even the lesson run. The jobs a run launched stay listed by
step, to go back to and to compare. `?present=1` is carried through every link and on to the
job page, for presenter mode.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.db.models import Count
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_POST, require_safe

from occviz.jobs.models import Job
from occviz.jobs.registry import ParamsError
from occviz.jobs.tasks import LaunchRefused, launch
from occviz.lessons.models import Lesson, LessonRun, LessonRunJob, Step
from occviz.scenarios import SCENARIOS
from occviz.web.views import MAX_COMPARE

RECENT_RUNS = 10


def _present(request: HttpRequest) -> bool:
    return request.GET.get("present") == "1" or request.POST.get("present") == "1"


def _query(present: bool, run: int | None = None) -> str:
    """`?run=3&present=1` for the links of a page, '' when there is nothing to carry."""
    found = {name: value for name, value in (("run", run), ("present", 1 if present else None)) if value}
    return f"?{urlencode(found)}" if found else ""


def _step_at(lesson: Lesson, number: int) -> tuple[Step, list[Step]]:
    steps = lesson.ordered_steps()
    if not 1 <= number <= len(steps):
        raise Http404(f"{lesson.title} has steps 1 to {len(steps)}, not {number}.")
    return steps[number - 1], steps


def _own_run(request: HttpRequest, lesson: Lesson, raw: str) -> LessonRun | None:
    """The run `?run=<id>` names, if it is one of this user's of this lesson; None for none given."""
    if not raw:
        return None
    if not (raw.isascii() and raw.isdigit()):
        raise Http404(f"run must be a run's number, not {raw!r}.")
    return get_object_or_404(LessonRun, pk=int(raw), lesson=lesson, started_by_id=request.user.pk)


def _with_alarms(jobs: list[Job]) -> list[Job]:
    """The jobs, each with its alarming figures ("344 lost updates"): a lost update is no plain success."""
    for job in jobs:
        spec = SCENARIOS.get(job.scenario)
        job.alarms = spec.alarms(job.summary) if spec else []  # type: ignore[attr-defined]
    return jobs


def compare_url(jobs: list[Job]) -> str:
    """The compare page of the latest jobs (as many as it takes), or '' for fewer than two."""
    latest = [job.pk for job in jobs][-MAX_COMPARE:]
    return f"{reverse('job_compare')}?ids={','.join(map(str, latest))}" if len(latest) >= 2 else ""


@require_safe
@login_required
def lesson_list(request: HttpRequest) -> HttpResponse:
    lessons = Lesson.objects.annotate(step_count=Count("steps")).order_by("position", "title")
    return render(request, "lessons/lesson_list.html", {"lessons": lessons, "present": _present(request)})


@require_safe
@login_required
def lesson_detail(request: HttpRequest, slug: str) -> HttpResponse:
    lesson = get_object_or_404(Lesson, slug=slug)
    runs = LessonRun.objects.filter(lesson=lesson, started_by_id=request.user.pk)[:RECENT_RUNS]
    context = {
        "lesson": lesson,
        "steps": lesson.ordered_steps(),
        "runs": runs,
        "present": _present(request),
        "query": _query(_present(request)),
    }
    return render(request, "lessons/lesson_detail.html", context)


def _step_context(request: HttpRequest, lesson: Lesson, number: int, run: LessonRun | None) -> dict[str, Any]:
    step, steps = _step_at(lesson, number)
    present = _present(request)
    try:
        params, problem = step.cleaned_params(), ""
    except ParamsError as refused:
        params, problem = {}, str(refused)
    ran = LessonRunJob.objects.filter(step=step).select_related("job", "run")
    ran = ran.filter(run=run) if run else ran.filter(run__started_by_id=request.user.pk)
    jobs = _with_alarms([found.job for found in ran])
    return {
        "lesson": lesson,
        "step": step,
        "number": number,
        "count": len(steps),
        "spec": step.spec,
        "preset": step.chosen_preset(),
        "setup": step.spec.setup(params) if step.spec and params else "",
        "problem": problem,
        "run": run,
        "jobs": jobs,
        "compare_url": compare_url(jobs),
        "present": present,
        "query": _query(present, run=run.pk if run else None),
        "previous": (number - 1, steps[number - 2]) if number > 1 else None,
        "next": (number + 1, steps[number]) if number < len(steps) else None,
    }


@require_safe
@login_required
def lesson_step(request: HttpRequest, slug: str, number: int) -> HttpResponse:
    lesson = get_object_or_404(Lesson, slug=slug)
    run = _own_run(request, lesson, request.GET.get("run", ""))
    return render(request, "lessons/lesson_step.html", _step_context(request, lesson, number, run))


@require_POST
@login_required
def run_step(request: HttpRequest, slug: str, number: int) -> HttpResponse:
    """Launch the step's job in the lesson run the form names (a new one if none) and show it; or say why not."""
    lesson = get_object_or_404(Lesson, slug=slug)
    step, _ = _step_at(lesson, number)
    chosen = _own_run(request, lesson, request.POST.get("run", ""))
    try:
        # One transaction: a refused launch leaves no lesson run behind it.
        with transaction.atomic():
            run = chosen or LessonRun.objects.create(lesson=lesson, started_by_id=request.user.pk)
            job = launch(step.scenario, step.launch_data(), request.user)
            LessonRunJob.objects.create(run=run, step=step, job=job)
    except ParamsError as refused:
        context = _step_context(request, lesson, number, chosen)
        context["refused"] = refused.message if isinstance(refused, LaunchRefused) else str(refused)
        status = 409 if isinstance(refused, LaunchRefused) else 400
        return render(request, "lessons/lesson_step.html", context, status=status)
    return redirect(f"{reverse('job_detail', args=[job.pk])}{_query(_present(request))}")


@require_safe
@login_required
def lesson_run(request: HttpRequest, run_id: int) -> HttpResponse:
    """A run's jobs, step by step: any of them to go back to, and each step's runs to compare."""
    run = get_object_or_404(LessonRun.objects.select_related("lesson", "started_by"), pk=run_id)
    ran: dict[int, list[Job]] = {}
    found_jobs = list(LessonRunJob.objects.filter(run=run).select_related("job"))
    _with_alarms([found.job for found in found_jobs])
    for found in found_jobs:
        ran.setdefault(found.step_id, []).append(found.job)
    rows = [
        {"number": number, "step": step, "jobs": ran.get(step.pk, []), "compare_url": compare_url(ran.get(step.pk, []))}
        for number, step in enumerate(run.lesson.ordered_steps(), start=1)
    ]
    mine = run.started_by_id == request.user.pk
    present = _present(request)
    context = {"run": run, "lesson": run.lesson, "rows": rows, "mine": mine, "present": present}
    context["query"] = _query(present, run=run.pk if mine else None)
    return render(request, "lessons/lesson_run.html", context)
