"""`{% student_links as panel %}`: the student links a teacher may show on a job page or a lesson run."""

from __future__ import annotations

from typing import Any

from django import template
from django.db.models import Count
from django.urls import reverse
from django.utils import timezone

from occviz.jobs.models import Job
from occviz.students.models import DEFAULT_MINUTES, MAX_MINUTES, StudentLink
from occviz.students.qr import qr_svg
from occviz.students.tokens import token_for

register = template.Library()


def _job_of(context: template.Context) -> Job | None:
    """The page's job: the job page's `job`, or the newest job of a lesson run page's `run`."""
    job = context.get("job")
    if isinstance(job, Job):
        return job
    run = context.get("run")
    if run is not None:
        return Job.objects.filter(lesson_run_job__run=run).order_by("-pk").first()
    return None


@register.simple_tag(takes_context=True)
def student_links(context: template.Context) -> dict[str, Any] | None:
    """The panel's content, or None where the viewer may not make links (only the job's owner and staff may)."""
    request = context.get("request")
    job = _job_of(context)
    if request is None or job is None or not job.may_be_controlled_by(request.user):
        return None
    links = (
        StudentLink.objects.filter(job=job, revoked=False, expires__gt=timezone.now())
        .annotate(joined=Count("students"))
        .order_by("-created")
    )
    shown = []
    for link in links:
        url = request.build_absolute_uri(reverse("students:page", args=[token_for(link)]))
        shown.append({"link": link, "url": url, "qr": qr_svg(url, f"QR code of the student link to job {job.pk}")})
    return {
        "job": job,
        "links": shown,
        "next": request.get_full_path(),
        "default_minutes": DEFAULT_MINUTES,
        "max_minutes": MAX_MINUTES,
    }
