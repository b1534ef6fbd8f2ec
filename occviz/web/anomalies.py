"""The anomalies page: the latest anomalies job's table, both databases side by side, beside Hermitage's rows.

Each measured cell links to its step-mode jobs; Hermitage's published rows for PostgreSQL
and MySQL/InnoDB are shown whatever was measured; a button launches a new table (a normal
job of the `anomalies` scenario). While the latest job runs, its table refreshes itself.
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_safe

from occviz.jobs.models import Job
from occviz.scenarios import SCENARIOS
from occviz.scenarios.step.database import allowed_servers
from occviz.steps.hermitage import ANOMALIES, LEVELS, NAMES, PUBLISHED

_PUBLISHED_TITLES = (("postgresql", "PostgreSQL"), ("mysql", "MySQL/InnoDB"))


@require_safe
@login_required
def anomalies_page(request: HttpRequest) -> HttpResponse:
    spec = SCENARIOS["anomalies"]
    latest = Job.objects.filter(scenario=spec.name).order_by("-pk").first()
    state = spec.read_state(latest.pk, latest.params).data if latest is not None else None
    context = {
        "job": latest,
        "running": latest is not None and latest.status in (Job.Status.QUEUED, Job.Status.RUNNING),
        "state": state,
        "servers": allowed_servers(),
        "published": [
            {"title": title, "rows": [(level, [PUBLISHED[key][level][a] for a in ANOMALIES]) for level in LEVELS]}
            for key, title in _PUBLISHED_TITLES
        ],
        "anomalies": [(name, NAMES[name]) for name in ANOMALIES],
    }
    if request.GET.get("part") == "table":
        return render(request, "web/anomalies.html#measured", context)
    return render(request, "web/anomalies.html", context)
