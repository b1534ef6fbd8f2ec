"""What other pages show of the lessons, without importing them: the home page's "where to start",
and on a job page, the lesson step that launched the job (a way back to the lesson)."""

from __future__ import annotations

from typing import Any

from django import template
from django.db.models import Count

from occviz.lessons.models import Lesson, LessonRunJob

register = template.Library()


@register.inclusion_tag("lessons/where_to_start.html")
def lessons_to_start() -> dict[str, Any]:
    return {"lessons": Lesson.objects.annotate(step_count=Count("steps")).order_by("position", "title")}


@register.inclusion_tag("lessons/job_in_lesson.html", takes_context=True)
def lesson_of_job(context: template.Context, job: Any) -> dict[str, Any]:
    """The lesson run and step a job was launched from, if it was."""
    found = LessonRunJob.objects.filter(job_id=job.pk).select_related("run__lesson", "step").first()
    if found is None:
        return {"found": None}
    steps = found.run.lesson.ordered_steps()
    number = [step.pk for step in steps].index(found.step_id) + 1
    request = context.get("request")
    present = request is not None and request.GET.get("present") == "1"
    return {
        "found": found,
        "lesson": found.run.lesson,
        "number": number,
        "count": len(steps),
        "next": number + 1 if number < len(steps) else None,
        "query": f"?run={found.run_id}{'&present=1' if present else ''}",
    }
