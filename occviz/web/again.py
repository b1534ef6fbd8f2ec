"""Run a job again: the same scenario and parameters, a new job (presenter mode's `r` key).

The parameters go through the launch path as any launch's do, so the limits and the room
for jobs apply; a job's stored parameters are its form's cleaned data, which cleans to itself.
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from occviz.jobs.models import Job
from occviz.jobs.registry import ParamsError
from occviz.jobs.tasks import LaunchRefused, launch


@require_POST
@login_required
def job_again(request: HttpRequest, job_id: int) -> HttpResponse:
    """Launch a job like this one and show it (in presenter mode when `present=1`), or say why not (400/409)."""
    job = get_object_or_404(Job, pk=job_id)
    params = {name: value for name, value in job.params.items() if value is not None}
    try:
        again = launch(job.scenario, params, request.user)
    except ParamsError as refused:
        status = 409 if isinstance(refused, LaunchRefused) else 400
        why = refused.message if isinstance(refused, LaunchRefused) else str(refused)
        return HttpResponse(f"Not run again: {why}", status=status, content_type="text/plain; charset=utf-8")
    query = "?present=1" if request.POST.get("present") == "1" else ""
    return redirect(f"{reverse('job_detail', args=[again.pk])}{query}")
